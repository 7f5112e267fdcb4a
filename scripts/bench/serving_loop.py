#!/usr/bin/env python3
"""What clockalign costs a real serving loop (issue 23): a warm decode loop
(scripts/workloads/decode_loop.py: GPT-2 with a static cache, generate() replaying a CUDA graph
per token; or, with --standin, the same driver-call mix against the stand-in libcuda) while
configurations are attached to it and detached in turn, rotated round by round.

Part "attach" (one warm process, every configuration in every round, order rotated):
  plain                  nothing attached
  record                 clockalign record --pid (everything, the defaults)
  record_cuda            record --counters none --no-gpu-clock (CUDA probes + tracepoints)
  record_nocuda          record --no-cuda (everything but the CUDA probes)
  record_blocking        record --cuda-returns blocking
  record_cuda_blocking   record_cuda + --cuda-returns blocking
  watch / watch_blocking clockalign watch --pid (always-on), without / with blocking
  empty_entry            an empty BPF program on the entry of every function clockalign
                         probes (uprobe_multi, this pid): the trap alone
  empty_pair             empty programs on entry and return: two traps
  empty_entry_at / empty_pair_at   the same at clockalign's probe points (past a leading
                         endbr64 where the kernel emulates the next instruction, prologue.py)
  profiler               torch.profiler (CPU + CUDA activities) in the loop (SIGUSR1/2)
Part "duty": each of --duty-configs ('name[@share[/period]]', default share 0.5 and
--duty-period) attached once, duty-cycled: record_cuda, record, record_blocking, watch,
watch_blocking with --cuda-duty (CUDA probes armed for the share of every period);
duty_activity: `record --pid --gpu-activity --gpu-activity-duty SHARE` (the CUDA probes always
on, CUPTI attached for the share of every period, at least 1 s on and off); duty_profiler:
torch.profiler switched on and off in the loop (last).  Armed windows against the detached
windows beside them, in one process; whole cycles against their detached windows (the cost of
running at that share, switching included), e.g. duty_watch@0.2/5 measures watch at share 0.2.
Part "activity" (--gpu-activity needs spawn mode): one loop started under
`clockalign record --gpu-activity`, whose CUPTI library switches what it collects between
windows through its control file (CLOCKALIGN_CUPTI_CTL): off, everything (the default),
activity without the launch callbacks, callbacks only, kernels only, graph-level trace.

Per window: tokens/s from the loop's own log, its loop thread's CPU ns per token, and for
recordings the CUDA calls per token by function.  A plain window comes before every
--plain-every configurations; each window's ratio is over the mean of the plain (or 'off')
windows just before and after it, since the loop's own rate drifts; medians and min-max over
windows.  torch.profiler goes last, paired with plain windows: once used, it may leave CUPTI
behind in the process.

    sudo python3 scripts/bench/serving_loop.py --out results/serving-loop/h200-1
    sudo .venv/bin/python scripts/bench/serving_loop.py --standin --out /tmp/sl --rounds 3

Writes OUT/serving.json (every window) and OUT/serving.md.
"""
import argparse
import collections
import datetime
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
LOOP = HERE.parent / "workloads" / "decode_loop.py"

ATTACH = {  # name: (kind, extra args)
    "plain": ("none", []),
    "record": ("record", []),
    "record_cuda": ("record", ["--counters", "none", "--no-gpu-clock"]),
    "record_nocuda": ("record", ["--no-cuda"]),
    "record_blocking": ("record", ["--cuda-returns", "blocking"]),
    "record_cuda_blocking": ("record", ["--counters", "none", "--no-gpu-clock",
                                        "--cuda-returns", "blocking"]),
    "watch": ("watch", []),
    "watch_blocking": ("watch", ["--cuda-returns", "blocking"]),
    "empty_entry": ("empty", [False]),
    "empty_pair": ("empty", [True]),
    "empty_entry_at": ("empty", [False, "at"]),
    "empty_pair_at": ("empty", [True, "at"]),
    "profiler": ("profiler", []),
}
# CLOCKALIGN_CUPTI_MODE bits (native/ca_gpu_wire.h CA_MODE_*)
K, C, S, A, G = 1, 2, 4, 8, 16
ACTIVITY = {"off": 0, "activity_all": K | C | S | A, "activity_no_api": K | C | S,
            "api_only": A, "kernels_only": K, "graph_level": G | C | S | A}


