"""clockalign export: the traces parse back with Perfetto's own classes and hold the run.

Every expected number comes from the run file itself (RunReader), never from the exporter.
"""
import collections
import json
from decimal import Decimal
import os
import shutil
import subprocess
import sys
import tracemalloc

import numpy as np
import pytest
from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import (
    DebugAnnotation, Trace, TracePacket, TrackEvent)

from clockalign.cli.main import main as cli_main
from clockalign.export import export_run
from clockalign.export import jsontext as jt
from clockalign.export import varbytes as vb
from clockalign.export.chrome_json import write_chrome_json
from clockalign.export.perfetto import write_perfetto
from clockalign.store import cuda_api
from clockalign.store.reader import RunReader
from clockalign.store.schema import CUDA_FUNCTIONS, EVENT_DTYPE, Chunk, Kind, unpack_dims
from clockalign.store.writer import RunWriter
from clockalign.timeline import Timeline
from tests.unit import pftrace as pfdecode
from tests.unit import chrome_content

DATA = os.path.join(os.path.dirname(__file__), "..", "data", "synthetic-report", "run.ca")
SLICE_KINDS = (Kind.CUDA, Kind.CUDA_UNFINISHED, Kind.CONNECT, Kind.SCHED)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    assert os.path.exists(DATA), "tests/data/synthetic-report/run.ca is missing"
    return DATA


@pytest.fixture(scope="module")
def kinds(run):
    ev = RunReader(run).events()
    return collections.Counter(ev["kind"].tolist())


def stream_work(run) -> int:
    """Calls of the run that put work on a stream: each is also drawn on its stream's track."""
    ev = RunReader(run).events()
    return int((np.isin(ev["kind"], [Kind.CUDA, Kind.CUDA_UNFINISHED]) &
                np.isin(ev["code"], cuda_api.STREAM_WORK_IDS)).sum())


def parse(path) -> Trace:
    """The trace's packets as a reader sees them: compressed bundles expanded, timestamps
    absolute (MONOTONIC), each event's track filled in from its sequence's defaults
    (tests/unit/pftrace.py)."""
    with open(path, "rb") as f:
        return pfdecode.decode(f.read())


