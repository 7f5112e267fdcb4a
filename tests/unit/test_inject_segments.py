"""Segments of a fault's life cycle cut from real recordings (tests/data/inject/) and from
synthetic repetitions; the rows, their schema and the outputs."""
import json
import os

import pytest

from clockalign.inject import output
from clockalign.inject.eventlog import read_events
from clockalign.inject.segments import canonical_order, segments, split
from clockalign.timeline import Timeline

DATA = os.path.join(os.path.dirname(__file__), "..", "data", "inject")
ROW_KEYS = {"engine", "fault", "n", "detect_ms", "recover_ms", "total_ms", "deadline_ms",
            "pass", "segments"}


def _load(stem):
    d = os.path.join(DATA, stem)
    with open(os.path.join(d, "client.json")) as f:
        client = json.load(f)
    events = read_events(os.path.join(d, "events.jsonl"))
    return Timeline.open(os.path.join(d, "run.ca")), client, events


def _by_name(rep):
    return {b["name"]: b for b in rep["boundaries"]}


def test_timeout_boundaries_come_from_the_kernel():
    tl, client, events = _load("onnxruntime-timeout")
    reps = split(tl, client, events)
    assert len(reps) == 3
    kills = [r for r in events if r["ev"] == "kill_sent"]
    assert len(kills) == 3
    for rep, raw, kill in zip(reps, client["repetitions"], kills):
        b = _by_name(rep)
        assert rep["status"] == 504
        assert rep["detect_ns"] == raw["t_answer_ns"] - raw["t_send_ns"]
        assert rep["recover_ns"] == raw["t_ready_ns"] - raw["t_answer_ns"]
        assert b["watchdog wakeup"]["source"] == "sched_wakeup tracepoint"
        assert b["kill sent"]["source"] == "signal_generate tracepoint"
        assert b["worker exit"]["source"] == "sched_process_exit tracepoint"
        assert b["worker restart"]["source"] == "sched_process_fork tracepoint"
        # causality, each stamp on one clock: wakeup <= the log's own stamp of it, the kill
        # signal before the exit, the exit before the new fork and the answer
        fired = next(r for r in events if r["ev"] == "watchdog_fired"
                     and r["t_ns"] >= raw["t_send_ns"])
        assert b["watchdog wakeup"]["t_ns"] <= fired["t_ns"] < b["kill sent"]["t_ns"]
        assert abs(b["kill sent"]["t_ns"] - kill["t_ns"]) < 5_000_000
        assert b["kill sent"]["t_ns"] < b["worker exit"]["t_ns"] < b["worker restart"]["t_ns"]
        assert b["worker exit"]["t_ns"] < b["error answer"]["t_ns"]
        # the watchdog's deadline (1000 ms) from the request's acceptance
        wait = b["watchdog wakeup"]["t_ns"] - b["request accepted"]["t_ns"]
        assert 1_000_000_000 <= wait < 1_100_000_000
        assert b["ready (service)"]["t_ns"] <= b["ready answer"]["t_ns"]
        assert b["request sent"]["unc_ns"] > 0
        assert [x["t_ns"] for x in rep["boundaries"]] == sorted(x["t_ns"] for x in rep["boundaries"])


def test_segments_add_up_to_the_repetition():
    tl, client, events = _load("onnxruntime-timeout")
    reps = split(tl, client, events)
    order = canonical_order(reps)
    assert order[0] == "request sent" and order[-1] == "ready answer"
    segs = segments(reps)
    assert len(segs) == len(order) - 1
    for i, rep in enumerate(reps):
        b = _by_name(rep)
        total = sum(d[i] for _, d, _ in segs)
        assert total == b["ready answer"]["t_ns"] - b["request sent"]["t_ns"]


def test_oom_stays_in_one_worker():
    tl, client, events = _load("onnxruntime-oom")
    reps = split(tl, client, events)
    for rep in reps:
        b = _by_name(rep)
        assert rep["status"] == 507
        assert "worker exit" not in b and "worker restart" not in b
        assert b["request accepted"]["t_ns"] < b["engine raised"]["t_ns"] \
            < b["split retry failed"]["t_ns"] < b["error answer"]["t_ns"]
        assert b["first successful inference"]["source"] == "service log"
        assert b["ready (service)"]["t_ns"] < b["ready answer"]["t_ns"]


