#!/usr/bin/env python3
"""Where the probe cost goes: clockalign's CUDA probe path taken apart, measured side by side.

Three parts, each interleaved (every round runs every configuration, the order rotated by
one each round), medians and spread over the rounds:

  micro  one thread calls the stand-in libcuda's cuLaunchKernel flat out (scripts/
         workloads/storm.c) under: no probes; empty entry / entry+return programs; the CUDA path
         rebuilt one piece at a time (scripts/bench/probe_stages.c: filter, clock reads,
         pairing state — hash map, per-thread array, task storage —, arguments, one ring
         record); the real bpf/probes.c (CUDA only, then with sched/connect/thread
         tracepoints); `clockalign record` (minimal, then everything on); probes.c CUDA
         only and the full recording again with the per-CPU perf buffers (the event
         transport's A/B: the fall-back against the default).  A second pass
         with kernel.bpf_stats_enabled reads each BPF program's own run time: this
         process's from fdinfo, a recorder's (record, watch) through the bpf() syscall.
  model  a warm ResNet-18 fp16 batch-1 loop (scripts/workloads/resnet_loop.py, GPU only) while
         configurations are attached and detached on it in turn: plain, empty
         entry+return programs on every symbol clockalign probes, `clockalign record`
         minimal and full.  Driver calls per iteration are counted from the recording.
  storm  N threads flat out or paced, recorded by `clockalign record --pid`: the storm's
         own call count against the events recorded plus drops, recorder CPU, bytes/event.

    sudo .venv/bin/python scripts/bench/probe_cost.py --parts micro,storm --quick --out /tmp/pc
    sudo python3 scripts/bench/probe_cost.py --out results/overhead/h200      # GPU host

Writes OUT/overhead.json (every raw measurement) and OUT/overhead.md.
"""
import argparse
import contextlib
import ctypes
import datetime
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from clockalign.capture.probes import bpfinfo
from clockalign.capture.probes.cflags import ProbeOptions, import_bcc
from clockalign.capture.probes.program import Probes
from clockalign.capture.transport.perfbuf import PerfBuffers
from clockalign.store.schema import CUDA_FUNCTIONS
from ringbuf import RingReader  # the BPF ring buffer, for comparison (scripts/bench/)

HERE = Path(__file__).resolve().parent
WORKLOADS = HERE.parent / "workloads"       # the loads: storm, ResNet-18, their log reader
sys.path.insert(0, str(WORKLOADS))
import progress_log  # noqa: E402  (WORKLOADS)

STAGES = [  # (name, cflags, what it adds)
    ("entry_empty", ["-DSTAGE=0"], "empty program on entry only"),
    ("pair_empty", ["-DSTAGE=1"], "empty programs on entry and return"),
    ("filter", ["-DSTAGE=2"], "+ target tgid check (hash lookup) in both"),
    ("clock", ["-DSTAGE=3"], "+ bpf_ktime_get_ns in both"),
    ("pair_hash", ["-DSTAGE=4", "-DPAIR=1"], "+ entry state in a hash map (today)"),
    ("args_hash", ["-DSTAGE=5", "-DPAIR=1"], "+ arguments (3 stack reads)"),
    ("record_hash", ["-DSTAGE=6", "-DPAIR=1"], "+ 128-byte ring record (today's path)"),
    ("args_array", ["-DSTAGE=5", "-DPAIR=2"], "arguments, state in a per-thread array slot"),
    ("record_array", ["-DSTAGE=6", "-DPAIR=2"], "record, state in a per-thread array slot"),
    ("args_task", ["-DSTAGE=5", "-DPAIR=3"], "arguments, state in task-local storage"),
    ("record_task", ["-DSTAGE=6", "-DPAIR=3"], "record, state in task-local storage"),
    ("record72_task", ["-DSTAGE=6", "-DPAIR=3", "-DRECORD=72"], "72-byte record (no data field), task storage"),
    ("record_retry", ["-DSTAGE=6", "-DPAIR=2", "-DRETRY"], "array slot, ring reserve retried on failure"),
    ("record_perf", ["-DSTAGE=6", "-DPAIR=2", "-DPERF"], "array slot, record to a per-CPU perf buffer"),
    ("record_aring", ["-DSTAGE=6", "-DPAIR=2", "-DARING"],
     "array slot, record written in place into a per-CPU slot ring (mmapable array)"),
]

# what each micro configuration is, for overhead.json and overhead.md
STAGE_TEXT = dict({n: d for n, _, d in STAGES}, pair_empty_multi=
    "empty programs on entry and return, as a uprobe_multi link (how "
    "clockalign attaches)",
    probes_cuda="bpf/probes.c, CUDA probes only, per-process links, "
    "default event buffers (slot rings)",
    probes_cuda_perf="same, per-CPU perf buffers (the fall-back, forced by "
    "CLOCKALIGN_TEST_NO_SLOT_RINGS=1)",
    probes_cuda_map="same, one link for all processes + target map",
    probes_cuda_regs="same, --cuda-args registers (no user reads)",
    probes_all="bpf/probes.c with sched/connect/thread tracepoints",
    clockalign_min="clockalign record --counters none --no-gpu-clock",
    clockalign_full="clockalign record, everything on, default "
    "event buffers (slot rings)",
    clockalign_full_perf="same, per-CPU perf buffers (the fall-back, forced by "
    "CLOCKALIGN_TEST_NO_SLOT_RINGS=1)",
    watch="clockalign watch (no run file), everything on")


def now_ns():
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def clockalign_cmd(*args):
    """`clockalign ARGS`; with BENCH_READER=python in this script's environment, with the
    event buffers read by the benchmark's Python reader arm (bench/python_reader.py)."""
    if os.environ.get("BENCH_READER") == "python":
        return [sys.executable, str(HERE / "bench" / "python_reader.py"), *args]
    return [sys.executable, "-m", "clockalign.cli.main", *args]


# The event transport for the A/B: the slot rings (the default), or the per-CPU perf
# buffers, which clockalign uses where the slot rings do not load; the perf arms make them
# fail to load (the hook the tests use), so clockalign falls back as on such a kernel.  Read
# by Probes(...) when constructed and by `clockalign record`/`watch` from their environment.
BUFFERS_ENV = "CLOCKALIGN_TEST_NO_SLOT_RINGS"
BUFFERS = {"probes_cuda_perf": "1", "clockalign_full_perf": "1"}


def with_overrides(env, overrides):
    """env with overrides applied in place: a value sets the variable, None removes it."""
    for k, v in (overrides or {}).items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def child_env(overrides=None):
    return with_overrides(dict(os.environ), overrides)


@contextlib.contextmanager
def environ(overrides):
    """os.environ with overrides for the with-block only (restored after): what Probes
    reads when constructed, and nothing else in this process should see."""
    old = {k: os.environ.get(k) for k in overrides}
    with_overrides(os.environ, overrides)
    try:
        yield
    finally:
        with_overrides(os.environ, old)