def check_trace(trace: Trace) -> dict:
    """The structural rules; returns what was seen for the content checks."""
    declared = {}
    seq_started = set()
    seq_last_ts = {}
    names = collections.defaultdict(dict)
    strings = collections.defaultdict(dict)
    ann_names = collections.defaultdict(dict)
    stacks = collections.defaultdict(list)
    slices = []            # (track_uuid, name, begin, end, annotations)
    instants, counters, flows = [], [], collections.defaultdict(list)
    snapshot = None
    open_begin = {}
    for i, p in enumerate(trace.packet):
        s = p.trusted_packet_sequence_id
        if p.HasField("clock_snapshot") and all(c.clock_id < 64 for c in p.clock_snapshot.clocks):
            snapshot = {c.clock_id: c.timestamp for c in p.clock_snapshot.clocks}  # the run's
        if p.sequence_flags & TracePacket.SEQ_INCREMENTAL_STATE_CLEARED:
            assert s not in seq_started, f"packet {i}: sequence {s} cleared twice"
            seq_started.add(s)
            # BUILTIN_CLOCK_MONOTONIC, or the sequence's own incremental clock (pftrace.py
            # checks that a snapshot on the sequence pairs it with MONOTONIC before use)
            assert p.trace_packet_defaults.timestamp_clock_id in (3, 64)
        if p.HasField("timestamp"):
            assert p.timestamp_clock_id == 3, f"packet {i}: not on MONOTONIC"
        if p.sequence_flags & TracePacket.SEQ_NEEDS_INCREMENTAL_STATE:
            assert s in seq_started, f"packet {i}: sequence {s} used before it was cleared"
        if p.HasField("interned_data"):
            for n in p.interned_data.event_names:
                names[s][n.iid] = n.name
            for n in p.interned_data.debug_annotation_string_values:
                strings[s][n.iid] = n.str.decode()
            for n in p.interned_data.debug_annotation_names:
                ann_names[s][n.iid] = n.name
        if p.HasField("track_descriptor"):
            d = p.track_descriptor
            if d.parent_uuid:
                assert d.parent_uuid in declared, f"packet {i}: parent declared after child"
            declared[d.uuid] = d
        if p.HasField("timestamp"):
            assert p.timestamp >= seq_last_ts.get(s, 0), f"packet {i}: time goes back on {s}"
            seq_last_ts[s] = p.timestamp
        if not p.HasField("track_event"):
            continue
        e = p.track_event
        assert e.track_uuid in declared, f"packet {i}: track {e.track_uuid} not declared"
        name = e.name if e.HasField("name") else names[s].get(e.name_iid)
        if e.type in (TrackEvent.TYPE_SLICE_BEGIN, TrackEvent.TYPE_INSTANT):
            assert name is not None, f"packet {i}: name iid {e.name_iid} not interned on {s}"
        anns = {}
        for a in e.debug_annotations:
            key = a.name if a.HasField("name") else ann_names[s][a.name_iid]
            if a.HasField("string_value_iid"):
                anns[key] = strings[s][a.string_value_iid]
            else:
                anns[key] = getattr(a, a.WhichOneof("value"))
        for fid in e.flow_ids:
            flows[fid].append((p.timestamp, False))
        for fid in e.terminating_flow_ids:
            flows[fid].append((p.timestamp, True))
        if e.type == TrackEvent.TYPE_SLICE_BEGIN:
            stacks[e.track_uuid].append(p.timestamp)
            open_begin.setdefault(e.track_uuid, []).append((name, p.timestamp, anns))
        elif e.type == TrackEvent.TYPE_SLICE_END:
            assert stacks[e.track_uuid], f"packet {i}: END without BEGIN"
            b = stacks[e.track_uuid].pop()
            assert p.timestamp >= b
            nm, bts, a = open_begin[e.track_uuid].pop()
            slices.append((e.track_uuid, nm, bts, p.timestamp, a))
        elif e.type == TrackEvent.TYPE_INSTANT:
            instants.append((e.track_uuid, name, p.timestamp, anns))
        elif e.type == TrackEvent.TYPE_COUNTER:
            counters.append((e.track_uuid, p.timestamp, e.double_counter_value))
    assert not any(stacks.values()), "unbalanced slices"
    # slices on one track nest: each starts after the previous ended or inside it
    by_track = collections.defaultdict(list)
    for u, _, b, e, _ in slices:
        by_track[u].append((b, e))
    for u, ivs in by_track.items():
        ivs.sort()
        stack = []
        for b, e in ivs:
            while stack and stack[-1] <= b:
                stack.pop()
            assert not stack or e <= stack[-1], f"track {u}: slices overlap without nesting"
            stack.append(e)
    return {"declared": declared, "slices": slices, "instants": instants,
            "counters": counters, "flows": flows, "snapshot": snapshot}


@pytest.fixture(scope="module")
def pftrace(run, tmp_path_factory):
    out = tmp_path_factory.mktemp("pf") / "run.pftrace"
    stats = export_run(Timeline.open(run), str(out), "perfetto")
    return out, stats


def test_perfetto_structure_and_counts(pftrace, kinds, run):
    path, stats = pftrace
    seen = check_trace(parse(path))
    n_slices = sum(kinds[k] for k in SLICE_KINDS)
    assert len(seen["slices"]) == n_slices + stream_work(run)
    n_inst = sum(v for k, v in kinds.items() if k not in SLICE_KINDS)
    tl = Timeline.open(run)
    faults = tl.faults()
    # every event instant + one per fault (+ chain steps that name no event)
    assert len(seen["instants"]) >= n_inst + len(faults)
    assert len([i for i in seen["instants"] if i[3].get("kind")]) == len(faults)
    clock = {u for u, t in seen["declared"].items() if t.name.endswith("clock ± (ns)")}
    assert len(clock) == len([d for d in tl.models if d.startswith("GPU")]) == 2
    assert len([c for c in seen["counters"] if c[0] in clock]) == 400 * len(clock)
    assert len([c for c in seen["counters"] if c[0] not in clock]) == \
        len(RunReader(run).columns(Chunk.COUNTERS)["value"])
    snap = seen["snapshot"]
    assert snap is not None and {1, 3, 6} <= set(snap)   # REALTIME, MONOTONIC, BOOTTIME
    assert stats["events"] == {int(k): v for k, v in kinds.items()}


