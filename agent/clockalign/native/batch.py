"""numpy-facing wrappers of batch.c: slot-ring and perf-ring drains, row gather, column planes.

Each function returns None when the C helper is not available (see ``available``); callers
keep a numpy path that gives the same result.
"""
import ctypes

import numpy as np

from . import load, why_not

_HOW = {"raw": 0, "shuffle": 1, "delta": 2, "sparse": 3}
_u8p = ctypes.POINTER(ctypes.c_uint8)
_u64p = ctypes.POINTER(ctypes.c_uint64)
_i64p = ctypes.POINTER(ctypes.c_int64)
_i32p = ctypes.POINTER(ctypes.c_int32)


def _lib():
    lib = load("batch")
    if lib is not None and not getattr(lib, "_typed", False):
        lib.ca_drain.restype = ctypes.c_int64
        lib.ca_drain.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64,
                                 ctypes.c_uint64, ctypes.c_uint32, ctypes.c_void_p,
                                 ctypes.c_void_p, ctypes.c_int64, _u64p, _u64p, _u64p]
        lib.ca_slot_drain.restype = ctypes.c_int64
        lib.ca_slot_drain.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64,
                                      ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint32,
                                      ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, _u64p]
        lib.ca_take.restype = None
        lib.ca_take.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                ctypes.c_uint32, ctypes.c_void_p]
        lib.ca_encode.restype = ctypes.c_int64
        lib.ca_encode.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_uint32,
                                  ctypes.c_void_p, ctypes.c_int32, ctypes.c_void_p,
                                  ctypes.c_void_p]
        lib._typed = True
    return lib


def reader_lib():
    """native/reader.c (the GIL-free buffer reader thread), typed, or None."""
    lib = load("reader")
    if lib is not None and not getattr(lib, "_typed", False):
        vp, i64 = ctypes.c_void_p, ctypes.c_int64
        lib.ca_reader_start.restype = vp
        lib.ca_reader_start.argtypes = [vp, vp, ctypes.c_int, ctypes.c_uint64, ctypes.c_uint32,
                                        i64, i64, ctypes.c_int]
        lib.ca_reader_pending.restype = i64
        lib.ca_reader_pending.argtypes = [vp]
        lib.ca_reader_take.restype = i64
        lib.ca_reader_take.argtypes = [vp, vp, vp, i64, ctypes.POINTER(ctypes.c_int32)]
        lib.ca_reader_stats.restype = None
        lib.ca_reader_stats.argtypes = [vp, vp, vp]
        for f in ("ca_reader_stop", "ca_reader_free"):
            getattr(lib, f).restype = None
            getattr(lib, f).argtypes = [vp]
        lib._typed = True
    return lib


def available() -> bool:
    return _lib() is not None


def why_unavailable() -> str:
    return why_not("batch")


def drain_into(data_addr: int, size: int, tail: int, head: int, out: np.ndarray,
               ts: np.ndarray, start: int):
    """Copy the samples of one perf ring's data area (at data_addr, size bytes) between tail
    and head into out[start:] (their timestamps into ts[start:]): (copied, lost, bad), or
    None without the helper.  out and ts must have room for (head - tail) // (12 + out.dtype.itemsize) more."""
    lib = _lib()
    if lib is None:
        return None
    rec = out.dtype.itemsize
    lost, bad, new_tail = ctypes.c_uint64(0), ctypes.c_uint64(0), ctypes.c_uint64(0)
    n = lib.ca_drain(data_addr, size, tail, head, rec, out.ctypes.data + start * rec,
                     ts.ctypes.data + start * 8, len(out) - start, ctypes.byref(lost),
                     ctypes.byref(bad), ctypes.byref(new_tail))
    return n, lost.value, bad.value


def slot_drain_into(slots_addr: int, nslots: int, tail: int, head: int, kind_off: int,
                    out: np.ndarray, ts: np.ndarray, start: int):
    """Copy the committed records of one slot ring (nslots slots of out's itemsize at
    slots_addr) between positions tail and head into out[start:] (timestamps into ts[start:]),
    clearing each one's kind: (copied, new tail), or None without the helper."""
    lib = _lib()
    if lib is None:
        return None
    rec = out.dtype.itemsize
    new_tail = ctypes.c_uint64(0)
    n = lib.ca_slot_drain(slots_addr, nslots, tail, head, rec, kind_off,
                          out.ctypes.data + start * rec, ts.ctypes.data + start * 8,
                          len(out) - start, ctypes.byref(new_tail))
    return n, new_tail.value


def take(rows: np.ndarray, order: np.ndarray):
    """rows[order] for a contiguous structured array, or None."""
    lib = _lib()
    if lib is None or not rows.flags.c_contiguous:
        return None
    order = np.ascontiguousarray(order, dtype=np.int64)
    out = np.empty(len(order), rows.dtype)
    lib.ca_take(rows.ctypes.data, order.ctypes.data, len(order), rows.dtype.itemsize,
                out.ctypes.data)
    return out


def encode(rows: np.ndarray, spec):
    """(uncompressed payload bytes, sparse sizes) of a contiguous structured array whose
    fields are [(name, dtype, how), ...] in spec order, or None."""
    lib = _lib()
    if lib is None or not rows.flags.c_contiguous:
        return None
    fields = rows.dtype.fields
    cols = np.array([(fields[name][1], np.dtype(dt).itemsize, _HOW[how])
                     for name, dt, how in spec], np.int32)
    n = len(rows)
    nsparse = sum(1 for _, _, how in spec if how == "sparse")
    width = sum(np.dtype(dt).itemsize for _, dt, _ in spec)
    out = np.empty(n * width + nsparse * ((n + 7) // 8) + 8, np.uint8)
    sizes = np.zeros(max(nsparse, 1), np.int64)
    total = lib.ca_encode(rows.ctypes.data, n, rows.dtype.itemsize, cols.ctypes.data,
                          len(cols), out.ctypes.data, sizes.ctypes.data)
    if total < 0:
        return None
    return memoryview(out)[:total], [int(s) for s in sizes[:nsparse]]
