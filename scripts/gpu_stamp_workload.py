#!/usr/bin/env python3
"""Kernels that stamp their own %globaltimer, for checking GPU activity timestamps.

Each ``ca_selfstamp`` kernel (clockalign/workloads/selfstamp.py; one thread) reads %globaltimer as it starts, spins for
--spin-ns, reads it again and stores both in stamps[i].  Rounds of --per-sync launches on
one stream, a cuMemsetD8Async, then cuStreamSynchronize; every --gap-every rounds a pause
of up to --gap-ms (idle GPU time with the launching thread blocked in sleep).  At the end
the stamps are copied back (cuMemcpyDtoH) and written to OUT as .npz: stamps (n x 2 uint64,
launch order), seconds, rounds.  Launch i is the i-th ca_selfstamp kernel of the run in
start order (one stream, so executions are serial).  Optional --matmul keeps a torch bf16
matmul loop (workloads/matmul_loop.load_until) running on another thread as load.

    python3 scripts/gpu_stamp_workload.py --seconds 60 --out stamps.npz
"""
import argparse
import faulthandler
import os
import random
import signal
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "agent"))
from clockalign.capture.clocks.cudadriver import check as _check  # noqa: E402
from clockalign.workloads.matmul_loop import load_until  # noqa: E402
from clockalign.workloads.selfstamp import Stamper  # noqa: E402


def main():
    faulthandler.register(signal.SIGUSR1, all_threads=True)   # a hang's Python stacks
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--per-sync", type=int, default=8)
    ap.add_argument("--spin-ns", type=int, default=20000)
    ap.add_argument("--gap-every", type=int, default=50)
    ap.add_argument("--gap-ms", type=float, default=2.0)
    ap.add_argument("--max-kernels", type=int, default=400000)
    ap.add_argument("--round-sleep-ms", type=float, default=0.0,
                    help="sleep after every round (caps the kernel rate of long runs)")
    ap.add_argument("--matmul", action="store_true")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    stop = threading.Event()
    load = None
    if a.matmul:
        load = threading.Thread(target=load_until, args=(stop,), daemon=True)
        load.start()
    st = Stamper(a.max_kernels, a.spin_ns)
    cu = st.cu
    scratch = int(_check(cu.cuMemAlloc(1 << 16), "cuMemAlloc"))
    rng = random.Random(23)
    rounds = 0
    t_end = time.monotonic() + a.seconds
    while time.monotonic() < t_end and st.n + a.per_sync <= st.n_max:
        for _ in range(a.per_sync):
            st.launch()
        _check(cu.cuMemsetD8Async(scratch, rounds & 0xFF, 1 << 16, st.stream), "cuMemsetD8Async")
        st.sync()
        rounds += 1
        if a.round_sleep_ms:
            time.sleep(a.round_sleep_ms / 1e3)
        if a.gap_every and rounds % a.gap_every == 0:
            time.sleep(rng.uniform(0, a.gap_ms) / 1e3)
    host = st.stamps()
    i = st.n
    stop.set()
    if load:
        load.join(5)
    np.savez(a.out, stamps=host, seconds=a.seconds, rounds=rounds, per_sync=a.per_sync)
    print(f"{i} stamp kernels in {rounds} rounds -> {a.out}", flush=True)


if __name__ == "__main__":
    main()