def test_perfetto_clock_snapshot_uses_a_sandwich_midpoint(pftrace, run):
    seen = check_trace(parse(pftrace[0]))
    cpu = RunReader(run).columns(Chunk.CPU_CLOCK)
    rt = cpu["domain"] == 1
    mids = cpu["t0"][rt] + (cpu["t1"][rt] - cpu["t0"][rt]) // 2
    k = int(np.flatnonzero(mids == seen["snapshot"][3])[0])
    assert seen["snapshot"][1] == int(cpu["remote"][rt][k])


def test_perfetto_content(pftrace, run):
    seen = check_trace(parse(pftrace[0]))
    d = seen["declared"]
    ev = RunReader(run).events()
    launches = [s for s in seen["slices"] if s[1] == "cuLaunchKernel"]
    assert launches and launches[0][4]["grid"] == "108x1x1"
    assert launches[0][4]["result"] == "CUDA_SUCCESS"
    assert launches[0][4]["block"] == "256x1x1"
    cuda = ev[ev["kind"] == Kind.CUDA]
    first = cuda[np.argmin(cuda["ts"])]
    got = min((s for s in seen["slices"] if s[4].get("result")), key=lambda s: s[2])
    assert got[2] == int(first["ts"]) and got[3] == int(first["ts"] + first["dur"])
    oom = [s for s in seen["slices"] if s[1] == "cuMemAlloc_v2: CUDA_ERROR_OUT_OF_MEMORY"]
    assert len(oom) == int(((cuda["code"] == 3) & (cuda["ret"] == 2)).sum())
    # off-CPU: child track of its thread named off-CPU, preempted vs blocked
    off = [s for s in seen["slices"] if s[1] == "preempted" or s[1].startswith("blocked")]
    sched = ev[ev["kind"] == Kind.SCHED]
    assert len(off) == len(sched)
    assert sum(s[1] == "preempted" for s in off) == int((sched["code"] == 1).sum())
    track = d[off[0][0]]
    assert track.name.startswith("off-CPU") and d[track.parent_uuid].HasField("thread")
    conn = [s for s in seen["slices"] if s[1].startswith("connect")]
    assert {s[4]["peer"] for s in conn} == {"10.0.0.7:8000", "[::1]:443",
                                            "unix:/run/triton.sock"}
    assert sum(s[1] == "connect: ECONNREFUSED" for s in conn) == 2
    # GPU groups with counter tracks
    gpus = [t for t in d.values() if t.name.startswith("GPU") and t.child_ordering]
    assert len(gpus) == 2
    cts = [t for t in d.values() if t.HasField("counter")]
    assert {d[t.parent_uuid].name for t in cts} == {"GPU0 00000000:17:00.0",
                                                    "GPU1 00000000:18:00.0"}
    # faults: sources and uncertainty as annotations, flows to what followed
    xid = [i for i in seen["instants"] if i[3].get("kind") == "xid"]
    assert xid and "tracepoint" in xid[0][3]["sources"] and "unc_ns" in xid[0][3]
    chains = [sorted(v) for v in seen["flows"].values() if len(v) >= 2]
    assert chains and all(v[-1][1] for v in chains if any(t for _, t in v))
    assert len(seen["flows"]) == len({f for f in seen["flows"]})


