"""The slot rings' reader (capture/transport/slotring.py) on memory laid out as the BPF side
writes it.

The two BPF arrays are stood in for by memfds of the same layout (an mmapable BPF array maps
its values from offset 0 like a file), written here as bpf/probes.c's ring_reserve and
ring_commit do: head moved first, the slot filled, its kind stored last.  Each reader — the C
drain called from Python, native/reader.c's thread — must take the committed slots in timestamp
order, stop at a slot still being written, clear the kinds it took and move the tail.
"""
import os
import time

import pytest

from clockalign.capture.transport.slotring import CTL_BYTES, HEAD_WORD, TAIL_WORD, SlotRings
from clockalign.store.schema import EVENT_DTYPE

CPUS, SLOTS = 3, 16


class _Table:
    """A BPF array's mmap-able stand-in: a memfd of the array's size."""

    def __init__(self, nbytes):
        self.map_fd = os.memfd_create("ca-test")
        os.ftruncate(self.map_fd, -(-nbytes // 4096) * 4096)

    def close(self):
        os.close(self.map_fd)


class _Writer:
    """bpf/probes.c's side of the rings, through the same memory."""

    def __init__(self, rings):
        self.rings = rings            # no views of its own: the mappings must close after

    @property
    def ctl(self):
        return self.rings._ctl

    @property
    def rows(self):
        return self.rings._rows

    def reserve(self, cpu):
        at = int(self.ctl[cpu, HEAD_WORD])
        if at - int(self.ctl[cpu, TAIL_WORD]) >= SLOTS:
            return None
        self.ctl[cpu, HEAD_WORD] = at + 1
        return cpu, at % SLOTS

    def fill(self, where, ts, kind=1, commit=True):
        cpu, i = where
        row = self.rows[cpu, i:i + 1]
        row["ts"] = ts
        row["tid"] = 7
        if commit:
            row["kind"] = kind

    def commit(self, where, kind=1):
        cpu, i = where
        self.rows[cpu, i:i + 1]["kind"] = kind

    def write(self, cpu, *stamps):
        for ts in stamps:
            w = self.reserve(cpu)
            assert w is not None
            self.fill(w, ts)


@pytest.fixture
def rings():
    ctl, ring = _Table(CPUS * CTL_BYTES), _Table(CPUS * SLOTS * EVENT_DTYPE.itemsize)
    r = SlotRings(ctl, ring, CPUS, SLOTS, EVENT_DTYPE)
    yield r
    r.close()
    ctl.close()
    ring.close()


def test_every_cpu_read_in_timestamp_order(rings):
    w = _Writer(rings)
    w.write(0, 10, 40, 70)
    w.write(2, 20, 50)
    w.write(1, 30, 60)
    got = rings.read()
    assert [int(t) for t in got["ts"]] == [10, 20, 30, 40, 50, 60, 70]
    assert rings.records == 7
    assert list(rings._ctl[:, TAIL_WORD]) == list(rings._ctl[:, HEAD_WORD]) == [3, 2, 2]
    assert not rings._rows["kind"].any()              # every slot taken is free again
    assert len(rings.read()) == 0


def test_a_slot_still_being_written_stops_that_cpu_only(rings):
    w = _Writer(rings)
    w.write(0, 1)
    busy = w.reserve(0)                                # reserved, not committed yet
    w.fill(busy, 2, commit=False)
    w.write(0, 3)                                      # committed behind it: must wait
    w.write(1, 4)
    assert [int(t) for t in rings.read()["ts"]] == [1, 4]
    assert int(rings._ctl[0, TAIL_WORD]) == 1         # stopped at the busy slot
    w.commit(busy)
    assert [int(t) for t in rings.read()["ts"]] == [2, 3]
    assert int(rings._ctl[0, TAIL_WORD]) == 3


def test_wrapping_and_a_full_ring(rings):
    w = _Writer(rings)
    for round_ in range(3):                            # 3 * 11 records through 16 slots
        base = 100 * round_
        w.write(1, *range(base, base + 11))
        assert [int(t) for t in rings.read()["ts"]] == list(range(base, base + 11))
    w.write(1, *range(1000, 1000 + SLOTS))
    assert w.reserve(1) is None                        # full: the writer counts a drop
    assert len(rings.read()) == SLOTS
    assert rings.last_fill == 1.0 and rings.peak_fill == 1.0
    assert w.reserve(1) is not None


def test_the_c_reader_thread_takes_what_is_written():
    ctl, ring = _Table(CPUS * CTL_BYTES), _Table(CPUS * SLOTS * EVENT_DTYPE.itemsize)
    rings = SlotRings(ctl, ring, CPUS, SLOTS, EVENT_DTYPE)
    try:
        w = _Writer(rings)
        rings.start_reader(max_bytes=1 << 20, poll_s=0.001)
        want, ts = [], 0
        for burst in range(20):                        # more than the rings hold in all
            for cpu in range(CPUS):
                for _ in range(10):
                    ts += 1
                    while (at := w.reserve(cpu)) is None:
                        time.sleep(0.001)              # the reader frees slots meanwhile
                    w.fill(at, ts)
                    want.append(ts)
        got = []
        deadline = time.monotonic() + 10
        while len(got) < len(want) and time.monotonic() < deadline:
            got.extend(int(t) for t in rings.read()["ts"])
            time.sleep(0.002)
        rings.stop_reader()
        while rings.reader_running:
            got.extend(int(t) for t in rings.read()["ts"])
        assert sorted(got) == want
        assert rings.records == len(want)
    finally:
        rings.close()
        ctl.close()
        ring.close()
