"""Timeline query API over the synthetic runs in tests/data/synthetic (make_test_runs.py)."""
import os

import numpy as np
import pytest

from clockalign.errors import ClockalignError, NotARunFile, UnsupportedVersion
from clockalign.store.counter_fields import FIELD_BY_NAME
from clockalign.store.schema import EVENT_DTYPE, Chunk, Kind
from clockalign.store.writer import RunWriter
from clockalign.timeline import (COUNTER_DTYPE, TIMELINE_DTYPE, Timeline, decode_sockaddr,
                                 decode_xid)
from clockalign.timeline.stamps import STAMP_UNC_NS, stamp_unc_ns

DATA = os.path.join(os.path.dirname(__file__), "..", "data", "synthetic")
FAULTS = os.path.join(DATA, "faults.ca")
TRUNC = os.path.join(DATA, "faults_truncated.ca")
ALIGNED = os.path.join(DATA, "aligned.ca")
T0 = 5_000_000_000_000
MS = 1_000_000
REAL_OFFSET = 1_700_000_000_000_000_000 - T0


class OffsetModel:
    """REALTIME = MONOTONIC + offset exactly, model uncertainty ``unc``."""

    def __init__(self, offset=REAL_OFFSET, unc=7):
        self.offset, self.unc = offset, unc

    def map(self, remote_ns, stamp_unc_ns=None):
        r = np.asarray(remote_ns, dtype=np.int64)
        s = 0 if stamp_unc_ns is None else np.asarray(stamp_unc_ns, dtype=np.int64)
        return r - self.offset, np.zeros_like(r) + self.unc + s


@pytest.fixture
def tl():
    return Timeline.open(FAULTS, models={"REALTIME": OffsetModel()})


def test_open_meta_span_and_threads(tl):
    assert tl.truncated is None
    assert tl.meta["host"] == "synthetic"
    assert tl.start_ns == T0                       # header clock snapshot
    assert tl.end_ns == T0 + 1200 * MS             # trailer
    assert tl.threads == {4242: "python", 4250: "pt_worker", 5000: "server"}
    assert tl.thread_pids[4250] == 4242
    assert tl.thread_name(4250, T0 + 2 * MS) == "python"      # before its rename at +5 ms
    assert tl.thread_name(4250, T0 + 6 * MS) == "pt_worker"
    assert tl.thread_name(4250) == "pt_worker"
    assert tl.thread_name(99) is None


def test_events_sorted_with_stamp_uncertainty(tl):
    ev = tl.events()
    assert ev.dtype == TIMELINE_DTYPE
    assert len(ev) == 2 + 23 + 4 + 1 + 1 + 1 + 1 + 1 + 1 + 1
    assert np.all(np.diff(ev["t_ns"]) >= 0)
    assert np.all(ev["unc_ns"] == 0)
    cuda = tl.events(kinds="cuda")
    assert len(cuda) == 23
    assert (cuda["ret"] != 0).sum() == 8
    assert cuda["t_ns"][0] == T0 + 10 * MS and cuda["dur_ns"][0] == 5_000


def test_iter_events_is_per_chunk_and_unsorted(tl):
    parts = list(tl.iter_events())
    assert len(parts) == 3                         # three EVENTS chunks
    allev = np.concatenate(parts)
    assert len(allev) == len(tl.events())
    assert not np.all(np.diff(allev["t_ns"]) >= 0)  # file order, not time order


