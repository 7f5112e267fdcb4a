"""What the two per-CPU event buffer kinds share: reading them from a C thread, merging CPUs.

The BPF programs write each record to the buffer of the CPU they run on: a slot ring
(slotring.py), or a perf buffer (perfbuf.py) on a kernel where the slot rings do not load.
Either is read in bulk into one EVENT_DTYPE array in timestamp order by native/reader.c's
thread, which needs no GIL, once start_reader() ran: read() takes what it gathered.  Before
the thread starts and after it stopped, read() makes one pass over every CPU itself (the C
drain of batch.c, called from Python).

A subclass opens its buffers and gives: _reader_spans() (each CPU's head/tail words and data
area, the data area's bytes, the reader mode), _read_pass() (one pass over every CPU),
_close_buffers().
"""
import ctypes

import numpy as np

from ...native import batch as native_batch


class EventBuffers:
    READER_MODE = None            # native/reader.c's mode number for this kind

    def __init__(self, dtype):
        self.dtype = np.dtype(dtype)
        self.records = 0
        self.lost = 0                 # counted by the kernel where the kind has such a count
        self.malformed = 0            # records of another size than dtype's (never expected)
        self.peak_fill = 0.0
        self.last_fill = 0.0          # the fullest CPU buffer at the latest read
        self._reader = None           # native/reader.c's thread, once start_reader() ran
        self._reader_views = []       # ctypes views the C thread reads through
        self.reader_held_s = 0.0      # time that thread held back (its staging area full)

    def read(self) -> np.ndarray:
        """Every record now in any CPU's buffer, as one array sorted by ts (a copy); with the
        reader thread running, what it has gathered."""
        if self._reader is not None:
            batch = self._take()
            if len(batch) or not self._reader_stopped:
                return batch
            self._free_reader()       # stopped and empty: the buffers are read here again
        return self._read_pass()

    # ------------------------------------------------------------- the C reader thread
    def start_reader(self, max_bytes: int = 256 << 20, poll_s: float = 0.05) -> None:
        """Hand the reading to a C thread (native/reader.c) that needs no GIL; read() then
        takes what it gathered.  It gathers at most max_bytes of records, then leaves the
        buffers to fill (what cannot be written is counted).  NativeMissing where the helper
        is not built; OSError where the thread cannot start."""
        lib = native_batch.lib()
        if self._reader is not None:
            raise RuntimeError("the reader thread runs already")
        spans = self._reader_spans()
        ctls, datas, size, self._reader_views = spans
        n = len(ctls)
        ctl = (ctypes.c_void_p * n)(*ctls)
        data = (ctypes.c_void_p * n)(*datas)
        r = lib.ca_reader_start(ctl, data, n, size, self.dtype.itemsize,
                                max(1, max_bytes // self.dtype.itemsize), int(poll_s * 1e9),
                                self.READER_MODE)
        if not r:
            self._reader_views = []
            raise OSError("the event buffers' reader thread could not start (out of memory?)")
        self._reader, self._reader_stopped, self._lib = r, False, lib
        self._base = {"lost": self.lost, "malformed": self.malformed}

    @property
    def reader_running(self) -> bool:
        """The C reader thread owns the buffers (started, and not yet stopped and emptied)."""
        return self._reader is not None

    def reader_pending(self) -> int:
        """Records the C thread has gathered and nobody took yet."""
        return self._lib.ca_reader_pending(self._reader) if self._reader is not None else 0

    def stop_reader(self) -> None:
        """Stop the C thread (it reads once more first); read() returns the rest."""
        if self._reader is not None and not self._reader_stopped:
            self._lib.ca_reader_stop(self._reader)
            self._reader_stopped = True
            self._reader_stats()

    def _reader_stats(self):
        st, fill = (ctypes.c_uint64 * 3)(), (ctypes.c_double * 2)()
        self._lib.ca_reader_stats(self._reader, st, fill)
        self.lost = self._base["lost"] + st[0]
        self.malformed = self._base["malformed"] + st[1]
        self.last_fill, self.peak_fill = fill[0], max(self.peak_fill, fill[1])
        self.reader_held_s = st[2] / 1e9

    def _take(self) -> np.ndarray:
        n = self._lib.ca_reader_pending(self._reader)
        self._reader_stats()
        if n <= 0:
            return np.empty(0, dtype=self.dtype)
        out, ts = np.empty(n, self.dtype), np.empty(n, np.uint64)
        cpus = ctypes.c_int32(0)
        n = self._lib.ca_reader_take(self._reader, out.ctypes.data, ts.ctypes.data, n,
                                     ctypes.byref(cpus))
        return self._took(out, ts, n, cpus.value)

    def _free_reader(self):
        self._lib.ca_reader_free(self._reader)
        self._reader = None
        self._reader_views = []

    def _in_ts_order(self, out, ts, cpus):
        """Rows of one read, merged into timestamp order where more than one CPU's buffer
        (or, for the C thread, more than one pass) gave rows: one argsort, one row gather."""
        if cpus > 1 and len(out) > 1 and "ts" in (self.dtype.names or ()) \
                and np.any(ts[1:] < ts[:-1]):
            return native_batch.take(out, np.argsort(ts, kind="stable"))
        return out

    def _took(self, out, ts, n, cpus):
        """out[:n], read from cpus buffers in one pass, in timestamp order and counted."""
        out = self._in_ts_order(out[:n], ts[:n], cpus)
        self.records += n
        return out

    def _note_fill(self, fill: float):
        if fill > 0:
            self.last_fill = max(self.last_fill, fill)
            self.peak_fill = max(self.peak_fill, self.last_fill)

    def close(self):
        if self._reader is not None:
            self.stop_reader()
            self._free_reader()
        self._close_buffers()