def test_json_structure_and_counts(run, kinds, tmp_path):
    out = tmp_path / "run.json"
    export_run(Timeline.open(run), str(out), "chrome-json")
    doc = chrome_content.loads(out.read_text())
    evs = doc["traceEvents"]
    by = collections.Counter(e["ph"] for e in evs)
    assert by["X"] == sum(kinds[k] for k in SLICE_KINDS) + stream_work(run)
    assert sum(e["ph"] == "X" and e["cat"] == "stream" for e in evs) == stream_work(run)
    assert by["C"] == len(RunReader(run).columns(Chunk.COUNTERS)["value"])
    assert by["s"] == by["f"] > 0
    named = {(e["pid"], e["tid"]) for e in evs if e["ph"] == "M" and e["name"] == "thread_name"}
    per_track = collections.defaultdict(list)
    for e in evs:
        if e["ph"] == "X":
            assert (e["pid"], e["tid"]) in named
            per_track[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
    for ivs in per_track.values():       # written in time order, never overlapping
        for (b0, e0), (b1, _) in zip(ivs, ivs[1:]):
            assert b1 >= b0 and b1 >= e0 - 1e-6
    cuda = ev_first_cuda(run)
    x = min((e for e in evs if e["ph"] == "X" and e["cat"] == "cuda"), key=lambda e: e["ts"])
    assert round(x["ts"] * 1000) == int(cuda["ts"]) and round(x["dur"] * 1000) == int(cuda["dur"])


def ev_first_cuda(run):
    ev = RunReader(run).events()
    cuda = ev[ev["kind"] == Kind.CUDA]
    return cuda[np.argmin(cuda["ts"])]


def test_small_batches_give_the_same_trace(run, tmp_path):
    tl = Timeline.open(run)
    a, b = tmp_path / "a.pftrace", tmp_path / "b.pftrace"
    with open(a, "wb") as f:
        write_perfetto(tl, f)
    with open(b, "wb") as f:
        write_perfetto(Timeline.open(run), f, batch_rows=500)

    def key(seen):
        return sorted((s[1], s[2], s[3]) for s in seen["slices"])
    assert key(check_trace(parse(a))) == key(check_trace(parse(b)))


def _write_events(path, rows, chunks):
    """A run whose EVENTS chunks are exactly ``chunks`` (lists of row indexes)."""
    ev = np.zeros(len(rows), dtype=EVENT_DTYPE)
    for i, r in enumerate(rows):
        for k, v in r.items():
            ev[i][k] = v
    with RunWriter(path, {"targets": [{"pid": 10, "cmdline": ["x"]}]}) as w:
        for c in chunks:
            part = ev[c]
            w.write_columns(Chunk.EVENTS, {n: part[n] for n in EVENT_DTYPE.names})


def test_out_of_order_and_nested_calls_stay_balanced(tmp_path):
    """A long call written after later ones, and a call nested in another on one thread."""
    cuda = dict(kind=Kind.CUDA, pid=10, code=1)
    rows = [
        dict(ts=1000, dur=100, tid=11, **cuda),          # chunk 1
        dict(ts=1200, dur=100, tid=11, **cuda),
        dict(ts=2000, dur=50, tid=12, **cuda),
        dict(ts=500, dur=5000, tid=12, **cuda),          # chunk 2: started before 2000
        dict(ts=1300, dur=10, tid=11, **cuda),           # inner call returns first ...
        dict(ts=1250, dur=500, tid=11, **cuda),          # ... then the outer one
        dict(ts=1260, dur=20, tid=11, kind=Kind.SCHED, pid=10, code=1),
    ]
    path = str(tmp_path / "ooo.ca")
    _write_events(path, rows, [[0, 1, 2], [3, 4, 5, 6]])
    for fmt in ("perfetto", "chrome-json"):
        out = str(tmp_path / f"ooo.{fmt}")
        export_run(Timeline.open(path), out, fmt)
    seen = check_trace(parse(str(tmp_path / "ooo.perfetto")))
    assert len(seen["slices"]) == 7 + 6           # the 6 launches again on their stream
    lanes = [t for t in seen["declared"].values() if "overlapping" in t.name]
    assert lanes, "overlapping calls go to an overflow lane"


def test_stream_work_on_one_track_per_stream(tmp_path):
    """Launches, graph launches, copies and memsets are also drawn on their CUDA stream's
    track (whichever thread queued them); syncs and lookups are not; stream 0 of a _ptsz
    twin is its thread's own default stream."""
    fid = cuda_api.BY_SYMBOL
    cuda = dict(kind=Kind.CUDA, pid=10)
    s1, s2 = 0x5000, 0x6000
    rows = [
        dict(ts=1000, dur=100, tid=11, code=fid["cuLaunchKernel"].id, a4=s1, **cuda),
        dict(ts=1050, dur=100, tid=12, code=fid["cuGraphLaunch"].id, a1=s1, **cuda),
        dict(ts=1200, dur=100, tid=11, code=fid["cuMemcpyHtoDAsync_v2"].id, a3=s2, **cuda),
        dict(ts=1300, dur=100, tid=11, code=fid["cuMemsetD32Async"].id, a3=s2, **cuda),
        dict(ts=1400, dur=100, tid=11, code=fid["cuMemcpyDtoH_v2"].id, **cuda),   # legacy
        dict(ts=1500, dur=100, tid=12, code=fid["cuLaunchKernel_ptsz"].id, a4=0, **cuda),
        dict(ts=1600, dur=100, tid=12, code=fid["cuLaunchKernel"].id,
             a4=cuda_api.STREAM_PER_THREAD, **cuda),
        dict(ts=1700, dur=100, tid=11, code=fid["cuStreamSynchronize"].id, a0=s1, **cuda),
        dict(ts=1800, dur=100, tid=11, code=fid["cuModuleGetFunction"].id, **cuda),
    ]
    path = str(tmp_path / "streams.ca")
    _write_events(path, rows, [[0, 1, 2, 3], [4, 5, 6, 7, 8]])
    export_run(Timeline.open(path), str(tmp_path / "s.pftrace"), "perfetto")
    seen = check_trace(parse(str(tmp_path / "s.pftrace")))
    d = seen["declared"]
    on = collections.defaultdict(list)
    for u, name, b, e, _ in seen["slices"]:       # a call overlapping another: a lane of it
        on[d[u].name.split(" overlapping #")[0]].append((name, b))
    assert any(t.name == "stream 0x5000 overlapping #1" for t in d.values())
    assert sorted(on["stream 0x5000"]) == [("cuGraphLaunch", 1050), ("cuLaunchKernel", 1000)]
    assert sorted(on["stream 0x6000"]) == [("cuMemcpyHtoDAsync_v2", 1200),
                                           ("cuMemsetD32Async", 1300)]
    assert on["stream: legacy default"] == [("cuMemcpyDtoH_v2", 1400)]
    pt = [n for n in on if n.startswith("stream: per-thread default")]
    assert len(pt) == 1 and pt[0].endswith(" 12")
    assert sorted(on[pt[0]]) == [("cuLaunchKernel", 1600), ("cuLaunchKernel_ptsz", 1500)]
    streams = [t for t in d.values() if t.name.startswith("stream") and "overlapping" not in
               t.name]
    assert len(streams) == 4
    assert all(d[t.parent_uuid].HasField("process") for t in streams)
    assert len(seen["slices"]) == len(rows) + 7         # every call once, stream work twice
    export_run(Timeline.open(path), str(tmp_path / "s.json"), "chrome-json")
    evs = chrome_content.loads((tmp_path / "s.json").read_text())["traceEvents"]
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in evs
             if e["ph"] == "M" and e["name"] == "thread_name"}
    st = [e for e in evs if e["ph"] == "X" and e["cat"] == "stream"]
    assert len(st) == 7
    assert {names[(e["pid"], e["tid"])].split(" overlapping #")[0] for e in st} == \
        {t.name for t in streams}
    assert sum(e["ph"] == "X" and e["cat"] == "cuda" for e in evs) == len(rows)


