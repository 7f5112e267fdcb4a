"""export --from/--to/--pid/--kind (export/window.py): a part of a run holds exactly the
events of that part, decoded with Perfetto's own protobuf classes, and is about its size."""
import json

import numpy as np
import pytest

from clockalign.export import export_run
from clockalign.export.clocks import gpu_clock_bands
from clockalign.export.window import Selection
from clockalign.store import cuda_api
from clockalign.store.schema import KIND_NAMES, Kind
from clockalign.timeline import Timeline
from tests.unit import chrome_content
from tests.unit.gpu_runs import PID, PID2, make_gpu_run
from tests.unit.test_export import DATA, SLICE_KINDS, _cli, check_trace, parse


def _expected(ev, t0, t1):
    """Events whose span [t, t + dur] overlaps [t0, t1) (instants: t0 <= t < t1), chosen
    here from the run's own columns, and how many slices/instants they draw."""
    t, end = ev["t_ns"].astype(np.int64), ev["t_ns"] + np.maximum(ev["dur_ns"], 0)
    sel = ev[(t < t1) & (end >= t0)]
    is_slice = np.isin(sel["kind"], SLICE_KINDS)
    work = int((np.isin(sel["kind"], [Kind.CUDA, Kind.CUDA_UNFINISHED]) &
                np.isin(sel["code"], cuda_api.STREAM_WORK_IDS)).sum())
    return sel, int(is_slice.sum()) + work, int((~is_slice).sum())


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    out = tmp_path_factory.mktemp("full") / "full.pftrace"
    export_run(Timeline.open(DATA), str(out))
    return out


def test_window_holds_exactly_the_window(tmp_path, full):
    tl = Timeline.open(DATA)
    span = tl.end_ns - tl.start_ns
    t0, t1 = tl.start_ns + span * 7 // 10, tl.start_ns + span * 8 // 10   # 10 %, the Xid in it
    sel = Selection.parse(tl, f"{t0}ns", f"{t1}ns",
                          kinds=[n for k, n in KIND_NAMES.items() if k != Kind.XID_MSG]
                          + ["counters"])
    out = tmp_path / "w.pftrace"
    stats = export_run(tl, str(out), select=sel)
    seen = check_trace(parse(out))
    ev, n_slices, n_inst = _expected(tl.events(), t0, t1)
    assert len(seen["slices"]) == n_slices > 0
    assert len(seen["instants"]) == n_inst > 0             # no faults: not among the kinds
    assert stats["events"] == {int(k): int((ev["kind"] == k).sum())
                               for k in np.unique(ev["kind"]).tolist()}
    assert all(b < t1 and e >= t0 for _, _, b, e, _ in seen["slices"])
    t = np.concatenate([tl.counters()["t_ns"]] + [b[0] for b in gpu_clock_bands(tl).values()])
    in_win = int(((t >= t0) & (t < t1)).sum())
    assert len(seen["counters"]) == in_win > 0             # samples and GPU clock bands
    assert all(t0 <= t < t1 for _, t, _ in seen["counters"])
    assert seen["snapshot"]                                 # still merges with a system trace
    assert out.stat().st_size < 0.25 * full.stat().st_size