def test_filters_kind_window_tid(tl):
    assert len(tl.events(kinds=[Kind.CONNECT])) == 4
    assert len(tl.events(kinds=["connect", "xid"])) == 5
    assert len(tl.events(kinds=Kind.CUDA, tids=4250)) == 2
    assert len(tl.events(kinds="cuda", tids=[4242, 4250])) == 23
    # window overlap: the 2 ms ILLEGAL_ADDRESS sync (+500..+502 ms) overlaps [+501, +503)
    w = tl.events(kinds="cuda", window=(T0 + 501 * MS, T0 + 503 * MS))
    assert list(w["t_ns"]) == [T0 + 500 * MS]
    # start inclusive, end exclusive for instants
    w = tl.events(kinds="xid", window=(T0 + 499_500_000, T0 + 499_500_001))
    assert len(w) == 1
    assert len(tl.events(kinds="xid", window=(None, T0 + 499_500_000))) == 0
    assert len(tl.events(window=(T0 + 1100 * MS, None))) == 3
    with pytest.raises(ValueError):
        tl.events(kinds="bogus")


def test_events_gpu_filter(tl):
    ev = tl.events(gpu=0)
    assert list(ev["kind"]) == [Kind.XID]
    assert len(tl.events(gpu=1)) == 0


def test_counters_mapped_through_realtime_with_latency(tl):
    c = tl.counters(fields="sm_clock")
    assert c.dtype == COUNTER_DTYPE
    assert len(c) == 13
    assert list(c["t_ns"] - T0) == [i * 100 * MS for i in range(13)]
    assert np.all(c["unc_ns"] == 7 + 20_000)       # model ± + stamp latency
    assert list(c["value"][:7]) == [1980.0] * 7
    both = tl.counters(gpu=0)
    assert len(both) == 26
    assert set(both["field"]) == {FIELD_BY_NAME["sm_clock"], FIELD_BY_NAME["clock_event_reasons"]}
    assert len(tl.counters(gpu=3)) == 0
    assert len(tl.counters(fields=[FIELD_BY_NAME["clock_event_reasons"]])) == 13
    assert tl.field_name(FIELD_BY_NAME["sm_clock"]) == "sm_clock"
    with pytest.raises(ValueError):
        tl.counters(fields="nope")


def test_counters_without_realtime_fall_back_to_receipt():
    tl = Timeline.open(FAULTS, models={})
    c = tl.counters(fields="sm_clock")
    assert list(c["t_ns"] - T0) == [i * 100 * MS + 30_000 for i in range(13)]
    assert np.all(c["unc_ns"] == 20_000)            # all received equally fresh
    assert any("receipt" in n for n in tl.notes)


def test_map(tl):
    assert tl.map("MONOTONIC", 123) == (123, 0)
    assert tl.map("MONOTONIC", 123, 5) == (123, 5)
    t, u = tl.map("REALTIME", np.array([T0 + REAL_OFFSET, T0 + REAL_OFFSET + 1]), 10)
    assert t.dtype == np.int64 and list(t) == [T0, T0 + 1] and list(u) == [17, 17]
    assert tl.map("REALTIME", T0 + REAL_OFFSET) == (T0, 7)
    with pytest.raises(ClockalignError, match="no GPU0 clock samples"):
        tl.map("GPU0", 5)


def test_real_alignment_maps_counters():
    pytest.importorskip("clockalign.align")
    tl = Timeline.open(ALIGNED)
    assert "REALTIME" in tl.models
    c = tl.counters(fields="sm_clock")
    # sandwiches are ±400..700 ns around the exact offset: the fit is within its band
    err = c["t_ns"] - (T0 + np.arange(13) * 100 * MS)
    assert np.all(np.abs(err) <= c["unc_ns"] - 20_000)
    assert np.all(c["unc_ns"] < 20_000 + 1_000)


def test_gpu_events_and_pci(tl):
    rows = tl.gpu_events()
    assert [(r["code"], r["t_ns"] - T0, r["unc_ns"], r["domain"]) for r in rows] == [
        (31, 799_500_000, 50_000, "MONOTONIC"), (43, 1000 * MS, 50_000, "MONOTONIC")]
    assert tl.gpu_of_pci("0000:18:00.0") == 0
    assert tl.gpu_of_pci("00000000:18:00.0") == 0


