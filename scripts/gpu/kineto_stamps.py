#!/usr/bin/env python3
"""Self-stamping kernels under torch.profiler: CUPTI's CONVERTED kernel times (through
Kineto) beside each kernel's own %globaltimer, for issue 14 item 4 (c).

Run it while `clockalign record` probes the same GPU's clock (any target): clockalign maps
the %globaltimer stamps through its GPU0 model; CUPTI's converted start comes from the
profiler's trace.  Kineto's clock is tied to MONOTONIC by "mark" ranges every 0.5 s, each
bracketed by MONOTONIC reads (a few µs wide), interpolated between marks.

    python3 scripts/gpu/kineto_stamps.py --seconds 70 --out kineto.npz
    -> stamps (n x 2, GPU ns), kineto_start_ns (n, Kineto ns), marks (m x 3: Kineto ns of
       the mark, MONOTONIC before, after)
"""
import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

WORKLOADS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "workloads")
sys.path.insert(0, WORKLOADS)
from selfstamp import Stamper  # noqa: E402  (WORKLOADS)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=70)
    ap.add_argument("--per-sync", type=int, default=4)
    ap.add_argument("--round-sleep-ms", type=float, default=4.0)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function
    torch.cuda.init()
    st = Stamper(200_000, 20_000)
    marks = []
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t_end = time.monotonic() + a.seconds
        next_mark = 0.0
        k = 0
        while time.monotonic() < t_end and st.n + a.per_sync <= st.n_max:
            now = time.monotonic()
            if now >= next_mark:
                t0 = time.monotonic_ns()
                with record_function(f"mark{k}"):
                    pass
                t1 = time.monotonic_ns()
                marks.append((k, t0, t1))
                k += 1
                next_mark = now + 0.5
            for _ in range(a.per_sync):
                st.launch()
            st.sync()
            time.sleep(a.round_sleep_ms / 1e3)
    stamps = st.stamps()
    path = os.path.join(tempfile.mkdtemp(), "trace.json")
    prof.export_chrome_trace(path)
    with open(path) as f:
        tr = json.load(f)
    evs = tr["traceEvents"] if isinstance(tr, dict) else tr
    ker = sorted(float(e["ts"]) for e in evs if e.get("name") == "ca_selfstamp"
                 and e.get("cat") == "kernel")
    mk = {}
    for e in evs:
        n = str(e.get("name", ""))
        if n.startswith("mark") and n[4:].isdigit() and e.get("ph") == "X":
            mk[int(n[4:])] = float(e["ts"])
    rows = [(mk[i] * 1000.0, t0, t1) for i, t0, t1 in marks if i in mk]
    np.savez(a.out, stamps=stamps, kineto_start_ns=np.array(ker) * 1000.0,
             marks=np.array(rows, dtype=np.float64),
             base_ns=float(tr.get("baseTimeNanoseconds", 0)) if isinstance(tr, dict) else 0.0)
    print(f"{len(ker)} kernels in the trace, {st.n} launched, {len(rows)} marks -> {a.out}",
          flush=True)


if __name__ == "__main__":
    main()
