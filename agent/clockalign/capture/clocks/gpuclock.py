"""One GPU's %globaltimer against CLOCK_MONOTONIC: ping-pong and launch+sync sandwiches.

The recorder opens its OWN CUDA context on each probed GPU (the device's primary context
in this process; the target runs in another process), loads the hand-written PTX in
ptx/globaltimer.ptx with cuModuleLoadData, and talks to one-thread kernels through mapped
pinned host memory:

- ping-pong (method 1): a short-lived kernel spins on a request word; the host reads
  MONOTONIC t0, writes a sequence number, spins until the kernel has answered with that
  number and the %globaltimer value it read after seeing it, then reads t1.  So
  t0 <= remote <= t1 holds causally.  The kernel ends after n answers, when asked to,
  or after ``idle_timeout_ns`` with no request, so it never holds the GPU.
- launch+sync (method 2, the fallback): t0, cuLaunchKernel of a kernel that stores
  %globaltimer, cuStreamSynchronize, t1.  Wider (about 9 us on an H200 against 2 us).

Every sandwich is returned raw; the align stage picks and fits.

    clock = GpuClock(0); clock.open()
    method, t0, remote, t1 = clock.burst(64)
    clock.close()

The ping-pong's host side is clockalign/native/ca_pingpong.c (built at install, called
through ctypes with the GIL released): its best round trip is shorter than a Python loop's,
and the band half-width follows the best round trip.

The kernel's answer is one 8-byte word, its %globaltimer with the request's low 5 bits in
place of the timer's (ptx ca_pingpong_word, no fence), wherever the tick kernel's values are
all multiples of 32 (word_protocol_note); else value, membar.sys, sequence number (ptx
ca_pingpong), whose fence costs the kernel a round trip per ping.  ``info["pingpong_answer"]``
says which.

The CUDA driver API comes through cudadriver.py (cuda-bindings, imported lazily).  Every
CUDA failure is a GpuClockError with one sentence; callers fall back or go on CPU-only.
"""
import ctypes
import time
from pathlib import Path

import numpy as np

from .cudadriver import (GpuClockError, bindings_version, check, decode, driver, err_text,
                         init_driver, uuid_text)

PTX_PATH = Path(__file__).with_name("ptx") / "globaltimer.ptx"

METHOD_PINGPONG = 1
METHOD_LAUNCH_SYNC = 2
METHOD_NAMES = {METHOD_PINGPONG: "ping-pong", METHOD_LAUNCH_SYNC: "launch+sync"}

# Byte offsets in the mapped buffer; ptx/globaltimer.ptx uses the same numbers.
REQ, RESP_SEQ, RESP_VAL, RESP_WORD, READY, EXIT = 0, 64, 72, 80, 128, 136
WORD_MASK = 31          # ca_pingpong_word: the request's low bits in the answer's
STAMP_SEQ, STAMP_VAL = 192, 200
TICK = 4096
TICK_MAX = 2048
BUF_BYTES = 32768
assert TICK + 8 * (TICK_MAX + 1) <= BUF_BYTES
STOP = (1 << 64) - 1
EXIT_REASONS = {1: "answered all", 2: "asked to stop", 3: "idle timeout"}

MONOTONIC = time.CLOCK_MONOTONIC


_native = None          # the C loops, by answer (one word or fenced)


def native_loop(word: bool = False):
    """ca_pingpong() (or, with word, ca_pingpong_word()) of native/ca_pingpong.c;
    NativeMissing where it is not built."""
    global _native
    if _native is None:
        from ... import native
        lib = native.load("ca_pingpong")
        for f in (lib.ca_pingpong, lib.ca_pingpong_word):
            f.restype = ctypes.c_int
            f.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int, ctypes.c_int64,
                          ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                          ctypes.POINTER(ctypes.c_int)]
        _native = {False: lib.ca_pingpong, True: lib.ca_pingpong_word}
    return _native[word]