def test_row_schema_and_values():
    tl, client, events = _load("onnxruntime-timeout")
    reps = split(tl, client, events)
    row = output.make_row("onnxruntime", "timeout", reps)
    assert set(row) == ROW_KEYS
    assert row["n"] == 3 and row["deadline_ms"] == 2800
    totals = sorted(r["total_ns"] / 1e6 for r in reps)
    assert row["total_ms"]["p99"] == pytest.approx(totals[-1], abs=1e-3)
    assert row["total_ms"]["p50"] == pytest.approx(totals[1], abs=1e-3)
    assert row["pass"] == (totals[-1] <= 2800)
    for s in row["segments"]:
        assert set(s) == {"name", "p50_ms", "p99_ms"} and " -> " in s["name"]
    strict = output.make_row("onnxruntime", "timeout", reps, deadline_ms=totals[-1] - 1)
    assert strict["pass"] is False


def _rep(i, t0, answer, ready, status=500, extra=()):
    bs = [{"name": "request sent", "t_ns": t0, "unc_ns": 10, "source": "client"},
          {"name": "error answer", "t_ns": t0 + answer, "unc_ns": 0, "source": "client"},
          {"name": "ready answer", "t_ns": t0 + ready, "unc_ns": 0, "source": "client"}]
    bs += [{"name": n, "t_ns": t0 + t, "unc_ns": 5, "source": "tracepoint"} for n, t in extra]
    bs.sort(key=lambda b: b["t_ns"])
    return {"i": i, "status": status, "error": "x", "detect_ns": answer,
            "recover_ns": ready - answer, "total_ns": ready, "boundaries": bs}


def test_missing_boundary_and_unrecovered_repetition():
    reps = [_rep(0, 0, 100, 300, extra=[("worker exit", 50)]),
            _rep(1, 1000, 120, 400),                       # exit not seen
            {"i": 2, "status": 500, "error": "x", "detect_ns": None, "recover_ns": None,
             "total_ns": None, "boundaries": []}]          # never ready again
    segs = {n: (d, u) for n, d, u in segments(reps)}
    assert segs["request sent -> worker exit"] == ([50], [15])
    assert segs["worker exit -> error answer"] == ([50], [5])
    assert segs["error answer -> ready answer"] == ([200, 280], [0, 0])
    row = output.make_row("torch", "timeout", reps)
    assert row["n"] == 2 and row["pass"] is False          # one repetition did not recover
    assert output.pct([], 50) is None


def test_nearest_rank_percentiles():
    vals = list(range(1, 21))
    assert output.pct(vals, 50) == 10 and output.pct(vals, 99) == 20


