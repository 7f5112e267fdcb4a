#!/usr/bin/env python3
"""The figure of results/overhead.md's slot-ring section: cost per call by configuration.

Left: each configuration's added wall time per call ÷ the empty programs' in the same round
(one point a round; box: quartiles, line: median) from probe_cost.py runs: the
switched-in-one-process part (ab) and the separate-process micro.  Right: the BPF programs'
own run time per call (kernel statistics) from the micro runs' statistics pass.  With
--intervals it prints each per-round ratio's median and bootstrap 95 % interval instead (the
ResNet-18 ones too, given --model), as results/overhead/intervals.txt.

    python3 scripts/bench/overhead_figure.py --ab results/overhead/h200-14/ab/overhead.json \\
        --micro results/overhead/h200-13/micro/overhead.json \\
        --empty-bpf 72:h200-12 --out results/overhead/slot-rings.png
    python3 scripts/bench/overhead_figure.py --intervals --ab ... --micro ... --model ...
"""
import argparse
import json
import sys
from pathlib import Path

from probe_cost import bpf_ns_per_call, reference_config   # scripts/bench/

LABELS = {"probes_cuda": "CUDA probes, slot rings", "probes_cuda_perf": "CUDA probes, perf buffers",
          "probes_all": "all recording programs, slot rings",
          "clockalign_full": "clockalign record, slot rings",
          "clockalign_full_perf": "clockalign record, perf buffers",
          "watch": "clockalign watch, slot rings"}


def per_round_ratios(part: dict) -> dict:
    by = part["ns_per_call_by_round"]
    ref = reference_config(by)
    out = {}
    for cfg, vals in by.items():
        if cfg in ("plain", ref) or not vals:
            continue
        out[cfg] = [(v - p) / (b - p) for v, p, b in zip(vals, by["plain"], by[ref])
                    if b - p > 0]
    return out


def median_interval(vals, n=10000, seed=1):
    """(median, 2.5 %, 97.5 %): the median and a bootstrap 95 % interval of it."""
    import random
    import statistics
    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(vals, k=len(vals))) for _ in range(n))
    return statistics.median(vals), meds[int(0.025 * n)], meds[int(0.975 * n) - 1]


def model_ratios(res) -> list:
    """The full recording's per-round speed ÷ the empty programs' of a model part."""
    vals = res["model"]["ratio_to_empty"]["clockalign_full"]
    return vals.get("all", vals) if isinstance(vals, dict) else vals


def print_intervals(a):
    """Each configuration's per-round ratio: median and its bootstrap 95 % interval, per
    run; the model parts' ratios per run and pooled."""
    for path in a.ab + a.micro:
        _, part = load(path)
        run = Path(path).parent.parent.name
        for cfg, r in per_round_ratios(part).items():
            m, lo, hi = median_interval(r)
            print(f"per call  {run:8s} {cfg:22s} {len(r):3d} rounds  added ÷ empty programs' "
                  f"{m:.3f} (95 % {lo:.3f}-{hi:.3f})")
    pooled = []
    for path in a.model:
        res, _ = load(path)
        r = model_ratios(res)
        pooled += r
        m, lo, hi = median_interval(r)
        print(f"ResNet-18 {Path(path).parent.parent.name:8s} {len(r):3d} rounds  full recording "
              f"÷ empty programs {m:.3f} (95 % {lo:.3f}-{hi:.3f}), "
              f"{sum(v < 0.97 for v in r)} below 0.97")
    if len(a.model) > 1:
        m, lo, hi = median_interval(pooled)
        print(f"ResNet-18 pooled   {len(pooled):3d} rounds  full recording ÷ empty programs "
              f"{m:.3f} (95 % {lo:.3f}-{hi:.3f}), {sum(v < 0.97 for v in pooled)} below 0.97")


def load(path):
    res = json.loads(Path(path).read_text())
    return res, res.get("ab") or res.get("micro")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ab", action="append", default=[], help="overhead.json with an ab part")
    ap.add_argument("--micro", action="append", default=[], help="overhead.json with a micro part")
    ap.add_argument("--model", action="append", default=[], help="overhead.json with a model "
                    "part (for --intervals)")
    ap.add_argument("--intervals", action="store_true", help="print each per-round ratio's "
                    "median and bootstrap 95 %% interval instead of drawing")
    ap.add_argument("--out", default=None)
    ap.add_argument("--goal", type=float, default=1.25)
    ap.add_argument("--empty-bpf", default=None, metavar="NS:RUN",
                    help="the empty programs' BPF time per call where no micro json has it "
                         "(h200-12's statistics pass printed 'e 36 ns x200000': 72:h200-12)")
    a = ap.parse_args(argv)
    if a.intervals:
        print_intervals(a)
        return 0
    if not a.out:
        ap.error("--out is needed to draw")
    from matplotlib.figure import Figure
    boxes, bpf = [], []
    for kind, paths in (("switched in one process", a.ab), ("separate processes", a.micro)):
        for path in paths:
            res, part = load(path)
            run = Path(path).parent.parent.name
            for cfg, r in per_round_ratios(part).items():
                boxes.append((f"{LABELS.get(cfg, cfg)}\n{run}, {kind}, {len(r)} rounds", r))
            if "bpf_stats" in part:
                ref = bpf_ns_per_call(part, "pair_empty_multi")
                for cfg in part["bpf_stats"]:
                    ns = bpf_ns_per_call(part, cfg)
                    if ns and cfg != "pair_empty_multi":
                        bpf.append((f"{LABELS.get(cfg, cfg)} ({run})", ns, ref))
    fig = Figure(figsize=(12, 0.55 * max(len(boxes), len(bpf)) + 1.8))
    ax = fig.add_subplot(1, 2, 1)
    names = [n for n, _ in boxes][::-1]
    ax.boxplot([r for _, r in boxes][::-1], orientation="horizontal", widths=0.6, showfliers=True)
    ax.set_yticks(range(1, len(names) + 1), names, fontsize=7)
    ax.axvline(1.0, color="#888", lw=0.8)
    ax.axvline(a.goal, color="#c53", lw=1.2, ls="--", label=f"goal: {a.goal}× the empty programs")
    ax.set_xlabel("added ns per call ÷ the empty entry+return programs', same round")
    ax.legend(loc="lower right", fontsize=8)
    bx = fig.add_subplot(1, 2, 2)
    y = range(len(bpf))
    bx.barh(list(y), [ns for _, ns, _ in bpf], color="#9ab", label="BPF run time per call")
    refs = [(ref, "") for _, _, ref in bpf if ref]
    if not refs and a.empty_bpf:
        ns, _, run = a.empty_bpf.partition(":")
        refs = [(float(ns), f", {run}")]
    if refs:
        bx.axvline(refs[0][0], color="#c53", lw=1.2, ls="--",
                   label=f"empty entry+return programs ({refs[0][0]:.0f} ns{refs[0][1]})")
    bx.set_yticks(list(y), [n for n, _, _ in bpf], fontsize=7)
    bx.set_xlabel("ns per call (kernel.bpf_stats_enabled)")
    bx.legend(loc="lower right", fontsize=8)
    fig.suptitle("clockalign probe cost per CUDA call, NVIDIA H200 hosts (16 CPUs, kernel "
                 "6.18.44), 2026-12-01", fontsize=10)
    fig.tight_layout()
    fig.savefig(a.out, dpi=110)
    print(a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
