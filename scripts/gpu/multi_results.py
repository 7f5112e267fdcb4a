#!/usr/bin/env python3
"""results/multi-gpu.md from a two-GPU all-reduce recording (scripts/gpu/multi.sh).

Reads the run file and the ranks' own records (scripts/workloads/allreduce_gpu.py writes
DIR/rank<r>.json) and writes, with the machine, command and date:

- the per-GPU alignment table (device identity, skew, band p50/p99, steps);
- the GPUs' timers against each other (align/compare.py via the report's analysis);
- counters per device (sm_clock, power, gpu_util, gpu_temp);
- each all-reduce on both GPUs side by side: the %globaltimer stamps that bracket the
  NCCL kernel on each GPU, mapped through that GPU's own domain, each with its
  uncertainty, and the start difference between the GPUs with the summed uncertainty.

A rank finds its domain by its device's PCI bus id (or uuid) in the run's device table,
never by an ordinal.

    python3 scripts/gpu/multi_results.py RUN.ca WORKDIR results/multi-gpu.md --command "..."
"""
import argparse
import datetime
import glob
import json
import os

import numpy as np


from clockalign.align.sandwiches import run_sandwiches
from clockalign.align.stats import pct
from clockalign.report import analysis
from clockalign.store.devices import bus_id
from clockalign.timeline import Timeline

FIELDS = ("sm_clock", "power", "gpu_util", "gpu_temp")


def _table(head, rows):
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out) + "\n"


def _device_of(tl, rec):
    d = rec.get("device") or {}
    dev = tl.devices.by_bus(d.get("bus_id")) if bus_id(d.get("bus_id")) else None
    if dev is None and d.get("uuid"):
        u = str(d["uuid"]).removeprefix("GPU-")
        dev = next((x for x in tl.devices if x.uuid and x.uuid.removeprefix("GPU-") == u), None)
    return dev


def alignment_md(tl) -> str:
    rows = [r for r in analysis.alignment(tl) if r["domain"].startswith("GPU")]
    md = _table(["domain", "device", "skew ppm", "band p50", "band p99", "min RTT", "steps",
                 "sandwiches used/total"],
                [[r["domain"], r["device"] or "-", f"{r['skew_ppm']:+.3f}", r["hw_p50"],
                  r["hw_p99"], r["min_rtt_ns"], len(r["steps"]),
                  f"{r['samples_used']}/{r['samples_total']}"] for r in rows])
    failed = {d: w for d, w in tl.fit_failures.items() if d.startswith("GPU")}
    md += "".join(f"\n{d} ({tl.devices.describe(d)}): fit failed: {w}\n" for d, w in failed.items())
    pairs = analysis.gpu_clock_pairs(tl)
    md += "\n### The GPUs' timers against each other\n\n" + _table(
        ["GPU", "against", "skew ppm", "offset first ns", "offset last ns", "steps",
         "± p50 ns", "± p99 ns"],
        [[p["b_label"], p["a_label"], f"{p['skew_ppm']:+.3f}", p["offset_first_ns"],
          p["offset_last_ns"], len(p["steps"]), p["unc_p50_ns"], p["unc_p99_ns"]]
         for p in pairs]) if pairs else "\nNo two GPU domains were fitted.\n"
    return md


def counters_md(tl) -> str:
    rows = []
    for d in tl.devices:
        for name in FIELDS:
            c = tl.counters(gpu=d.number, fields=name)
            if len(c):
                rows.append([tl.devices.label(d.number), name, len(c), f"{pct(c['value'], 50):.6g}",
                             f"{c['value'].max():.6g}", pct(c["unc_ns"], 99)])
    return _table(["device", "field", "samples", "p50", "max", "time ± p99 ns"], rows)


def _probed_span(tl, name):
    r = run_sandwiches(tl.reader)[name].remote
    return int(r.min()), int(r.max())


