"""Per-CPU perf buffers for BPF records, opened and mapped by us, read in bulk with numpy.

Why not the BPF ring buffer: on these 6.18 kernels `bpf_ringbuf_reserve` failed about once
in 100k-400k records with ONE producer and the ring 3 % full (scripts/bench_probe_cost.py,
results/overhead/), so "no drops below the limit" cannot hold; its one lock is also shared
by every CPU.  `bpf_perf_event_output` writes to the current CPU's own buffer without a
lock and fails only when that buffer is full; a full buffer also leaves a PERF_RECORD_LOST
with the exact count.

Why not BCC's open_perf_buffer: it calls back into Python once per record and asks for a
wakeup (an IRQ work, a self-IPI: a VM exit here) after every record.  We never sleep on
the buffers (the recorder polls), so the wakeup watermark is set past the buffer's size.

Each record is a PERF_RECORD_SAMPLE: header(8) | u32 raw size | raw data | pad to 8, so with
one fixed-size BPF struct every sample has the same stride and one numpy view decodes a
whole CPU's batch; anything else in the buffer (LOST records) is stepped over and counted.

    bufs = PerfBuffers(bpf["events"], per_cpu_bytes=4 << 20, dtype=EVENT_DTYPE)
    batch = bufs.read()              # EVENT_DTYPE array, every CPU, sorted by ts
"""
import ctypes
import mmap
import os
import struct

import numpy as np

from ..native import batch as native_batch

PERF_TYPE_SOFTWARE = 1
PERF_COUNT_SW_BPF_OUTPUT = 10
PERF_SAMPLE_RAW = 1 << 10
PERF_FLAG_FD_CLOEXEC = 1 << 3
ATTR_WATERMARK = 1 << 14
PERF_RECORD_LOST = 2
PERF_RECORD_SAMPLE = 9
NR_PERF_EVENT_OPEN = 298          # x86-64
PERF_EVENT_IOC_ENABLE = 0x2400
HEAD_OFF, TAIL_OFF = 1024, 1032   # perf_event_mmap_page.data_head / data_tail
_U64 = struct.Struct("<Q")
_HDR = struct.Struct("<IHH")
_libc = ctypes.CDLL(None, use_errno=True)


class PerfAttr(ctypes.Structure):
    """perf_event_attr up to config1 (PERF_ATTR_SIZE_VER0, 64 bytes)."""
    _fields_ = [("type", ctypes.c_uint32), ("size", ctypes.c_uint32),
                ("config", ctypes.c_uint64), ("sample_period", ctypes.c_uint64),
                ("sample_type", ctypes.c_uint64), ("read_format", ctypes.c_uint64),
                ("flags", ctypes.c_uint64), ("wakeup_watermark", ctypes.c_uint32),
                ("bp_type", ctypes.c_uint32), ("config1", ctypes.c_uint64)]


def online_cpus():
    """CPU numbers from /sys/devices/system/cpu/online ("0-3,6")."""
    with open("/sys/devices/system/cpu/online") as f:
        text = f.read().strip()
    cpus = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


