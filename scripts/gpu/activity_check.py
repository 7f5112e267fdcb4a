#!/usr/bin/env python3
"""Check a --gpu-activity recording of scripts/workloads/stamp_kernels.py against the kernels'
own %globaltimer stamps (issue 14 item 4).

Raw timestamps (the default):
  (a) CUPTI's raw start/end against each kernel's first/last own %globaltimer read;
  (b) every mapped kernel inside [its launch call's entry, the return of the sync that
      waited for it] (central times, and beyond the stated uncertainty).
Converted timestamps (--gpu-activity-timestamps converted):
  (c) CUPTI's converted start against clockalign's mapping of the kernel's own start stamp
      (less the raw start offset from (a), --offsets), over the run, with clockalign's
      stated uncertainty; and (b) for CUPTI's converted times.

    python3 scripts/gpu/activity_check.py --run raw.ca --stamps raw-stamps.npz --out check-raw.json
    python3 scripts/gpu/activity_check.py --run conv.ca --stamps conv-stamps.npz \
        --offsets check-raw.json --out check-conv.json --plot gpu-activity.png
"""
import argparse
import json
import os

import numpy as np

from clockalign.store import cuda_api
from clockalign.store.schema import GpuKind
from clockalign.timeline import Timeline
from clockalign.timeline.gpu_activity import cuda_calls, waiting_syncs

KERNEL = "ca_selfstamp"


def dist(x) -> dict:
    x = np.asarray(x, dtype=np.int64)
    if not len(x):
        return {"n": 0}
    q = np.percentile(x, [0, 1, 50, 99, 100])
    return {"n": int(len(x)), "min": int(q[0]), "p1": float(q[1]), "p50": float(q[2]),
            "p99": float(q[3]), "max": int(q[4])}


def containment(rows, cuda, unc_ok=True) -> dict:
    """Kernels against [launch entry, return of the sync that waited for them]."""
    syncs = waiting_syncs(rows, cuda, cuda_api.ids("sync"))
    have = (rows["launch_src"] == 1) & (syncs >= 0)
    r, s = rows[have], syncs[have]
    early = r["t_ns"] - r["launch_t_ns"]             # >= 0 when the start is after the entry
    late = s - r["end_ns"]                           # >= 0 when the end is before the return
    out = {"kernels": int(len(rows)), "checked": int(have.sum()),
           "start_before_launch_entry": int((early < 0).sum()),
           "end_after_sync_return": int((late < 0).sum()),
           "launch_entry_to_start_ns": dist(early), "end_to_sync_return_ns": dist(late)}
    if unc_ok:
        out["start_before_entry_beyond_unc"] = int((early + r["unc_ns"] < 0).sum())
        out["end_after_return_beyond_unc"] = int((late + r["end_unc_ns"] < 0).sum())
    return out