def test_window_faults_and_flows(tmp_path):
    tl = Timeline.open(DATA)
    faults = tl.faults()
    t0 = int(faults[len(faults) // 2].t_ns)
    out = tmp_path / "f.pftrace"
    t1 = t0 + 2_000_000_000
    stats = export_run(tl, str(out), select=Selection.parse(tl, f"{t0}ns", f"{t1}ns"))
    seen = check_trace(parse(out))
    want = [f for f in faults if t0 <= f.t_ns < t1]
    assert stats["faults"] == len(want) > 0 and seen["flows"]
    for fid, ends in seen["flows"].items():                # every flow has both its ends
        assert len(ends) >= 2 and any(term for _, term in ends), fid
        assert all(t0 <= t < t1 for t, _ in ends)


def test_kind_filter_keeps_only_those_kinds(tmp_path):
    tl = Timeline.open(DATA)
    out = tmp_path / "k.json"
    stats = export_run(tl, str(out), "chrome-json", select=Selection.parse(tl, kinds=["sched"]))
    assert set(stats["events"]) == {Kind.SCHED} and stats["counters"] == stats["faults"] == 0
    evs = chrome_content.loads(out.read_text())["traceEvents"]
    assert {e["cat"] for e in evs if e["ph"] not in ("M",)} == {"sched"}
    assert sum(e["ph"] == "X" for e in evs) == int((tl.events()["kind"] == Kind.SCHED).sum())


@pytest.fixture(scope="module")
def gpu_run(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpu") / "g.ca"
    make_gpu_run(str(path))
    return str(path)


@pytest.mark.parametrize("pid,other", [(PID, PID2), (PID2, PID)])
def test_pid_filter_keeps_only_that_pid(gpu_run, tmp_path, pid, other):
    tl = Timeline.open(gpu_run)
    out = tmp_path / "p.pftrace"
    stats = export_run(tl, str(out), select=Selection.parse(tl, pids=[pid]))
    seen = check_trace(parse(out))
    pids = {d.process.pid for d in seen["declared"].values() if d.HasField("process")} | \
        {d.thread.pid for d in seen["declared"].values() if d.HasField("thread")}
    assert other not in pids and pids <= {pid}        # PID2 has GPU work only: no threads
    assert pid != PID or pids == {PID}
    ev = tl.events()
    acts = tl.gpu_activity().rows
    assert stats["gpu_activity"] == int((acts["pid"] == pid).sum()) > 0
    assert sum(stats["events"].values()) == int((ev["pid"] == pid).sum())
    assert stats["counters"] == 0 and not seen["counters"]       # nor GPU clock bands


def test_gpu_window_and_gpu_kinds(gpu_run, tmp_path):
    tl = Timeline.open(gpu_run)
    acts = tl.gpu_activity().rows
    span = tl.end_ns - tl.start_ns
    t0, t1 = tl.start_ns + span // 4, tl.start_ns + span // 2
    want = (acts["t_ns"] < t1) & (acts["end_ns"] >= t0)
    out = tmp_path / "g.pftrace"
    stats = export_run(tl, str(out), select=Selection.parse(tl, f"{t0}ns", f"{t1}ns"))
    assert stats["gpu_activity"] == int(want.sum()) > 0
    seen = check_trace(parse(out))
    for fid, ends in seen["flows"].items():
        assert len(ends) == 2, fid
    stats = export_run(tl, str(out), select=Selection.parse(tl, kinds=["gpu_memset"]))
    assert stats["gpu_activity"] == int((acts["kind"] == 3).sum()) > 0     # GpuKind.MEMSET
    assert not stats["events"] and stats["gpu_flows"] == 0   # launches not written: no flow


@pytest.mark.parametrize("args,words", [
    (["--from", "3", "--to", "2"], "is not before"),
    (["--from", "2", "--to", "2"], "is not before"),
    (["--from", "abc"], "is not a time"),
    (["--to", "1e400"], "is not a time"),
    (["--from", "-1"], "outside the run"),
    (["--to", "9999"], "outside the run"),
    (["--from", "5ns"], "outside the run"),
    (["--kind", "kernels"], "unknown --kind"),
    (["--kind", "xid_msg"], "unknown --kind"),       # folded into its xid: --kind xid
    (["--pid", "0"], "not a process id"),
])
def test_bad_window_or_filter_is_one_sentence(tmp_path, capsys, args, words):
    out = tmp_path / "x.pftrace"
    code, io = _cli(["export", DATA, "-o", str(out)] + args, capsys)
    assert code == 2 and io.err.count("\n") == 1 and words in io.err, io.err
    assert not out.exists()


def test_cli_window_in_seconds(tmp_path, capsys):
    out = tmp_path / "s.json"
    code, io = _cli(["export", DATA, "-o", str(out), "--format", "chrome-json",
                     "--from", "2.5", "--to", "4", "--kind", "cuda"], capsys)
    assert code == 0, io.err
    tl = Timeline.open(DATA)
    ev = tl.events()
    sel, _, _ = _expected(ev[ev["kind"] == Kind.CUDA], tl.start_ns + 2_500_000_000,
                          tl.start_ns + 4_000_000_000)
    evs = chrome_content.loads(out.read_text())["traceEvents"]
    assert sum(e["ph"] == "X" and e["cat"] == "cuda" for e in evs) == len(sel) > 0


def test_bench_script_runs(tmp_path):
    """scripts/bench/export_window.py end to end on a small run: the window's share of the
    events is about its share of the span, and so is its share of the bytes."""
    import os
    import subprocess
    import sys
    script = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "bench",
                          "export_window.py")
    p = subprocess.run([sys.executable, script, "-n", "40000", "--repeat", "1",
                        "--out", str(tmp_path / "w")], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    doc = json.loads((tmp_path / "w.json").read_text())
    rows = {(r["format"], r["part"] == "whole run"): r for r in doc["rows"]}
    for fmt in ("perfetto", "chrome-json"):
        whole, part = rows[(fmt, True)], rows[(fmt, False)]
        assert 0.05 < part["events"] / whole["events"] < 0.15
        assert part["bytes"] < 0.25 * whole["bytes"]
    assert "share of whole" in (tmp_path / "w.md").read_text()
