"""Bulk reader for a BPF ring buffer of fixed-size records, mapped straight into numpy.

BCC's ring-buffer API calls back into Python once per record; at a million events a
second that alone would eat the CPU.  Every clockalign record has the same size, so the
records between the consumer and producer positions sit at a fixed stride in the
(double-mapped, hence contiguous across the wrap) data area, and one numpy view decodes a
whole batch.  The protocol is the kernel's (kernel/bpf/ringbuf.c), as libbpf implements it:

    page 0            consumer_pos (u64, we write it)
    page 1            producer_pos (u64)
    page 2..          data, mapped twice; each record = u32 len|BUSY|DISCARD, u32 pg_off, body

    ring = RingReader(map_fd, size_bytes, EVENT_DTYPE)
    batch = ring.read()          # numpy array of EVENT_DTYPE (a copy), possibly empty
"""
import mmap
import struct

import numpy as np

BUSY_BIT = 1 << 31
DISCARD_BIT = 1 << 30
HDR = 8
_U64 = struct.Struct("<Q")


class RingLayoutError(RuntimeError):
    """A record of an unexpected size appeared: the BPF side and EVENT_DTYPE disagree."""


class RingReader:
    def __init__(self, map_fd: int, size: int, dtype: np.dtype):
        if size & (size - 1):
            raise ValueError("ring buffer size must be a power of two")
        page = mmap.PAGESIZE
        self.size = size
        self.mask = size - 1
        self.dtype = np.dtype(dtype)
        self.stride = (self.dtype.itemsize + HDR + 7) & ~7
        self._cons = mmap.mmap(map_fd, page, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE,
                               offset=0)
        self._prod = mmap.mmap(map_fd, page + 2 * size, mmap.MAP_SHARED, mmap.PROT_READ,
                               offset=page)
        self._page = page
        self._rec = np.dtype({"names": ["len", "pg_off", "body"],
                              "formats": ["<u4", "<u4", self.dtype],
                              "offsets": [0, 4, HDR], "itemsize": self.stride})
        self.records = 0
        self.peak_fill = 0.0      # largest fraction of the ring seen pending at a read

    def pending_bytes(self) -> int:
        return _U64.unpack_from(self._prod, 0)[0] - _U64.unpack_from(self._cons, 0)[0]

    def read(self, max_records: int = 1 << 20) -> np.ndarray:
        """Copy out every committed record (up to max_records) and release its space."""
        cons = _U64.unpack_from(self._cons, 0)[0]
        prod = _U64.unpack_from(self._prod, 0)[0]
        self.peak_fill = max(self.peak_fill, (prod - cons) / self.size)
        n = min((prod - cons) // self.stride, max_records)
        if n <= 0:
            return np.empty(0, dtype=self.dtype)
        start = self._page + (cons & self.mask)
        recs = np.frombuffer(self._prod, dtype=self._rec, count=n, offset=start)
        lens = recs["len"]
        busy = np.flatnonzero(lens & BUSY_BIT)
        if len(busy):
            n = int(busy[0])
            recs, lens = recs[:n], lens[:n]
        if n == 0:
            return np.empty(0, dtype=self.dtype)
        if np.any((lens & ~np.uint32(DISCARD_BIT)) != self.dtype.itemsize):
            raise RingLayoutError("ring buffer record size differs from EVENT_DTYPE")
        keep = (lens & DISCARD_BIT) == 0
        out = recs["body"][keep].copy() if not keep.all() else recs["body"].copy()
        _U64.pack_into(self._cons, 0, cons + n * self.stride)
        self.records += len(out)
        return out

    def close(self):
        self._cons.close()
        self._prod.close()
