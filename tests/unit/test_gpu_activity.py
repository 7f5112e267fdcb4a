"""GPU activity of a run (record --gpu-activity) on the timeline, in dump, the Perfetto trace
and the report, checked against the known truth of tests/unit/gpu_runs.py."""
import json

import numpy as np
import pytest
from click.testing import CliRunner
from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import TrackEvent

from . import gpu_runs as g
from . import pftrace
from . import chrome_content
from clockalign.cli.main import cli
from clockalign.export import export_run
from clockalign.report import build_report
from clockalign.store import cuda_api
from clockalign.store.schema import Chunk, GpuKind, Kind
from clockalign.timeline import Timeline
from clockalign.timeline.gpu_activity import (CUPTI_STAMP_UNC_NS, LAUNCH_BPF, LAUNCH_CUPTI,
                                              _join_bpf, waiting_syncs)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpu") / "gpu.ca"
    truth = g.make_gpu_run(path)
    return path, truth


def test_raw_times_map_within_their_uncertainty(run):
    path, truth = run
    acts = Timeline.open(path).gpu_activity()
    r = acts.rows
    k = r[(r["pid"] == g.PID) & (r["kind"] == GpuKind.KERNEL)]
    k = k[np.argsort(k["corr"])]
    assert len(k) == len(truth["kernels"]) == 160
    assert (k["corr"] == truth["kernels"][:, 2]).all()
    err0 = np.abs(k["t_ns"] - truth["kernels"][:, 0])
    err1 = np.abs(k["end_ns"] - truth["kernels"][:, 1])
    assert (err0 <= k["unc_ns"]).all() and (err1 <= k["end_unc_ns"]).all()
    # band + tick + CUPTI's stamping offset, and no more than a few hundred ns beyond
    assert (k["unc_ns"] >= 32 + CUPTI_STAMP_UNC_NS["start"]).all()
    assert (k["unc_ns"] < 900 + 32 + CUPTI_STAMP_UNC_NS["start"] + 400).all()
    step = CUPTI_STAMP_UNC_NS["end"] - CUPTI_STAMP_UNC_NS["start"]
    assert (np.abs(k["end_unc_ns"] - k["unc_ns"] - step) <= 4).all()   # the band ~ the same
    assert k["raw"].all() and (k["gpu"] == 0).all()
    assert acts.domains[(g.PID, 0)] == "GPU0"          # by the device UUID


def test_converted_times_go_through_the_cupti_clock_with_no_bound(run):
    path, truth = run
    acts = Timeline.open(path).gpu_activity()
    c = acts.rows[acts.rows["pid"] == g.PID2]
    c = c[np.argsort(c["corr"])]
    assert len(c) == 10 and not c["raw"].any()
    assert (c["t_ns"] == truth["conv_truth"]).all()
    assert (c["unc_ns"] == -1).all()
    assert any("converted" in n and "no stated bound" in n for n in acts.notes)


def test_each_execution_is_joined_to_the_bpf_call_that_launched_it(run):
    path, truth = run
    tl = Timeline.open(path)
    acts = tl.gpu_activity()
    r = acts.rows[acts.rows["pid"] == g.PID]
    assert (r["launch_src"] == LAUNCH_BPF).all() and (r["launch_tid"] == g.TID).all()
    cuda = truth["events"][truth["events"]["kind"] == Kind.CUDA]
    launches = cuda[cuda["code"] != cuda_api.ids("sync")[0]]
    launches = launches[np.argsort(launches["ts"])]
    r = r[np.argsort(r["corr"])]
    assert (r["launch_t_ns"] == launches["ts"].astype(np.int64)).all()
    names = {acts.launch_function(x) for x in r}
    assert names == {"cuLaunchKernel", "cuMemsetD8Async"}
    # no BPF events for PID2: the CUPTI callback's own stamp
    r2 = acts.rows[acts.rows["pid"] == g.PID2]
    assert (r2["launch_src"] == LAUNCH_CUPTI).all() and (r2["launch_tid"] == g.TID2).all()
    assert acts.stats["joined_bpf"] == 200 and acts.stats["cupti_dropped"] == 3


