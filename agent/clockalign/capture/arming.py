"""Before the probes fire: what was asked checked in one sentence each, and how long arming
took, step by step.

    check_request(opts)          # ClockalignError naming what is wrong
    arm = Arming(); ...; arm.step("libcuda_lookup_s"); notice(arm.text())
"""
import os
import shutil
import time

from ..errors import ClockalignError


def check_request(o) -> None:
    """Refuse a RecordOptions that cannot be recorded, before anything is armed."""
    if not o.pids and not o.command and not o.follow:
        raise ClockalignError("nothing to record: give --pid PID (one or more) or -- COMMAND")
    if o.follow and o.command:
        raise ClockalignError("--follow attaches to running processes by name: give it "
                              "alone or with --pid, not with -- COMMAND")
    if o.pids and o.command:
        raise ClockalignError("give either --pid PID or -- COMMAND, not both")
    if o.duration is not None and not o.duration > 0:
        raise ClockalignError(f"--duration must be more than 0 seconds (got {o.duration})")
    if o.command:
        check_command(o.command, o.env if o.env is not None else os.environ)
    for pid in o.pids:
        tgid = tgid_of(pid)
        if tgid is not None and tgid != pid:
            raise ClockalignError(f"{pid} is a thread of process {tgid}, not a process: "
                                  f"record it with --pid {tgid}")
    if o.output is None and not o.sinks:
        raise ClockalignError("nothing to write to: give a run file")


class Arming:
    """How long arming takes, step by step: from the libcuda lookup to the probes attached
    (what a --pid target runs unrecorded after `record` starts: 3-5 s on the 2-core VM,
    mostly the BPF compile), then the run file and the helpers' start (the trailer's
    "arming" has every step; "total_s" is up to the last one timed)."""
    NAMES = {"libcuda_lookup_s": "libcuda lookup", "bpf_compile_load_s": "BPF compile and load",
             "targets_s": "targets map", "cuda_links_s": "CUDA links",
             "event_buffers_s": "event buffers", "run_file_and_threads_s":
             "run file and thread snapshot", "helpers_s": "clock probe, counters and CUPTI "
             "reader start"}

    def __init__(self):
        self.t0 = self.last = time.monotonic()
        self.steps = {}

    def step(self, name=None):
        """End a step (name None: one whose parts were filled in by someone else)."""
        now = time.monotonic()
        if name is not None:
            self.steps[name] = now - self.last
        self.last = now

    def done(self) -> dict:
        return {"total_s": round(self.last - self.t0, 4),
                **{k: round(v, 4) for k, v in self.steps.items()}}

    def text(self) -> str:
        """One notice: the time to the probes attached, by the steps that took 5 ms or more."""
        d = self.done()
        parts = ", ".join(f"{self.NAMES.get(k, k)} {v:.2f} s" for k, v in d.items()
                          if k != "total_s" and v >= 0.005)
        return f"probes armed in {d['total_s']:.2f} s ({parts})"


def tgid_of(pid: int):
    """The process a thread id belongs to (itself for a main thread), None if unknown."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Tgid:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def check_command(argv, env) -> None:
    """Refuse, before any probe is armed, a command that exec would refuse to run."""
    exe = argv[0] if os.sep in argv[0] else shutil.which(argv[0], path=env.get("PATH"))
    if not exe or not os.path.isfile(exe) or not os.access(exe, os.X_OK):
        raise ClockalignError(f"command not found or not executable: {argv[0]}")
    try:
        with open(exe, "rb") as f:
            head = f.read(4)
    except OSError as e:
        raise ClockalignError(f"cannot run {argv[0]}: {e.strerror}") from None
    if head != b"\x7fELF" and not head.startswith(b"#!"):
        raise ClockalignError(f"cannot run {argv[0]}: it is neither a program nor a script "
                              "starting with #! (exec would fail: exec format error)")