@pytest.mark.parametrize("fmt", ["perfetto", "chrome-json"])
def test_export_memory_is_bounded(tmp_path, fmt):
    """Peak memory does not grow with the run: 4x the events, about the same peak, fault
    finding included (it keeps the failing calls, not every call)."""
    from tests.synthetic import make_run
    write = write_perfetto if fmt == "perfetto" else write_chrome_json
    warm = str(tmp_path / "warm.ca")
    make_run(warm, n_events=2000, duration_s=10, chunk_rows=2048)
    with open(os.devnull, "wb") as f:               # imports and one-time caches
        write(Timeline.open(warm), f, batch_rows=4096)
    peaks = []
    for n in (20_000, 80_000):
        path = str(tmp_path / f"m{n}.ca")
        make_run(path, n_events=n, duration_s=10, chunk_rows=2048)
        tl = Timeline.open(path)
        tracemalloc.start()
        with open(tmp_path / "m.out", "wb") as f:
            write(tl, f, batch_rows=4096)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    assert peaks[1] < 1.6 * peaks[0], peaks


def test_fault_finding_memory_is_bounded(tmp_path):
    """Timeline.faults() keeps failing calls and what their chains need, not every call:
    8x the events, about the same peak."""
    from tests.synthetic import make_run
    found = []
    for n in (2000, 20_000, 160_000):
        path = str(tmp_path / f"f{n}.ca")
        make_run(path, n_events=n, duration_s=10, chunk_rows=2048)
        tl = Timeline.open(path, models={})
        tl.threads
        tracemalloc.start()
        faults = tl.faults()
        found.append((tracemalloc.get_traced_memory()[1], faults))
        tracemalloc.stop()
    (_, _), (small, fs), (big, fb) = found
    assert big < 1.3 * small, (small, big)
    for faults in (fs, fb):          # the same story at every size: an OOM chain that recovers
        oom = [f for f in faults if f.name == "CUDA_ERROR_OUT_OF_MEMORY"]
        assert oom and all(f.chain[-1]["what"] == "success" and f.recovery_ns > 0
                           and f.healthy_ns is not None for f in oom)
        assert any(f.kind == "cuda_sticky_error" for f in faults)