def test_join_picks_the_call_of_that_thread_that_holds_the_callback():
    from clockalign.timeline.events import TIMELINE_DTYPE
    cuda = np.zeros(4, dtype=TIMELINE_DTYPE)
    cuda["tid"] = [1, 2, 1, 1]
    cuda["t_ns"] = [100, 150, 300, 500]
    cuda["dur_ns"] = [100, 200, 50, 10]
    got = _join_bpf(np.array([1, 1, 2, 1, 3]), np.array([110, 310, 160, 400, 110]),
                    np.array([190, 340, 340, 410, 120]), cuda)
    assert got.tolist() == [0, 2, 1, -1, -1]       # 400..410 falls between two calls


def test_every_kernel_inside_its_launch_and_the_sync_that_waited(run):
    path, _ = run
    tl = Timeline.open(path)
    r = tl.gpu_activity().rows
    r = r[r["pid"] == g.PID]
    syncs = waiting_syncs(r, tl.events(kinds=["cuda"]), cuda_api.ids("sync"))
    assert (syncs > 0).all()
    assert (r["t_ns"] >= r["launch_t_ns"]).all() and (r["end_ns"] <= syncs).all()


def test_dump_writes_gpu_lines(run):
    path, truth = run
    res = CliRunner().invoke(cli, ["dump", str(path)])
    assert res.exit_code == 0, res.output
    lines = [json.loads(x) for x in res.stdout.splitlines() if x.startswith("{")]
    gpu = [d for d in lines if d["kind"].startswith("gpu_")]
    assert len(gpu) == 210
    k = next(d for d in gpu if d["kind"] == "gpu_kernel" and d["pid"] == g.PID)
    assert set(k) >= {"t_ns", "end_ns", "unc_ns", "device", "stream", "name", "grid", "block",
                      "launch"}
    assert k["grid"] == [2, 1, 1] and k["block"] == [128, 1, 1] and k["timestamps"] == "raw"
    assert k["launch"]["tid"] == g.TID and k["launch"]["source"] == "bpf"
    m = next(d for d in gpu if d["kind"] == "gpu_memset")
    assert m["bytes"] == 65536 and m["value"] == 7
    c = next(d for d in gpu if d["pid"] == g.PID2)
    assert c["unc_ns"] is None and c["timestamps"] == "converted"
    assert any(len(d["name"]) > 4096 for d in gpu)      # a name sent in two packets


