#!/usr/bin/env python3
"""Measure the GPU<->MONOTONIC alignment of a real recording and write results/alignment.*

    python3 scripts/gpu/alignment_results.py RUN.ca --out results [--gpu 0] [--cost probe_cost.json]
    python3 scripts/gpu/alignment_results.py results/gpu-align/gpu0_sandwiches.csv.xz --out results \
        --cost results/gpu-align/probe_cost.json      # the committed raw data, no run file

From the run's raw sandwiches it reports: the band half-width over time (p50/p99/max)
against the floor (half the minimum round trip); skew and drift per segment; steps; a
cross-validation (fit on even sandwiches, every odd sandwich's [t0, t1] must contain its
mapped point within the uncertainty); and, side by side, the error a one-time offset taken
at the start (what host-clock-only eBPF agents rely on) and one least-squares line over the
whole run would reach.  Writes alignment.md, alignment.json and alignment.png.
"""
import argparse
import datetime
import json
import os
import platform

import numpy as np

from clockalign.align import fit_sandwiches
from clockalign.align.sandwiches import recorded_ticks, run_sandwiches
from clockalign.store.reader import RunReader


def load_sandwiches(path, gpu, tick):
    """(t0, remote, t1, tick) from a run file's GPU_CLOCK chunks or a t0_ns,remote_ns,t1_ns CSV."""
    if path.endswith((".csv", ".csv.xz")):
        import lzma
        opener = lzma.open if path.endswith(".xz") else open
        with opener(path, "rt") as f:
            rows = np.loadtxt(f, delimiter=",", skiprows=1, dtype=np.int64, ndmin=2)
        return rows[:, 0], rows[:, 1], rows[:, 2], tick
    r = RunReader(path)
    s = run_sandwiches(r)[f"GPU{gpu}"]
    return s.t0, s.remote, s.t1, recorded_ticks(r).get(f"GPU{gpu}", tick)