def buffers_env(cfg):
    """{BUFFERS_ENV: "1"} for a perf-buffer arm; None (unset: the slot rings) for every
    other configuration, whatever the caller's environment says, so that the A/B compares
    the two transports."""
    return {BUFFERS_ENV: BUFFERS.get(cfg)}


def summarize(vals):
    vals = [v for v in vals if v is not None]
    if not vals:
        return None
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals),
            "n": len(vals), "all": vals}


def reference_config(ns):
    """The configuration added costs are divided by: the empty entry+return programs as a
    uprobe_multi link (how clockalign attaches) where it ran, else as two perf uprobes."""
    return "pair_empty_multi" if ns.get("pair_empty_multi") else "pair_empty"


def added_ratios(by_round, ref):
    """{configuration: its added ns/call over plain ÷ ref's}, three ways (None where ref
    adds nothing): of the medians over rounds; per round, each against the same round's
    plain and ref, so that a host drifting between rounds cancels out (median, min-max);
    of the minimums over rounds, the usual estimate of a fixed cost under additive noise.
    by_round: {configuration: ns/call of each round, in round order}."""
    def ratio(a, b):
        return a / b if b > 0 else None
    plain, base = by_round.get("plain") or [], by_round.get(ref) or []
    out = {}
    for cfg, vals in by_round.items():
        if cfg == "plain" or not vals or not plain or not base:
            continue
        med = statistics.median
        out[cfg] = {
            "of_medians": ratio(med(vals) - med(plain), med(base) - med(plain)),
            "per_round": summarize([ratio(v - p, b - p) for v, p, b in zip(vals, plain, base)]),
            "of_minimums": ratio(min(vals) - min(plain), min(base) - min(plain))}
    return out


def bpf_ns_per_call(micro, cfg):
    """The BPF programs' own run time per traced call in cfg's stats run (None: none)."""
    st = micro["bpf_stats"].get(cfg, {}).get("programs", {})
    if not st:
        return None
    return sum(v["ns_per_run"] * v["runs"] for v in st.values()) / micro["calls_per_run"]


# ---------------------------------------------------------------- building blocks
def build_tools(work: Path):
    """(stand-in libcuda, storm's own one-function library, storm program)."""
    from clockalign.workloads.standin import build
    libdir, _ = build(str(work / "standin"))
    storm = work / "storm"
    subprocess.run(["gcc", "-O2", "-o", str(storm), str(WORKLOADS / "storm.c"), "-ldl",
                    "-lpthread"], check=True)
    stormlib = work / "stormlib" / "libcuda.so.1"
    stormlib.parent.mkdir()
    subprocess.run(["gcc", "-shared", "-fPIC", "-O0", "-fcf-protection=none", "-o",
                    str(stormlib), str(WORKLOADS / "stormlib.c")], check=True)
    return str(Path(libdir) / "libcuda.so.1"), str(stormlib), str(storm)


def first_instructions(lib, symbols, n=2):
    """{symbol: the first n instructions} by objdump (None where there is no objdump)."""
    if not shutil.which("objdump") or not shutil.which("nm"):
        return None
    out = {}
    table = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True,
                           text=True).stdout.split("\n")
    addr = {ln.split()[2]: int(ln.split()[0], 16) for ln in table if len(ln.split()) == 3}
    for sym in symbols:
        if sym not in addr:
            continue
        dis = subprocess.run(["objdump", "-d", "--no-show-raw-insn", f"--start-address={addr[sym]}",
                              f"--stop-address={addr[sym] + 24}", lib], capture_output=True,
                             text=True).stdout.splitlines()
        ins = [ln.split(":", 1)[1].strip() for ln in dis if ln.startswith(" ") and ":" in ln]
        out[sym] = ins[:n]
    return out


class Storm:
    """One storm process, held before its first call until go()."""

    # micro: the CPU every storm runs on (--cpu), so that configurations do not differ by
    # where the scheduler put the calling thread; None: wherever it lands
    cpu = None

    def __init__(self, storm, lib, threads=1, calls=None, seconds=None, rate=None,
                 repeat=False):
        cmd = [storm, "--lib", lib, "--threads", str(threads), "--wait"]
        cmd += ["--repeat"] if repeat else []
        cmd += ["--calls", str(calls)] if calls else ["--seconds", str(seconds)]
        if rate:
            cmd += ["--rate", str(rate)]
        cpu = Storm.cpu
        pin = (lambda: os.sched_setaffinity(0, {cpu})) if cpu is not None else None
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  preexec_fn=pin)
        line = self.p.stdout.readline().split()
        if not line or line[0] != "ready":
            raise SystemExit(f"storm did not start: {line}")
        self.pid = int(line[1])

    def go(self) -> dict:
        self.p.stdin.write("go\n")
        self.p.stdin.flush()
        out = self.p.stdout.readline()
        self.p.wait()
        return json.loads(out)

    def again(self) -> dict:
        """One more run of a --repeat storm."""
        self.p.stdin.write("go\n")
        self.p.stdin.flush()
        return json.loads(self.p.stdout.readline())

    def close(self):
        self.p.stdin.close()
        self.p.wait()


class Drain(threading.Thread):
    """Empties ring buffers every 20 ms, as a recorder would (so reserves do not fail)."""

    def __init__(self):
        super().__init__(daemon=True)
        self.rings = []
        self.records = 0
        self._halt = threading.Event()

    def run(self):
        while not self._halt.wait(0.02):
            for r in list(self.rings):
                self.records += len(r.read())

    def stop(self):
        self._halt.set()


def prog_stats(funcs: dict) -> dict:
    """{program: (run_cnt, run_time_ns)} from /proc/self/fdinfo (needs bpf_stats_enabled)."""
    out = {}
    for name, fn in funcs.items():
        info = {}
        try:
            for line in open(f"/proc/self/fdinfo/{fn.fd}"):
                k, _, v = line.partition(":")
                info[k.strip()] = v.strip()
        except OSError:
            continue
        out[name.decode() if isinstance(name, bytes) else name] = (int(info.get("run_cnt", 0)), int(info.get("run_time_ns", 0)),
                     info.get("prog_jited"))
    return out


class bpf_stats:
    """kernel.bpf_stats_enabled=1 for the duration of a with-block (restored after)."""
    PATH = "/proc/sys/kernel/bpf_stats_enabled"

    def __enter__(self):
        self.old = open(self.PATH).read().strip()
        open(self.PATH, "w").write("1")

    def __exit__(self, *exc):
        open(self.PATH, "w").write(self.old)


# ---------------------------------------------------------------- every BPF program (bpf())
# A recorder's programs live in its own process, out of reach of this one's fdinfo: the
# bpf() syscall walks every program of the system by id instead (capture/probes/bpfinfo.py).
def system_progs() -> dict:
    """{id: (name, run_cnt, run_time_ns, jited)} of every BPF program loaded now."""
    return {i: (v["name"], v["run_cnt"], v["run_time_ns"], "1" if v["jited"] else "0")
            for i, v in bpfinfo.system_progs().items()}


