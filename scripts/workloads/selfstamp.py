"""A kernel that stamps its own %globaltimer, for checking GPU activity timestamps
(scripts/workloads/stamp_kernels.py, scripts/gpu/kineto_stamps.py, tests/gpu).

Each ``ca_selfstamp`` kernel (one thread) reads %globaltimer as it starts, spins for
spin_ns, reads it again and stores both in stamps[i]: launch i is the i-th kernel.

    st = Stamper(n_max=200_000, spin_ns=20_000)   # GPU 0's primary context, own stream
    st.launch(); st.sync()
    st.stamps()                                   # (n x 2) uint64 GPU ns, launch order
"""
import ctypes

import numpy as np

from clockalign.capture.clocks.cudadriver import check as ok, driver, init_driver

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


class Stamper:
    """The self-stamping kernel loaded in the current process's primary context on GPU 0."""

    def __init__(self, n_max, spin_ns):
        cu = self.cu = driver()
        init_driver()
        dev = ok(cu.cuDeviceGet(0), "cuDeviceGet")
        ctx = ok(cu.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
        ok(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        self._src = ctypes.create_string_buffer(PTX.encode())
        mod = ok(cu.cuModuleLoadData(ctypes.addressof(self._src)), "cuModuleLoadData")
        self.fn = ok(cu.cuModuleGetFunction(mod, b"ca_selfstamp"), "cuModuleGetFunction")
        self.stream = ok(cu.cuStreamCreate(0), "cuStreamCreate")
        self.n_max = n_max
        self.out = int(ok(cu.cuMemAlloc(n_max * 16), "cuMemAlloc"))
        self._p = [np.array([self.out], dtype=np.uint64), np.zeros(1, dtype=np.uint32),
                   np.array([spin_ns], dtype=np.uint64)]
        self.params = np.array([p.ctypes.data for p in self._p], dtype=np.uint64)
        self.n = 0

    def launch(self):
        self._p[1][0] = self.n
        ok(self.cu.cuLaunchKernel(self.fn, 1, 1, 1, 1, 1, 1, 0, self.stream,
                                      self.params.ctypes.data, 0), "cuLaunchKernel")
        self.n += 1

    def sync(self):
        ok(self.cu.cuStreamSynchronize(self.stream), "cuStreamSynchronize")

    def stamps(self):
        host = np.zeros((self.n, 2), dtype=np.uint64)
        ok(self.cu.cuMemcpyDtoH(host.ctypes.data, self.out, self.n * 16), "cuMemcpyDtoH")
        return host