def per_cpu_size(total_bytes: int, ncpu: int, minimum: int = mmap.PAGESIZE) -> int:
    """Data bytes per CPU: total / ncpu rounded down to a power of two pages, at least min."""
    page = mmap.PAGESIZE
    each = max(minimum, total_bytes // max(1, ncpu))
    pages = max(1, each // page)
    return page * (1 << (pages.bit_length() - 1))


def _open_event(cpu: int, data_bytes: int) -> int:
    attr = PerfAttr(type=PERF_TYPE_SOFTWARE, size=ctypes.sizeof(PerfAttr),
                    config=PERF_COUNT_SW_BPF_OUTPUT, sample_period=1,
                    sample_type=PERF_SAMPLE_RAW, flags=ATTR_WATERMARK,
                    wakeup_watermark=data_bytes - mmap.PAGESIZE)
    fd = _libc.syscall(NR_PERF_EVENT_OPEN, ctypes.byref(attr), -1, cpu, -1,
                       PERF_FLAG_FD_CLOEXEC)
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"perf_event_open on CPU {cpu}: {os.strerror(err)}")
    return fd


def sample_dtype(body: np.dtype) -> np.dtype:
    """A PERF_RECORD_SAMPLE carrying one raw record of dtype body: header(8) | u32 size |
    body | padding to 8 bytes."""
    body = np.dtype(body)
    stride = 8 + ((body.itemsize + 4 + 7) & ~7)
    return np.dtype({"names": ["type", "size", "body"], "formats": ["<u4", "<u2", body],
                     "offsets": [0, 6, 12], "itemsize": stride})


def parse_samples(buf: bytes, rec: np.dtype):
    """([arrays of bodies], records lost, samples of another size) from one CPU's batch.
    Runs of fixed-stride samples are numpy views; whatever breaks the stride (a
    PERF_RECORD_LOST after an overflow) is stepped over by its own size and counted, so an
    overloaded buffer costs no Python per record.  The same counts as native/batch.c's."""
    stride = rec.itemsize
    parts, lost, malformed, pos, end = [], 0, 0, 0, len(buf)
    while end - pos >= 8:
        n = (end - pos) // stride
        if n:
            recs = np.frombuffer(buf, dtype=rec, count=n, offset=pos)
            bad = np.flatnonzero((recs["type"] != PERF_RECORD_SAMPLE) | (recs["size"] != stride))
            good = int(bad[0]) if len(bad) else n
            if good:
                parts.append(recs["body"][:good])
            pos += good * stride
            if good == n:
                continue
        typ, _, size = _HDR.unpack_from(buf, pos)
        if size < 8:
            break                                  # not a record: the kernel never writes one
        if typ == PERF_RECORD_LOST and pos + 24 <= end:
            lost += _U64.unpack_from(buf, pos + 16)[0]
        elif typ == PERF_RECORD_SAMPLE:
            malformed += 1
        pos += size
    return parts, lost, malformed


class PerfBuffers:
    """The per-CPU buffers behind one BPF_PERF_OUTPUT map; read() drains them all."""

    def __init__(self, table, per_cpu_bytes: int, dtype: np.dtype, cpus=None,
                 native: bool = True):
        self.dtype = np.dtype(dtype)
        self.size = per_cpu_bytes
        self.mask = per_cpu_bytes - 1
        self._rec = sample_dtype(self.dtype)
        self.stride = self._rec.itemsize
        self._page = mmap.PAGESIZE
        self._bufs = []
        self.records = 0
        self.lost = 0                 # from PERF_RECORD_LOST: the kernel's own count
        self.malformed = 0            # samples of another size than dtype's (never expected)
        self.native = native_batch.available() and native
        self._addrs = []              # ctypes views of each mapping's data area (native drain)
        self.peak_fill = 0.0
        self.last_fill = 0.0          # the fullest CPU buffer at the latest read
        self._reader = None           # native/reader.c's thread, once start_reader() ran
        self._ctl = []                # ctypes views of each mapping's control page (reader)
        self.reader_held_s = 0.0      # time that thread held back (its staging area full)
        try:
            for cpu in (online_cpus() if cpus is None else cpus):
                fd = _open_event(cpu, per_cpu_bytes)
                mm = mmap.mmap(fd, self._page + per_cpu_bytes, mmap.MAP_SHARED,
                               mmap.PROT_READ | mmap.PROT_WRITE)
                self._bufs.append((cpu, fd, mm))
                if self.native:
                    self._addrs.append(ctypes.c_char.from_buffer(mm, self._page))
                table[table.Key(cpu)] = table.Leaf(fd)
        except BaseException:
            self.close()
            raise

    def _drain_one(self, mm) -> list:
        tail, head = self._fill(mm)
        avail = head - tail
        if avail <= 0:
            return []
        start = self._page + (tail & self.mask)
        end = start + avail
        limit = self._page + self.size
        buf = mm[start:end] if end <= limit else mm[start:limit] + mm[self._page:end - self.size]
        _U64.pack_into(mm, TAIL_OFF, head)
        parts, lost, malformed = parse_samples(buf, self._rec)
        self.lost += lost
        self.malformed += malformed
        return parts

    def read(self) -> np.ndarray:
        """Every record now in any CPU's buffer, as one array sorted by ts (a copy); with the
        reader thread running, what it has gathered."""
        if self._reader is not None:
            batch = self._take()
            if len(batch) or not self._reader_stopped:
                return batch
            self._free_reader()       # stopped and empty: the buffers are read here again
        return self._read_native() if self.native else self._read_numpy()

    # ------------------------------------------------------------- the C reader thread
    def start_reader(self, max_bytes: int = 256 << 20, poll_s: float = 0.05) -> bool:
        """Hand the reading to a C thread (native/reader.c) that needs no GIL; read() then
        takes what it gathered.  It gathers at most max_bytes of records, then leaves the
        buffers to fill (the kernel counts what it cannot send).  False where the helper is
        not available (the caller reads from a Python thread instead)."""
        lib = native_batch.reader_lib()
        if lib is None or not self.native or not self._bufs or self._reader is not None:
            return False
        n = len(self._bufs)
        self._ctl = [ctypes.c_char.from_buffer(mm, 0) for _, _, mm in self._bufs]
        ctl = (ctypes.c_void_p * n)(*[ctypes.addressof(c) for c in self._ctl])
        data = (ctypes.c_void_p * n)(*[ctypes.addressof(a) for a in self._addrs])
        r = lib.ca_reader_start(ctl, data, n, self.size, self.dtype.itemsize,
                                max(1, max_bytes // self.dtype.itemsize), int(poll_s * 1e9))
        if not r:
            self._ctl = []
            return False
        self._reader, self._reader_stopped, self._lib = r, False, lib
        self._base = {"lost": self.lost, "malformed": self.malformed}
        return True

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
        out = self._in_ts_order(out[:n], ts[:n], cpus.value)
        self.records += n
        return out

    def _free_reader(self):
        self._lib.ca_reader_free(self._reader)
        self._reader = None
        self._ctl = []

    def _fill(self, mm):
        """(tail, head) of one buffer, with the fill bookkeeping."""
        head = _U64.unpack_from(mm, HEAD_OFF)[0]
        tail = _U64.unpack_from(mm, TAIL_OFF)[0]
        if head > tail:
            self.last_fill = max(self.last_fill, (head - tail) / self.size)
            self.peak_fill = max(self.peak_fill, self.last_fill)
        return tail, head

    def _in_ts_order(self, out, ts, cpus):
        """Rows of one read, merged into timestamp order where more than one CPU's buffer
        (or, for the C thread, more than one pass) gave rows: one argsort, one row gather."""
        if cpus > 1 and len(out) > 1 and "ts" in self.dtype.names and np.any(ts[1:] < ts[:-1]):
            return native_batch.take(out, np.argsort(ts, kind="stable"))
        return out

    def _read_native(self) -> np.ndarray:
        """The C helper copies each CPU's samples straight into one array (no per-CPU views,
        no concatenation); a merge of several CPUs is one argsort and one row gather."""
        self.last_fill = 0.0
        spans = [(self._fill(mm), mm, addr) for (_, _, mm), addr in zip(self._bufs, self._addrs)]
        room = sum(max(head - tail, 0) for (tail, head), _, _ in spans) \
            // (12 + self.dtype.itemsize) + 1        # a sample copied takes at least this
        out = np.empty(room, self.dtype)
        ts = np.empty(room, np.uint64)
        n, cpus = 0, 0
        for (tail, head), mm, addr in spans:
            if head <= tail:
                continue
            got, lost, bad = native_batch.drain_into(ctypes.addressof(addr), self.size, tail,
                                                     head, out, ts, n)
            _U64.pack_into(mm, TAIL_OFF, head)
            self.lost += lost
            self.malformed += bad
            cpus += got > 0
            n += got
        out = self._in_ts_order(out[:n], ts[:n], cpus)
        self.records += n
        return out

    def _read_numpy(self) -> np.ndarray:
        parts = []
        self.last_fill = 0.0
        for _, _, mm in self._bufs:
            parts.extend(self._drain_one(mm))
        if not parts:
            return np.empty(0, dtype=self.dtype)
        out = np.concatenate(parts) if len(parts) > 1 else parts[0].copy()
        if len(parts) > 1 and "ts" in self.dtype.names:
            out = out[np.argsort(out["ts"], kind="stable")]
        self.records += len(out)
        return out

    def close(self):
        if self._reader is not None:
            self.stop_reader()
            self._free_reader()
        self._addrs = []              # the mappings cannot close while a view is exported
        for _, fd, mm in self._bufs:
            mm.close()
            os.close(fd)
        self._bufs = []
