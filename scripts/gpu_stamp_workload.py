#!/usr/bin/env python3
"""Kernels that stamp their own %globaltimer, for checking GPU activity timestamps.

Each ``ca_selfstamp`` kernel (one thread) reads %globaltimer as it starts, spins for
--spin-ns, reads it again and stores both in stamps[i].  Rounds of --per-sync launches on
one stream, a cuMemsetD8Async, then cuStreamSynchronize; every --gap-every rounds a pause
of up to --gap-ms (idle GPU time with the launching thread blocked in sleep).  At the end
the stamps are copied back (cuMemcpyDtoH) and written to OUT as .npz: stamps (n x 2 uint64,
launch order), seconds, rounds.  Launch i is the i-th ca_selfstamp kernel of the run in
start order (one stream, so executions are serial).  Optional --matmul keeps a torch bf16
matmul loop running on another thread as load.

    python3 scripts/gpu_stamp_workload.py --seconds 60 --out stamps.npz
"""
import argparse
import ctypes
import os
import random
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "agent"))
from clockalign.capture.gpuclock import _check, driver, init_driver  # noqa: E402

PTX = r"""
.version 6.0
.target sm_60
.address_size 64
.visible .entry ca_selfstamp(.param .u64 p_out, .param .u32 p_i, .param .u64 p_spin)
{
        .reg .pred      %p;
        .reg .b32       %i;
        .reg .b64       %out, %spin, %g0, %g1, %dt, %off, %addr;
        ld.param.u64    %out, [p_out];
        ld.param.u32    %i, [p_i];
        ld.param.u64    %spin, [p_spin];
        mov.u64         %g0, %globaltimer;
SPIN:
        mov.u64         %g1, %globaltimer;
        sub.u64         %dt, %g1, %g0;
        setp.lt.u64     %p, %dt, %spin;
        @%p bra         SPIN;
        mul.wide.u32    %off, %i, 16;
        add.u64         %addr, %out, %off;
        st.global.u64   [%addr], %g0;
        st.global.u64   [%addr+8], %g1;
        ret;
}
"""


def matmul_load(stop):
    import torch
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    while not stop.is_set():
        for _ in range(20):
            a @ a
        torch.cuda.synchronize()


class Stamper:
    """The self-stamping kernel loaded in the current process's primary context on GPU 0."""

    def __init__(self, n_max, spin_ns):
        cu = self.cu = driver()
        init_driver()
        dev = _check(cu.cuDeviceGet(0), "cuDeviceGet")
        ctx = _check(cu.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
        _check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        self._src = ctypes.create_string_buffer(PTX.encode())
        mod = _check(cu.cuModuleLoadData(ctypes.addressof(self._src)), "cuModuleLoadData")
        self.fn = _check(cu.cuModuleGetFunction(mod, b"ca_selfstamp"), "cuModuleGetFunction")
        self.stream = _check(cu.cuStreamCreate(0), "cuStreamCreate")
        self.n_max = n_max
        self.out = int(_check(cu.cuMemAlloc(n_max * 16), "cuMemAlloc"))
        self._p = [np.array([self.out], dtype=np.uint64), np.zeros(1, dtype=np.uint32),
                   np.array([spin_ns], dtype=np.uint64)]
        self.params = np.array([p.ctypes.data for p in self._p], dtype=np.uint64)
        self.n = 0

    def launch(self):
        self._p[1][0] = self.n
        _check(self.cu.cuLaunchKernel(self.fn, 1, 1, 1, 1, 1, 1, 0, self.stream,
                                      self.params.ctypes.data, 0), "cuLaunchKernel")
        self.n += 1

    def sync(self):
        _check(self.cu.cuStreamSynchronize(self.stream), "cuStreamSynchronize")

    def stamps(self):
        host = np.zeros((self.n, 2), dtype=np.uint64)
        _check(self.cu.cuMemcpyDtoH(host.ctypes.data, self.out, self.n * 16), "cuMemcpyDtoH")
        return host


def main():
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
        load = threading.Thread(target=matmul_load, args=(stop,), daemon=True)
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