def test_json_holds_every_call_as_the_run_has_it(run, tmp_path):
    """Each CUDA call's slice carries the run's own values: name, times, every argument."""
    out = tmp_path / "run.json"
    export_run(Timeline.open(run), str(out), "chrome-json")
    evs = chrome_content.loads(out.read_text())["traceEvents"]
    tids = {e["args"]["name"]: e["tid"] for e in evs if e.get("name") == "thread_name"}
    got = {}
    for e in evs:
        if e["ph"] == "X" and e["cat"] == "cuda":
            key = (e["tid"], round(e["ts"] * 1000))
            assert key not in got
            got[key] = e
    ev = RunReader(run).events()
    cuda = ev[ev["kind"] == Kind.CUDA]
    assert len(got) == len(cuda) and tids
    for c in cuda:
        e = got[(int(c["tid"]), int(c["ts"]))]
        fn, args = CUDA_FUNCTIONS[int(c["code"])]
        assert e["name"].split(":")[0] == fn
        assert round(e["dur"] * 1000) == int(c["dur"]) and e["pid"] == int(c["pid"])
        for j, arg in enumerate(args):
            v = int(c[f"a{j}"])
            if not arg:
                continue
            if arg in ("grid", "block"):
                x, y, z = (int(d[0]) for d in unpack_dims(np.array([v], np.uint64)))
                assert e["args"][arg] == f"{x}x{y}x{z}"
            elif arg in ("func", "dptr", "stream", "dst", "src", "event"):
                assert e["args"][arg] == f"0x{v:x}"
            else:
                assert e["args"][arg] == v
        assert e["args"]["result"].startswith("CUDA_")


def test_json_rare_wide_record_keeps_its_place(tmp_path):
    """A record much wider than its batch's others (a long unix socket path) is written in
    its place, the others stay narrow, and the file parses."""
    path = str(tmp_path / "wide.ca")
    rows = [dict(ts=1000 + 10 * i, dur=5, tid=11 + i % 3, kind=Kind.CUDA, pid=10, code=9,
                 a0=0x55000000) for i in range(300)]
    sun = b"\x01\x00/run/" + b"x" * 45
    rows.insert(150, dict(ts=2495, dur=3, tid=12, kind=Kind.CONNECT, pid=10, ret=0, a0=7,
                          a1=len(sun), data=np.void(sun.ljust(56, b"\0"))))
    _write_events(path, rows, [list(range(len(rows)))])
    out = tmp_path / "wide.json"
    export_run(Timeline.open(path), str(out), "chrome-json")
    text = out.read_text()
    evs = [e for e in chrome_content.loads(text)["traceEvents"] if e["ph"] == "X"]
    assert len(evs) == 301
    assert [round(e["ts"] * 1000) for e in evs] == sorted(round(e["ts"] * 1000) for e in evs)
    conn = [e for e in evs if e["cat"] == "net"]
    assert len(conn) == 1 and conn[0]["args"]["peer"] == "unix:/run/" + "x" * 45
    widths = {len(line) for line in text.splitlines() if '"cuStreamSynchronize"' in line}
    assert max(widths) < len(next(ln for ln in text.splitlines() if '"net"' in ln))


def _cli(args, capsys):
    with pytest.raises(SystemExit) as e:
        cli_main(args)
    return e.value.code, capsys.readouterr()


def test_cli_export(run, tmp_path, capsys):
    out = tmp_path / "x.pftrace"
    code, io = _cli(["export", run, "-o", str(out)], capsys)
    assert code == 0 and out.stat().st_size > 0 and "wrote" in io.out
    code, io = _cli(["export", run, "-o", str(tmp_path / "x.json"), "--format", "chrome-json"],
                    capsys)
    assert code == 0 and json.loads((tmp_path / "x.json").read_text())["traceEvents"]


def test_cli_export_bad_input(tmp_path, capsys):
    bad = tmp_path / "bad.ca"
    bad.write_bytes(b"not a run at all")
    code, io = _cli(["export", str(bad)], capsys)
    assert code == 2 and io.err.count("\n") == 1 and "not a clockalign run" in io.err
    code, io = _cli(["export", str(tmp_path / "missing.ca")], capsys)
    assert code == 2 and "does not exist" in io.err