def now_ns():
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def clockalign(*args):
    return [sys.executable, "-m", "clockalign.cli.main", *args]


def child_env(extra=None):
    return dict(os.environ, **(extra or {}))


def read_log(path):
    """[(t_ns, tokens, thread_cpu_ns, profiler_on)] of the loop's log."""
    out = []
    with open(path) as f:
        for ln in f:
            p = ln.split()
            if len(p) >= 3:
                out.append(tuple(int(x) for x in p))
    return out


def interp_rate(samples, t0, t1):
    """Tokens/s over [t0, t1] from the loop's cumulative token count, interpolated linearly
    between its per-request lines (a window may be shorter than a request)."""
    import numpy as np
    if len(samples) < 2 or t0 < samples[0][0] or t1 > samples[-1][0] or t1 <= t0:
        return None
    t = np.array([x[0] for x in samples], dtype=np.float64)
    k = np.array([x[1] for x in samples], dtype=np.float64)
    a, b = np.interp([t0, t1], t, k)
    return (b - a) / ((t1 - t0) / 1e9)


def window_rate(samples, t0, t1):
    inside = [s for s in samples if t0 <= s[0] <= t1]
    if len(inside) < 2:
        return None, None
    a, b = inside[0], inside[-1]
    toks = b[1] - a[1]
    return toks / ((b[0] - a[0]) / 1e9), (b[2] - a[2]) / toks if toks else None


class Loop:
    def __init__(self, seconds, log, standin=None, wrap=None, env=None):
        args = [sys.executable, str(LOOP), "--seconds", str(seconds), "--log", str(log)]
        if standin:
            args += ["--standin", standin]
        self.log = log
        self.p = subprocess.Popen((wrap or []) + args, stdout=subprocess.PIPE, text=True,
                                  env=child_env(env))
        line = self.p.stdout.readline()
        self.info = json.loads(line) if line.startswith("{") else {"error": line}
        if not self.info.get("ready"):
            self.p.kill()
            raise SystemExit(f"the decode loop did not start: {self.info}")

    def target_pid(self):
        """The loop's pid: the child of clockalign when wrapped."""
        kids = Path(f"/proc/{self.p.pid}/task/{self.p.pid}/children")
        for _ in range(50):
            text = kids.read_text().split() if kids.exists() else []
            if not text:
                return self.p.pid
            return int(text[0])
        return self.p.pid

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.p.kill()


class Attached:
    """One configuration attached to pid; stop() returns what it says of itself."""

    def __init__(self, name, pid, tmp, lib, empty):
        self.kind, extra = ATTACH[name]
        self.name, self.pid, self.proc, self.fds, self.out = name, pid, None, [], None
        fname = name.replace("@", "-at").replace("/", "-per")      # duty_watch@0.2/5
        if self.kind == "record":
            self.out = Path(tmp) / f"{fname}-{now_ns()}.ca"
            self.proc = subprocess.Popen(clockalign("record", "--pid", str(pid), "-o",
                                                    str(self.out), "--quiet", *extra),
                                         env=child_env(), stderr=subprocess.PIPE, text=True)
            self._wait(lambda: self.out.exists())
            time.sleep(0.3)                 # helpers start once the file exists
        elif self.kind == "watch":
            import socket
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                self.port = s.getsockname()[1]
            if name.startswith("duty"):         # its run file holds the armed windows
                self.out = Path(tmp) / f"{fname}-{now_ns()}.ca"
                extra = [*extra, "-o", str(self.out)]
            self.proc = subprocess.Popen(clockalign("watch", "--pid", str(pid), "--listen",
                                                    f"127.0.0.1:{self.port}", "--quiet",
                                                    *extra),
                                         env=child_env(), stderr=subprocess.PIPE, text=True)
            self._wait(lambda: "clockalign_probes_armed 1.0" in self._metrics())
        elif self.kind == "empty":
            from clockalign.capture.probes.uprobe_multi import link_uprobe_multi
            fd_prog, path, offs = empty[extra[1] if len(extra) > 1 else "entry"]
            for ret in ([True, False] if extra[0] else [False]):
                self.fds.append(link_uprobe_multi(fd_prog, path, offs,
                                                  list(range(len(offs))), ret, pid=pid))
        elif self.kind == "profiler":
            os.kill(pid, signal.SIGUSR1)
            time.sleep(1.0)                 # it starts between two requests

    def _metrics(self):
        import urllib.request
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics",
                                          timeout=5).read().decode()
        except OSError:
            return ""

    def _wait(self, ready, timeout=120):
        t_end = time.monotonic() + timeout
        while not ready():
            if self.proc.poll() is not None or time.monotonic() > t_end:
                raise SystemExit(f"{self.name} did not start: {self.proc.stderr.read()[-1500:]}")
            time.sleep(0.05)

    def stop(self):
        res = {}
        for fd in reversed(self.fds):
            os.close(fd)
        if self.kind == "profiler":
            os.kill(self.pid, signal.SIGUSR2)
        if self.proc:
            self.proc.send_signal(signal.SIGINT)
            try:
                err = self.proc.communicate(timeout=60)[1]
            except subprocess.TimeoutExpired:
                self.proc.kill()
                err = self.proc.communicate()[1]
            res["rc"] = self.proc.returncode
            res["summary"] = (err.strip().splitlines() or [""])[-1][:400]
        return res


