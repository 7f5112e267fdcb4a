"""Per-CPU perf buffers for BPF records, opened and mapped by us, read in bulk by C.

The transport before the slot rings (slotring.py), kept as their automatic fall-back where
they do not load (no BPF compare-and-swap or mmapable arrays: before Linux 5.12;
probes/program.py): sending a record through bpf_perf_event_output cost the CUDA return
probe 68-161 ns more than writing it in place into a slot ring on the H200
(results/overhead.md, runs h200-12 and h200-13).

Why not the BPF ring buffer: on these 6.18 kernels `bpf_ringbuf_reserve` failed about once
in 100k-400k records with ONE producer and the ring 3 % full (scripts/bench/probe_cost.py,
results/overhead/), so "no drops below the limit" cannot hold; its one lock is also shared
by every CPU.  `bpf_perf_event_output` writes to the current CPU's own buffer without a
lock and fails only when that buffer is full; a full buffer also leaves a PERF_RECORD_LOST
with the exact count.

Why not BCC's open_perf_buffer: it calls back into Python once per record and asks for a
wakeup (an IRQ work, a self-IPI: a VM exit here) after every record.  We never sleep on
the buffers (the recorder polls), so the wakeup watermark is set past the buffer's size.

Each record is a PERF_RECORD_SAMPLE: header(8) | u32 raw size | raw data | pad to 8, so with
one fixed-size BPF struct every sample has the same stride; native/batch.c's ca_drain copies
the bodies of a whole CPU's batch and steps over anything else (LOST records), counting it.

    bufs = PerfBuffers(bpf["events"], per_cpu_bytes=4 << 20, dtype=EVENT_DTYPE)
    batch = bufs.read()              # EVENT_DTYPE array, every CPU, sorted by ts
"""
import ctypes
import mmap
import os
import struct

import numpy as np

from ...native import batch as native_batch
from .buffers import EventBuffers

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


class PerfBuffers(EventBuffers):
    """The per-CPU buffers behind one BPF_PERF_OUTPUT map; read() drains them all."""

    READER_MODE = 0               # native/reader.c MODE_PERF

    def __init__(self, table, per_cpu_bytes: int, dtype: np.dtype, cpus=None):
        super().__init__(dtype)   # lost: from PERF_RECORD_LOST, the kernel's count
        self.size = per_cpu_bytes
        self.mask = per_cpu_bytes - 1
        self._rec = sample_dtype(self.dtype)
        self.stride = self._rec.itemsize
        self._page = mmap.PAGESIZE
        self._bufs = []
        self._addrs = []              # ctypes views of each mapping's data area (C drain)
        try:
            for cpu in (online_cpus() if cpus is None else cpus):
                fd = _open_event(cpu, per_cpu_bytes)
                mm = mmap.mmap(fd, self._page + per_cpu_bytes, mmap.MAP_SHARED,
                               mmap.PROT_READ | mmap.PROT_WRITE)
                self._bufs.append((cpu, fd, mm))
                self._addrs.append(ctypes.c_char.from_buffer(mm, self._page))
                table[table.Key(cpu)] = table.Leaf(fd)
        except BaseException:
            self.close()
            raise

    def _fill(self, mm):
        """(tail, head) of one buffer, with the fill bookkeeping."""
        head = _U64.unpack_from(mm, HEAD_OFF)[0]
        tail = _U64.unpack_from(mm, TAIL_OFF)[0]
        if head > tail:
            self._note_fill((head - tail) / self.size)
        return tail, head

    def _reader_spans(self):
        if not self._bufs:
            return None
        views = [ctypes.c_char.from_buffer(mm, 0) for _, _, mm in self._bufs]
        return ([ctypes.addressof(v) for v in views],
                [ctypes.addressof(a) for a in self._addrs], self.size, views)

    def _read_pass(self) -> np.ndarray:
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
        return self._took(out, ts, n, cpus)

    def _close_buffers(self):
        self._addrs = []              # the mappings cannot close while a view is exported
        for _, fd, mm in self._bufs:
            mm.close()
            os.close(fd)
        self._bufs = []
