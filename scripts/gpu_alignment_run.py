#!/usr/bin/env python3
"""Record GPU %globaltimer sandwiches for a while, with a GPU workload running beside them.

A torch bf16 matmul loop runs in a SUBPROCESS on each probed GPU (its own context, like a
real target; --no-workload leaves the GPUs idle) while a ClockProbeThread writes the run
file DIR/align.ca.  Afterwards the raw sandwiches are dumped as CSV for the align engine
and a first look is printed: round trips, tick, and a straight line through the best
sandwich of each burst (drift in ppm, worst residual).

    python scripts/gpu_alignment_run.py --duration 300 --out results/gpu_align
    python scripts/gpu_alignment_run.py --duration 120 --gpu-period 0.1 --gpus 0,1 --out /tmp/a

Writes DIR/align.ca, DIR/gpu<N>_sandwiches.csv (t0_ns,remote_ns,t1_ns,method),
DIR/cpu_clocks.csv (domain,t0_ns,remote_ns,t1_ns), DIR/summary.json and DIR/workload_gpu<N>.log.
"""
import argparse
import datetime
import importlib.util
import json
import os
import socket
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "agent"))


def _probe_cost_module():
    spec = importlib.util.spec_from_file_location("probe_cost", HERE / "probe_cost.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def summarize(t0, remote, t1, method, gap_ns=None):
    """Round trips and a line through the best sandwich of each burst."""
    rtt = t1 - t0
    out = {"sandwiches": int(len(t0)),
           "methods": {int(m): int((method == m).sum()) for m in np.unique(method)}}
    if not len(t0):
        return out
    out["rtt_ns"] = {q: float(np.percentile(rtt, p)) for q, p in
                     (("min", 0), ("p10", 10), ("median", 50), ("p90", 90), ("p99", 99),
                      ("max", 100))}
    # Bursts: split where consecutive t0 are further apart than gap_ns (half a period).
    gap = gap_ns or 1_000_000
    starts = np.r_[0, np.nonzero(np.diff(t0) > gap)[0] + 1]
    ends = np.r_[starts[1:], len(t0)]
    best = np.array([s + int(np.argmin(rtt[s:e])) for s, e in zip(starts, ends)])
    out["bursts"] = int(len(starts))
    out["best_rtt_ns"] = {q: float(np.percentile(rtt[best], p))
                          for q, p in (("min", 0), ("median", 50), ("max", 100))}
    # offset = GPU - host midpoint, in int64 first, then relative (small) floats.
    mid = t0[best] + (t1[best] - t0[best]) // 2
    off = remote[best] - mid
    x = (mid - mid[0]).astype(np.float64) / 1e9
    y = (off - off[0]).astype(np.float64)
    out["offset_first_ns"] = int(off[0])
    out["span_s"] = float(x[-1])
    if len(best) >= 3 and x[-1] > 0:
        slope, icpt = np.polyfit(x, y, 1)
        resid = y - (slope * x + icpt)
        out["drift_ppm"] = float(slope / 1e3)      # ns per s -> ppm
        out["line_resid_ns"] = {"max_abs": float(np.abs(resid).max()),
                                "rms": float(np.sqrt(np.mean(resid ** 2)))}
        out["single_offset_error_ns_at_end"] = float(y[-1])
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=300, help="seconds to record (default 300)")
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--gpus", default="0", help="comma-separated CUDA ordinals (default 0)")
    ap.add_argument("--pings", type=int, default=64)
    ap.add_argument("--gpu-period", type=float, default=1.0)
    ap.add_argument("--cpu-period", type=float, default=0.1)
    ap.add_argument("--no-workload", action="store_true", help="leave the GPUs idle")
    ap.add_argument("--size", type=int, default=4096, help="workload matmul size")
    args = ap.parse_args(argv)

    from clockalign.align.sandwiches import Sandwiches, run_sandwiches, write_csv
    from clockalign.capture.clocks.clockprobe import ClockProbeThread
    from clockalign.store.reader import RunReader
    from clockalign.store.schema import Chunk, ClockDomain
    from clockalign.store.writer import RunWriter

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    gpus = [int(g) for g in args.gpus.split(",") if g.strip()]
    started = datetime.datetime.now(datetime.timezone.utc)

    workloads = []
    if not args.no_workload:
        pc = _probe_cost_module()
        for g in gpus:
            workloads.append(pc.Workload(g, args.duration + 600, out / f"workload_gpu{g}.log",
                                         args.size))
        for w in workloads:
            w.wait_ready()
        print(f"workload running on GPU(s) {gpus}", flush=True)

    run_path = out / "align.ca"
    meta = {"tool": "scripts/gpu_alignment_run.py", "argv": sys.argv, "host": socket.gethostname(),
            "started": started.isoformat(timespec="seconds"), "workload": not args.no_workload,
            "t0_monotonic_ns": time.monotonic_ns(), "t0_realtime_ns": time.time_ns()}
    writer = RunWriter(run_path, meta)
    probe = ClockProbeThread(writer, gpus=gpus, cpu_period_s=args.cpu_period,
                             gpu_period_s=args.gpu_period, pings=args.pings)
    reason = "duration reached"
    probe.start()
    try:
        end = time.monotonic() + args.duration
        next_print = time.monotonic() + 30
        while time.monotonic() < end:
            time.sleep(min(1.0, max(0.0, end - time.monotonic())))
            if time.monotonic() >= next_print:
                s = probe.stats()
                print(f"  {args.duration - (end - time.monotonic()):.0f} s: sandwiches "
                      f"{s['sandwiches']}, failures {s['failures']}", flush=True)
                next_print += 30
    except KeyboardInterrupt:
        reason = "interrupted"
    finally:
        probe.stop()
        stats = probe.stats()
        writer.close({"reason": reason, "counts": stats["sandwiches"]})
        wl = [w.finish() for w in workloads]

    run = RunReader(run_path)
    summary = {"date": started.isoformat(timespec="seconds"),
               "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
               "duration_s": args.duration, "pings": args.pings,
               "gpu_period_s": args.gpu_period, "workload": wl, "probe_stats": stats,
               "clock_info": run.rows(Chunk.CLOCK_INFO), "notices": run.rows(Chunk.NOTICES),
               "gpus": {}}
    found = run_sandwiches(run)
    none = np.zeros(0, np.int64)
    for g in gpus:
        s = found.get(f"GPU{g}", Sandwiches(none, none, none, method=none))
        path = out / f"gpu{g}_sandwiches.csv"
        write_csv(path, s)
        gap = int(args.gpu_period * 0.5e9)
        summary["gpus"][f"GPU{g}"] = summarize(s.t0, s.remote, s.t1, s.method, gap_ns=gap)
        summary["gpus"][f"GPU{g}"]["csv"] = path.name
    ccols = run.columns(Chunk.CPU_CLOCK)
    with open(out / "cpu_clocks.csv", "w") as f:
        f.write("domain,t0_ns,remote_ns,t1_ns\n")
        if ccols:
            for d, a, r, b in zip(ccols["domain"].tolist(), ccols["t0"].tolist(),
                                  ccols["remote"].tolist(), ccols["t1"].tolist()):
                f.write(f"{ClockDomain(d).name},{a},{r},{b}\n")
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")

    print(f"run file {run_path} ({run.chunk_count} chunks, clean={run.clean})")
    for n in summary["notices"]:
        print(f"  notice: {n['text']}")
    for name, s in summary["gpus"].items():
        tick = stats["tick_ns"].get(name)
        print(f"{name}: {s['sandwiches']} sandwiches in {s.get('bursts', 0)} bursts, "
              f"methods {s['methods']}, tick {tick} ns")
        if "rtt_ns" in s:
            r = s["rtt_ns"]
            print(f"  round trip ns: min {r['min']:.0f}  median {r['median']:.0f}  "
                  f"p90 {r['p90']:.0f}  p99 {r['p99']:.0f}  max {r['max']:.0f}")
            b = s["best_rtt_ns"]
            print(f"  best of burst: min {b['min']:.0f}  median {b['median']:.0f}  "
                  f"max {b['max']:.0f}")
        if "drift_ppm" in s:
            print(f"  one line over {s['span_s']:.0f} s: drift {s['drift_ppm']:+.3f} ppm, "
                  f"worst residual {s['line_resid_ns']['max_abs']:.0f} ns; a single start "
                  f"offset is {s['single_offset_error_ns_at_end']:+.0f} ns off at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
