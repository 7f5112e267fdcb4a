#!/usr/bin/env python3
"""Summary of scripts/gpu/attach_activity.sh: the decode loop's rate before, during and after
each `record --pid --gpu-activity`, and what each recording holds (kernels recorded, joined to
their BPF launch call, mapped with a bound).

The windows come from the run files: attached = from the CA_GK_MODE record that switched
activity on to the one that switched it off (both stamped MONOTONIC in the target); before =
from the loop's first log line (or the previous detach + SETTLE_S) to the record command's
start; after = from the detach + SETTLE_S to the next record command's start (or the log's end).

    python3 scripts/gpu/attach_summary.py --log decode.log --marks marks.txt \
        --run attach1.ca --run attach2.ca --out summary.json > summary.md
"""
import argparse
import json
import os
import sys

import numpy as np

from clockalign.report.gpu_activity import graph_table
from clockalign.store.reader import RunReader
from clockalign.store.schema import Chunk, GpuKind
from clockalign.timeline import Timeline
from clockalign.timeline.gpu_activity import LAUNCH_BPF

WORKLOADS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "workloads")
sys.path.insert(0, WORKLOADS)
import progress_log  # noqa: E402  (WORKLOADS)

SETTLE_S = 2.0


def mode_times(path):
    c = RunReader(path).columns(Chunk.GPU_ACTIVITY)
    m = c["kind"] == GpuKind.MODE
    t, v = c["start"][m].astype(np.int64), c["value"][m]
    on = t[v != 0]
    off = t[v == 0]
    return (int(on[0]) if len(on) else None, int(off[-1]) if len(off) else None)


def run_stats(path):
    acts = Timeline.open(path).gpu_activity()
    r = acts.rows
    k = r[r["kind"] == GpuKind.KERNEL]
    bounded = k[k["unc_ns"] >= 0]
    out = {"kernels": int(len(k)), "joined_bpf": int((k["launch_src"] == LAUNCH_BPF).sum()),
           "kernels_bounded": int(len(bounded)), "stats": {x: y for x, y in acts.stats.items()
                                                            if isinstance(y, (int, float))},
           "notes": acts.notes}
    out["graph_kernels"] = int((k["aux"] != 0).sum())
    out["graphs"] = graph_table(r, k=5)
    if len(bounded):
        u = bounded["unc_ns"]
        out["bound_ns"] = {"median": int(np.median(u)), "p99": int(np.percentile(u, 99)),
                           "max": int(u.max())}
    meta = RunReader(path)
    out["trailer_counts"] = {x: y for x, y in meta.trailer.get("counts", {}).items()
                             if x.startswith("gpu_")}
    out["notices"] = [n["text"] for n in meta.rows(Chunk.NOTICES)
                      if "GPU activity" in n["text"] or "CUPTI" in n["text"]]
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--log", required=True)
    ap.add_argument("--marks", required=True, help='lines "NAME MONOTONIC_ns"')
    ap.add_argument("--run", action="append", default=[])
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    samples = progress_log.read(a.log)
    marks = {}
    for line in open(a.marks):
        name, t = line.split()
        marks[name] = int(t)
    res = {"runs": [], "windows": []}
    prev_end = samples[0][0]
    for i, path in enumerate(a.run, 1):
        on, off = mode_times(path)
        st = run_stats(path)
        st.update(path=path, attached_ns=on, detached_ns=off)
        res["runs"].append(st)
        start = marks.get(f"record{i}_start")
        nxt = marks.get(f"record{i + 1}_start", samples[-1][0])
        if i == 1:          # a later one's "before" is the previous "after"
            res["windows"].append({"name": "before1", "rate": progress_log.rate(
                samples, prev_end, start)})
        if on and off:
            res["windows"].append({"name": f"attached{i}",
                                   "rate": progress_log.rate(samples, on, off)})
            res["windows"].append({"name": f"after{i}", "rate": progress_log.rate(
                samples, off + int(SETTLE_S * 1e9), nxt)})
            prev_end = off + int(SETTLE_S * 1e9)
    res["loop_exit"] = marks.get("loop_rc")
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    base = next((w["rate"] for w in res["windows"] if w["rate"]), None)
    print("| window | tokens/s | vs first plain |\n|---|---|---|")
    for w in res["windows"]:
        r = w["rate"]
        print(f"| {w['name']} | {r:.1f} | {r / base:.3f} |" if r and base else
              f"| {w['name']} | - | - |")
    for st in res["runs"]:
        b = st.get("bound_ns", {})
        secs = (st["detached_ns"] - st["attached_ns"]) / 1e9 \
            if st["detached_ns"] and st["attached_ns"] else None
        print(f"\n{st['path']}: {st['kernels']} kernels, {st['joined_bpf']} joined to their BPF "
              f"launch call, {st['kernels_bounded']} mapped with a bound (median "
              f"{b.get('median')} ns, p99 {b.get('p99')} ns, max {b.get('max')} ns); attached "
              f"{secs if secs is not None else '?'} s")
        for gr in st["graphs"]:
            print(f"- graph {gr['graph']}: {gr['replays']} replays of {gr['nodes']} nodes, "
                  f"{gr['kernels']} kernels, replay span p50 {gr['span_p50_ns']} ns")
        for n in st["notices"]:
            print(f"- {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