def progs_named(snap, ids) -> dict:
    """{program: (run_cnt, run_time_ns, jited)} of those ids of a system_progs() snapshot,
    keyed like prog_stats; names that several of them share (the kernel keeps 15
    characters: sched_process_exit/_fork) get #1, #2... in load (id) order, the same
    from run to run."""
    mine = [(i, snap[i]) for i in sorted(ids) if i in snap]
    names = [v[0] for _, v in mine]
    out = {}
    for i, (name, cnt, t, jit) in mine:
        if names.count(name) > 1:
            name = f"{name}#{sum(1 for k in out if k.split('#')[0] == name) + 1}"
        out[name] = (cnt, t, jit)
    return out


def held_prog_ids(pid) -> set:
    """Ids of the BPF programs that pid and its descendants hold a program or link fd to
    (fdinfo's prog_id): which new programs are the recorder's, and not those of another
    tool loaded meanwhile on a shared host."""
    ids, todo = set(), [pid]
    while todo:
        p = todo.pop()
        try:
            for fd in os.listdir(f"/proc/{p}/fdinfo"):
                try:
                    for line in open(f"/proc/{p}/fdinfo/{fd}"):
                        if line.startswith("prog_id:"):
                            ids.add(int(line.split()[1]))
                except (OSError, ValueError):
                    continue
            for task in os.listdir(f"/proc/{p}/task"):
                todo += [int(c) for c in open(f"/proc/{p}/task/{task}/children").read().split()]
        except OSError:
            continue
    return ids