def pct(a, q):
    return float(np.percentile(a, q)) if len(a) else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("run")
    ap.add_argument("--out", default="results")
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--window", type=float, default=5.0, help="fit window, seconds")
    ap.add_argument("--cost", help="probe_cost.json to quote")
    ap.add_argument("--raw-note", default="results/gpu-align/ (gpu0_sandwiches.csv.xz: every GPU sandwich; cpu_*_sandwiches.csv; info; probe cost); the 202 MB run file itself is not committed", help="where the raw files are kept")
    ap.add_argument("--tick", type=int, default=32, help="GPU timer tick (CSV input)")
    ap.add_argument("--recorded-by", default="`scripts/gpu/session.sh align` (`clockalign record "
                    "--duration 300 --gpu-clock-period 0.25 -- python3 <bf16 4096³ matmul loop>` "
                    "on one NVIDIA H200, driver 580.159.04, kernel 6.18.44-fc, Firecracker VM)",
                    help="how the run whose sandwiches these are was recorded")
    ap.add_argument("--loop", default="Python", help="the ping-pong's host loop (Python or C)")
    a = ap.parse_args()

    t0, rem, t1, tick = load_sandwiches(a.run, a.gpu, a.tick)
    order = np.argsort(t0, kind="stable")
    t0, rem, t1 = t0[order], rem[order], t1[order]
    win = int(a.window * 1e9)
    model = fit_sandwiches(t0, rem, t1, tick_ns=tick, window_ns=win)
    s = model.summary()
    host, unc = model.map(rem)
    rtt = t1 - t0
    half = unc - tick                      # the band half-width alone (no stamp unc given)
    start = int(t0[0])
    tsec = (t0 - start) / 1e9

    # cross-validation: fit on even sandwiches, check the odd ones
    even = np.arange(len(t0)) % 2 == 0
    m_even = fit_sandwiches(t0[even], rem[even], t1[even], tick_ns=tick, window_ns=win)
    h_odd, u_odd = m_even.map(rem[~even])
    miss = np.abs(h_odd - np.clip(h_odd, t0[~even], t1[~even])) > u_odd
    # the same check restricted to each burst's fastest sandwich (the informative ones)
    burst_id = np.concatenate([[0], np.cumsum(np.diff(t0) > 50_000_000)])
    odd_idx = np.flatnonzero(~even)

    # one-time offset (host-clock agents) and one global least-squares line, vs the model
    best0 = int(np.argmin(rtt[:64]))
    offset0 = (t0[best0] + t1[best0]) // 2 - rem[best0]
    err_offset = (rem + offset0) - host
    mid = (t0 + t1) // 2
    x = (rem - rem[0]).astype(np.float64)
    coef = np.polyfit(x, (mid - rem[0]).astype(np.float64) - x, 1)
    ls_host = rem[0] + (x + np.polyval(coef, x)).astype(np.int64)
    err_ls = ls_host - host
    marks = [10, 60, 120, 300]
    at = {}
    for sec in marks:
        i = np.searchsorted(tsec, sec)
        if i < len(tsec):
            at[sec] = {"one_time_offset_ns": int(abs(err_offset[i])),
                       "one_line_ls_ns": int(abs(err_ls[i])), "band_halfwidth_ns": int(half[i])}
    end = {"one_time_offset_ns": int(abs(err_offset[-1])),
           "max_one_time_offset_ns": int(np.max(np.abs(err_offset))),
           "max_one_line_ls_ns": int(np.max(np.abs(err_ls))),
           "band_halfwidth_ns": int(half[-1])}
    segs = s["segments"]
    skews = np.array([sg["skew_ppm"] for sg in segs])
    res = {
        "run": os.path.basename(a.run), "domain": f"GPU{a.gpu}",
        "duration_s": float(tsec[-1]), "sandwiches": int(len(t0)),
        "bursts": int(burst_id[-1] + 1), "tick_ns": int(tick), "window_s": a.window,
        "min_rtt_ns": int(rtt.min()), "median_rtt_ns": int(np.median(rtt)),
        "floor_ns": int(rtt.min() // 2),
        "halfwidth_ns": {"p50": pct(half, 50), "p99": pct(half, 99), "max": float(half.max())},
        "uncertainty_ns": {"p50": pct(unc, 50), "p99": pct(unc, 99), "max": float(unc.max())},
        "skew_ppm": s["skew_ppm"], "segments": len(segs),
        "segment_skew_ppm": {"min": float(skews.min()), "max": float(skews.max())},
        "steps": s["steps"],
        "cross_validation": {"odd_sandwiches": int(len(odd_idx)), "misses": int(miss.sum())},
        "error_vs_model": {"at_s": at, "end": end},
        "assumption": s["assumption"],
    }
    if a.cost:
        with open(a.cost) as f:
            res["probe_cost"] = json.load(f)

    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "alignment.json"), "w") as f:
        json.dump(res, f, indent=1, default=float)
    plot(os.path.join(a.out, "alignment.png"), tsec, mid - host, rtt, half, err_offset, err_ls,
         res)
    write_md(os.path.join(a.out, "alignment.md"), res, a)
    print(json.dumps({k: res[k] for k in ("halfwidth_ns", "cross_validation", "skew_ppm")}))