def allreduce_pairs(tl, ranks):
    """Ranks 0 and 1's all-reduces on MONOTONIC, each through its own GPU's domain:
    {"a", "b": Device, "start_a", "unc_a", "end_a", "start_b", "unc_b", "end_b": int64
    arrays, "outside": all-reduces left out} or a sentence saying why there are none."""
    per = {}
    for rec in ranks:
        dev = _device_of(tl, rec)
        st = np.asarray(rec.get("gpu_stamps") or [], dtype=np.int64)
        if dev is None or dev.name not in tl.models or len(st) < 2:
            why = ("its device is not in the run's table" if dev is None else
                   f"{dev.name} has no fit" if dev.name not in tl.models else
                   rec.get("stamps_note") or "no stamps")
            return f"Rank {rec['rank']} cannot be placed: {why}."
        st = st[:len(st) // 2 * 2]
        lo, hi = _probed_span(tl, dev.name)
        inside = (st[0::2] >= lo) & (st[1::2] <= hi)      # a fit maps only what it spans
        t, u = tl.map(dev.name, st)
        per[rec["rank"]] = (dev, t[0::2], u[0::2], t[1::2], inside)
    if len(per) < 2:
        return "Fewer than two ranks recorded stamps."
    n = min(len(per[0][1]), len(per[1][1]))
    keep = per[0][4][:n] & per[1][4][:n]
    if not keep.any():
        return "No all-reduce lies inside both GPUs' probed spans."
    out = {"a": per[0][0], "b": per[1][0], "outside": int(n - keep.sum())}
    for side, p in (("a", per[0]), ("b", per[1])):
        out[f"start_{side}"], out[f"unc_{side}"], out[f"end_{side}"] = (
            x[:n][keep] for x in p[1:4])
    return out


def allreduce_md(tl, ranks, show=10) -> str:
    p = allreduce_pairs(tl, ranks)
    if isinstance(p, str):
        return p + "\n"
    da, db = p["a"], p["b"]
    sa, ua, ea, sb, ub, eb = (p[k] for k in ("start_a", "unc_a", "end_a",
                                             "start_b", "unc_b", "end_b"))
    n = len(sa)
    rows = [[i, f"{(sa[i] - sa[0]) / 1e6:.3f}", f"±{ua[i]}", f"{(ea[i] - sa[i]) / 1e3:.1f}",
             f"{(sb[i] - sa[0]) / 1e6:.3f}", f"±{ub[i]}", f"{(eb[i] - sb[i]) / 1e3:.1f}",
             int(sb[i] - sa[i]), f"±{ua[i] + ub[i]}"] for i in range(min(show, n))]
    md = (f"{n} all-reduces ({p['outside']} outside a GPU's probed span left out); times in "
          f"ms from the first all-reduce's start on {da.name}, durations in µs (first stamp "
          "to second stamp, which bracket the NCCL kernel), start difference "
          f"{db.name} − {da.name} in ns.\n\n")
    md += _table(["#", f"{da.name} start", "±ns", "µs", f"{db.name} start", "±ns", "µs",
                  "start diff ns", "± ns"], rows)
    diff, unc = sb - sa, ua + ub
    md += "\n" + _table(["over all all-reduces", "p50", "p99", "max |x|"],
                        [["start diff ns", pct(diff, 50), pct(diff, 99), int(np.abs(diff).max())],
                         ["its ± ns", pct(unc, 50), pct(unc, 99), int(unc.max())],
                         [f"{da.name} duration ns", pct(ea - sa, 50), pct(ea - sa, 99),
                          int((ea - sa).max())],
                         [f"{db.name} duration ns", pct(eb - sb, 50), pct(eb - sb, 99),
                          int((eb - sb).max())]])
    return md


def nccl_kernels_md(tl, show=10) -> str:
    """The NCCL all-reduce kernels CUPTI recorded (--gpu-activity) on each GPU, the i-th of
    one GPU beside the i-th of the other, each mapped through its own GPU's domain."""
    acts = tl.gpu_activity()
    if not len(acts):
        return "No GPU activity in this run (recorded without --gpu-activity?).\n"
    rows = acts.rows
    is_ar = np.array(["AllReduce" in acts.name(r) for r in rows], dtype=bool)
    per = {g: rows[is_ar & (rows["gpu"] == g)] for g in sorted(set(rows["gpu"][is_ar].tolist()))
           if g >= 0}
    if len(per) < 2:
        return (f"NCCL all-reduce kernels on {len(per)} GPU(s) only"
                f"{'' if per else ' (none named AllReduce)'}.\n")
    (ga, a), (gb, b) = list(per.items())[:2]
    n = min(len(a), len(b))
    la, lb = tl.devices.label(int(ga)), tl.devices.label(int(gb))
    diff = b["t_ns"][:n] - a["t_ns"][:n]
    unc = a["unc_ns"][:n] + b["unc_ns"][:n]
    t0 = int(a["t_ns"][0])
    md = (f"{len(a)} NCCL AllReduce kernels on {la}, {len(b)} on {lb} (CUPTI raw %globaltimer "
          "stamps, each through its GPU's own fit); the i-th beside the i-th.\n\n")
    md += _table(["#", f"GPU{ga} start ms", "±ns", "µs", f"GPU{gb} start ms", "±ns", "µs",
                  "start diff ns", "± ns"],
                 [[i, f"{(a['t_ns'][i] - t0) / 1e6:.3f}", a["unc_ns"][i],
                   f"{(a['end_ns'][i] - a['t_ns'][i]) / 1e3:.1f}",
                   f"{(b['t_ns'][i] - t0) / 1e6:.3f}", b["unc_ns"][i],
                   f"{(b['end_ns'][i] - b['t_ns'][i]) / 1e3:.1f}", int(diff[i]), int(unc[i])]
                  for i in range(min(show, n))])
    md += "\n" + _table(["over all pairs", "p50", "p99", "max |x|"],
                        [["start diff ns", pct(diff, 50), pct(diff, 99), int(np.abs(diff).max())],
                         ["its ± ns", pct(unc, 50), pct(unc, 99), int(unc.max())]])
    return md + "".join(f"\n{x}\n" for x in acts.notes)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run")
    ap.add_argument("workdir", help="where the ranks wrote rank<r>.json")
    ap.add_argument("out")
    ap.add_argument("--command", default="scripts/gpu/multi.sh OUTDIR")
    a = ap.parse_args()
    tl = Timeline.open(a.run)
    ranks = sorted((json.load(open(p)) for p in glob.glob(os.path.join(a.workdir, "rank*.json"))),
                   key=lambda r: r["rank"])
    meta = tl.meta or {}
    md = ["# Two GPUs on one host: a clock domain per GPU, counters and all-reduces per device\n",
          f"Machine: {meta.get('host')} (kernel {meta.get('kernel')}; {meta.get('driver')}). "
          f"Command: `{a.command}`. Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}. "
          f"Run: {os.path.basename(a.run)}, {(tl.end_ns - tl.start_ns) / 1e9:.1f} s.\n",
          "Devices (NVML index → PCI bus id → CUDA ordinal of the recorder):\n",
          _table(["name", "bus id", "NVML", "CUDA", "model", "uuid"],
                 [[d.name, d.bus_id, d.nvml_index, d.cuda_ordinal, d.model, d.uuid]
                  for d in tl.devices]),
          "Ranks: " + "; ".join(f"rank {r['rank']} pid {r['pid']} on "
                                f"{getattr(_device_of(tl, r), 'name', 'no known device')} "
                                f"({r['iterations']} all-reduces of {r['bytes'] >> 20} MiB; "
                                f"env {r['env']})" for r in ranks) + "\n",
          "## Alignment per GPU\n", alignment_md(tl),
          "\n## Counters per device\n", counters_md(tl),
          "\n## Each all-reduce on both GPUs\n",
          "\n### From the ranks' own %globaltimer stamps around each all-reduce\n",
          allreduce_md(tl, ranks),
          "\n### From CUPTI's kernel records (--gpu-activity)\n", nccl_kernels_md(tl)]
    with open(a.out, "w") as f:
        f.write("\n".join(md))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
