"""Processes chosen by name, found now and whenever they (re)appear: ``watch --follow``.

A NAME matches a process the way pgrep/pidof select one, by one clear rule:

  * NAME without a "/" is compared with the process's comm (/proc/PID/comm, what ps and
    top show and ``pgrep -x NAME`` compares): equal, after cutting NAME to the 15
    characters the kernel keeps of a comm;
  * NAME with a "/" is a file: the process's executable (/proc/PID/exe) is that file, or
    its first argument that is not an option is (a script: ``python3 -u /srv/serve.py``,
    relative arguments resolved against the process's working directory).

Threads never match (only processes: /proc's top level), nor does clockalign itself or
any of its ancestors (``--follow python3`` from a python3 must not trace its own shell).

New processes are found by scanning /proc every SCAN_S, not by an exec tracepoint: the
scan sees processes started before the probes, in containers, and with any of the rules
above (a BPF program sees only a comm and the path as exec was given it), and the CUDA
probes of a new process need user space anyway (its libcuda is located, then a
per-process link is added).  The price: what a new process does in its first scan
interval after exec is not traced (a restarted inference service spends far longer than
that loading libraries before its first CUDA call).

A scan matches only the processes it has not seen for long: each one is matched every scan
for its first YOUNG_S (a supervisor's fork execs its worker a moment later), then only by a
sweep of every process each SWEEP_S (a long-running process that execs in place).  Matching
every process every scan read three /proc files a process and cost 28 % of a core at 1 084
processes on the 2-core VM; listing /proc is what each scan costs now.

    f = Follower(["tritonserver"]); new, gone = f.scan(current_tgids)
"""
import os
import time

from ...errors import ClockalignError
from . import process as targets

SCAN_S = 0.25
YOUNG_S = 3.0           # match a process every scan for this long after it is first seen
SWEEP_S = 5.0           # then only in a sweep of every process this often
COMM_LEN = 15


def check_names(names) -> list:
    """The --follow names, each checked (one clear sentence for a bad one)."""
    out = []
    for n in names:
        if not n or not n.strip():
            raise ClockalignError("--follow needs a process name or an executable's path")
        if "/" in n and not os.path.exists(n):
            raise ClockalignError(f"--follow {n}: no such file (a NAME with a / is the "
                                  "executable or script the processes run)")
        out.append(n)
    return out


def _read(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return None


def _first_operand(argv: list):
    """The first argument after argv[0] that is not an option (a script's path)."""
    for a in argv[1:]:
        if not a.startswith("-"):
            return a
    return None


def matches(pid: int, names) -> str:
    """The first of names process pid matches (module docstring), or None."""
    comm = None
    for n in names:
        if "/" not in n:
            if comm is None:
                comm = (_read(f"/proc/{pid}/comm") or "").rstrip("\n")
            if comm and comm == n[:COMM_LEN]:
                return n
            continue
        want = os.path.realpath(n)
        try:
            if os.readlink(f"/proc/{pid}/exe") == want:
                return n
        except OSError:
            continue
        script = _first_operand(targets.cmdline(pid))
        if script:
            cwd = _cwd(pid)
            if cwd is not None and os.path.realpath(os.path.join(cwd, script)) == want:
                return n
    return None


def _cwd(pid: int):
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return None


def _ancestors(pid: int) -> set:
    out = set()
    while pid > 1 and pid not in out:
        out.add(pid)
        stat = _read(f"/proc/{pid}/stat")
        try:
            pid = int(stat.rsplit(")", 1)[1].split()[1])
        except (AttributeError, IndexError, ValueError):
            break
    return out


def processes():
    """Pids of every process now (/proc's numeric entries)."""
    return [int(d) for d in os.listdir("/proc") if d.isdigit()]


class Follower:
    """Which processes match names now, against the targets already attached."""

    scan_s = SCAN_S

    def __init__(self, names, me: int = None, clock=time.monotonic):
        self.names = check_names(names)
        self._skip = _ancestors(me or os.getpid())
        self.matched = {}            # tgid -> the name it matched, while attached
        self.attached = 0            # processes attached since the start
        self.exited = 0              # attached processes that exited
        self._clock = clock
        self._first_seen = {}        # pid -> when a scan first saw it
        self._last_sweep = None
        self.checked = 0             # processes matched, all scans together

    def scan(self, current):
        """(new matching processes [(tgid, name)], attached ones that exited [tgid]).
        current: the tgids attached now (the followed and any --pid ones)."""
        gone = [p for p in list(current) if not targets.alive(p)]
        for p in gone:
            self.matched.pop(p, None)
        self.exited += len(gone)
        have = set(current) - set(gone)
        now = self._clock()
        sweep = self._last_sweep is None or now - self._last_sweep >= SWEEP_S
        if sweep:
            self._last_sweep = now
        pids = processes()
        seen = {}
        new = []
        for pid in pids:
            first = seen[pid] = self._first_seen.get(pid, now)
            if pid in have or pid in self._skip:
                continue
            if not sweep and now - first > YOUNG_S:
                continue
            self.checked += 1
            name = matches(pid, self.names)
            if name is not None and targets.alive(pid):
                new.append((pid, name))
        self._first_seen = seen      # exited processes are forgotten
        return new, gone

    def attach(self, pid: int, name: str) -> None:
        self.matched[pid] = name
        self.attached += 1