def test_outputs_merge_rows(tmp_path):
    a = output.make_row("onnxruntime", "timeout", [_rep(0, 0, 100_000_000, 300_000_000)])
    b = output.make_row("torch", "oom", [_rep(0, 0, 1_000_000, 3_000_000_000)])
    output.write_all(str(tmp_path), [a], {("onnxruntime", "timeout"): {}}, [])
    paths = output.write_all(str(tmp_path), [b], {("torch", "oom"): {}}, ["a note"])
    doc = json.loads(open(paths["json"]).read())
    assert list(doc) == ["rows"]
    assert [(r["engine"], r["fault"]) for r in doc["rows"]] == [("onnxruntime", "timeout"),
                                                                ("torch", "oom")]
    md = open(paths["md"]).read()
    assert "| torch | oom | 1 |" in md and "FAIL" in md and "- a note" in md
    assert open(paths["png"], "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_outputs_say_how_they_were_made(tmp_path):
    """lifecycle.md names the command that repeats the plan, the machine and the date."""
    import shlex

    from clockalign.inject.run import Plan, made_by
    plan = Plan(engines=["onnxruntime"], faults=["oom", "timeout"], out_dir=str(tmp_path),
                n=7, load=2, deadline_ms=500.0)
    line = made_by(plan)
    cmd = line.split("`")[1]
    assert shlex.split(cmd) == ["clockalign", "inject", "--engine", "onnxruntime",
                                "--fault", "oom", "--fault", "timeout", "-n", "7",
                                "--deadline-ms", "500", "--recovery-deadline", "2.8",
                                "--load", "2", "--load-generator", "auto", "-o", str(tmp_path)]
    assert os.uname().nodename in line and f"kernel {os.uname().release}" in line
    assert " UTC" in line
    row = output.make_row("onnxruntime", "oom", [_rep(0, 0, 100_000_000, 300_000_000)])
    paths = output.write_all(str(tmp_path), [row], {("onnxruntime", "oom"): {}}, [line])
    assert f"- {line}" in open(paths["md"]).read()


# ---------------------------------------------------------------- the GPU path, synthetic
MS = 1_000_000
T0 = 50_000 * MS
SERVICE, OLD, NEW, DOG, CLIENT = 100, 200, 300, 101, 50


def write_run(path, rows) -> str:
    """A run file of the event records ``rows`` (dicts of EVENT_DTYPE fields)."""
    import numpy as np

    from clockalign.store.schema import EVENT_DTYPE, Chunk
    from clockalign.store.writer import RunWriter
    ev = np.zeros(len(rows), dtype=EVENT_DTYPE)
    for i, r in enumerate(rows):
        for k, v in r.items():
            ev[i][k] = v
    with RunWriter(path, {"targets": [{"pid": CLIENT}]}) as w:
        w.write_columns(Chunk.EVENTS, {n: ev[n] for n in EVENT_DTYPE.names})
    return path


def sticky_fault_rows() -> list:
    """The old worker's launch, its synchronize failing with 700 (ILLEGAL_ADDRESS), the Xid."""
    from clockalign.store import cuda_api
    from clockalign.store.schema import Kind
    fid = {n: cuda_api.BY_SYMBOL[n].id for n in ("cuLaunchKernel", "cuStreamSynchronize")}
    return [dict(ts=T0 + 2 * MS, dur=10_000, pid=OLD, tid=OLD, code=fid["cuLaunchKernel"],
                 kind=Kind.CUDA),
            dict(ts=T0 + 3 * MS, dur=2 * MS, pid=OLD, tid=OLD, code=fid["cuStreamSynchronize"],
                 ret=700, kind=Kind.CUDA),
            dict(ts=T0 + 4 * MS, pid=OLD, tid=OLD, kind=Kind.XID, ret=31)]


def _gpu_run(tmp_path, cuinit=False):
    """An illegal-address repetition as the probes would record it on a GPU host: the
    worker's failing synchronize (700), the Xid, its exit, the new worker's fork, its CUDA
    init (with cuinit: a 60 ms cuInit first), allocations, module load and first launch; the
    service's log; the client."""
    from clockalign.store import cuda_api
    from clockalign.store.schema import Kind
    fid = {n: cuda_api.BY_SYMBOL[n].id for n in
           ("cuLaunchKernel", "cuStreamSynchronize", "cuMemAlloc_v2", "cuModuleLoadData",
            "cuDevicePrimaryCtxRetain", "cuInit")}
    cuda = dict(kind=Kind.CUDA)
    rows = [
        *sticky_fault_rows(),
        dict(ts=T0 + 30 * MS, pid=OLD, tid=OLD, kind=Kind.THREAD_EXIT, code=1),
        dict(ts=T0 + 32 * MS, pid=SERVICE, tid=NEW, kind=Kind.THREAD_NEW, a0=SERVICE + 1),
        *([dict(ts=T0 + 830 * MS, dur=60 * MS, pid=NEW, tid=NEW, code=fid["cuInit"], **cuda)]
          if cuinit else []),
        dict(ts=T0 + 900 * MS, dur=1000, pid=NEW, tid=NEW, code=fid["cuDevicePrimaryCtxRetain"], **cuda),
        *[dict(ts=T0 + (1000 + i) * MS, dur=5000, pid=NEW, tid=NEW, code=fid["cuMemAlloc_v2"],
               **cuda) for i in range(9)],
        dict(ts=T0 + 1100 * MS, dur=9000, pid=NEW, tid=NEW, code=fid["cuModuleLoadData"],
             **cuda),
        dict(ts=T0 + 1205 * MS, dur=8000, pid=NEW, tid=NEW, code=fid["cuLaunchKernel"], **cuda),
    ]
    run = write_run(str(tmp_path / "gpu.ca"), rows)

    def e(t, ev, pid, **kw):
        return {"t_ns": T0 + t, "ev": ev, "pid": pid, "tid": pid, **kw}
    events = [e(0, "worker_spawn", SERVICE, worker=OLD),
              e(1 * MS, "accepted", SERVICE, id="inject-0"),
              e(6 * MS, "engine_sticky_error", OLD), e(7 * MS, "not_ready", SERVICE),
              e(31 * MS, "worker_exit", SERVICE, worker=OLD, code=3),
              e(31 * MS + 5, "worker_spawn", SERVICE, worker=NEW),
              e(800 * MS, "worker_start", NEW), e(1200 * MS, "model_loaded", NEW),
              e(1215 * MS, "first_success", NEW), e(1216 * MS, "ready", SERVICE, worker=NEW)]
    client = {"fault": "illegal-address", "repetitions": [{
        "i": 0, "t_send_ns": T0, "t_sent_ns": T0 + 200_000, "t_answer_ns": T0 + 8 * MS,
        "status": 500, "error": "sticky", "t_ready_ns": T0 + 1250 * MS, "polls": 25}]}
    return Timeline.open(run), client, events


def test_gpu_boundaries_come_from_the_probes(tmp_path):
    tl, client, events = _gpu_run(tmp_path)
    rep, = split(tl, client, events)
    b = _by_name(rep)
    assert b["CUDA error returned"] == {"name": "CUDA error returned", "t_ns": T0 + 5 * MS,
                                        "unc_ns": 0, "source": "uprobe: cuStreamSynchronize -> "
                                        "CUDA_ERROR_ILLEGAL_ADDRESS"}
    assert b["Xid 31"]["t_ns"] == T0 + 4 * MS and b["Xid 31"]["source"] == "tracepoint"
    assert b["worker exit"]["t_ns"] == T0 + 30 * MS
    assert b["worker exit"]["source"] == "sched_process_exit tracepoint"
    assert b["worker restart"]["t_ns"] == T0 + 32 * MS
    assert b["CUDA init"]["source"] == "uprobe: cuDevicePrimaryCtxRetain"
    assert b["first successful launch"]["t_ns"] == T0 + 1205 * MS + 8000
    assert "first successful inference" not in b          # the probe saw it: no log needed
    assert b["engine raised"]["source"] == "service log"
    assert rep["reload_cuda_calls"] == {"context": 1, "alloc": 9, "module": 1}
    assert rep["detect_ns"] == 8 * MS and rep["total_ns"] == 1250 * MS
    row = output.make_row("torch", "illegal-address", [rep])
    assert row["pass"] is True and row["total_ms"]["p50"] == 1250.0
    names = [s["name"] for s in row["segments"]]
    assert names[:3] == ["request sent -> request accepted",
                         "request accepted -> Xid 31", "Xid 31 -> CUDA error returned"]
    assert output.detail([rep])["reload_cuda_calls_p50"] == {"alloc": 9, "context": 1,
                                                             "module": 1}


def test_a_probed_cuinit_splits_the_import_from_the_driver_start(tmp_path):
    """With cuInit probed, "CUDA init" is its entry and "CUDA context" the return of the
    first context call: worker started -> CUDA init is the import before any driver call."""
    tl, client, events = _gpu_run(tmp_path, cuinit=True)
    rep, = split(tl, client, events)
    b = _by_name(rep)
    assert b["CUDA init"]["t_ns"] == T0 + 830 * MS and b["CUDA init"]["source"] == "uprobe: cuInit"
    assert b["CUDA context"] == {"name": "CUDA context", "t_ns": T0 + 900 * MS + 1000,
                                 "unc_ns": 0,
                                 "source": "uprobe: cuDevicePrimaryCtxRetain returned"}
    row = output.make_row("torch", "illegal-address", [rep])
    seg = {x["name"]: x["p50_ms"] for x in row["segments"]}
    assert seg["worker started -> CUDA init"] == 30.0
    assert seg["CUDA init -> CUDA context"] == 70.001
    (tmp_path / "old").mkdir()
    assert "CUDA context" not in _by_name(split(*_gpu_run(tmp_path / "old"))[0])  # no cuInit


def test_the_request_comes_first_even_when_its_stamp_is_after_the_acceptance():
    """A slow send puts the middle of the client's send window after the service's
    "request accepted" (seen in CI under load): the order still starts at the request."""
    def rep(accepted):
        return {"total_ns": 10, "boundaries": sorted([
            {"name": "request accepted", "t_ns": accepted, "unc_ns": 0},
            {"name": "request sent", "t_ns": 1000, "unc_ns": 900},
            {"name": "error answer", "t_ns": 5000, "unc_ns": 0}], key=lambda b: b["t_ns"])}
    reps = [rep(400), rep(600), rep(1200)]
    assert canonical_order(reps) == ["request sent", "request accepted", "error answer"]
    (name, d, u), _ = segments(reps)
    assert name == "request sent -> request accepted" and d == [-600, -400, 200]
    assert u == [900, 900, 900]            # inside the send window's uncertainty