def test_cli_export_truncated_run_exits_3(run, tmp_path, capsys):
    path = tmp_path / "cut.ca"
    data = open(run, "rb").read()
    path.write_bytes(data[:len(data) * 2 // 3])
    out = tmp_path / "cut.pftrace"
    code, io = _cli(["export", str(path), "-o", str(out)], capsys)
    assert code == 3 and "truncated at byte" in io.err and io.err.count("\n") == 1
    check_trace(parse(out))


def test_overlong_varints_parse_with_perfetto_classes():
    vals = np.array([0, 1, 127, 128, 300, 2**40, 2**63 + 5], dtype=np.uint64)
    for width in (None, 10):
        p = vb.varint(vals, width)
        blob = vb.flatten([vb.const(b"\x18"), p], len(vals))   # uint_value = 3, varint
        step = len(blob) // len(vals)
        got = []
        for i in range(len(vals)):
            a = DebugAnnotation()
            a.ParseFromString(blob[i * step:(i + 1) * step])
            got.append(a.uint_value)
        assert got == vals.tolist()


def test_text_into_place():
    """The fixed-width writers the JSON rows use, against Python's own formatting: numbers
    right-aligned after PAD bytes, µs with only the decimals the ns need."""
    pad = chr(jt.PAD)
    rng = np.random.default_rng(5)
    u = np.concatenate([np.array([0, 9, 10, 9999, 10000, 10**15, 2**64 - 1], np.uint64),
                        rng.integers(0, 2**63, 300).astype(np.uint64)])
    w = jt.decimal_digits(int(u.max()))
    d = np.zeros((len(u), w), np.uint8)
    jt.put_decimal(d, u)
    assert [bytes(r).decode() for r in d] == [str(v).rjust(w, pad) for v in u.tolist()]
    s = np.array([-5, 0, 70, -(2**63), 2**63 - 1, -1000], np.int64)
    d = np.zeros((len(s), 20), np.uint8)
    jt.put_signed(d, s)
    assert [bytes(r).decode() for r in d] == [str(v).rjust(20, pad) for v in s.tolist()]
    ns = np.concatenate([np.array([0, 1, 999, 1000, -1, -1500, 1500, 1230, 2**63 - 1],
                                  np.int64), rng.integers(-10**13, 10**17, 300)])
    w = jt.micros_width(ns)
    d = np.zeros((len(ns), w), np.uint8)
    jt.put_micros(d, ns)
    got = [bytes(r).decode() for r in d]
    assert [g.strip(pad) for g in got] == [_micros_text(v) for v in ns.tolist()]
    assert all(g.rstrip(pad)[-1] != "0" or "." not in g for g in got)
    assert [g.strip(pad) for g in got][:9] == ["0", "0.001", "0.999", "1", "-0.001", "-1.5",
                                              "1.5", "1.23", "9223372036854775.807"]
    assert {Decimal(g.strip(pad)) * 1000 for g in got} == set(ns.tolist())
    nd = jt.hex_digits(u)
    d = np.full((len(u), int(nd.max()) + 1), 32, np.uint8)
    jt.put_hex(d, u, nd)
    assert [bytes(r).decode() for r in d] == [(f"{v:x}" + '"').ljust(d.shape[1])
                                              for v in u.tolist()]


def _micros_text(ns: int) -> str:
    s = str(Decimal(ns) / 1000)
    return s.rstrip("0").rstrip(".") if "." in s else s


@pytest.mark.skipif(not os.environ.get("CLOCKALIGN_TRACE_PROCESSOR"),
                    reason="set CLOCKALIGN_TRACE_PROCESSOR to a trace_processor_shell binary "
                           "(none ships with the perfetto wheel and none can be downloaded "
                           "here) to load the trace in Perfetto's trace processor")
def test_trace_processor_loads_the_trace(pftrace, kinds):
    from perfetto.trace_processor import TraceProcessor, TraceProcessorConfig
    shell = os.environ["CLOCKALIGN_TRACE_PROCESSOR"]
    assert shutil.which(shell) or os.path.exists(shell)
    tp = TraceProcessor(trace=str(pftrace[0]), config=TraceProcessorConfig(bin_path=shell))
    try:
        n = tp.query("select count(*) as n from slice").as_pandas_dataframe()
        total = int(n["n"][0])
        assert total >= sum(kinds[k] for k in SLICE_KINDS)
        cuda = tp.query("select count(*) as n from slice where name like 'cu%'") \
            .as_pandas_dataframe()
        assert int(cuda["n"][0]) == kinds[Kind.CUDA] + kinds[Kind.CUDA_UNFINISHED]
    finally:
        tp.close()


def test_bench_script_runs(tmp_path):
    """The benchmark runs end to end on a small run (numbers are not judged here)."""
    script = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "bench",
                          "export.py")
    p = subprocess.run([sys.executable, script, "-n", "3000", "6000", "--duration", "2",
                        "--repeat", "1", "--results", str(tmp_path)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    doc = json.loads((tmp_path / "export-bench.json").read_text())
    assert set(doc["results"]) == {"perfetto", "chrome-json"}
    assert [(s["shape"], s["events"] > 0) for s in doc["sizes"]] == [
        ("cuda", True), ("cuda", True), ("gpu", True), ("gpu", True)]
    assert set(doc["rss_growth"]) == {f"{s} {f}" for s in ("cuda", "gpu")
                                      for f in ("perfetto", "chrome-json")}
    for s in doc["sizes"]:
        for r in s["results"].values():
            assert r["peak_rss_mb"] >= r["peak_anon_mb"] > 0 and r["bytes_per_event"] > 0
    assert doc["sizes"][-1]["results"]["perfetto"]["gpu_activity"] > 0
    text = (tmp_path / "export-bench.md").read_text()
    assert "events/s" in text and "bytes/event" in text


def test_two_exports_concatenate_without_id_collisions(tmp_path):
    """`cat a.pftrace b.pftrace` must not merge tracks or sequences of different runs, nor
    take the small sequence ids traced's own writers use."""
    from clockalign.export import export_run
    from clockalign.timeline import Timeline
    here = os.path.dirname(__file__)
    runs = [os.path.join(here, "..", "data", "synthetic-report", "run.ca"),
            os.path.join(here, "..", "data", "gpu-h200", "reference.ca")]
    ids, counts = [], []
    blob = b""
    for i, run in enumerate(runs):
        out = tmp_path / f"{i}.pftrace"
        export_run(Timeline.open(run), str(out), "perfetto")
        data = out.read_bytes()
        blob += data
        t = pfdecode.decode(data)
        seqs = {p.trusted_packet_sequence_id for p in t.packet}
        uuids = {p.track_descriptor.uuid for p in t.packet if p.HasField("track_descriptor")}
        assert min(seqs) >= 1 << 21 and max(seqs) < 1 << 28 and uuids
        ids.append((seqs, uuids))
        counts.append(len(t.packet))
    assert not ids[0][0] & ids[1][0] and not ids[0][1] & ids[1][1]
    both = pfdecode.decode(blob)                # one valid trace: the packets of both
    assert len(both.packet) == sum(counts)


def test_export_modules_import_no_cycle():
    """Each export module imports only modules below it: gpu_json builds on jsonrows, not on
    chrome_json, which imports it (issue 25: the cycle is gone)."""
    code = ("import sys, clockalign.export.gpu_json, clockalign.export.gpu_tracks; "
            "assert 'clockalign.export.chrome_json' not in sys.modules; "
            "assert 'clockalign.export.perfetto' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True,
                   env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})


def test_launch_flows_of_one_row_in_columns_or_table():
    """A row that starts several GPU flows (a graph launch) gets each of them, whether
    they fit the per-flow columns or spill into the per-row table."""
    from types import SimpleNamespace
    from clockalign.export.perfetto_packets import _launch_flows
    rows = np.array([0, 2, 2, 2, 2, 2, 2, 4], dtype=np.int64)
    ids = np.arange(1, 9, dtype=np.uint64) << np.uint64(60) | np.uint64(5)
    b = SimpleNamespace(launch=(rows, ids))
    for levels in (1, 2, 4, 10):
        parts = _launch_flows(b, 5, levels)
        lens = np.broadcast_to(vb.total(parts, 5), (5,))
        blob = vb.flatten(parts, 5)
        at = np.r_[0, np.cumsum(lens)]
        got = {}
        for r in range(5):
            e = TrackEvent()
            e.ParseFromString(blob[at[r]:at[r + 1]])
            got[r] = list(e.flow_ids)
        assert got == {0: [ids[0]], 1: [], 2: ids[1:7].tolist(), 3: [], 4: [ids[7]]}, levels