def test_gpu_of_pci_several_gpus(tmp_path):
    meta = {"gpus": [{"index": 0, "pci_bus_id": "00000000:18:00.0"},
                     {"index": 1, "pci_bus_id": "00000000:2A:00.0"}]}
    p = tmp_path / "two.ca"
    RunWriter(p, meta).close()
    tl = Timeline.open(p, models={})
    assert tl.gpu_of_pci("0000:2a:00.0") == 1
    assert tl.gpu_of_pci("0000:18:00") == 0
    assert tl.gpu_of_pci("0000:99:00.0") is None
    assert tl.start_ns == tl.end_ns          # nothing but a trailer


def test_truncated_run_still_opens():
    tl = Timeline.open(TRUNC, models={})
    assert tl.truncated.startswith("truncated at byte")
    assert len(tl.events(kinds="cuda")) == 23


def test_bad_files(tmp_path):
    with pytest.raises(NotARunFile):
        Timeline.open(tmp_path / "missing.ca")
    junk = tmp_path / "junk.ca"
    junk.write_bytes(b"hello world, not a run")
    with pytest.raises(NotARunFile):
        Timeline.open(junk)
    data = bytearray(open(FAULTS, "rb").read())
    data[8] = 99                                  # format version
    v = tmp_path / "v99.ca"
    v.write_bytes(bytes(data))
    with pytest.raises(UnsupportedVersion):
        Timeline.open(v)


def test_failed_fit_keeps_events_usable(tmp_path, monkeypatch):
    import clockalign.align as align

    def broken(reader):
        raise ClockalignError("REALTIME: not enough sandwiches")
    monkeypatch.setattr(align, "fit_run", broken)
    tl = Timeline.open(FAULTS)
    assert tl.models == {}
    assert any("clock fit failed" in n for n in tl.notes)
    assert len(tl.faults(kinds="cuda_error")) == 2
    with pytest.raises(ClockalignError, match="clock fit failed"):
        tl.map("REALTIME", 1)


def test_stamp_table():
    assert set(STAMP_UNC_NS) == set(Kind)
    assert list(stamp_unc_ns([1, 5, 99])) == [0, 0, 0]


def test_decoders():
    ev = Timeline.open(FAULTS, models={}).events(kinds=["connect", "xid"])
    peers = [decode_sockaddr(e["data"], e["a1"]) for e in ev if e["kind"] == Kind.CONNECT]
    assert peers == ["10.0.0.7:443"] + ["127.0.0.1:8000"] * 3
    dev, msg = decode_xid(ev[ev["kind"] == Kind.XID][0]["data"])
    assert dev == "0000:18:00.0" and msg.startswith("pid=4242, name=python")
    import socket
    import struct
    v6 = struct.pack("<H", socket.AF_INET6) + struct.pack(">H", 443) + b"\0" * 4 \
        + socket.inet_pton(socket.AF_INET6, "::1") + b"\0" * 4
    assert decode_sockaddr(v6, 28) == "[::1]:443"
    assert decode_sockaddr(struct.pack("<H", 1) + b"/run/x.sock\0", 14) == "unix:/run/x.sock"
    assert decode_sockaddr(struct.pack("<H", 1) + b"\0abstract", 11) == "unix:@abstract"


def test_iter_events_bounded_memory(tmp_path):
    """Many chunks: iter_events hands out one chunk's worth at a time."""
    p = tmp_path / "big.ca"
    with RunWriter(p, {}) as w:
        for c in range(20):
            ev = np.zeros(1000, dtype=EVENT_DTYPE)
            ev["ts"] = T0 + c * 1000 + np.arange(1000)
            ev["kind"] = Kind.SCHED
            w.write_columns(Chunk.EVENTS, {n: ev[n] for n in EVENT_DTYPE.names})
    tl = Timeline.open(p, models={})
    sizes = [len(x) for x in tl.iter_events(kinds="sched")]
    assert sizes == [1000] * 20