def calls_in(path, t0, t1):
    """{function: calls} of a run file inside [t0, t1] (CUDA and CUDA_ENTRY records),
    its drops and first-instructions-free trailer facts."""
    from clockalign.store.reader import RunReader
    from clockalign.store.schema import CUDA_FUNCTIONS, Kind
    r = RunReader(path)
    by = collections.Counter()
    for ev in r.iter_events():
        sel = ev[((ev["kind"] == Kind.CUDA) | (ev["kind"] == Kind.CUDA_ENTRY))
                 & (ev["ts"] >= t0) & (ev["ts"] <= t1)]
        for fid in sel["code"].tolist():
            by[CUDA_FUNCTIONS.get(int(fid), (f"cuda_fn_{fid}",))[0]] += 1
    tr = r.trailer or {}
    return dict(by), tr.get("drops") or {}


def first_instructions(lib, symbols):
    """{symbol: {bytes, first, probed, skip, emulated}}: each function's first bytes, its
    first instruction and the one clockalign probes (capture/probes/prologue.py), no disassembler
    needed (the GPU hosts have none)."""
    from clockalign.capture.probes import prologue
    from clockalign.capture.probes.cflags import import_bcc
    BPF = import_bcc().BPF
    out = {}
    for s in symbols:
        try:
            path, off = BPF._check_path_symbol(lib, s, 0, -1)
        except Exception:
            continue
        code = prologue.read_code(path.decode() if isinstance(path, bytes) else path, off)
        skip = prologue.entry_skip(code)
        probed, emu = prologue.first_instruction(code[skip:])
        out[s] = {"bytes": code[:8].hex(" "), "first": prologue.first_instruction(code)[0],
                  "probed": probed, "skip": skip, "emulated": emu}
    return out


