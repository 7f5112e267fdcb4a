#!/usr/bin/env python3
"""What the CUDA uprobes cost a launch-bound workload: the same PyTorch launch loop run
plain and under `clockalign record`, interleaved, in one invocation.

    sudo python3 scripts/bench/probe_overhead.py --reps 3 --launches 20000 --out results/probe-overhead

Each run times `--launches` calls of `x.add_(1)` on a tiny tensor (launch-bound: the GPU
finishes each kernel long before the next is queued) and reports launches/s; the recorded
runs use `clockalign record --counters none --no-gpu-clock -- python3 ...` so only the BPF
probes differ.  Writes OUT/probe_overhead.{json,md}.
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys

WORKLOAD = r"""
import json, sys, time, torch
n = int(sys.argv[1])
x = torch.zeros(16, device="cuda")
for _ in range(200): x.add_(1)
torch.cuda.synchronize()
t = time.perf_counter()
for _ in range(n): x.add_(1)
torch.cuda.synchronize()
dt = time.perf_counter() - t
print(json.dumps({"launches": n, "seconds": dt, "per_s": n / dt}))
"""


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads([ln for ln in p.stdout.splitlines() if ln.startswith("{")][-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--launches", type=int, default=20000)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    plain = [sys.executable, "-c", WORKLOAD, str(a.launches)]
    rec_file = os.path.join(a.out, "probe_overhead.ca")
    traced = ["clockalign", "record", "-o", rec_file, "--quiet", "--counters", "none",
              "--no-gpu-clock", "--"] + plain
    rows = []
    for i in range(a.reps):
        off = run(plain)
        on = run(traced)
        rows.append({"rep": i, "off_per_s": off["per_s"], "on_per_s": on["per_s"],
                     "extra_us_per_launch": (1 / on["per_s"] - 1 / off["per_s"]) * 1e6})
        print(rows[-1], flush=True)
    extra = [r["extra_us_per_launch"] for r in rows]
    ratio = [r["on_per_s"] / r["off_per_s"] for r in rows]
    res = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "command": " ".join(sys.argv), "machine": platform.node(),
           "platform": platform.platform(), "python": platform.python_version(),
           "launches_per_run": a.launches, "rows": rows,
           "on_off_ratio_median": statistics.median(ratio),
           "extra_us_per_launch_median": statistics.median(extra),
           "extra_us_per_launch_min": min(extra), "extra_us_per_launch_max": max(extra)}
    with open(os.path.join(a.out, "probe_overhead.json"), "w") as f:
        json.dump(res, f, indent=1)
    lines = ["# CUDA uprobe cost to a launch-bound loop", "",
             f"- date: {res['date']}", f"- command: `{res['command']}`",
             f"- machine: {res['machine']} ({res['platform']}), Python {res['python']}",
             f"- workload: {a.launches} `x.add_(1)` launches on a 16-element CUDA tensor, "
             "plain vs under `clockalign record --counters none --no-gpu-clock` "
             "(uprobe + uretprobe on every driver call), interleaved", "",
             "| rep | plain launches/s | recorded launches/s | extra µs per launch |",
             "|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['rep']} | {r['off_per_s']:,.0f} | {r['on_per_s']:,.0f} | "
                     f"{r['extra_us_per_launch']:.2f} |")
    lines += ["", f"Median: recorded/plain throughput {res['on_off_ratio_median']:.3f}, "
              f"{res['extra_us_per_launch_median']:.2f} µs extra per launch "
              f"(range {res['extra_us_per_launch_min']:.2f}–{res['extra_us_per_launch_max']:.2f})."]
    with open(os.path.join(a.out, "probe_overhead.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