def test_perfetto_has_stream_tracks_and_flows_from_launches(run, tmp_path):
    path, _ = run
    out = tmp_path / "g.pftrace"
    res = CliRunner().invoke(cli, ["export", str(path), "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "210 GPU executions (200 with a flow" in res.output
    t = pftrace.decode(out.read_bytes())
    tracks = {p.track_descriptor.uuid: p.track_descriptor for p in t.packet
              if p.HasField("track_descriptor")}
    gpu_tracks = {u for u, d in tracks.items() if d.name.startswith("GPU0 stream")}
    assert {tracks[u].name for u in gpu_tracks} == {"GPU0 stream 13 (pid 4242)",
                                                    "GPU0 stream 7 (pid 5151)"}
    begins = [p for p in t.packet if p.HasField("track_event")
              and p.track_event.type == TrackEvent.TYPE_SLICE_BEGIN
              and p.track_event.track_uuid in gpu_tracks]
    assert len(begins) == 210
    starts = {f for p in t.packet if p.HasField("track_event") for f in p.track_event.flow_ids}
    ends = {f for p in begins for f in p.track_event.terminating_flow_ids}
    assert len(ends) == 200 and ends <= starts
    # the kernels of a CUDA graph carry one annotation more: "graph ID node ID" (interned)
    strings = {}
    for p in t.packet:
        if p.HasField("interned_data"):
            for d in p.interned_data.debug_annotation_string_values:
                strings[(p.trusted_packet_sequence_id, d.iid)] = d.str.decode()
    graph = [strings.get((p.trusted_packet_sequence_id, a.string_value_iid)) for p in begins
             for a in p.track_event.debug_annotations if a.HasField("string_value_iid")]
    graph = [x for x in graph if x and x.startswith("graph ")]
    assert len(graph) == 4 * len(range(0, 40, g.GRAPH_EVERY))
    assert set(graph) == {f"graph {g.GRAPH_ID} node {(1 << 32) + j}" for j in range(4)}
    by_seq = {}
    for p in t.packet:
        if p.HasField("track_event") and p.track_event.track_uuid in gpu_tracks:
            by_seq.setdefault(p.trusted_packet_sequence_id, []).append(p.timestamp)
    assert all(ts == sorted(ts) for ts in by_seq.values())


def test_chrome_json_has_every_dumped_execution_on_its_stream_thread_with_flows(run, tmp_path):
    from decimal import Decimal
    path, _ = run
    out = tmp_path / "g.json"
    res = CliRunner().invoke(cli, ["export", str(path), "-o", str(out), "--format",
                                   "chrome-json"])
    assert res.exit_code == 0, res.output
    assert "210 GPU executions (200 with a flow" in res.output
    ev, _ = chrome_content.events(out.read_bytes())    # the µs text, exactly; defaults put back
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev
               if e["ph"] == "M" and e["name"] == "thread_name"}
    gpu = {(e["args"]["pid"], e["args"]["correlation"]): e for e in ev
           if e["ph"] == "X" and e["cat"] == "gpu"}
    dump = CliRunner().invoke(cli, ["dump", str(path)])
    lines = [json.loads(x) for x in dump.stdout.splitlines() if x.startswith('{"kind": "gpu_')]
    assert len(lines) == len(gpu) == 210
    for d in lines:
        x = gpu[(d["pid"], d["correlation"])]
        assert x["ts"] == Decimal(d["t_ns"]) / 1000
        assert x["dur"] == Decimal(max(d["end_ns"] - d["t_ns"], 0)) / 1000
        assert x["name"] == d["name"]
        assert x["args"] == {k: v for k, v in d.items() if k not in ("kind", "t_ns", "end_ns",
                                                                       "name")}
        assert threads[(x["pid"], x["tid"])] == f"GPU0 stream {d['stream']} (pid {d['pid']})"
    conv = [x for x in gpu.values() if x["args"]["pid"] == g.PID2]
    assert len(conv) == 10 and all(x["args"]["timestamps"] == "converted"
                                   and x["args"]["unc_ns"] is None for x in conv)
    # flows: one start on the launching thread's call, one end on the execution
    s = {e["id"]: e for e in ev if e["ph"] == "s" and e["cat"] == "gpu"}
    f = {e["id"]: e for e in ev if e["ph"] == "f" and e["cat"] == "gpu"}
    assert len(s) == len(f) == 200 and set(s) == set(f)
    launches = {(x["pid"], x["tid"], x["ts"]) for x in ev if x["ph"] == "X" and x["cat"] == "cuda"}
    by_end = {(x["pid"], x["tid"], x["ts"]): x for x in gpu.values()}
    for i, a in s.items():
        b = f[i]
        assert b["bp"] == "e" and (a["pid"], a["tid"], a["ts"]) in launches
        x = by_end[(b["pid"], b["tid"], b["ts"])]
        assert x["args"]["launch"]["source"] == "bpf"
        assert (a["pid"], a["tid"]) == (x["args"]["pid"], x["args"]["launch"]["tid"])
        assert a["ts"] == Decimal(x["args"]["launch"]["t_ns"]) / 1000


def test_report_section_counts_idle_gaps_while_the_launcher_was_off_cpu(run, tmp_path):
    path, truth = run
    rep = build_report(Timeline.open(path), tmp_path / "rep")
    n = rep.numbers["gpu_activity"]
    gaps = n["idle_gaps"]
    blocked = [x for x in truth["gaps"] if x[2] == "blocked"]
    preempted = [x for x in truth["gaps"] if x[2] == "preempted"]
    assert gaps["with_offcpu"] == len(truth["gaps"]) == 11
    assert gaps["blocked_ns"] == sum(b - a for a, b, _ in blocked)
    assert gaps["preempted_ns"] == sum(b - a for a, b, _ in preempted)
    s = next(x for x in n["streams"] if x["pid"] == g.PID)
    assert s["kernels"] == 160 and s["memsets"] == 40
    assert 0 < s["busy_share"] < 1 and s["busy_ns"] + s["idle_ns"] == s["span_ns"]
    assert n["launch_to_start_ns"]["negative"] == 0 and n["launch_to_start_ns"]["p50"] >= 8000
    assert "GPU activity" in rep.text and "Idle gaps while the launching thread" in rep.markdown
    # the findings say it first, with the idle time those gaps held, pointing to the section
    f = next(x for x in rep.numbers["findings"] if x["section"] == "GPU activity")
    assert f["impact_ns"] == gaps["idle_in_gaps_with_offcpu_ns"] > 0
    assert f["text"].startswith("GPU idle while the launching thread was off-CPU: ")
    assert f"in 11 of {gaps['gaps']} gaps" in f["text"]


def test_load_in_blocks_gives_the_same_rows(run, monkeypatch):
    """load() maps and joins BLOCK rows at a time (bounded temporaries): blocks of 7 rows
    must give exactly the rows of one block over all."""
    from clockalign.timeline import gpu_load
    path, _ = run
    whole = Timeline.open(path).gpu_activity().rows
    monkeypatch.setattr(gpu_load, "BLOCK", 7)
    small = Timeline.open(path).gpu_activity().rows
    assert len(whole) > 7 * 10 and (whole["launch_src"] == LAUNCH_BPF).any()
    assert whole.tobytes() == small.tobytes()


@pytest.mark.parametrize("maker", ["gpu", "bulk-graphs"])
def test_a_few_fields_as_narrow_columns_are_the_full_rows_fields(run, tmp_path, maker):
    """load(fields=...) keeps each field in the narrowest integer type (end_ns and
    launch_t_ns as differences from t_ns): the values are the full rows' own."""
    from clockalign.timeline.gpu_activity import ACTIVITY_DTYPE
    if maker == "gpu":
        path = run[0]
    else:
        path = tmp_path / "bulk.ca"
        g.make_bulk_gpu_run(str(path), 3000, chunk=512, per_call=3, every_ns=20_000)
    full = Timeline.open(path).gpu_activity().rows
    fields = list(ACTIVITY_DTYPE.names)
    tl = Timeline.open(path)
    part = tl.gpu_activity(fields=fields).rows
    assert len(part) == len(full) > 0
    for f in fields:
        assert (np.asarray(part[f]) == full[f]).all(), f
    assert part["pid"].itemsize < full["pid"].itemsize
    assert part.cols["dur_ns"].itemsize < 8 and "end_ns" not in part.cols
    assert tl.gpu_activity().rows.tobytes() == full.tobytes()     # the whole rows again


def test_a_run_without_gpu_activity_has_no_section(tmp_path):
    from tests.synthetic import make_run
    p = tmp_path / "plain.ca"
    make_run(str(p), n_events=2000, duration_s=2)
    tl = Timeline.open(p)
    assert len(tl.gpu_activity()) == 0
    rep = build_report(tl, tmp_path / "rep")
    assert "gpu_activity" not in rep.numbers


def test_row_keys_are_numpy_unique_over_rows():
    from clockalign.timeline.gpu_activity import row_keys
    rng = np.random.default_rng(3)
    cols = [rng.integers(0, 3, 500), rng.integers(0, 1 << 40, 500) % 7 << 33,
            rng.integers(0, 5, 500).astype(np.uint32)]
    uniq, inv = row_keys(*cols)
    want, winv = np.unique(np.stack([c.astype(np.int64) for c in cols], axis=1), axis=0,
                           return_inverse=True)
    assert uniq == [tuple(r) for r in want.tolist()]
    assert (inv == winv.reshape(-1)).all()


def test_launch_flows_match_every_execution_of_a_launch_by_time_and_thread():
    from types import SimpleNamespace
    from clockalign.export.gpu_tracks import FLOW_BASE, LaunchFlows
    r = np.zeros(5, dtype=[("launch_src", "u1"), ("launch_tid", "<u4"),
                           ("launch_t_ns", "<i8")])
    r["launch_src"] = [1, 1, 1, 1, 2]           # row 4: a callback stamp, no BPF call
    r["launch_tid"] = [7, 7, 8, 7, 7]
    r["launch_t_ns"] = [100, 200, 200, 200, 300]  # rows 1 and 3: one graph launch, two runs
    lf = LaunchFlows(SimpleNamespace(rows=r))
    start = np.array([50, 100, 200, 200, 300, 200])
    tid = np.array([7, 7, 8, 7, 7, 7])
    kind = np.full(6, Kind.CUDA)
    skip = np.array([False] * 5 + [True])       # its stream-track copy gets no flow
    rows, ids = lf.match(start, tid, kind, skip)
    assert rows.tolist() == [1, 2, 3, 3]                  # sorted by row, then execution
    assert (ids - np.uint64(FLOW_BASE + 1)).tolist() == [0, 2, 1, 3]
    assert lf.matched.tolist() == [True, True, True, True, False]


def test_graph_kernels_are_grouped_into_their_replays():
    from clockalign.report.gpu_activity import graph_table
    from clockalign.timeline.gpu_activity import ACTIVITY_DTYPE
    # graph 5: 3 replays (correlations 10, 11, 12) of 2 nodes; graph 9: 1 replay of 3 nodes;
    # 4 kernels launched one by one (graph id 0)
    spec = [(5, 10, n, 100 * r) for r in range(3) for n in (1, 2)] + \
           [(9, 20, n, 1000) for n in (1, 2, 3)] + [(0, 30 + i, 0, 2000) for i in range(4)]
    rows = np.zeros(len(spec), dtype=ACTIVITY_DTYPE)
    rows["kind"] = GpuKind.KERNEL
    rows["pid"] = 7
    for i, (graph, corr, node, t) in enumerate(spec):
        rows[i]["aux"], rows[i]["graph_node"] = graph, node
        rows[i]["corr"] = corr + (t // 100 if graph == 5 else 0)
        rows[i]["t_ns"] = t + 10 * node
        rows[i]["end_ns"] = t + 10 * node + 5
    got = {g["graph"]: g for g in graph_table(rows)}
    assert set(got) == {5, 9}
    assert (got[5]["replays"], got[5]["nodes"], got[5]["kernels"]) == (3, 2, 6)
    assert (got[9]["replays"], got[9]["nodes"], got[9]["kernels"]) == (1, 3, 3)
    assert got[5]["total_ns"] == 30 and got[9]["total_ns"] == 15
    assert got[5]["span_max_ns"] == 15 and got[9]["span_max_ns"] == 25   # first start..last end


def test_launches_seen_at_entry_only_are_joined_too(tmp_path):
    """--cuda-returns blocking: launches are CUDA_ENTRY records (no return).  Each kernel
    is still joined to its BPF launch, at the entry's stamp; the call's end stays CUPTI's
    callback end, since its return was not probed."""
    truth = g.make_gpu_run(tmp_path / "entry.ca", entry_only=True)
    acts = Timeline.open(tmp_path / "entry.ca").gpu_activity()
    r = acts.rows[acts.rows["pid"] == g.PID]
    assert acts.stats["joined_bpf"] == 200
    assert (r["launch_src"] == LAUNCH_BPF).all() and (r["launch_tid"] == g.TID).all()
    ev = truth["events"]
    entries = np.sort(ev[ev["kind"] == Kind.CUDA_ENTRY]["ts"].astype(np.int64))
    r = r[np.argsort(r["corr"])]
    assert (r["launch_t_ns"] == entries).all()
    assert (r["launch_end_ns"] == entries + g.LAUNCH_NS - 1_000).all()   # CUPTI's end
    names = {acts.launch_function(x) for x in r}
    assert names == {"cuLaunchKernel", "cuMemsetD8Async"}


def test_sampled_windows_bound_idle_time_and_gaps():
    """--gpu-activity-duty: a stream's idle time counts only inside the windows, and the
    time between two windows is no idle gap (nothing was recorded there)."""
    from clockalign.report.gpu_activity import idle_gaps, stream_table, within
    from clockalign.timeline.gpu_activity import ACTIVITY_DTYPE
    rows = np.zeros(4, ACTIVITY_DTYPE)
    rows["kind"] = GpuKind.KERNEL
    rows["t_ns"] = [100, 300, 1100, 1500]      # window 1: [0, 500), window 2: [1000, 1600)
    rows["end_ns"] = [200, 400, 1200, 1550]
    w = np.array([[0, 500], [1000, 1600]], dtype=np.int64)
    assert within(100, 1550, w) == 400 + 550 and within(100, 1550, None) == 1450
    s = stream_table(rows, windows=w)[0]
    assert (s["span_ns"], s["busy_ns"], s["idle_ns"]) == (950, 350, 600)
    assert stream_table(rows)[0]["idle_ns"] == 1450 - 350
    # gaps 200-300 and 1200-1500 stay; 400-1100 spans the time between the windows
    assert idle_gaps(rows, {}, windows=w)["idle_ns"] == 100 + 300
    assert idle_gaps(rows, {})["idle_ns"] == 100 + 700 + 300


def test_flows_start_on_launches_seen_at_entry_only(tmp_path):
    """Launches recorded at their entry only (CUDA_ENTRY instants) start the flows to their
    executions, in Perfetto and in Chrome JSON, as launches with a return do."""
    truth = g.make_gpu_run(tmp_path / "entry.ca", entry_only=True)
    ev = truth["events"]
    entries = set(ev[ev["kind"] == Kind.CUDA_ENTRY]["ts"].astype(np.int64).tolist())
    tl = Timeline.open(tmp_path / "entry.ca")
    stats = export_run(tl, str(tmp_path / "e.pftrace"), "perfetto")
    assert stats["gpu_activity"] == 210 and stats["gpu_flows"] == 200
    t = pftrace.decode((tmp_path / "e.pftrace").read_bytes())
    names = {}
    starts, ends = {}, {}
    for p in t.packet:
        for n in p.interned_data.event_names:
            names[(p.trusted_packet_sequence_id, n.iid)] = n.name
        e = p.track_event
        for f in e.flow_ids:
            assert e.type == TrackEvent.TYPE_INSTANT
            starts[f] = (p.timestamp, names[(p.trusted_packet_sequence_id, e.name_iid)])
        for f in e.terminating_flow_ids:
            ends[f] = p.timestamp
    assert len(starts) == 200 and set(starts) == set(ends)
    assert {ts for ts, _ in starts.values()} <= entries
    assert {n for _, n in starts.values()} == {"cuLaunchKernel", "cuMemsetD8Async"}
    assert all(ends[f] > ts for f, (ts, _) in starts.items())       # the GPU ran it after
    export_run(tl, str(tmp_path / "e.json"), "chrome-json")
    evs = chrome_content.loads((tmp_path / "e.json").read_text())["traceEvents"]
    s = {e["id"] for e in evs if e.get("ph") == "s" and e.get("cat") == "gpu"}
    f = {e["id"] for e in evs if e.get("ph") == "f" and e.get("cat") == "gpu"}
    assert len(s) == 200 and s == f


def _device_records_last(src, dst):
    """A copy of run ``src`` whose DEVICE records come after all the activity they name."""
    from clockalign.store.reader import COLUMNAR, RunReader
    from clockalign.store.schema import Chunk
    from clockalign.store.writer import RunWriter
    r = RunReader(src)
    dev = []
    with RunWriter(dst, r.meta) as w:
        for ctype, payload in r.iter_chunks():
            if ctype == Chunk.TRAILER:
                continue
            if ctype not in COLUMNAR:
                w.write_rows(ctype, payload["rows"])
                continue
            cols = r.decode_payload(payload)
            if ctype == Chunk.GPU_ACTIVITY:
                m = cols["kind"] == GpuKind.DEVICE
                dev.append({k: v[m] for k, v in cols.items()})
                cols = {k: v[~m] for k, v in cols.items()}
            w.write_columns(ctype, cols)
        w.write_columns(Chunk.GPU_ACTIVITY, {k: np.concatenate([d[k] for d in dev])
                                             for k in dev[0]})
        w.close(r.trailer)


def test_a_device_record_after_the_activity_it_names_maps_that_activity(tmp_path,
                                                                         monkeypatch):
    """Chunks are mapped as they are read, by the DEVICE records seen so far; one that comes
    later and names another domain makes load() read the chunks again: the rows are those
    of the run with the record first."""
    from clockalign.timeline import gpu_load
    src, late = tmp_path / "a.ca", tmp_path / "b.ca"
    g.make_bulk_gpu_run(str(src), 4000, chunk=1024, per_call=2)
    _device_records_last(str(src), str(late))
    monkeypatch.setattr(gpu_load._Domains, "guess", lambda self, p, d: None)
    want = Timeline.open(src).gpu_activity()
    tl = Timeline.open(late)
    got = tl.gpu_activity()
    n = len(list(tl.reader.chunk_sizes(Chunk.GPU_ACTIVITY)))
    assert tl.reader.decodes[Chunk.GPU_ACTIVITY] == 2 * n        # read twice
    assert len(got) == len(want) == 4000 and got.rows.tobytes() == want.rows.tobytes()
    assert got.stats == want.stats and got.notes == want.notes == []