def word_protocol_note(tick_values) -> str:
    """Why the fenced (value, fence, sequence) answer is used, or "" for the one-word one.

    The one-word answer (ptx ca_pingpong_word) drops %globaltimer's low 5 bits, so it is
    used only where every value the tick kernel saw is a multiple of 32 (the H200's are).
    """
    vals = np.asarray(tick_values, dtype=np.int64)
    if not len(vals):
        return "the tick kernel returned no %globaltimer values"
    odd = int(np.count_nonzero(vals & WORD_MASK))
    if odd:
        return (f"{odd} of {len(vals)} %globaltimer values are not multiples of "
                f"{WORD_MASK + 1} ns, so the one-word answer would lose their low bits")
    return ""


def gpu_clock_available(gpus=None) -> tuple:
    """(True, what will be probed) or (False, one sentence saying why GPU clocks are off).

    Cheap enough for ``clockalign doctor``: loads libcuda and counts devices, but makes no
    context.
    """
    try:
        count = init_driver()
    except GpuClockError as e:
        return False, str(e)
    if count == 0:
        return False, "no NVIDIA GPU is visible to CUDA (cuDeviceGetCount returned 0)"
    if not PTX_PATH.is_file():
        return False, f"the probe kernel {PTX_PATH} is missing from the installation"
    wanted = list(range(count)) if gpus is None else [int(g) for g in gpus]
    missing = [g for g in wanted if not 0 <= g < count]
    if missing:
        return False, (f"GPU{missing[0]} does not exist: CUDA sees {count} GPU(s), "
                       f"numbered 0 to {count - 1}")
    cu = driver()
    names = []
    for g in wanted:
        try:
            dev = check(cu.cuDeviceGet(g), "cuDeviceGet")
            name = decode(check(cu.cuDeviceGetName(256, dev), "cuDeviceGetName"))
            names.append(f"GPU{g} {name}")
        except GpuClockError as e:
            return False, f"GPU{g}: {e}"
    return True, "%globaltimer will be probed on " + ", ".join(names)


class _Params:
    """Kernel arguments in numpy scalars plus the void** array cuLaunchKernel wants."""

    def __init__(self, *spec):
        self.vals = [np.zeros(1, dtype=dt) for dt in spec]
        self.ptrs = np.array([v.ctypes.data for v in self.vals], dtype=np.uint64)

    def set(self, *values):
        for arr, v in zip(self.vals, values):
            arr[0] = v
        return self.ptrs.ctypes.data