def _plot(path, secs, diff, unc, label, title):
    """Differences (ns) over time against clockalign's stated uncertainty (±unc), as PNG."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    fig = Figure(figsize=(9, 4.5))
    ax = fig.add_subplot(111)
    step = max(1, len(secs) // 20000)
    ax.plot(secs[::step], diff[::step] / 1e3, ",", color="tab:red", label=label)
    ax.fill_between(secs[::step], -unc[::step] / 1e3, unc[::step] / 1e3, color="tab:blue",
                    alpha=0.3, label="clockalign's stated uncertainty (±)")
    ax.axhline(0, color="k", lw=0.5)
    ax.set_xlabel("seconds")
    ax.set_ylabel("µs")
    ax.set_title(title, fontsize=9)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def kineto_check(tl, acts, path, res, plot) -> dict:
    """(c): CUPTI's converted kernel start (torch.profiler) against clockalign's mapping of
    the same kernel's own start stamp plus the raw start offset of (a)."""
    z = np.load(path)
    st = z["stamps"].astype(np.int64)
    kin = z["kineto_start_ns"].astype(np.float64)
    marks = z["marks"]
    n = min(len(st), len(kin))
    st, kin = st[:n], kin[:n]
    off = res["a_raw_start_minus_stamp_ns"]["p50"]
    dom = next((d for d in acts.domains.values() if d), "GPU0")
    mono_k, unc = tl.map(dom, st[:, 0] + int(round(off)))
    # Kineto's clock -> MONOTONIC through the marks (bracket midpoints, interpolated)
    km, m0, m1 = marks[:, 0], marks[:, 1], marks[:, 2]
    mid_off = (m0 + (m1 - m0) / 2) - km
    conv = kin + np.interp(kin, km, mid_off)
    diff = conv - mono_k
    secs = (mono_k - mono_k.min()) / 1e9
    out = {"kernels": int(n), "marks": int(len(marks)),
           "mark_bracket_ns": dist((m1 - m0).astype(np.int64)),
           "converted_minus_clockalign_ns": dist(np.round(diff).astype(np.int64)),
           "clockalign_unc_ns": dist(unc),
           "outside_clockalign_unc_plus_mark_bracket": int(
               (np.abs(diff - np.median(diff)) > unc + np.max(m1 - m0) / 2).sum()),
           "span_s": float(secs.max()) if n else 0.0}
    if n > 10:
        out["drift_ns_per_s"] = float(np.polyfit(secs, diff, 1)[0])
        d0 = diff - np.median(diff)
        out["converted_minus_clockalign_minus_median_ns"] = dist(np.round(d0).astype(np.int64))
    if plot and n:
        med = float(np.median(diff))
        _plot(plot, secs, diff - med, unc,
              f"CUPTI converted start (torch.profiler) - clockalign mapping, less its median "
              f"{med / 1e3:+.1f} µs",
              f"{n} self-stamping kernels on an H200: CUPTI's conversion vs clockalign's "
              "bounded mapping of %globaltimer")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run", required=True)
    ap.add_argument("--stamps", required=True)
    ap.add_argument("--offsets", help="check-raw.json of a raw run: its median start offset")
    ap.add_argument("--out", required=True)
    ap.add_argument("--plot")
    ap.add_argument("--kineto", help="npz of scripts/gpu/kineto_stamps.py run during RUN: (c) "
                    "with CUPTI's converted times through torch.profiler")
    a = ap.parse_args()
    tl = Timeline.open(a.run)
    acts = tl.gpu_activity()
    st = np.load(a.stamps)["stamps"].astype(np.int64)
    rows = acts.rows
    is_stamp = np.zeros(len(rows), dtype=bool)
    for (pid, space, nid), name in acts.names.items():
        if space == 1 and name == KERNEL:
            is_stamp |= (rows["pid"] == pid) & (rows["name"] == nid)
    k = rows[is_stamp & (rows["kind"] == GpuKind.KERNEL)]
    k = k[np.argsort(k["gpu_start"], kind="stable")]
    n = min(len(k), len(st))
    res = {"run": os.path.basename(a.run), "stamp_kernels": int(len(st)),
           "cupti_stamp_kernels": int(len(k)), "activity_stats": acts.stats,
           "notes": tl.notes,
           "counts": {kk: int(v) for kk, v in (tl.reader.trailer or {}).get("counts", {}).items()
                      if kk.startswith("gpu")},
           "drops": (tl.reader.trailer or {}).get("drops")}
    k, st = k[:n], st[:n]
    raw = bool(n and k["raw"].all())
    res["timestamps"] = "raw" if raw else "converted"
    cuda = cuda_calls(tl)
    if raw:
        d0 = k["gpu_start"].astype(np.int64) - st[:, 0]
        d1 = k["gpu_end"].astype(np.int64) - st[:, 1]
        res["a_raw_start_minus_stamp_ns"] = dist(d0)
        res["a_raw_end_minus_stamp_ns"] = dist(d1)
        res["b_containment"] = containment(k, cuda)
        res["unc_ns"] = dist(k["unc_ns"])
        res["end_unc_ns"] = dist(k["end_unc_ns"])
        all_k = rows[rows["kind"] == GpuKind.KERNEL]
        res["b_containment_all_kernels"] = containment(all_k, cuda)
    else:
        off = 0.0
        if a.offsets:
            off = json.load(open(a.offsets))["a_raw_start_minus_stamp_ns"]["p50"]
        dom = next((d for d in acts.domains.values() if d), "GPU0")
        m, u = tl.map(dom, st[:, 0])
        want = m + int(round(off))              # where a raw CUPTI start would map
        diff = k["t_ns"] - want
        res["c_offset_used_ns"] = off
        res["c_converted_minus_clockalign_ns"] = dist(diff)
        res["c_clockalign_unc_ns"] = dist(u)
        t0 = int(want.min()) if n else 0
        secs = (want - t0) / 1e9
        if n > 10:
            slope = np.polyfit(secs, diff.astype(np.float64), 1)[0]
            res["c_drift_ns_per_s"] = float(slope)
        res["c_outside_clockalign_unc"] = int((np.abs(diff) > u).sum())
        res["b_containment_converted"] = containment(k, cuda, unc_ok=False)
        if a.plot and n:
            _plot(a.plot, secs, diff, u, "CUPTI converted start - clockalign mapping",
                  f"{n} self-stamping kernels: CUPTI's converted kernel start vs clockalign's "
                  "mapping of %globaltimer")
    if a.kineto and raw:
        res["c_kineto"] = kineto_check(tl, acts, a.kineto, res, a.plot)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1, default=str)
    print(json.dumps(res, indent=1, default=str))


if __name__ == "__main__":
    main()