def summarize(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return None
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def vs_neighbours(windows, cfg, ref, key="rate"):
    """Each cfg window's value over the mean of the ref windows just before and just after
    it in time (the loop's rate drifts; neighbours cancel the drift)."""
    refs = sorted((w["t0"], w[key]) for w in windows if w["config"] == ref and w.get(key))
    rs = []
    for w in windows:
        if w["config"] != cfg or not w.get(key):
            continue
        before = [v for t, v in refs if t < w["t0"]][-1:]
        after = [v for t, v in refs if t > w["t0"]][:1]
        near = before + after
        if near:
            rs.append(w[key] / (sum(near) / len(near)))
    return summarize(rs)


def part_attach(args, tmp, deadline):
    from clockalign.capture.probes.libcuda import resolve_like_loader
    from clockalign.store import cuda_api
    configs = [c for c in args.configs.split(",") if c]
    if "plain" not in configs:
        configs.insert(0, "plain")
    if args.standin:
        from clockalign.workloads.standin import build
        libdir, _ = build(str(tmp / "standin"))
        lib = os.path.join(libdir, "libcuda.so.1")
        configs = [c for c in configs if c != "profiler"]
    else:
        lib = resolve_like_loader(dict(os.environ))[0]
    log = tmp / "decode.log"
    loop = Loop(args.loop_seconds, log, standin=lib if args.standin else None)
    print(f"loop ready: {loop.info}", flush=True)
    from clockalign.capture.probes.cflags import import_bcc
    from clockalign.capture.probes.uprobe_multi import BPF_TRACE_UPROBE_MULTI
    BPF = import_bcc().BPF
    empty_bpf = BPF(text="int e(void *ctx) { return 0; }")
    fn = empty_bpf.load_func("e", BPF.KPROBE, attach_type=BPF_TRACE_UPROBE_MULTI)
    from clockalign.capture.probes import prologue
    path = BPF._check_path_symbol(lib, "cuLaunchKernel", 0, -1)[0].decode()
    offs, offs_at = set(), set()
    for f in cuda_api.FUNCTIONS.values():
        try:
            off = BPF._check_path_symbol(lib, f.symbol, 0, -1)[1]
        except Exception:
            continue
        offs.add(off)
        offs_at.add(off + prologue.entry_skip(prologue.read_code(path, off)))
    empty = {"entry": (fn.fd, path, sorted(offs)), "at": (fn.fd, path, sorted(offs_at))}
    windows = []

    def window(cfg, rnd):
        att = Attached(cfg, loop.p.pid, tmp, lib, empty)
        time.sleep(args.settle)
        t0 = now_ns()
        time.sleep(args.window)
        t1 = now_ns()
        w = {"config": cfg, "round": rnd, "t0": t0, "t1": t1, **att.stop()}
        if att.out and att.out.exists():
            w["calls"], w["drops"] = calls_in(att.out, t0, t1)
            att.out.unlink()
        windows.append(w)
        print(f"  round {rnd} {cfg:22s} {w.get('summary', '')[:100]}", flush=True)
        if cfg == "profiler":           # its stop() processes the trace: wait for the loop
            wait_profiler_off(log)
        time.sleep(0.3)

    others = [c for c in configs if c not in ("plain", "profiler")]
    for rnd in range(args.rounds):
        if time.monotonic() > deadline:
            print(f"attach: time is up after {rnd} rounds", flush=True)
            break
        k = rnd % len(others)
        for i, cfg in enumerate(others[k:] + others[:k]):
            if i % args.plain_every == 0:
                window("plain", rnd)
            window(cfg, rnd)
    window("plain", args.rounds)
    if "profiler" in configs:           # last: torch.profiler may leave CUPTI behind it
        for i in range(args.profiler_pairs):
            window("profiler", args.rounds + i)
            window("plain", args.rounds + i)
    import shutil
    shutil.copy(log, Path(args.out) / "decode-attach.log")
    loop.stop()
    samples = read_log(log)
    for w in windows:
        w["rate"], w["cpu_ns_per_token"] = window_rate(samples, w["t0"], w["t1"])
        if w.get("calls") and w["rate"]:
            toks = w["rate"] * (w["t1"] - w["t0"]) / 1e9
            w["calls_per_token"] = sum(w["calls"].values()) / toks
    empty_bpf.cleanup()
    called = collections.Counter()
    for w in windows:
        called.update(w.get("calls") or {})
    firsts = first_instructions(lib, sorted(called))
    return {"loop": loop.info, "libcuda": lib, "configs": configs, "windows": windows,
            "first_instructions": firsts, "calls": dict(called)}


def wait_profiler_off(log, timeout=120):
    """Until the loop has logged a request with the profiler off again."""
    t_end = time.monotonic() + timeout
    while time.monotonic() < t_end:
        rows = read_log(log)
        if rows and len(rows[-1]) > 3 and rows[-1][3] == 0:
            return
        time.sleep(0.2)


DUTY = {"duty_record_cuda": ("record", ATTACH["record_cuda"][1]),
        "duty_record": ("record", []), "duty_record_blocking": ("record", ATTACH["record_blocking"][1]),
        "duty_watch": ("watch", []), "duty_watch_blocking": ("watch", ATTACH["watch_blocking"][1]),
        # CUDA probes always on, CUPTI attached for the share of each period (--gpu-activity-duty)
        "duty_activity": ("record", ["--gpu-activity"]),
        # torch.profiler switched on and off inside the loop (SIGUSR1/2): the tool it replaces
        "duty_profiler": ("profiler", [])}


def duty_config(spec, default_period):
    """'name[@share[/period]]' -> (name, share, period): e.g. duty_watch@0.2/5."""
    name, _, rest = spec.partition("@")
    share, _, period = rest.partition("/")
    return name, float(share or 0.5), float(period or default_period)


def duty_windows(path):
    """[(start_ns, end_ns)] of the armed windows a run file's trailer lists (the CUDA
    probes', or CUPTI's for --gpu-activity-duty)."""
    from clockalign.store.reader import RunReader
    t = RunReader(path).trailer or {}
    duty = t.get("cuda_duty") or (t.get("helpers", {}).get("gpu_activity") or {}).get("duty")
    return [tuple(w) for w in (duty or {}).get("windows", [])]


def profiler_windows(samples, t0, t1):
    """[(start_ns, end_ns)] of the loop's requests made with torch.profiler on inside [t0, t1]:
    from the end of the first such request (its start pays prof.start()) to the end of the
    last one (the next request pays prof.stop(), which processes the trace)."""
    out, first, last = [], None, None
    for t, _, _, on in (x for x in samples if t0 <= x[0] <= t1 and len(x) > 3):
        if on:
            first = t if first is None else first
            last = t
        elif first is not None:
            if last > first:
                out.append((first, last))
            first = None
    return out


def run_profiler_duty(pid, share, period, seconds, deadline):
    """torch.profiler on for share of every period (signals; it starts and stops between two
    requests), for seconds."""
    t_end = min(time.monotonic() + seconds, deadline)
    while time.monotonic() < t_end:
        os.kill(pid, signal.SIGUSR1)
        time.sleep(share * period)
        os.kill(pid, signal.SIGUSR2)
        time.sleep((1 - share) * period)


def duty_ratios(samples, windows, margin):
    """(armed, cycle): each armed window's rate over the mean of the detached windows beside
    it (trimmed by margin after each switch); each whole cycle's rate (armed window, switches,
    detached window) over its detached window's rate, which is what running at that share
    costs against running detached, switching included."""
    on = [interp_rate(samples, a + margin, b) for a, b in windows]
    off = [interp_rate(samples, b + margin, c)
           for (_, b), (c, _) in zip(windows, windows[1:])]
    armed = []
    for i, x in enumerate(on):
        near = [v for v in off[max(0, i - 1):i + 1] if v]
        if x and near:
            armed.append(x / (sum(near) / len(near)))
    cycle = []
    for (a, _), (c, _), o in zip(windows, windows[1:], off):
        whole = interp_rate(samples, a, c)
        if whole and o:
            cycle.append(whole / o)
    return armed, cycle


def part_duty(args, tmp, deadline):
    """One configuration at a time attached for --duty-seconds, duty-cycled: its CUDA probes
    (CUPTI for duty_activity, torch.profiler for duty_profiler) on for a share of every period
    and off for the rest, in one process and one recording.  Each armed window's rate over the
    mean of the detached windows beside it is one ratio: dozens of pairs a minute, each pair
    seconds apart, so the host's slow swings cancel (the windows of attach part are tens of
    seconds apart).  Configurations are 'name[@share[/period]]' (default 0.5 and
    --duty-period); duty_profiler runs last, whatever the order given (torch.profiler may
    leave CUPTI behind in the process)."""
    specs = [c for c in args.duty_configs.split(",") if c]
    specs.sort(key=lambda c: c.startswith("duty_profiler"))
    if args.standin:
        from clockalign.workloads.standin import build
        libdir, _ = build(str(tmp / "standin-duty"))
        lib = os.path.join(libdir, "libcuda.so.1")
        specs = [c for c in specs if not c.startswith("duty_profiler")]
    log = tmp / "decode-duty.log"
    loop = Loop(args.loop_seconds, log, standin=lib if args.standin else None)
    print(f"duty loop ready: {loop.info}", flush=True)
    runs = []
    for spec in specs:
        if time.monotonic() > deadline:
            print(f"duty: time is up before {spec}", flush=True)
            break
        cfg, share, period = duty_config(spec, args.duty_period)
        kind, more = DUTY[cfg]
        seconds = min(args.duty_seconds, max(1.0, deadline - time.monotonic()))
        res = {"config": spec, "share": share, "period_s": period}
        if kind == "profiler":
            t0 = now_ns()
            run_profiler_duty(loop.p.pid, share, period, seconds, deadline)
            wait_profiler_off(log)
            res["windows"] = profiler_windows(read_log(log), t0, now_ns())
        else:
            duty = (["--gpu-activity-duty", str(share), "--gpu-activity-duty-period", str(period)]
                    if cfg == "duty_activity" else
                    ["--cuda-duty", str(share), "--cuda-duty-period", str(period)])
            ATTACH[spec] = (kind, [*more, *duty])
            att = Attached(spec, loop.p.pid, tmp, None, None)
            time.sleep(seconds)
            res.update(att.stop())
            res["windows"] = duty_windows(att.out) if att.out else []
        runs.append(res)
        print(f"  {spec:26s} {len(res['windows'])} armed windows; {res.get('summary', '')[:90]}",
              flush=True)
        time.sleep(1.0)
    loop.stop()
    import shutil
    shutil.copy(log, Path(args.out) / "decode-duty.log")
    samples = read_log(log)
    for r in runs:
        margin = int(0.1 * r["period_s"] * 1e9)      # a request that spans the switch
        r["ratios"], r["cycle_ratios"] = duty_ratios(samples, r["windows"], margin)
        r["summary_ratio"] = summarize(r["ratios"])
        r["ci95"] = bootstrap_median_ci(r["ratios"])
        r["summary_cycle"] = summarize(r["cycle_ratios"])
        r["cycle_ci95"] = bootstrap_median_ci(r["cycle_ratios"])
    return {"period_s": args.duty_period, "seconds": args.duty_seconds, "runs": runs}


def bootstrap_median_ci(xs, n=2000):
    import random
    if len(xs) < 5:
        return None
    rnd = random.Random(1)
    meds = sorted(statistics.median(rnd.choices(xs, k=len(xs))) for _ in range(n))
    return [meds[int(0.025 * n)], meds[int(0.975 * n)]]


def part_activity(args, tmp, deadline):
    ctl = tmp / "cupti.ctl"
    ctl.write_text(str(ACTIVITY["activity_all"]))
    log = tmp / "decode-act.log"
    run = tmp / "activity.ca"
    wrap = clockalign("record", "--gpu-activity", "--quiet", "-o", str(run), "--")
    loop = Loop(args.loop_seconds, log, wrap=wrap,
                env={"CLOCKALIGN_CUPTI_CTL": str(ctl)})
    print(f"activity loop ready: {loop.info}", flush=True)
    modes = [m for m in args.activity.split(",") if m]
    others = [m for m in modes if m != "off"]
    windows = []
    for rnd in range(args.rounds):
        if time.monotonic() > deadline:
            print(f"activity: time is up after {rnd} rounds", flush=True)
            break
        k = rnd % len(others)
        for m in [x for o in others[k:] + others[:k] for x in ("off", o)]:
            ctl.write_text(str(ACTIVITY[m]))
            time.sleep(0.25 + args.settle)      # the library looks every 100 ms
            t0 = now_ns()
            time.sleep(args.window)
            t1 = now_ns()
            windows.append({"config": m, "round": rnd, "t0": t0, "t1": t1})
            print(f"  round {rnd} {m}", flush=True)
    loop.stop()
    import shutil
    shutil.copy(log, Path(args.out) / "decode-activity.log")
    samples = read_log(log)
    for w in windows:
        w["rate"], w["cpu_ns_per_token"] = window_rate(samples, w["t0"], w["t1"])
    res = {"modes": {m: ACTIVITY[m] for m in modes}, "windows": windows}
    if run.exists():
        res.update(activity_counts(run, windows))
    return res


def activity_counts(run, windows):
    """GPU records per window and kind, and the mode switches the run file holds."""
    import numpy as np
    from clockalign.store.reader import RunReader
    from clockalign.store.schema import Chunk, GpuKind
    r = RunReader(run)
    tr = r.trailer or {}
    out = {"trailer": {k: tr.get(k) for k in ("counts", "drops", "gpu_activity", "reason")}}
    a = r.columns(Chunk.GPU_ACTIVITY)
    if not a:
        return out
    kind = a["kind"]
    m = kind == GpuKind.MODE
    out["mode_switches"] = [(int(t), int(v)) for t, v in zip(a["start"][m], a["value"][m])]
    api = kind == GpuKind.API
    for w in windows:
        sel = api & (a["start"] >= w["t0"]) & (a["start"] <= w["t1"])
        w["api_records"] = int(sel.sum())
        for k in (GpuKind.KERNEL, GpuKind.GRAPH, GpuKind.MEMCPY):
            # activity of the window: GPU times are on another clock, so count by the
            # window's calls' correlation ids where callbacks ran, else leave it out
            w[f"{k.name.lower()}_records"] = (int(np.isin(a["corr"][kind == k],
                                                          a["corr"][sel]).sum())
                                              if sel.any() else None)
    return out


def machine():
    m = {"host": platform.node(), "kernel": platform.release(), "cpus": os.cpu_count()}
    try:
        m["gpu"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version",
                                   "--format=csv,noheader"], capture_output=True, text=True,
                                  timeout=20).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        m["gpu"] = None
    return m


