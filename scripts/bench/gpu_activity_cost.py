#!/usr/bin/env python3
"""What GPU activity recording costs the ResNet-18 eager loop (issue 14 item 4 d), beside
torch.profiler's own cost.

One fresh process per configuration and round (CUPTI can only be injected at start):
  plain          python3 LOOP
  clockalign     clockalign record -- python3 LOOP               (BPF probes, clock probe)
  +gpu-activity  clockalign record --gpu-activity -- python3 LOOP (+ CUPTI, raw timestamps)
  torch.profiler python3 LOOP --profiler  (torch.profiler, CPU + CUDA activities, in-loop)
LOOP is scripts/workloads/resnet_loop.py --throughput: the model of resnet_loop.py (fp16,
batch 1, eager, inference_mode, a synchronize every 10 iterations); throughput is counted
over --seconds after 50 warm-up iterations; configurations are interleaved round by round.

    python3 scripts/bench/gpu_activity_cost.py --seconds 8 --rounds 2 --out cost.json
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

LOOP = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "workloads",
                    "resnet_loop.py")

CONFIGS = ["plain", "clockalign", "+gpu-activity", "torch.profiler"]


def run_one(cfg, seconds, tmp):
    child = [sys.executable, LOOP, "--seconds", str(seconds), "--throughput"] + (
        ["--profiler"] if cfg == "torch.profiler" else [])
    if cfg in ("clockalign", "+gpu-activity"):
        run = os.path.join(tmp, f"{cfg.strip('+')}.ca")
        cmd = ["clockalign", "record", "--quiet", "--force", "-o", run] + (
            ["--gpu-activity"] if cfg == "+gpu-activity" else []) + ["--"] + child
    else:
        cmd = child
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])["it_per_s"], None
    return None, (p.stderr or p.stdout)[-400:]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    configs = [c for c in a.configs.split(",") if c]
    bad = [c for c in configs if c not in CONFIGS]
    if bad:
        sys.exit(f"unknown configuration {bad[0]}; known: {', '.join(CONFIGS)}")
    tmp = tempfile.mkdtemp()
    res = {c: [] for c in configs}
    errors = {}
    for r in range(a.rounds):
        for c in configs:
            rate, err = run_one(c, a.seconds, tmp)
            if rate is None:
                errors[c] = err
            else:
                res[c].append(rate)
            print(f"round {r + 1} {c}: {rate}", flush=True)
    mean = {c: sum(v) / len(v) for c, v in res.items() if v}
    base = mean.get("plain")
    out = {"seconds": a.seconds, "rounds": a.rounds, "it_per_s": res, "mean_it_per_s": mean,
           "relative_to_plain": {c: m / base for c, m in mean.items()} if base else None,
           "errors": errors, "command": " ".join(sys.argv)}
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
