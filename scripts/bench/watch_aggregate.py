#!/usr/bin/env python3
"""What watch's aggregator costs per event (no root, no GPU): interleaved rounds over one
launch-heavy batch (cuLaunchKernel / cuMemcpyAsync / cuStreamSynchronize, one pid, all
CUDA_SUCCESS), the whole Aggregator.write_columns and, apart, its pid x function x result
count done the two ways watch/aggregate.py knows (one packed uint64 key; np.unique over rows,
which was the only way before and now the fallback for results that do not fit 16 bits).

    .venv/bin/python scripts/bench/watch_aggregate.py --events 100000 --rounds 7 --out DIR

Writes DIR/watch_aggregate.json and DIR/watch_aggregate.md.
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time

import numpy as np

from clockalign.store import cuda_api
from clockalign.store.schema import EVENT_DTYPE, Chunk, Kind
from clockalign.watch import aggregate


def batch(n):
    fn = {f.symbol: f.id for f in cuda_api.FUNCTIONS.values()}
    rng = np.random.default_rng(0)
    a = np.zeros(n, dtype=EVENT_DTYPE)
    a["kind"], a["pid"], a["tid"] = Kind.CUDA, 1234, 1234
    a["code"] = rng.choice([fn["cuLaunchKernel"], fn["cuMemcpyAsync"],
                            fn["cuStreamSynchronize"]], n)
    a["dur"] = rng.integers(500, 5000, n)
    a["ts"] = 10**12 + np.arange(n) * 1000
    return {k: a[k] for k in EVENT_DTYPE.names}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=100000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    cols = batch(a.events)
    agg = aggregate.Aggregator()
    agg.open({"cflags": ["-DCA_CUDA", "-DCA_SCHED"]})
    pid, code, ret = cols["pid"], cols["code"], cols["ret"].astype(np.int64)

    def rows():
        np.unique(np.stack([pid.astype(np.int64), code.astype(np.int64), ret], axis=1),
                  axis=0, return_counts=True)

    cases = {"write_columns (the whole aggregator)": lambda: agg.write_columns(Chunk.EVENTS, cols),
             "counts, packed uint64 key (now)": lambda: list(aggregate._call_counts(pid, code, ret)),
             "counts, np.unique over rows (before)": rows}
    ns = {k: [] for k in cases}
    for rnd in range(a.rounds):
        names = list(cases)
        k = rnd % len(names)
        for name in names[k:] + names[:k]:
            t = time.perf_counter_ns()
            cases[name]()
            ns[name].append((time.perf_counter_ns() - t) / a.events)
    res = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "command": "python3 " + " ".join(sys.argv), "machine": platform.node(),
           "cpu": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
           "python": platform.python_version(), "numpy": np.__version__,
           "events": a.events, "rounds": a.rounds,
           "ns_per_event": {k: {"median": statistics.median(v), "min": min(v), "max": max(v),
                                "all": v} for k, v in ns.items()}}
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "watch_aggregate.json"), "w") as f:
        json.dump(res, f, indent=1)
    md = ["# watch's aggregator per event", "",
          f"- date: {res['date']}", f"- command: `{res['command']}`",
          f"- machine: {res['machine']}, {res['cpus']} CPUs, Python {res['python']}, numpy "
          f"{res['numpy']}", f"- one batch of {a.events} CUDA calls, {a.rounds} interleaved rounds",
          "", "| step | ns per event, median (min–max) |", "|---|---|"]
    for k, v in res["ns_per_event"].items():
        md.append(f"| {k} | {v['median']:.0f} ({v['min']:.0f}–{v['max']:.0f}) |")
    with open(os.path.join(a.out, "watch_aggregate.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
