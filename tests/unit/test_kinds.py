"""The table of event kinds (store/kinds.py) and its newest row, CUDA_ENTRY: a call recorded
at its entry only (record --cuda-returns blocking), counted as a call with no duration by
dump, export, report and watch; an unknown function is spelled one way everywhere.
"""
import json

import numpy as np
import pytest
from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import TrackEvent
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from clockalign.export import export_run
from clockalign.report import build_report
from clockalign.store import cuda_api
from clockalign.store.kinds import CALL_KINDS, ENTRY_KINDS, KINDS, SPAN_KINDS, event_dicts
from clockalign.store.reader import RunReader
from clockalign.store.schema import EVENT_DTYPE, Chunk, Kind
from clockalign.store.writer import RunWriter
from clockalign.timeline import Timeline
from tests.unit import pftrace
from tests.unit import chrome_content
from clockalign.timeline.stamps import STAMP_UNC_NS, probe_type
from clockalign.watch.aggregate import ENTRY_ONLY, Aggregator
from clockalign.watch.metrics import build_registry

T0, PID = 10**12, 4242
LAUNCH = cuda_api.BY_SYMBOL["cuLaunchKernel"]
SYNC = cuda_api.BY_SYMBOL["cuStreamSynchronize"]
UNKNOWN_FN = 999
ENTRIES = 7                    # cuLaunchKernel calls recorded at their entry only


def _events() -> np.ndarray:
    ev = np.zeros(ENTRIES + 3, dtype=EVENT_DTYPE)
    ev["pid"], ev["tid"] = PID, PID + 1
    for i in range(ENTRIES):
        ev[i]["kind"], ev[i]["ts"], ev[i]["code"] = Kind.CUDA_ENTRY, T0 + i * 1000, LAUNCH.id
        ev[i][f"a{LAUNCH.slot('func')}"] = 0x7000 + i
        ev[i][f"a{LAUNCH.slot('grid')}"] = 2 | 1 << 32 | 1 << 48
    ev[ENTRIES]["kind"], ev[ENTRIES]["code"] = Kind.CUDA, SYNC.id
    ev[ENTRIES]["ts"], ev[ENTRIES]["dur"] = T0 + 10_000, 50_000
    ev[ENTRIES + 1]["kind"], ev[ENTRIES + 1]["code"] = Kind.CUDA, UNKNOWN_FN
    ev[ENTRIES + 1]["ts"], ev[ENTRIES + 1]["dur"] = T0 + 70_000, 1_000
    ev[ENTRIES + 2]["kind"], ev[ENTRIES + 2]["ts"] = Kind.THREAD_NAME, T0 + 80_000
    ev[ENTRIES + 2]["data"] = b"worker".ljust(56, b"\0")
    return ev


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("kinds") / "run.ca")
    ev = _events()
    with RunWriter(path, {"tool": "clockalign", "clocks": {"MONOTONIC": T0},
                          "targets": [{"pid": PID, "cmdline": ["serve"]}]}) as w:
        w.write_columns(Chunk.EVENTS, {n: ev[n] for n in EVENT_DTYPE.names})
        w.close({"reason": "test", "t_ns": T0 + 100_000})
    return path


def test_every_kind_has_one_row():
    assert set(KINDS) == set(Kind)
    assert set(STAMP_UNC_NS) == set(Kind)
    assert set(CALL_KINDS) == {Kind.CUDA, Kind.CUDA_UNFINISHED, Kind.CUDA_ENTRY}
    assert ENTRY_KINDS == (Kind.CUDA_ENTRY,) and Kind.CUDA_ENTRY not in SPAN_KINDS
    assert probe_type(Kind.CUDA_ENTRY) == "uprobe" and probe_type(Kind.SCHED) == "tracepoint"
    assert all(s.domain == "MONOTONIC" for s in KINDS.values())


def test_dump_fields(run):
    r = RunReader(run)
    got = [d for b in r.iter_events() for d in event_dicts(b, xid_messages=r.xid_messages)]
    entries = [d for d in got if d["kind"] == "cuda_entry"]
    assert len(entries) == ENTRIES
    assert entries[0] == {"kind": "cuda_entry", "t_ns": T0, "pid": PID, "tid": PID + 1,
                          "fn": "cuLaunchKernel", "ret": None, "entry_only": True,
                          **{a: 0 for a in LAUNCH.arg_names if a},
                          "func": 0x7000, "grid": [2, 1, 1], "block": [0, 0, 0]}
    unknown = [d for d in got if d.get("fn", "").startswith("cuda_fn_")]
    assert [d["fn"] for d in unknown] == [f"cuda_fn_{UNKNOWN_FN}"]
    assert got[-1] == {"kind": "thread_name", "t_ns": T0 + 80_000, "pid": PID,
                       "tid": PID + 1, "comm": "worker"}


def test_export_draws_entries_as_instant_calls(run, tmp_path):
    out = tmp_path / "t.json"
    export_run(Timeline.open(run), str(out), "chrome-json")
    evs = chrome_content.loads(out.read_text())["traceEvents"]
    launches = [e for e in evs if e.get("name") == "cuLaunchKernel" and e.get("cat") == "cuda"]
    assert len(launches) == ENTRIES and all(e["ph"] == "i" for e in launches)
    assert all(e["args"]["result"] == "not seen (entry only)" for e in launches)
    assert any(e.get("name") == f"cuda_fn_{UNKNOWN_FN}" and e["ph"] == "X" for e in evs)
    pb = tmp_path / "t.pftrace"
    export_run(Timeline.open(run), str(pb), "perfetto")
    trace = pftrace.decode(pb.read_bytes())
    names = {}
    for p in trace.packet:
        for n in p.interned_data.event_names:
            names[(p.trusted_packet_sequence_id, n.iid)] = n.name
    types = [p.track_event.type for p in trace.packet if p.HasField("track_event")
             and names.get((p.trusted_packet_sequence_id, p.track_event.name_iid))
             == "cuLaunchKernel"]
    assert types == [TrackEvent.TYPE_INSTANT] * (2 * ENTRIES)     # its thread, its stream


def test_report_counts_entries_as_calls(run, tmp_path):
    rep = build_report(Timeline.open(run), str(tmp_path / "rep"))
    assert rep.numbers["cuda_entry_only"] == {"cuLaunchKernel": ENTRIES}
    assert f"cuLaunchKernel x{ENTRIES}" in rep.markdown
    # no latency from them: the table's functions are the calls that returned
    assert {r["function"] for r in rep.numbers["cuda"]} == {"cuStreamSynchronize",
                                                            f"cuda_fn_{UNKNOWN_FN}"}


def test_watch_counts_entries_without_a_duration(run):
    agg = Aggregator()
    agg.open({"gpus": [], "cflags": []})
    ev = RunReader(run).events()
    agg.write_columns(Chunk.EVENTS, {n: ev[n] for n in EVENT_DTYPE.names})
    text = generate_latest(build_registry(agg)[0]).decode()
    m = {(s.name, tuple(sorted(s.labels.items()))): s.value
         for fam in text_string_to_metric_families(text) for s in fam.samples}
    assert m[("clockalign_cuda_calls_total", (("function", "cuLaunchKernel"), ("pid", str(PID)),
                                              ("result", ENTRY_ONLY)))] == ENTRIES
    assert not any(k[0].startswith("clockalign_cuda_call_duration") and
                   ("function", "cuLaunchKernel") in k[1] for k in m)
    assert agg.cuda_calls_seen == ENTRIES + 2
    assert "(0 failed" in agg.status_text()