class Recording:
    """`clockalign record --pid PID` in a subprocess; started() returns once armed.  env:
    overrides of this process's environment for it (a value sets, None removes)."""

    def __init__(self, pid, out, lib=None, full=True, extra=(), env=None):
        args = ["record", "--pid", str(pid), "-o", str(out), "--quiet"]
        if lib:
            args += ["--libcuda", lib]
        if not full:
            args += ["--counters", "none", "--no-gpu-clock"]
        self.out = Path(out)
        if self.out.exists():
            self.out.unlink()
        self.p = subprocess.Popen(clockalign_cmd(*args, *extra), env=child_env(env),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def wait_armed(self, timeout=120):
        t_end = time.monotonic() + timeout
        while not self.out.exists():
            if self.p.poll() is not None or time.monotonic() > t_end:
                raise SystemExit("clockalign record did not start: " + self.p.stderr.read()[-2000:])
            time.sleep(0.05)
        time.sleep(0.3)   # helpers (counters, clock probe) start after the file appears

    def cpu_s(self):
        """CPU seconds (user + system) the recorder has used so far (0 once it is gone)."""
        try:
            f = open(f"/proc/{self.p.pid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")

    def _end(self, grace_s=0.0):
        """Reap the recorder, SIGINT first unless it ends by itself within grace_s: (what
        every recording reports of its process, its stderr)."""
        early = self.p.returncode is not None
        ru = None
        if not early:
            t_end, pid = time.monotonic() + grace_s, 0
            while not pid and time.monotonic() < t_end:
                pid, status, ru = os.wait4(self.p.pid, os.WNOHANG)
                if not pid:
                    time.sleep(0.05)
            if not pid:
                # os.kill, not Popen.send_signal: that polls first and would reap a recorder
                # that already ended by itself, leaving wait4 nothing to report
                os.kill(self.p.pid, signal.SIGINT)
                _, status, ru = os.wait4(self.p.pid, 0)
            self.p.returncode = os.waitstatus_to_exitcode(status)
        err = self.p.stderr.read()
        return {"returncode": self.p.returncode, "exited_early": early,
                "stderr_tail": err[-3000:] if (early or self.p.returncode) else "",
                "cpu_user_s": ru.ru_utime if ru else 0, "cpu_sys_s": ru.ru_stime if ru else 0,
                "max_rss_mb": ru.ru_maxrss / 1024 if ru else 0,
                "notices": [ln for ln in err.splitlines() if "lost" in ln or "error" in ln]}, err

    def stop(self):
        from clockalign.store.reader import RunReader
        res, err = self._end()
        tr = RunReader(self.out).trailer or {}
        if not tr:
            res["stderr_tail"] = err[-3000:]
        return {**res, "size": self.out.stat().st_size, "counts": tr.get("counts"),
                "drops": tr.get("drops"), "ring_peak_fill": tr.get("ring_peak_fill")}


class WatchRecording(Recording):
    """`clockalign watch --pid PID` (no run file, everything on, like clockalign_full):
    armed once its /metrics says clockalign_probes_armed 1; its counts and drops are
    scraped from /metrics just before it is stopped."""

    def __init__(self, pid, out, lib=None, full=True, extra=(), env=None):
        import socket as _socket
        with _socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        args = ["watch", "--pid", str(pid), "--listen", f"127.0.0.1:{self.port}", "--quiet"]
        if lib:
            args += ["--libcuda", lib]
        if not full:
            args += ["--counters", "none", "--no-gpu-clock"]
        self.out = None
        self.p = subprocess.Popen(clockalign_cmd(*args, *extra), env=child_env(env),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def metrics(self):
        import urllib.request
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics",
                                          timeout=5).read().decode()
        except OSError:
            return ""

    def wait_armed(self, timeout=120):
        t_end = time.monotonic() + timeout
        while "clockalign_probes_armed 1.0" not in self.metrics():
            if self.p.poll() is not None or time.monotonic() > t_end:
                raise SystemExit("clockalign watch did not start: " + self.p.stderr.read()[-2000:])
            time.sleep(0.1)
        time.sleep(0.3)

    def totals(self):
        from prometheus_client.parser import text_string_to_metric_families
        counts, drops = {}, {}
        for fam in text_string_to_metric_families(self.metrics()):
            for smp in fam.samples:
                if smp.name == "clockalign_events_total":
                    counts[smp.labels["kind"]] = int(smp.value)
                elif smp.name == "clockalign_events_dropped_total" and smp.value:
                    drops[smp.labels["kind"]] = int(smp.value)
        return counts, drops

    def stop(self):
        # the last calls may still sit in the event buffers or in a batch being aggregated:
        # the totals are final once three scrapes over 1.5 s agree (two scrapes 0.3 s apart
        # stopped short on the H200, run h200-8: 59-100 % of the calls, while the VM's
        # watch reached every call 0.3-0.5 s after a 100 000-call burst)
        # watch --pid ends by itself soon after its target exits (the storm does, once its
        # calls are done): an empty scrape then means gone, and the last totals are final
        now, t_end, same = self.totals(), time.monotonic() + 30, 0
        while time.monotonic() < t_end and same < 3:
            time.sleep(0.5)
            prev, now = now, self.totals()
            if not now[0]:
                now = prev
                break
            same = same + 1 if now == prev else 0
        counts, drops = now
        # its target has exited (the storm is reaped before stop()): watch ends by itself,
        # and a SIGINT in its last moments would kill it (-2) before its summary line
        res, err = self._end(grace_s=30.0)
        # its last line ("watched: N CUDA calls, ..., D dropped; stopped by ...") is final
        m = re.search(r"watched: (\d+) CUDA calls.*?(\d+) dropped", err)
        if m:
            counts["cuda"] = int(m.group(1))
            res["watch_dropped"] = int(m.group(2))
        return {**res, "size": 0, "counts": counts, "drops": drops, "ring_peak_fill": None}


def link_empty_multi(empty, lib, pid=0):
    """The empty program of the BPF object empty on lib's cuLaunchKernel entry and return, as
    uprobe_multi links (how clockalign attaches; pid 0: every process): their detach()."""
    from clockalign.capture.probes.uprobe_multi import BPF_TRACE_UPROBE_MULTI, link_uprobe_multi
    BPF = type(empty)
    path, off = BPF._check_path_symbol(lib, "cuLaunchKernel", 0, -1)
    fn = empty.load_func("e", BPF.KPROBE, attach_type=BPF_TRACE_UPROBE_MULTI)
    fds = [link_uprobe_multi(fn.fd, path.decode(), [off], [1], r, pid=pid)
           for r in (False, True)]

    def detach():
        for fd in fds:
            os.close(fd)
    return detach


# ---------------------------------------------------------------- part: micro
def part_micro(lib, storm, rounds, calls, only=None, stats_only=None, on_rounds=None):
    """The timed rounds, then the BPF statistics pass (over stats_only's configurations
    where given).  on_rounds(result) gets the result before that pass, so that a run cut
    short there keeps its rounds."""
    BPF = import_bcc().BPF
    src = (HERE / "probe_stages.c").read_text()
    objs = {}
    for name, flags, _ in STAGES:
        objs[name] = BPF(text=src, cflags=flags)
    drain = Drain()
    drain.start()
    for name, b in objs.items():
        drain.rings.append(RingReader(b["events"].map_fd, 4096 * 4096,
                                      f"V{72 if '72' in name else 128}"))
    # a structured dtype with a leading ts: PerfBuffers merges CPUs by dtype.names' "ts"
    # (a bare "V128" has no names, and that merge raised TypeError in the Drain thread)
    drain.rings.append(PerfBuffers(objs["record_perf"]["pevents"], 4 << 20,
                                   np.dtype([("ts", "<u8"), ("rest", "V120")])))

    def attach_stage(name, pid):
        import ctypes
        b = objs[name]
        b["targets"][ctypes.c_uint32(pid)] = ctypes.c_uint8(1)
        b.attach_uprobe(name=lib, sym="cuLaunchKernel", fn_name="enter")
        if name != "entry_empty":
            b.attach_uretprobe(name=lib, sym="cuLaunchKernel", fn_name="ret")

        def detach():
            b.detach_uprobe(name=lib, sym="cuLaunchKernel")
            if name != "entry_empty":
                b.detach_uretprobe(name=lib, sym="cuLaunchKernel")
            b["targets"].clear()
        return detach

    empty = BPF(text="int e(void *ctx) { return 0; }")

    def attach_probes(cfg, pid):
        sched = cfg == "probes_all"
        with environ(buffers_env(cfg)):
            p = Probes(ProbeOptions(cuda_lib=lib, connect=sched, sched=sched, xid=sched,
                                    cuda_args="registers" if cfg.endswith("_regs") else "full",
                                    pid_links=not cfg.endswith("_map")), [pid])
        drain.rings.append(p.ring)

        def detach():
            drain.rings.remove(p.ring)
            time.sleep(0.05)
            p.close()
        return detach, p._bpf.funcs

    def attach(cfg, pid):
        """Attach an in-process configuration to pid, the same in both passes: (detach,
        {name: BPF function} whose fdinfo has the programs' statistics)."""
        if cfg in objs:
            return attach_stage(cfg, pid), objs[cfg].funcs
        if cfg == "pair_empty_multi":
            return link_empty_multi(empty, lib), empty.funcs
        return attach_probes(cfg, pid)

    def start_recorder(cfg, pid):
        """`clockalign record`/`watch` on pid, armed: the same in both passes."""
        kind = WatchRecording if cfg == "watch" else Recording
        rec = kind(pid, tmp / f"{cfg}.ca", lib=lib, full=cfg != "clockalign_min",
                   env=buffers_env(cfg))
        rec.wait_armed()
        return rec

    configs = ["plain"] + [s[0] for s in STAGES] + [
        "pair_empty_multi", "probes_cuda", "probes_cuda_perf", "probes_cuda_map",
        "probes_cuda_regs", "probes_all", "clockalign_min", "clockalign_full",
        "clockalign_full_perf", "watch"]
    if only:
        configs = [c for c in configs if c in only or c == "plain"]
    recorded = [c for c in configs if is_recorder(c)]
    tmp = Path(tempfile.mkdtemp(prefix="pc-micro-"))
    results = {c: [] for c in configs}
    lost = {c: [] for c in configs}
    recorders = {c: [] for c in recorded}
    for rnd in range(rounds):
        order = configs[rnd % len(configs):] + configs[:rnd % len(configs)]
        for cfg in order:
            st = Storm(storm, lib, calls=calls)
            rec = detach = None
            if cfg in recorded:
                rec = start_recorder(cfg, st.pid)
            elif cfg != "plain":
                detach, _ = attach(cfg, st.pid)
            lost0 = _lost(objs.get(cfg))
            res = st.go()
            time.sleep(0.05)
            if detach:
                detach()
            if rec:
                res["recording"] = r = rec.stop()
                lost[cfg].append(sum((r["drops"] or {}).values()))
                recorders[cfg].append({"cpu_s": r["cpu_user_s"] + r["cpu_sys_s"],
                                       "max_rss_mb": r["max_rss_mb"],
                                       "cuda_events": (r["counts"] or {}).get("cuda"),
                                       "drops_by_kind": r["drops"] or {},
                                       "returncode": r["returncode"]})
            elif cfg in objs:
                lost[cfg].append(_lost(objs[cfg]) - lost0)
            results[cfg].append(res["ns_per_call"])
            print(f"micro round {rnd} {cfg:20s} {res['ns_per_call']:9.1f} ns/call", flush=True)

    stats = {}

    def result():
        return {"calls_per_run": calls, "rounds": rounds, "storm_cpu": Storm.cpu,
                "stages": STAGE_TEXT,
                "first_instructions": first_instructions(lib, ["cuLaunchKernel"]),
                "ns_per_call": {c: summarize(v) for c, v in results.items()},
                "ns_per_call_by_round": results,
                "added_ratio_reference": reference_config(results),
                "added_ratio": added_ratios(results, reference_config(results)),
                "lost_per_run": lost,
                "recorders": recorders,
                "buffers_env": {c: BUFFERS.get(c) for c in configs
                                if c.startswith("probes_") or is_recorder(c)},
                "bpf_stats": stats}
    if on_rounds:
        on_rounds(result())

    # BPF run time per program, from the kernel's own statistics: in-process programs from
    # this process's fdinfo, a recorder's by the bpf() syscall (the programs that appeared
    # with it and that it holds), each snapshot just before and just after the storm
    with bpf_stats():
        for cfg in configs[1:]:
            if stats_only and cfg not in stats_only:
                continue
            st = Storm(storm, lib, calls=calls)
            extra = {}
            if cfg in recorded:
                old = set(system_progs())
                rec = start_recorder(cfg, st.pid)
                snap = system_progs()
                new = set(snap) - old
                ids = new & held_prog_ids(rec.p.pid)
                if not ids:                       # its fdinfo unreadable: every new one
                    ids = new
                extra["new_programs_not_held"] = sorted(snap[i][0] for i in new - ids)
                before = progs_named(snap, ids)
                res = st.go()
                after = progs_named(system_progs(), ids)
                time.sleep(0.05)
                r = rec.stop()
                extra["recorder"] = {"cuda_events": (r["counts"] or {}).get("cuda"),
                                     "returncode": r["returncode"]}
                extra["method"] = "bpf() syscall: the recorder's programs"
            else:
                detach, funcs = attach(cfg, st.pid)
                before = prog_stats(funcs)
                res = st.go()
                after = prog_stats(funcs)
                detach()
                extra["method"] = "fdinfo: this process's programs"
            per = {}
            for k, (cnt, t, jit) in after.items():
                c0, t0, _ = before.get(k, (0, 0, None))
                if cnt - c0 > 0:
                    per[k] = {"runs": cnt - c0, "ns_per_run": (t - t0) / (cnt - c0),
                              "jited": jit}
            stats[cfg] = {"storm_ns_per_call": res["ns_per_call"], "programs": per, **extra}
            print(f"bpf stats {cfg:20s} " + ", ".join(
                f"{k} {v['ns_per_run']:.0f} ns x{v['runs']}" for k, v in per.items()
                if v["runs"] >= calls // 2 or "sched" in k), flush=True)
    drain.stop()
    for b in objs.values():
        b.cleanup()
    shutil.rmtree(tmp, ignore_errors=True)
    return result()


def is_recorder(cfg):
    """A configuration run as a `clockalign record`/`watch` subprocess."""
    return cfg.startswith("clockalign_") or cfg == "watch"


AB_CONFIGS = ["plain", "pair_empty_multi", "probes_cuda", "probes_cuda_perf", "probes_all"]


def part_ab(lib, storm, rounds, calls, only=None):
    """Per call, the configurations switched within one storm process (storm --repeat):
    each in-process configuration is loaded once, and between runs only its links are made
    and closed, so consecutive runs are milliseconds apart, not a process start and a
    recorder start apart as in micro."""
    configs = [c for c in AB_CONFIGS if not only or c in only or c == "plain"]
    BPF = import_bcc().BPF
    empty = BPF(text="int e(void *ctx) { return 0; }")
    drain = Drain()
    drain.start()
    probes = {}
    for cfg in configs:
        if cfg.startswith("probes_"):
            every = cfg == "probes_all"       # the tracepoints a recording loads too
            with environ(buffers_env(cfg)):
                probes[cfg] = Probes(ProbeOptions(cuda_lib=lib, connect=every, sched=every,
                                                  xid=every, tcp=every, pid_links=True), [])
            drain.rings.append(probes[cfg].ring)
    st = Storm(storm, lib, calls=calls, repeat=True)

    def switch_on(cfg):
        if cfg == "pair_empty_multi":
            return link_empty_multi(empty, lib, pid=st.pid)
        if cfg in probes:
            why = probes[cfg].add_targets([st.pid], lib)
            if why:
                raise SystemExit(f"ab: {cfg}: {why}")
            return lambda: probes[cfg].remove_targets([st.pid])
        return lambda: None

    results = {c: [] for c in configs}
    try:
        for rnd in range(rounds):
            order = configs[rnd % len(configs):] + configs[:rnd % len(configs)]
            for cfg in order:
                off = switch_on(cfg)
                res = st.again()
                off()
                results[cfg].append(res["ns_per_call"])
            print(f"ab round {rnd} " + " ".join(f"{c} {results[c][-1]:.0f}" for c in configs),
                  flush=True)
    finally:
        st.close()
        time.sleep(0.05)
        drain.stop()
        for p in probes.values():
            p.close()
        empty.cleanup()
    ref = reference_config(results)
    return {"calls_per_run": calls, "rounds": rounds, "storm_cpu": Storm.cpu,
            "stages": {c: STAGE_TEXT[c] for c in configs if c in STAGE_TEXT},
            "ns_per_call": {c: summarize(v) for c, v in results.items()},
            "ns_per_call_by_round": results, "added_ratio_reference": ref,
            "added_ratio": added_ratios(results, ref)}


def _lost(b):
    import ctypes
    return int(b["lost"][ctypes.c_int(0)].value) if b is not None else 0


# ---------------------------------------------------------------- part: model
def real_libcuda():
    from clockalign.capture.probes.libcuda import resolve_like_loader
    path, _ = resolve_like_loader(dict(os.environ))
    return path


MODEL_CONFIGS = ["plain", "pair_empty_multi", "probes_inproc", "clockalign_full"]


def part_model(rounds, window_s, settle_s, only=None):
    lib = real_libcuda()
    if not lib:
        return {"skipped": "no libcuda on this machine"}
    BPF = import_bcc().BPF
    empty = BPF(text="int e(void *ctx) { return 0; }")
    symbols = [sym for _, (sym, _) in sorted(CUDA_FUNCTIONS.items())]
    firsts = first_instructions(lib, symbols)
    configs = [c for c in MODEL_CONFIGS if not only or c in only]
    if "plain" not in configs:
        configs.insert(0, "plain")        # every ratio is to the same round's plain window
    per_round = len(configs) * (window_s + settle_s + 6)
    total = rounds * per_round + 60
    tmp = Path(tempfile.mkdtemp(prefix="pc-model-"))
    log = tmp / "resnet.log"
    wl = subprocess.Popen([sys.executable, str(WORKLOADS / "resnet_loop.py"), "--seconds",
                           str(total), "--log", str(log)], stdout=subprocess.PIPE, text=True)
    ready = json.loads(wl.stdout.readline() or "{}")
    if not ready.get("ready"):
        wl.kill()
        return {"skipped": "the ResNet-18 workload did not start (torchvision/CUDA?)"}
    windows = []
    for rnd in range(rounds):
        k = rnd % len(configs)
        order = configs[k:] + configs[:k]
        for cfg in order:
            rec, attached, links = None, [], []
            if cfg == "pair_empty_multi":
                from clockalign.capture.probes.uprobe_multi import (BPF_TRACE_UPROBE_MULTI,
                                                                    link_uprobe_multi)
                offs = sorted({BPF._check_path_symbol(lib, s_, 0, -1)[1] for s_ in symbols
                               if _exports(lib, s_)})
                fn = empty.load_func("e", BPF.KPROBE, attach_type=BPF_TRACE_UPROBE_MULTI)
                links = [link_uprobe_multi(fn.fd, lib, offs, list(range(len(offs))), r)
                         for r in (False, True)]
                attached = []
            elif cfg == "pair_empty":
                for s in symbols:
                    try:
                        empty.attach_uprobe(name=lib, sym=s, fn_name="e")
                        empty.attach_uretprobe(name=lib, sym=s, fn_name="e")
                        attached.append(s)
                    except Exception:
                        pass
            elif cfg == "probes_inproc":      # bpf/probes.c in this process: no recorder
                inproc = Probes(ProbeOptions(cuda_lib=lib, xid=False), [wl.pid])
                drain = Drain()
                drain.rings.append(inproc.ring)
                drain.start()
            elif cfg.startswith("clockalign_"):
                rec = Recording(wl.pid, tmp / f"{cfg}-{rnd}.ca", full=cfg != "clockalign_min",
                                extra=("--cuda-args", "registers") if cfg.endswith("regs")
                                else ())
                rec.wait_armed()
            time.sleep(settle_s)
            t0 = now_ns()
            time.sleep(window_s)
            t1 = now_ns()
            for s_ in attached:
                empty.detach_uprobe(name=lib, sym=s_)
                empty.detach_uretprobe(name=lib, sym=s_)
            for fd in links:
                os.close(fd)
            if cfg == "probes_inproc":
                drain.stop()
                drain.join()
                inproc.close()
            w = {"config": cfg, "round": rnd, "t0": t0, "t1": t1,
                 "symbols": len(attached) or len(links) and len(offs)}
            if rec:
                w["recording"] = rec.stop()
                w["cuda_events_in_window"], w["calls_by_function"] = cuda_events_between(
                    rec.out, t0, t1)
            windows.append(w)
            time.sleep(0.5)
    wl.send_signal(signal.SIGTERM)
    wl.wait(timeout=60)
    samples = progress_log.read(log)
    for w in windows:
        w["it_per_s"] = progress_log.rate(samples, w["t0"], w["t1"])
        w["cpu_ns_per_it"] = progress_log.cpu_per_item(samples, w["t0"], w["t1"])
        if w.get("cuda_events_in_window") and w["it_per_s"]:
            w["calls_per_iteration"] = w["cuda_events_in_window"] / (
                w["it_per_s"] * (w["t1"] - w["t0"]) / 1e9)
    empty.cleanup()
    shutil.rmtree(tmp, ignore_errors=True)
    by = {c: summarize([w["it_per_s"] for w in windows if w["config"] == c]) for c in configs}
    cpi = [w["calls_per_iteration"] for w in windows if w.get("calls_per_iteration")]
    def per_round(c, ref, key="it_per_s", invert=False):
        # per round, against the same round's reference window: drift cancels
        rs = []
        for rnd in range(rounds):
            a = [w.get(key) for w in windows if w["round"] == rnd and w["config"] == c]
            p = [w.get(key) for w in windows if w["round"] == rnd and w["config"] == ref]
            if a and p and a[0] and p[0]:
                rs.append(p[0] / a[0] if invert else a[0] / p[0])
        return summarize(rs)
    ratio = {c: per_round(c, "plain") for c in configs[1:]}
    # the issue's goal: a full recording at >= 0.97x the empty programs' speed
    others = [c for c in configs if c not in ("plain", "pair_empty_multi")]
    to_empty = ({c: per_round(c, "pair_empty_multi") for c in others}
                if "pair_empty_multi" in configs else {})
    # the same from the driver-calling thread's CPU time per iteration (ref / config, so
    # that below 1 is slower, like the rate): what the probes add to that thread
    cpu = {c: summarize([w["cpu_ns_per_it"] for w in windows
                         if w["config"] == c and w.get("cpu_ns_per_it")]) for c in configs}
    cpu_to_empty = ({c: per_round(c, "pair_empty_multi", "cpu_ns_per_it", True)
                     for c in others} if "pair_empty_multi" in configs else {})
    cpu_to_plain = {c: per_round(c, "plain", "cpu_ns_per_it", True) for c in configs[1:]}
    return {"workload": ready, "libcuda": lib, "first_instructions": firsts,
            "window_s": window_s, "settle_s": settle_s,
            "rounds": rounds, "windows": windows, "it_per_s": by, "ratio_to_plain": ratio,
            "ratio_to_empty": to_empty, "cpu_ns_per_it": cpu, "cpu_ratio_to_plain": cpu_to_plain,
            "cpu_ratio_to_empty": cpu_to_empty,
            "calls_per_iteration": statistics.median(cpi) if cpi else None}


def cuda_events_between(path, t0, t1):
    """(CUDA calls recorded in [t0, t1], {function: calls})."""
    import collections
    from clockalign.store.reader import RunReader
    from clockalign.store.schema import Kind
    by = collections.Counter()
    for ev in RunReader(path).iter_events():
        sel = ev[(ev["kind"] == Kind.CUDA)]
        sel = sel[(sel["ts"] >= t0) & (sel["ts"] <= t1)]
        for fid, n in zip(*np_unique(sel["code"])):
            by[CUDA_FUNCTIONS.get(int(fid), (str(fid),))[0]] += int(n)
    return sum(by.values()), dict(by)


def np_unique(a):
    import numpy as np
    return np.unique(a, return_counts=True)


def _exports(lib, sym):
    try:
        import_bcc().BPF._check_path_symbol(lib, sym, 0, -1)
        return True
    except Exception:
        return False


# ---------------------------------------------------------------- part: storm
def part_storm(lib, storm, threads_list, seconds, paced, recorder="record"):
    tmp = Path(tempfile.mkdtemp(prefix="pc-storm-"))
    rows = []
    runs = [(t, None, seconds) for t in threads_list] + list(paced)
    for threads, rate_per_thread, secs in runs:
        st = Storm(storm, lib, threads=threads, seconds=secs, rate=rate_per_thread)
        rec = (WatchRecording if recorder == "watch" else Recording)(
            st.pid, tmp / "storm.ca", lib=lib, full=True)
        rec.wait_armed()
        cpu0 = rec.cpu_s()
        res = st.go()
        cpu_storm = rec.cpu_s() - cpu0      # steady state: no compile, no detach
        time.sleep(0.3)
        r = rec.stop()
        recorded = (r["counts"] or {}).get("cuda", 0)
        drops = sum((r["drops"] or {}).values())
        row = {"threads": threads, "paced_per_thread": rate_per_thread, "seconds": secs,
               "generator_calls": res["total"], "rate_per_s": res["total"] / res["wall_s"],
               "recorded": recorded, "drops": drops, "drops_by_kind": r["drops"],
               "missing_unaccounted": res["total"] - recorded - (r["drops"] or {}).get("cuda", 0),
               "ring_peak_fill": r["ring_peak_fill"],
               "recorder_cpu_s_total": r["cpu_user_s"] + r["cpu_sys_s"],
               "recorder_cpu_s_during_storm": cpu_storm,
               "recorder_cores": cpu_storm / res["wall_s"],
               "recorder_rss_mb": r["max_rss_mb"], "file_bytes": r["size"],
               "recorder_returncode": r["returncode"], "recorder_stderr": r["stderr_tail"],
               "bytes_per_event": r["size"] / max(1, recorded), "notices": r["notices"]}
        rows.append(row)
        print(f"storm {threads:2d} threads{' paced ' + str(rate_per_thread) if rate_per_thread else ''}: "
              f"{row['rate_per_s'] / 1e6:.3f} M calls/s, recorded {recorded}, drops {drops}, "
              f"unaccounted {row['missing_unaccounted']}, recorder {row['recorder_cores']:.2f} cores, "
              f"{row['bytes_per_event']:.1f} B/event", flush=True)
    shutil.rmtree(tmp, ignore_errors=True)
    return {"runs": rows, "recorder": recorder}


# ---------------------------------------------------------------- report
def machine():
    info = {"hostname": socket.gethostname(), "platform": platform.platform(),
            "kernel": os.uname().release, "cpus": os.cpu_count(), "python": platform.python_version()}
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        info["gpu"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version",
                                      "--format=csv,noheader"], capture_output=True, text=True,
                                     timeout=20).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        info["gpu"] = None
    try:
        info["clocksource"] = open("/sys/devices/system/clocksource/clocksource0/"
                                   "current_clocksource").read().strip()
        info["bpf_jit_enable"] = open("/proc/sys/net/core/bpf_jit_enable").read().strip()
    except OSError:
        pass
    return info


def ratio_table(mi, base, ratios) -> list:
    """The per-call table of a micro or ab result: ns/call, added cost, the three ratios to
    base's added cost, and the BPF run time per call where the statistics pass measured it."""
    def x(r):
        return "—" if r is None else f"{r:.2f}×"

    def spread(r):
        return "—" if not r else f"{x(r['median'])} ({r['min']:.2f}–{r['max']:.2f})"
    plain = mi["ns_per_call"]["plain"]["median"]
    out = ["| configuration | ns/call median (min–max) | added over plain (median) | "
           f"added ÷ {base}'s: of medians | per round: median (min–max) | of minimums "
           "| BPF run time per call (kernel stats) |", "|---|---|---|---|---|---|---|"]
    for cfg, s in mi["ns_per_call"].items():
        if not s:
            continue
        bpf = bpf_ns_per_call(mi, cfg) if "bpf_stats" in mi else None
        desc = mi["stages"].get(cfg, "")
        r = ratios.get(cfg) or {}
        out.append(f"| {cfg} {('— ' + desc) if desc else ''} | {s['median']:.0f} "
                   f"({s['min']:.0f}–{s['max']:.0f}) | {s['median'] - plain:+.0f} | "
                   f"{x(r.get('of_medians'))} | {spread(r.get('per_round'))} | "
                   f"{x(r.get('of_minimums'))} | "
                   f"{'' if bpf is None else f'{bpf:.0f} ns'} |")
    return out


def render(res) -> str:
    m = res["machine"]
    out = [f"# Probe cost, taken apart ({m.get('gpu') or 'no GPU'}; {m['hostname']})", "",
           f"- date: {res['date']}", f"- command: `{res['command']}`",
           f"- machine: {m.get('cpu')} x{m['cpus']}, kernel {m['kernel']}, clocksource "
           f"{m.get('clocksource')}, bpf_jit_enable {m.get('bpf_jit_enable')}", ""]
    mi = res.get("micro")
    if mi:
        plain = mi["ns_per_call"]["plain"]["median"]
        base = reference_config(mi["ns_per_call"])
        ratios = mi.get("added_ratio") or added_ratios(
            {c: s["all"] for c, s in mi["ns_per_call"].items() if s}, base)

        out += ["## Per call (stand-in cuLaunchKernel, one thread, "
                f"{mi['calls_per_run']} calls a run, {mi['rounds']} interleaved rounds)", "",
                f"Added ÷ {base}'s is (configuration − plain) ÷ ({base} − plain), three ways: "
                "of the medians over rounds; per round, against the same round's plain and "
                f"{base} (drift between rounds cancels), median and min–max over rounds; of "
                "the minimums over rounds (the usual estimate of a fixed cost under additive "
                "noise).", "",
                ] + ratio_table(mi, base, ratios) + [""]
        recs = {c: v for c, v in (mi.get("recorders") or {}).items() if v}
        if recs:
            out += ["| recorder | CPU s a run (median) | max RSS MB (max) | CUDA events a run "
                    "(each run's) | exit codes |", "|---|---|---|---|---|"]
            for c, runs in recs.items():
                out.append(f"| {c} | {statistics.median(r['cpu_s'] for r in runs):.2f} | "
                           f"{max(r['max_rss_mb'] for r in runs):.0f} | "
                           f"{', '.join(str(r['cuda_events']) for r in runs)} (of "
                           f"{mi['calls_per_run']} calls) | "
                           f"{sorted(set(r['returncode'] for r in runs))} |")
            out.append("")
    ab = res.get("ab")
    if ab:
        base = ab["added_ratio_reference"]
        out += [f"## Per call, switched within one process ({ab['rounds']} rounds of "
                f"{ab['calls_per_run']} calls a configuration)", "",
                "One storm process (one thread" + (f", on CPU {ab['storm_cpu']}"
                                                   if ab.get("storm_cpu") is not None else "")
                + ") makes every run; between runs the configurations' links are swapped "
                "(milliseconds), each round in a rotated order, so a run and its reference "
                "are a few hundred ms apart: a host that drifts over seconds cancels in the "
                "per-round ratio. The programs are loaded once.", ""] + \
            ratio_table(ab, base, ab["added_ratio"]) + [""]
    mo = res.get("model")
    if mo and not mo.get("skipped"):
        out += [f"## ResNet-18 fp16 batch 1 ({mo['workload'].get('device')}, torch "
                f"{mo['workload'].get('torch')}), {mo['rounds']} rounds of {mo['window_s']} s "
                f"windows on one warm process; {mo['calls_per_iteration'] or 0:.0f} driver calls "
                "per iteration", "",
                "| configuration | it/s median (min–max) | ratio to plain, per round (median, "
                "min–max) | ratio to the empty programs, per round |", "|---|---|---|---|"]
        def cell(r):
            return f"{r['median']:.3f} ({r['min']:.3f}–{r['max']:.3f})" if r else "—"
        for c, s in mo["it_per_s"].items():
            out.append(f"| {c} | {s['median']:.1f} ({s['min']:.1f}–{s['max']:.1f}) | "
                       f"{cell(mo['ratio_to_plain'].get(c))} | "
                       f"{cell(mo.get('ratio_to_empty', {}).get(c))} |")
        out.append("")
        cpu = {c: s for c, s in (mo.get("cpu_ns_per_it") or {}).items() if s}
        if cpu:
            out += ["The same windows by the CPU time of the thread that makes the driver calls "
                    "(the probes' traps and programs run in it; time the host gives to others "
                    "does not count): ratios are reference ÷ configuration, so below 1 is "
                    "slower, like the rate.", "",
                    "| configuration | thread CPU µs per iteration, median (min–max) | CPU "
                    "ratio to plain, per round | CPU ratio to the empty programs, per round |",
                    "|---|---|---|---|"]
            for c, s in cpu.items():
                out.append(f"| {c} | {s['median'] / 1e3:.1f} ({s['min'] / 1e3:.1f}–"
                           f"{s['max'] / 1e3:.1f}) | "
                           f"{cell((mo.get('cpu_ratio_to_plain') or {}).get(c))} | "
                           f"{cell((mo.get('cpu_ratio_to_empty') or {}).get(c))} |")
            out.append("")
    elif mo:
        out += [f"## ResNet-18: skipped ({mo['skipped']})", ""]
    sm = res.get("storm")
    if sm:
        out += [f"## Storm {'counted by `clockalign watch' if sm.get('recorder') == 'watch' else 'recorded by `clockalign record'} --pid` (everything on)", "",
                "| threads | paced/thread | M calls/s | recorded | drops | unaccounted | ring peak "
                "| recorder cores | RSS MB | bytes/event |", "|---|---|---|---|---|---|---|---|---|---|"]
        for r in sm["runs"]:
            out.append(f"| {r['threads']} | {r['paced_per_thread'] or '—'} | "
                       f"{r['rate_per_s'] / 1e6:.3f} | {r['recorded']} | {r['drops']} | "
                       f"{r['missing_unaccounted']} | {r['ring_peak_fill']} | "
                       f"{r['recorder_cores']:.2f} | {r['recorder_rss_mb']:.0f} | "
                       f"{r['bytes_per_event']:.1f} |")
        out.append("")
    return "\n".join(out)


def figure(res, path):
    """Cost per call by configuration (micro part): bars of the median added ns, whiskers
    min-max over the rounds; a second panel with the BPF programs' own run time."""
    from matplotlib.figure import Figure
    mi = res.get("micro")
    if not mi:
        return None
    plain = mi["ns_per_call"]["plain"]["median"]
    rows = [(c, v) for c, v in mi["ns_per_call"].items() if v and c != "plain"]
    fig = Figure(figsize=(9, 0.42 * len(rows) + 1.6))
    ax = fig.add_subplot(1, 1, 1)
    names = [c for c, _ in rows][::-1]
    med = [v["median"] - plain for _, v in rows][::-1]
    lo = [v["median"] - v["min"] for _, v in rows][::-1]
    hi = [v["max"] - v["median"] for _, v in rows][::-1]
    bpf = [bpf_ns_per_call(mi, c) or 0 for c in names]
    y = range(len(names))
    ax.barh(y, med, xerr=[lo, hi], color="#9ab", label="added wall time per call (median, "
            "min-max over rounds)")
    ax.barh(y, bpf, height=0.35, color="#c53", label="of which BPF programs run (kernel stats)")
    ax.set_yticks(list(y), names)
    ax.set_xlabel("ns per traced call, over no probes")
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title(f"Probe cost per call — {res['machine'].get('gpu') or 'no GPU'} host, "
                 f"{res['machine']['cpus']} CPUs, kernel {res['machine']['kernel']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--parts", default="micro,model,storm")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=None, help="calls per micro run")
    ap.add_argument("--quick", action="store_true", help="smaller sizes (2-core VM, CI-like)")
    ap.add_argument("--configs", default=None, help="micro and model: only these configurations (model always runs plain)")
    ap.add_argument("--cpu", type=int, default=None, help="micro: run every storm on this CPU")
    ap.add_argument("--stats", default=None, help="micro: only these configurations in the "
                    "BPF statistics pass (default: all)")
    ap.add_argument("--window", type=float, default=4.0, help="model: seconds per window")
    ap.add_argument("--storm-threads", default=None, help="comma list (default 1,2,4,8,12)")
    ap.add_argument("--storm-seconds", type=float, default=None)
    ap.add_argument("--paced", default="", help="THREADSxRATE[xSECONDS],... paced storm runs "
                    "(e.g. 8x250000x60: 2M calls/s for 60 s)")
    ap.add_argument("--storm-recorder", choices=("record", "watch"), default="record",
                    help="storm: recorded by `clockalign record --pid` or counted by "
                         "`clockalign watch --pid` (its /metrics and last line)")
    a = ap.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("probe_cost: needs root (BPF)")
    parts = set(a.parts.split(","))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="pc-"))
    standin, lib, storm = build_tools(work)
    res = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
           "machine": machine()}
    def save():
        (out / "overhead.json").write_text(json.dumps(res, indent=1) + "\n")
    if "micro" in parts:
        calls = a.calls or (20000 if a.quick else 200000)
        Storm.cpu = a.cpu

        def rounds_done(micro):
            res["micro"] = micro
            save()
            (out / "overhead.md").write_text(render(res) + "\n")
        res["micro"] = part_micro(lib, storm, a.rounds, calls,
                                  set(a.configs.split(",")) if a.configs else None,
                                  set(a.stats.split(",")) if a.stats else None, rounds_done)
        save()
    if "ab" in parts:
        Storm.cpu = a.cpu
        res["ab"] = part_ab(lib, storm, a.rounds, a.calls or (20000 if a.quick else 100000),
                            set(a.configs.split(",")) if a.configs else None)
        save()
    if "model" in parts:
        res["model"] = part_model(a.rounds, a.window, 1.0,
                                  set(a.configs.split(",")) if a.configs else None)
        save()
    if "storm" in parts:
        spec = a.storm_threads if a.storm_threads is not None else (
            "1,2" if a.quick else "1,2,4,8,12")          # "": paced runs only
        threads = [int(x) for x in spec.split(",") if x]
        secs = a.storm_seconds or (3 if a.quick else 10)
        paced = [tuple(int(v) for v in p.split("x")) for p in a.paced.split(",") if p]
        paced = [(p[0], p[1], p[2] if len(p) > 2 else secs) for p in paced]
        res["storm"] = part_storm(lib, storm, threads, secs, paced, a.storm_recorder)
    save()
    figure(res, out / "overhead.png")
    md = render(res)
    (out / "overhead.md").write_text(md + "\n")
    print(md)
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