def composed(runs):
    """Sampled GPU activity against plain and against torch.profiler, from ratios measured in
    the same loop: record's CUDA probes (duty_record, armed) times the sampled activity's cycle
    (duty_activity: its detached windows still have record's probes on); torch.profiler
    always on = its armed ratio (duty_profiler)."""
    med = {}
    for r in runs:
        for key in ("summary_ratio", "summary_cycle"):
            if r.get(key):
                med[(r["config"].split("@")[0], key, r.get("share", 0.5))] = r[key]["median"]
    rec = next((v for (c, k, _), v in med.items() if c == "duty_record" and k == "summary_ratio"), None)
    prof = next((v for (c, k, _), v in med.items() if c == "duty_profiler" and k == "summary_ratio"), None)
    L = []
    for (c, k, share), cyc in sorted(med.items()):
        if c != "duty_activity" or k != "summary_cycle" or rec is None:
            continue
        vs_plain = rec * cyc
        L.append(f"- record --gpu-activity --gpu-activity-duty {share:g}: {vs_plain:.3f}x plain "
                 f"(record's probes {rec:.3f} x cycle {cyc:.3f})"
                 + (f"; {vs_plain / prof:.2f}x torch.profiler's rate (profiler on: {prof:.3f}x)"
                    if prof else ""))
    return ["", "Composed from the medians above (same loop, same run):", "", *L] if L else []


