"""numpy-facing wrappers of batch.c and reader.c (one library, native/__init__.py "reader"):
slot-ring and perf-ring drains, the reader thread, row gather, column planes.

Each call loads the library on first use: NativeMissing (one sentence) where it is not built.
"""
import ctypes

import numpy as np

from . import load

_HOW = {"raw": 0, "shuffle": 1, "delta": 2, "sparse": 3}
_u64p = ctypes.POINTER(ctypes.c_uint64)


def lib():
    """The typed library; NativeMissing where it is not built."""
    lib = load("reader")
    if not getattr(lib, "_typed", False):
        vp, i64 = ctypes.c_void_p, ctypes.c_int64
        lib.ca_drain.restype = i64
        lib.ca_drain.argtypes = [vp, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64,
                                 ctypes.c_uint32, vp, vp, i64, _u64p, _u64p, _u64p]
        lib.ca_slot_drain.restype = i64
        lib.ca_slot_drain.argtypes = [vp, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64,
                                      ctypes.c_uint32, ctypes.c_uint32, vp, vp, i64, _u64p]
        lib.ca_take.restype = None
        lib.ca_take.argtypes = [vp, vp, i64, ctypes.c_uint32, vp]
        lib.ca_encode.restype = i64
        lib.ca_encode.argtypes = [vp, i64, ctypes.c_uint32, vp, ctypes.c_int32, vp, vp]
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


def drain_into(data_addr: int, size: int, tail: int, head: int, out: np.ndarray,
               ts: np.ndarray, start: int):
    """Copy the samples of one perf ring's data area (at data_addr, size bytes) between tail
    and head into out[start:] (their timestamps into ts[start:]): (copied, lost, bad).
    out and ts must have room for (head - tail) // (12 + out.dtype.itemsize) more."""
    rec = out.dtype.itemsize
    lost, bad, new_tail = ctypes.c_uint64(0), ctypes.c_uint64(0), ctypes.c_uint64(0)
    n = lib().ca_drain(data_addr, size, tail, head, rec, out.ctypes.data + start * rec,
                       ts.ctypes.data + start * 8, len(out) - start, ctypes.byref(lost),
                       ctypes.byref(bad), ctypes.byref(new_tail))
    return n, lost.value, bad.value


def slot_drain_into(slots_addr: int, nslots: int, tail: int, head: int, kind_off: int,
                    out: np.ndarray, ts: np.ndarray, start: int):
    """Copy the committed records of one slot ring (nslots slots of out's itemsize at
    slots_addr) between positions tail and head into out[start:] (timestamps into ts[start:]),
    clearing each one's kind: (copied, new tail)."""
    rec = out.dtype.itemsize
    new_tail = ctypes.c_uint64(0)
    n = lib().ca_slot_drain(slots_addr, nslots, tail, head, rec, kind_off,
                            out.ctypes.data + start * rec, ts.ctypes.data + start * 8,
                            len(out) - start, ctypes.byref(new_tail))
    return n, new_tail.value


def take(rows: np.ndarray, order: np.ndarray):
    """rows[order] of a structured array."""
    rows = np.ascontiguousarray(rows)
    order = np.ascontiguousarray(order, dtype=np.int64)
    out = np.empty(len(order), rows.dtype)
    lib().ca_take(rows.ctypes.data, order.ctypes.data, len(order), rows.dtype.itemsize,
                  out.ctypes.data)
    return out


def encode(rows: np.ndarray, spec):
    """(uncompressed payload bytes, sparse sizes) of a contiguous structured array whose
    fields are [(name, dtype, how), ...] in spec order, or None where batch.c has no
    encoding for it."""
    rows = np.ascontiguousarray(rows)
    fields = rows.dtype.fields
    cols = np.array([(fields[name][1], np.dtype(dt).itemsize, _HOW[how])
                     for name, dt, how in spec], np.int32)
    n = len(rows)
    nsparse = sum(1 for _, _, how in spec if how == "sparse")
    width = sum(np.dtype(dt).itemsize for _, dt, _ in spec)
    out = np.empty(n * width + nsparse * ((n + 7) // 8) + 8, np.uint8)
    sizes = np.zeros(max(nsparse, 1), np.int64)
    total = lib().ca_encode(rows.ctypes.data, n, rows.dtype.itemsize, cols.ctypes.data,
                            len(cols), out.ctypes.data, sizes.ctypes.data)
    if total < 0:
        return None
    return memoryview(out)[:total], [int(s) for s in sizes[:nsparse]]