def plot(path, tsec, resid, rtt, half, err_offset, err_ls, res):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(3, 1, figsize=(11, 10), sharex=True)
    fast = rtt <= np.percentile(rtt, 10)
    ax[0].fill_between(tsec, -half / 1e3, half / 1e3, color="tab:blue", alpha=0.25,
                       label="feasible band (±half-width)")
    ax[0].plot(tsec[fast], resid[fast] / 1e3, ".", ms=1.5, color="k",
               label="sandwich midpoint − mapped (fastest 10 %)")
    ax[0].set_ylabel("µs")
    ax[0].set_title(f"{res['domain']} → MONOTONIC: residuals and band "
                    f"(p99 half-width {res['halfwidth_ns']['p99']:.0f} ns, floor "
                    f"{res['floor_ns']} ns)")
    ax[0].legend(loc="upper right", fontsize=8)
    ax[1].plot(tsec, half, lw=0.8, label="band half-width")
    ax[1].axhline(res["floor_ns"], color="r", ls="--", lw=0.8, label="floor = min RTT / 2")
    ax[1].axhline(1000, color="g", ls=":", lw=0.8, label="goal 1.0 µs")
    ax[1].set_ylabel("ns")
    ax[1].legend(loc="upper right", fontsize=8)
    ax[1].set_title("uncertainty over time")
    ax[2].plot(tsec, np.abs(err_offset) / 1e3, lw=0.8, label="one-time offset at start")
    ax[2].plot(tsec, np.abs(err_ls) / 1e3, lw=0.8, label="one least-squares line, whole run")
    ax[2].plot(tsec, half / 1e3, lw=0.8, label="clockalign band half-width")
    ax[2].set_yscale("log")
    ax[2].set_ylabel("|error| µs (log)")
    ax[2].set_xlabel("seconds since first sandwich")
    ax[2].set_title("what simpler alignments would get wrong, against the piecewise fit")
    ax[2].legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_md(path, res, a):
    hw, cv, e = res["halfwidth_ns"], res["cross_validation"], res["error_vs_model"]
    cost = res.get("probe_cost")
    lines = [
        "# GPU ↔ MONOTONIC alignment on the H200 test host",
        "",
        f"- made: {datetime.datetime.now(datetime.timezone.utc).date()} by "
        f"`python3 scripts/gpu/alignment_results.py {a.run} --out {a.out}"
        + (f" --cost {a.cost}" if a.cost else "") + (f" --loop {a.loop}" if a.loop != "Python" else "")
        + "` from the sandwiches of the run recorded by " + a.recorded_by,
        f"- analysed on: {platform.node()} ({platform.platform()})",
        f"- raw data: {a.raw_note or 'see the results folder'}",
        "",
        "| | value |", "|---|---|",
        f"| recording | {res['duration_s']:.0f} s, {res['sandwiches']} sandwiches in "
        f"{res['bursts']} bursts of 64 pings, tick {res['tick_ns']} ns |",
        f"| round trip | min {res['min_rtt_ns']} ns, median {res['median_rtt_ns']} ns |",
        f"| floor (min RTT / 2) | {res['floor_ns']} ns |",
        f"| band half-width p50 / p99 / max | {hw['p50']:.0f} / {hw['p99']:.0f} / "
        f"{hw['max']:.0f} ns |",
        f"| uncertainty incl. tick p50 / p99 / max | {res['uncertainty_ns']['p50']:.0f} / "
        f"{res['uncertainty_ns']['p99']:.0f} / {res['uncertainty_ns']['max']:.0f} ns |",
        f"| goal p99 half-width <= 1.0 µs | {'met' if hw['p99'] <= 1000 else 'NOT met'} |",
        f"| skew (whole run) | {res['skew_ppm']:+.3f} ppm; per {res['window_s']:.0f} s segment "
        f"{res['segment_skew_ppm']['min']:+.3f} … {res['segment_skew_ppm']['max']:+.3f} ppm "
        f"({res['segments']} segments) |",
        f"| steps | {len(res['steps'])} |",
        f"| cross-validation (fit on even, check odd) | {cv['misses']} misses of "
        f"{cv['odd_sandwiches']} |",
        "",
        "## What a simpler alignment would get wrong (|error| against the piecewise fit)",
        "",
        "| time since start | one-time offset | one least-squares line | clockalign half-width |",
        "|---|---|---|---|",
    ]
    for sec, v in e["at_s"].items():
        lines.append(f"| {sec} s | {v['one_time_offset_ns'] / 1e3:.1f} µs | "
                     f"{v['one_line_ls_ns'] / 1e3:.2f} µs | {v['band_halfwidth_ns']} ns |")
    lines.append(f"| end ({res['duration_s']:.0f} s) | {e['end']['one_time_offset_ns'] / 1e3:.1f}"
                 f" µs | (max over run {e['end']['max_one_line_ls_ns'] / 1e3:.2f} µs) | "
                 f"{e['end']['band_halfwidth_ns']} ns |")
    if cost:
        lines += ["", "## Probe cost to the co-running workload (same session, separate run)", "",
                  f"`{cost['command']}` ({cost['date']}): throughput ON/OFF ratio of means "
                  f"{cost['ratio_on_off_means']:.4f}; cost per ON/OFF pair "
                  f"{_fmt_cost(cost['cost_pct'])}; goal <= {cost['goal_pct']} %: "
                  f"{'met' if cost['meets_goal'] else 'NOT met'} (probe_cost.md has the rest)."]
    lines += ["", "## Reading it", "",
              "- The band half-width is the stated uncertainty; it sits just above the floor "
              f"set by the best round trip of the ping-pong ({a.loop} host loop). A tighter band "
              "needs a faster round trip, not more fitting.",
              f"- Assumption (unobservable, stated not hidden): {res['assumption']}",
              "", "![alignment](alignment.png)"]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def _fmt_cost(c):
    if isinstance(c, dict):
        return ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                         for k, v in c.items())
    return str(c)


if __name__ == "__main__":
    main()
