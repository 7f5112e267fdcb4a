"""Per-CPU slot rings: the BPF programs write each record in place, no helper call.

Why not the perf buffers (perfbuf.py, kept for kernels where these rings do not load):
sending a record with bpf_perf_event_output runs the kernel's perf output path (sample
set-up, header, copy, the nesting and wakeup bookkeeping) for every CUDA call: on the H200
the CUDA probes took 259-403 ns of BPF time a call with it and 188-192 ns with these rings, the empty
programs 72 ns (scripts/bench/probe_cost.py, results/overhead.md, runs h200-12, h200-13).  Here each CPU has a ring of fixed 128-byte slots in one mmapable BPF array
(`ring`, CA_RING_SLOTS a CPU), and a head/tail pair in another (`ring_ctl`, bpf/probes.c):

- a writer reserves the slot at head with a compare-and-swap (a uprobe program can be
  preempted by another on the same CPU), fails and counts a drop of its kind when
  head - tail reaches the ring's size, fills the slot and stores its kind last: a slot whose
  kind is 0 is still being written;
- the reader (native/batch.c ca_slot_drain, from native/reader.c's thread or read() here)
  copies the committed slots from tail on, stopping at the first one still being written,
  clears each one's kind and then moves tail past them.

Every record that is not written is counted in the BPF drops map by kind, exactly; there is
no kernel-side loss count as with perf buffers (lost stays 0).  The rings hold records from
the moment the programs load, so nothing is sent "nowhere" before user space is ready.

    rings = SlotRings(bpf["ring_ctl"], bpf["ring"], cpus=possible_cpus(), slots=65536,
                      dtype=EVENT_DTYPE)
    batch = rings.read()             # EVENT_DTYPE array, every CPU, sorted by ts
"""
import ctypes
import mmap

import numpy as np

from ...native import batch as native_batch
from .buffers import EventBuffers

CTL_BYTES = 128                   # struct ca_ring_ctl: head, 56 bytes, tail, 56 bytes
HEAD_WORD, TAIL_WORD = 0, 8       # in u64s
KIND_OFF = 24                     # struct ca_event.kind


def possible_cpus() -> int:
    """How many CPU ids this kernel may ever use (the BPF side indexes rings by CPU id):
    the highest in /sys/devices/system/cpu/possible, plus one."""
    with open("/sys/devices/system/cpu/possible") as f:
        text = f.read().strip()
    return max(int(part.rpartition("-")[2]) for part in text.split(",")) + 1


def _mapped(table, nbytes: int) -> mmap.mmap:
    size = -(-nbytes // mmap.PAGESIZE) * mmap.PAGESIZE
    return mmap.mmap(table.map_fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)


class SlotRings(EventBuffers):
    """Every CPU's slot ring behind the `ring_ctl` and `ring` arrays; read() drains them."""

    READER_MODE = 1               # native/reader.c MODE_SLOTS

    def __init__(self, ctl_table, ring_table, cpus: int, slots: int, dtype):
        super().__init__(dtype)
        if slots & (slots - 1):
            raise ValueError("slots must be a power of two")
        self.cpus = cpus
        self.slots = slots
        self.size = slots * self.dtype.itemsize        # bytes a CPU, as PerfBuffers.size
        self._ctl_mm = _mapped(ctl_table, cpus * CTL_BYTES)
        try:
            self._ring_mm = _mapped(ring_table, cpus * self.size)
        except BaseException:
            self._ctl_mm.close()
            raise
        self._ctl = np.frombuffer(self._ctl_mm, np.uint64, count=cpus * CTL_BYTES // 8)
        self._ctl = self._ctl.reshape(cpus, CTL_BYTES // 8)
        self._rows = np.frombuffer(self._ring_mm, self.dtype, count=cpus * slots)
        self._rows = self._rows.reshape(cpus, slots)
        # ctypes views of the two mappings, which the C drain reads through
        self._views = [ctypes.c_char.from_buffer(self._ctl_mm),
                       ctypes.c_char.from_buffer(self._ring_mm)]

    def _spans(self):
        """(cpu, tail, head) of every ring that holds records, with the fill bookkeeping.
        head is read before anything in its slots (x86-64: loads are not reordered)."""
        out = []
        self.last_fill = 0.0
        for cpu in range(self.cpus):
            head = int(self._ctl[cpu, HEAD_WORD])
            tail = int(self._ctl[cpu, TAIL_WORD])
            if head > tail:
                self._note_fill((head - tail) / self.slots)
                out.append((cpu, tail, head))
        return out

    def _addr(self, which: int, offset: int) -> int:
        return ctypes.addressof(self._views[which]) + offset

    def _reader_spans(self):
        ctls = [self._addr(0, c * CTL_BYTES) for c in range(self.cpus)]
        datas = [self._addr(1, c * self.size) for c in range(self.cpus)]
        return ctls, datas, self.size, list(self._views)

    def _read_pass(self) -> np.ndarray:
        spans = self._spans()
        room = sum(head - tail for _, tail, head in spans)
        out = np.empty(room, self.dtype)
        ts = np.empty(room, np.uint64)
        n, cpus = 0, 0
        for cpu, tail, head in spans:
            got, new_tail = native_batch.slot_drain_into(
                self._addr(1, cpu * self.size), self.slots, tail, head, KIND_OFF, out, ts, n)
            self._ctl[cpu, TAIL_WORD] = new_tail
            cpus += got > 0
            n += got
        return self._took(out, ts, n, cpus)

    def _close_buffers(self):
        self._views = []              # the mappings cannot close while a view is exported
        self._ctl = self._rows = None
        for mm in (self._ctl_mm, self._ring_mm):
            if mm is not None:
                mm.close()
        self._ctl_mm = self._ring_mm = None
