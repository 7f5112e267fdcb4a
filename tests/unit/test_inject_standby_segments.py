"""Segments of a repetition served by a warm standby (inject --standby), synthetic as the
probes would record it on a GPU host: the switch, the standby's first request, the ready
answer, then the replacement's restart up to the standbys replenished; the cold restart of
the same fault has none of the standby's boundaries."""
from clockalign.inject import output
from clockalign.inject.segments import split
from clockalign.store import cuda_api
from clockalign.store.schema import Kind
from clockalign.timeline import Timeline

from .test_inject_segments import MS, OLD, T0, _gpu_run, sticky_fault_rows, write_run

SERVICE, SUP0, STANDBY, NEW = 100, 102, 250, 300


def _standby_run(tmp_path):
    fid = {n: cuda_api.BY_SYMBOL[n].id for n in ("cuLaunchKernel", "cuDevicePrimaryCtxRetain")}
    cuda = dict(kind=Kind.CUDA)
    rows = [
        *sticky_fault_rows(),
        # the standby's main thread, asleep in recv() since it was ready: woken by a request
        # 8.5 ms after the fault's request (it runs 0.5 ms later)
        dict(ts=T0 - 40 * MS, dur=49 * MS, pid=STANDBY, tid=STANDBY, kind=Kind.SCHED,
             a0=500_000),
        dict(ts=T0 + 10 * MS, dur=9000, pid=STANDBY, tid=STANDBY, code=fid["cuLaunchKernel"],
             **cuda),
        dict(ts=T0 + 30 * MS, pid=OLD, tid=OLD, kind=Kind.THREAD_EXIT, code=1),
        dict(ts=T0 + 32 * MS, pid=SERVICE, tid=NEW, kind=Kind.THREAD_NEW, a0=SUP0),
        dict(ts=T0 + 900 * MS, dur=1000, pid=NEW, tid=NEW, code=fid["cuDevicePrimaryCtxRetain"],
             **cuda),
        dict(ts=T0 + 1205 * MS, dur=8000, pid=NEW, tid=NEW, code=fid["cuLaunchKernel"], **cuda),
        # the slot's supervisor thread, asleep in recv() from the worker's start until it
        # says ready: woken at 1216.2 ms
        dict(ts=T0 + 33 * MS, dur=1183 * MS + 300_000, pid=SERVICE, tid=SUP0,
             kind=Kind.SCHED, a0=100_000),
    ]
    run = write_run(str(tmp_path / "standby.ca"), rows)

    def e(t, ev, pid=SERVICE, tid=None, **kw):
        return {"t_ns": T0 + t, "ev": ev, "pid": pid, "tid": tid or pid, **kw}
    events = [e(-3000 * MS, "worker_spawn", worker=OLD),
              e(-2999 * MS, "worker_spawn", worker=STANDBY),
              e(-100 * MS, "ready", worker=OLD), e(-50 * MS, "standby_ready", worker=STANDBY),
              e(1 * MS, "accepted", id="inject-0"),
              e(6 * MS, "engine_sticky_error", OLD),
              e(7 * MS, "switch", tid=SUP0, worker=STANDBY, old=OLD, why="sticky"),
              e(31 * MS, "worker_exit", tid=SUP0, worker=OLD, code=3),
              e(31 * MS + 5, "worker_spawn", tid=SUP0, worker=NEW),
              e(800 * MS, "worker_start", NEW), e(1200 * MS, "model_loaded", NEW),
              e(1215 * MS, "first_success", NEW),
              e(1216 * MS + 500_000, "standby_ready", tid=SUP0, worker=NEW, standbys=1)]
    client = {"fault": "illegal-address", "standby": 1, "repetitions": [{
        "i": 0, "t_send_ns": T0, "t_sent_ns": T0 + 200_000, "t_answer_ns": T0 + 8 * MS,
        "status": 500, "error": "sticky", "t_ready_ns": T0 + 10 * MS, "polls": 1,
        "t_full_ns": T0 + 1250 * MS}]}
    return Timeline.open(run), client, events


def test_the_standby_switch_and_the_replenish_are_boundaries(tmp_path):
    rep, = split(*_standby_run(tmp_path))
    b = {x["name"]: x for x in rep["boundaries"]}
    assert b["switched to standby"] == {"name": "switched to standby", "t_ns": T0 + 7 * MS,
                                        "unc_ns": 0, "source": "service log"}
    assert b["standby's first request"]["t_ns"] == T0 + 8 * MS + 500_000
    assert b["standby's first request"]["source"] == "sched_wakeup tracepoint"
    assert b["CUDA error returned"]["t_ns"] == T0 + 5 * MS     # the old worker's, not the standby's
    assert b["worker restart"]["t_ns"] == T0 + 32 * MS
    assert b["worker restart"]["source"] == "sched_process_fork tracepoint"
    assert b["CUDA init"]["source"] == "uprobe: cuDevicePrimaryCtxRetain"
    assert b["first successful launch"]["t_ns"] == T0 + 1205 * MS + 8000
    assert b["standby replenished"] == {"name": "standby replenished",
                                        "t_ns": T0 + 1216 * MS + 200_000, "unc_ns": 0,
                                        "source": "sched_wakeup tracepoint"}
    assert "ready (service)" not in b                 # readiness never went away
    names = [x["name"] for x in rep["boundaries"]]
    assert names.index("ready answer") < names.index("worker started")
    assert rep["total_ns"] == 10 * MS and rep["recover_ns"] == 2 * MS
    assert rep["replenish_ns"] == 1216 * MS + 200_000
    row = output.make_row("torch + 1 standby", "illegal-address", [rep], standby=1)
    assert row["standby"] == 1 and row["replenish_ms"] == {"p50": 1216.2, "p99": 1216.2}
    assert row["pass"] is True and row["total_ms"]["p99"] == 10.0
    seg = [s["name"] for s in row["segments"]]
    assert "error answer -> switched to standby" not in seg
    assert seg[-1] == "first successful launch -> standby replenished"
    md = output.markdown([row], {}, [])
    assert "replenished 1216.2 / 1216.2 ms" in md


def test_a_cold_restart_has_no_standby_boundaries(tmp_path):
    rep, = split(*_gpu_run(tmp_path))
    names = {x["name"] for x in rep["boundaries"]}
    assert {"switched to standby", "standby's first request",
            "standby replenished"}.isdisjoint(names)
    assert "ready (service)" in names and rep["replenish_ns"] is None
    row = output.make_row("torch", "illegal-address", [rep])
    assert "standby" not in row and "replenish_ms" not in row