class GpuClock:
    """%globaltimer of one GPU against MONOTONIC; every call from one thread.

    ``burst(n)`` returns raw sandwiches (method, t0, remote, t1); ``tick_ns`` is the
    observed resolution of %globaltimer (32 ns on an H200).
    """

    def __init__(self, ordinal: int, idle_timeout_ns: int = 50_000_000,
                 ping_timeout_s: float = 0.02, ready_timeout_s: float = 0.5, number=None):
        self.ordinal = int(ordinal)
        # n of the domain GPU<n>: the device's NVML index (store/devices.py), not the ordinal
        self.number = self.ordinal if number is None else int(number)
        self.domain = f"GPU{self.number}"
        self.idle_timeout_ns = int(idle_timeout_ns)
        self.ping_timeout_s = ping_timeout_s
        self.ready_timeout_s = ready_timeout_s
        self.info = {"domain": self.domain, "ordinal": self.ordinal}
        self.tick_ns = None
        self.tick_gcd_ns = None
        self._tick_values = np.zeros(0, dtype=np.int64)
        self._word = False       # the one-word answer (open() decides)
        self.last_exit = None   # EXIT word of the last ping-pong kernel: (reason, answers)
        self.last_note = None   # why the last ping-pong burst came back short, if it did
        self.last_start_wait_ns = None  # launch to kernel running, last ping-pong burst
        self._ctx = None
        self._dev = None
        self._mod = None
        self._stream = None
        self._host = 0
        self._seq = 0
        self._token = 0

    # -- setup -------------------------------------------------------------------------
    def open(self):
        """Context, module, stream, mapped buffer; then measure the tick.  GpuClockError."""
        cu = driver()
        count = init_driver()
        if not 0 <= self.ordinal < count:
            raise GpuClockError(f"CUDA device {self.ordinal} ({self.domain}) does not exist: "
                                f"CUDA sees {count} GPU(s)")
        where = f" on {self.domain}"
        self._dev = check(cu.cuDeviceGet(self.ordinal), "cuDeviceGet" + where)
        name = decode(check(cu.cuDeviceGetName(256, self._dev), "cuDeviceGetName" + where))
        self.info["device"] = name
        try:
            self.info["uuid"] = uuid_text(check(cu.cuDeviceGetUuid(self._dev), "cuDeviceGetUuid"))
            self.info["pci_bus_id"] = decode(check(cu.cuDeviceGetPCIBusId(32, self._dev),
                                                     "cuDeviceGetPCIBusId"))
            self.info["cuda_driver_version"] = int(check(cu.cuDriverGetVersion(),
                                                          "cuDriverGetVersion"))
        except GpuClockError:
            pass
        self.info["cuda_bindings"] = bindings_version()
        can_map = check(cu.cuDeviceGetAttribute(
            cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, self._dev),
            "cuDeviceGetAttribute" + where)
        if not can_map:
            raise GpuClockError(f"{self.domain} ({name}) cannot map host memory, "
                                "so its clock cannot be probed")
        self._ctx = check(cu.cuDevicePrimaryCtxRetain(self._dev),
                           "cuDevicePrimaryCtxRetain" + where)
        self._current()
        # A NUL-terminated copy passed by address: every cuda-bindings version takes an int.
        ptx = ctypes.create_string_buffer(PTX_PATH.read_bytes())
        self._mod = check(cu.cuModuleLoadData(ctypes.addressof(ptx)),
                           "cuModuleLoadData of globaltimer.ptx" + where)
        self._f_ping_fenced, self._f_ping_word, self._f_stamp, self._f_tick = (
            check(cu.cuModuleGetFunction(self._mod, name), f"cuModuleGetFunction({name!r})")
            for name in (b"ca_pingpong", b"ca_pingpong_word", b"ca_stamp", b"ca_tick"))
        self._stream = check(cu.cuStreamCreate(int(cu.CUstream_flags.CU_STREAM_NON_BLOCKING)),
                              "cuStreamCreate" + where)
        flags = (cu.CU_MEMHOSTALLOC_DEVICEMAP | cu.CU_MEMHOSTALLOC_PORTABLE)
        self._host = int(check(cu.cuMemHostAlloc(BUF_BYTES, flags), "cuMemHostAlloc" + where))
        self._dptr = int(check(cu.cuMemHostGetDevicePointer(self._host, 0),
                                "cuMemHostGetDevicePointer" + where))
        words = (ctypes.c_uint64 * (BUF_BYTES // 8)).from_address(self._host)
        self._mem = np.ctypeslib.as_array(words)
        self._mem[:] = 0
        # ctypes words: each .value is one fresh 8-byte load or store.
        at = ctypes.c_uint64.from_address
        self._req = at(self._host + REQ)
        self._rword = at(self._host + RESP_WORD)
        self._ready, self._exit = at(self._host + READY), at(self._host + EXIT)
        self._sseq, self._sval = at(self._host + STAMP_SEQ), at(self._host + STAMP_VAL)
        self._p_ping = _Params(np.uint64, np.uint64, np.uint64, np.uint32, np.uint64)
        self._p_stamp = _Params(np.uint64, np.uint64)
        self._p_tick = _Params(np.uint64, np.uint32, np.uint32)
        self.measure_tick()
        self.info["tick_ns"] = self.tick_ns
        self.info["tick_gcd_ns"] = self.tick_gcd_ns
        # The answer: one 8-byte word with no fence where the timer's values allow it, else
        # value, membar.sys, sequence number (the fence costs the kernel a round trip).
        why_fenced = word_protocol_note(self._tick_values)
        self._word = not why_fenced
        self._f_ping = self._f_ping_word if self._word else self._f_ping_fenced
        self.info["pingpong_answer"] = "one word" if self._word else "fenced"
        if why_fenced:
            self.info["pingpong_answer_note"] = why_fenced
        from ...native import NativeMissing
        try:
            self._native = native_loop(self._word)
        except NativeMissing as e:
            raise GpuClockError(str(e)) from None
        self.info["host_loop"] = "native"
        return self

    def _current(self):
        check(driver().cuCtxSetCurrent(self._ctx), f"cuCtxSetCurrent on {self.domain}")

    def _launch(self, f, params_ptr: int, what: str):
        check(driver().cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, self._stream, params_ptr, 0),
               f"cuLaunchKernel({what}) on {self.domain}")

    def _idle(self) -> bool:
        cu = driver()
        err = cu.cuStreamQuery(self._stream)[0]
        if int(err) == 0:
            return True
        if int(err) == int(cu.CUresult.CUDA_ERROR_NOT_READY):
            return False
        raise GpuClockError(f"the probe kernel on {self.domain} failed with {err_text(err)}")

    def _wait_idle(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not self._idle():
            if time.monotonic() > deadline:
                return False
            time.sleep(50e-6)
        return True

    def _ensure_idle(self):
        """The previous probe kernel must be gone before the buffer is reused."""
        if self._idle():
            return
        self._req.value = STOP
        if not self._wait_idle(self.idle_timeout_ns / 1e9 + 1.0):
            raise GpuClockError(f"the previous probe kernel on {self.domain} has not ended "
                                "after it was asked to stop")

    # -- measurements ------------------------------------------------------------------
    def measure_tick(self, iters: int = 1 << 22):
        """Resolution of %globaltimer: smallest step and gcd of steps between distinct reads."""
        self._current()
        self._ensure_idle()
        self._mem[TICK // 8] = 0
        self._launch(self._f_tick, self._p_tick.set(self._dptr, TICK_MAX, iters), "ca_tick")
        if not self._wait_idle(5.0):
            raise GpuClockError(f"the tick kernel on {self.domain} did not finish within 5 s")
        n = int(self._mem[TICK // 8])
        vals = self._mem[TICK // 8 + 1: TICK // 8 + 1 + n].astype(np.int64)
        self._tick_values = vals
        steps = np.diff(vals)
        steps = steps[steps > 0]
        if len(steps) == 0:
            raise GpuClockError(f"%globaltimer on {self.domain} did not advance "
                                f"in {iters} reads")
        self.tick_ns = int(steps.min())
        self.tick_gcd_ns = int(np.gcd.reduce(steps))
        return self.tick_ns

    def pingpong(self, n: int):
        """Up to n ping-pong sandwiches (t0, remote, t1 int64 arrays); short on a timeout.

        ``last_note`` says why a burst came back short.  GpuClockError on a CUDA failure.
        """
        self.last_note = None
        self.last_start_wait_ns = None
        self._current()
        self._ensure_idle()
        base = self._seq
        self._token += 1
        self._req.value = base
        self._rword.value = base & WORD_MASK    # "base answered": no stale word can match
        self._ready.value = 0
        self._exit.value = 0
        self._launch(self._f_ping, self._p_ping.set(self._dptr, base, self._token, n,
                                                    self.idle_timeout_ns), "ca_pingpong")
        t0s = np.zeros(n, dtype=np.int64)
        rem = np.zeros(n, dtype=np.int64)
        t1s = np.zeros(n, dtype=np.int64)
        launched = time.clock_gettime_ns(MONOTONIC)
        if not self._wait_ready():
            self._req.value = STOP
            self.last_note = (f"the ping-pong kernel on {self.domain} did not start within "
                              f"{self.ready_timeout_s * 1e3:.0f} ms")
            return t0s[:0], rem[:0], t1s[:0]
        # Another context's kernels on this GPU delay the start by up to a time slice.
        self.last_start_wait_ns = time.clock_gettime_ns(MONOTONIC) - launched
        timeout_ns = int(self.ping_timeout_s * 1e9)
        why = ctypes.c_int(0)
        k = self._native(self._host, base, n, timeout_ns, t0s.ctypes.data, rem.ctypes.data,
                         t1s.ctypes.data, ctypes.byref(why))
        seq = base + k + (k < n)
        if k < n:
            self.last_note = (f"ping {k + 1} of {n} on {self.domain} got no answer "
                              + ("(the kernel had ended: " + self._exit_text() + ")"
                                 if why.value == 1 else
                                 f"within {self.ping_timeout_s * 1e3:.0f} ms"))
        self._seq = seq
        if k < n:
            self._req.value = STOP
        # The kernel ends right after its n-th answer; waiting here keeps bursts apart.
        self._wait_idle(0.05)
        ev = self._exit.value
        self.last_exit = (ev & 0xFF, ev >> 8) if ev else None
        return t0s[:k], rem[:k], t1s[:k]

    def _wait_ready(self) -> bool:
        # Spin for the usual few microseconds of launch latency, then sleep between looks
        # so a GPU that is busy with another context does not cost a CPU (and the GIL).
        get = time.clock_gettime_ns
        token, ready = self._token, self._ready
        start = get(MONOTONIC)
        spin_until = start + 200_000
        deadline = start + int(self.ready_timeout_s * 1e9)
        while ready.value != token:
            now = get(MONOTONIC)
            if now > deadline:
                return ready.value == token
            if now > spin_until:
                time.sleep(20e-6)
        return True

    def _exit_text(self) -> str:
        ev = self._exit.value
        return f"{EXIT_REASONS.get(ev & 0xFF, ev & 0xFF)} after {ev >> 8} answers"

    def launch_sync(self, n: int):
        """n launch+sync sandwiches (t0, remote, t1 int64 arrays).  GpuClockError on failure."""
        cu = driver()
        self._current()
        self._ensure_idle()
        get = time.clock_gettime_ns
        t0s = np.zeros(n, dtype=np.int64)
        rem = np.zeros(n, dtype=np.int64)
        t1s = np.zeros(n, dtype=np.int64)
        for k in range(n):
            self._seq += 1
            seq = self._seq
            ptr = self._p_stamp.set(self._dptr, seq)
            t0 = get(MONOTONIC)
            self._launch(self._f_stamp, ptr, "ca_stamp")
            check(cu.cuStreamSynchronize(self._stream), f"cuStreamSynchronize on {self.domain}")
            t1 = get(MONOTONIC)
            if self._sseq.value != seq:
                raise GpuClockError(f"the stamp kernel on {self.domain} finished without "
                                    "writing its answer to mapped host memory")
            t0s[k], rem[k], t1s[k] = t0, self._sval.value, t1
        return t0s, rem, t1s

    def burst(self, n: int, method: int = METHOD_PINGPONG):
        """(method, t0, remote, t1): ping-pong, or launch+sync when asked for."""
        if method == METHOD_PINGPONG:
            return (METHOD_PINGPONG,) + self.pingpong(n)
        return (METHOD_LAUNCH_SYNC,) + self.launch_sync(n)

    # -- teardown ----------------------------------------------------------------------
    def close(self):
        """Stop any kernel, free the buffer, unload, release the context.  Never raises."""
        if self._ctx is None:
            return
        cu = driver()
        try:
            cu.cuCtxSetCurrent(self._ctx)
            if self._host:
                self._req.value = STOP
            if self._stream is not None:
                try:
                    self._wait_idle(self.idle_timeout_ns / 1e9 + 1.0)
                except GpuClockError:
                    pass
                cu.cuStreamDestroy(self._stream)
            if self._host:
                cu.cuMemFreeHost(self._host)
            if self._mod is not None:
                cu.cuModuleUnload(self._mod)
            cu.cuDevicePrimaryCtxRelease(self._dev)
        except Exception:
            pass
        finally:
            self._ctx = self._stream = self._mod = self._mem = None
            self._host = 0

    def __enter__(self):
        return self.open()

    def __exit__(self, *exc):
        self.close()