def render(res) -> str:
    L = [f"# Serving-loop cost ({res['date']})", "",
         f"Machine: {json.dumps(res['machine'])}", f"Command: `{res['command']}`", ""]
    at = res.get("attach")
    if at:
        L += [f"Loop: {json.dumps(at['loop'])}", "",
              f"{len(at['windows'])} windows of {res['window_s']} s, rotated rounds.", "",
              "| configuration | tokens/s median (min-max) | ÷ neighbouring plain, median (min-max) "
              "| CPU ns/token ÷ plain | calls/token | ns per call added |",
              "|---|---|---|---|---|---|"]
        w = at["windows"]
        plain = summarize([x["rate"] for x in w if x["config"] == "plain"])
        cpt = summarize([x.get("calls_per_token") for x in w if x.get("calls_per_token")])
        for c in at["configs"]:
            s = summarize([x["rate"] for x in w if x["config"] == c])
            r = vs_neighbours(w, c, "plain") if c != "plain" else None
            cpu = vs_neighbours(w, c, "plain", "cpu_ns_per_token") if c != "plain" else None
            mine = summarize([x.get("calls_per_token") for x in w if x["config"] == c])
            added = ""
            if r and cpt and plain and c != "plain":
                per_tok_ns = 1e9 / (r["median"] * plain["median"]) - 1e9 / plain["median"]
                added = f"{per_tok_ns / cpt['median']:.0f}"
            L.append(f"| {c} | {s['median']:.1f} ({s['min']:.1f}-{s['max']:.1f}) | "
                     + (f"{r['median']:.3f} ({r['min']:.3f}-{r['max']:.3f})" if r else "1") + " | "
                     + (f"{cpu['median']:.3f}" if cpu else "") + " | "
                     + (f"{mine['median']:.1f}" if mine else "") + f" | {added} |"
                     if s else f"| {c} | - | - | - | - | - |")
        L += ["", "Calls by function (all recorded windows) and first instructions:", "",
              "| function | calls | first bytes | first instruction | probed at | "
              "probed instruction in the trap |", "|---|---|---|---|---|---|"]
        for fnm, n in sorted(at["calls"].items(), key=lambda kv: -kv[1]):
            fi = at["first_instructions"].get(fnm)
            L.append(f"| {fnm} | {n} | " + (
                f"{fi['bytes']} | {fi['first']} | +{fi['skip']} | {fi['probed']}: "
                + ("emulated" if fi["emulated"] else "single-stepped") + " |"
                if fi else "? | ? | ? | ? |"))
        drops = [x.get("drops") for x in w if x.get("drops")]
        L += ["", f"Drops reported by recordings: {drops or 'none'}"]
    du = res.get("duty")
    if du and du.get("runs"):
        L += ["", f"## Duty-cycled ({du['seconds']} s each)", "",
              "Armed: each armed window's rate over the detached windows beside it (the cost "
              "while on). Cycle: each whole cycle (armed window, switches, detached window) over "
              "its detached window: what running at that share costs, switching included.", "",
              "| configuration | share | period s | armed windows | armed ÷ detached, median "
              "(min-max) | 95 % interval | cycle ÷ detached, median | 95 % interval |",
              "|---|---|---|---|---|---|---|---|"]
        for r in du["runs"]:
            sr, ci = r.get("summary_ratio"), r.get("ci95")
            sc, cc = r.get("summary_cycle"), r.get("cycle_ci95")
            L.append(f"| {r['config']} | {r.get('share', 0.5):g} | {r.get('period_s', du['period_s']):g} "
                     f"| {len(r['windows'])} | "
                     + (f"{sr['median']:.3f} ({sr['min']:.3f}-{sr['max']:.3f})" if sr else "-")
                     + " | " + (f"{ci[0]:.3f}-{ci[1]:.3f}" if ci else "-")
                     + " | " + (f"{sc['median']:.3f}" if sc else "-")
                     + " | " + (f"{cc[0]:.3f}-{cc[1]:.3f}" if cc else "-") + " |")
        L += composed(du["runs"])
    ac = res.get("activity")
    if ac and ac.get("windows"):
        w = ac["windows"]
        L += ["", "## GPU activity (spawn mode, CUPTI switched between windows)", "",
              "| mode | bits | tokens/s median (min-max) | ÷ neighbouring off, median (min-max) |", "|---|---|---|---|"]
        for m, bits in ac["modes"].items():
            s = summarize([x["rate"] for x in w if x["config"] == m])
            r = vs_neighbours(w, m, "off") if m != "off" else None
            L.append(f"| {m} | {bits} | " + (f"{s['median']:.1f} ({s['min']:.1f}-{s['max']:.1f})"
                                            if s else "-") + " | "
                     + (f"{r['median']:.3f} ({r['min']:.3f}-{r['max']:.3f})" if r else "1") + " |")
    return "\n".join(L) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--parts", default="attach,duty,activity")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--window", type=float, default=3.0)
    ap.add_argument("--settle", type=float, default=0.5)
    ap.add_argument("--plain-every", type=int, default=2,
                    help="a plain window before every N configurations")
    ap.add_argument("--profiler-pairs", type=int, default=3)
    ap.add_argument("--duty-configs", default=",".join(DUTY))
    ap.add_argument("--duty-seconds", type=float, default=40)
    ap.add_argument("--duty-period", type=float, default=2.0)
    ap.add_argument("--configs", default=",".join(ATTACH))
    ap.add_argument("--activity", default=",".join(ACTIVITY))
    ap.add_argument("--budget", type=float, default=480, help="seconds for all parts")
    ap.add_argument("--attach-share", type=float, default=0.7)
    ap.add_argument("--loop-seconds", type=float, default=900)
    ap.add_argument("--standin", action="store_true", help="host-only loop (no GPU)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="serving-"))
    t_start = time.monotonic()
    res = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "command": " ".join(sys.argv), "machine": machine(), "window_s": args.window,
           "settle_s": args.settle}
    parts = args.parts.split(",")

    def save():
        (out / "serving.json").write_text(json.dumps(res, indent=1, default=str))
        (out / "serving.md").write_text(render(res))

    if "attach" in parts:
        share = args.attach_share if "activity" in parts and not args.standin else 1.0
        res["attach"] = part_attach(args, tmp, t_start + args.budget * share)
        save()
    if "duty" in parts:
        res["duty"] = part_duty(args, tmp, t_start + args.budget)
        save()
    if "activity" in parts and not args.standin:
        res["activity"] = part_activity(args, tmp, t_start + args.budget)
        save()
    save()
    print(render(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
