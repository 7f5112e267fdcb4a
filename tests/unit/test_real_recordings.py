"""The whole chain on real recordings from the H200 host (tests/data/gpu-h200, made by
scripts/gpu/session.sh): timeline, faults, alignment, report and Perfetto export."""
import collections
import os

import numpy as np
import pytest

from clockalign.export import export_run
from clockalign.report import build_report
from clockalign.store.reader import RunReader
from clockalign.store.schema import Kind
from clockalign.timeline import Timeline

from .test_export import check_trace, parse

DATA = os.path.join(os.path.dirname(__file__), "..", "data", "gpu-h200")
RUNS = ["reference.ca", "faults.ca", "idle.ca", "busy.ca"]


@pytest.fixture(scope="module")
def faults_tl():
    return Timeline.open(os.path.join(DATA, "faults.ca"))


def test_real_faults_every_source(faults_tl):
    f = faults_tl.faults()
    by_kind = collections.Counter(x.kind for x in f)
    assert by_kind["cuda_sticky_error"] == 6
    ooms = [x for x in f if x.kind == "cuda_error" and x.code == 2]
    assert len(ooms) == 1 and ooms[0].recovery_ns > 0          # the retry is in its chain
    assert any(e["what"] == "retry" for e in ooms[0].chain)
    ill = [x for x in f if x.kind == "cuda_error" and x.code == 700]
    assert len(ill) == 1 and ill[0].function == "cuCtxSynchronize"
    xid = [x for x in f if x.kind == "xid"]
    assert len(xid) == 1 and xid[0].code == 31
    assert {s["source"] for s in xid[0].sightings} == {"tracepoint", "nvml"}
    assert xid[0].delays and xid[0].delays[0]["unc_ns"] > 0
    # the Xid fired while the failing synchronize was running
    assert ill[0].t_ns < xid[0].t_ns < ill[0].t_ns + ill[0].dur_ns


def test_real_alignment_models(faults_tl):
    m = faults_tl.models
    assert {"GPU0", "REALTIME", "BOOTTIME", "MONOTONIC_RAW"} <= set(m)
    s = m["GPU0"].summary()
    assert s["tick_ns"] == 32
    assert s["floor_ns"] <= s["halfwidth_ns"]["p50"] < 2_000
    assert m["REALTIME"].summary()["halfwidth_ns"]["p99"] < 1_000


def test_real_counters_mapped_with_uncertainty(faults_tl):
    c = faults_tl.counters(fields=["sm_clock"])
    assert len(c) > 50
    # the read latency NVML reports bounds each value: µs typically, ms for a first, cold read
    assert np.all(c["unc_ns"] > 0) and np.median(c["unc_ns"]) < 20_000
    assert np.all(c["unc_ns"] < 10_000_000)
    assert faults_tl.start_ns - 5e9 < c["t_ns"].min() and c["t_ns"].max() < faults_tl.end_ns + 1e9


@pytest.mark.parametrize("name", RUNS)
def test_real_run_exports_and_reports(name, tmp_path):
    path = os.path.join(DATA, name)
    tl = Timeline.open(path)
    out = tmp_path / "t.pftrace"
    export_run(tl, str(out), "perfetto")
    seen = check_trace(parse(out))
    ev = RunReader(path).events()
    n_slices = int(np.isin(ev["kind"], [Kind.CUDA, Kind.CONNECT, Kind.SCHED]).sum())
    names = collections.Counter(s[1] for s in seen["slices"])
    assert sum(names.values()) >= n_slices
    assert seen["snapshot"] is not None
    rep = build_report(Timeline.open(path), str(tmp_path / "report"))
    md = (tmp_path / "report" / "report.md").read_text()
    assert "CUDA calls" in md and "Alignment" in md
    assert rep.files and all(os.path.getsize(tmp_path / "report" / f) > 0 for f in rep.files)


def test_recovery_deadline_verdicts(capsys):
    import json as _json

    from clockalign.cli.main import main
    with pytest.raises(SystemExit) as e:
        main(["faults", os.path.join(DATA, "faults.ca"), "--json", "--deadline", "0.15"])
    assert e.value.code == 0
    doc = _json.loads(capsys.readouterr().out)
    verdict = {(f["kind"], f["name"]): f["deadline"] for f in doc["faults"]
               if f["kind"] != "cuda_sticky_error"}
    assert verdict[("cuda_error", "CUDA_ERROR_OUT_OF_MEMORY")] == "met"          # 134.9 ms
    assert verdict[("connect_error", "ECONNREFUSED")] == "MISSED"                # 200.6 ms
    assert verdict[("cuda_error", "CUDA_ERROR_ILLEGAL_ADDRESS")] == \
        "not healthy again before the run ended"


def test_info_shows_sampler_and_clock_probe_health(capsys):
    from clockalign.cli.main import main
    with pytest.raises(SystemExit) as e:
        main(["info", os.path.join(DATA, "faults.ca")])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "counters  nvml: 202 samples every 0.02 s, 17 missed sampling deadlines" in out
    assert "gpu clock GPU0: 4 bursts by ping-pong, 0 failures" in out
    assert "events    cuda 38, connect 4, sched 217, xid 1" in out


def test_info_names_the_clock_probes_host_loop_and_answer(tmp_path):
    """A run recorded with the one-word ping-pong answer says so on its gpu clock line."""
    from clockalign.report.run_info import info_lines
    from clockalign.store.reader import RunReader
    from clockalign.store.schema import Chunk
    from clockalign.store.writer import RunWriter
    src = RunReader(os.path.join(DATA, "faults.ca"))
    dst = tmp_path / "answer.ca"
    w = RunWriter(dst, src.meta)
    for ctype, payload in src.iter_chunks():
        if ctype == Chunk.TRAILER:
            continue
        if "rows" in payload:
            rows = payload["rows"]
            if ctype == Chunk.CLOCK_INFO:
                rows = [dict(r, host_loop="native", pingpong_answer="one word")
                        if str(r.get("domain", "")).startswith("GPU") else r for r in rows]
            w.write_rows(ctype, rows)
        else:
            w.write_columns(ctype, src.decode_payload(payload))
    w.close({k: v for k, v in src.trailer.items() if k != "chunks"})
    lines = info_lines(RunReader(dst), str(dst))
    assert "gpu clock GPU0: 4 bursts by ping-pong (C host loop, one-word answer), 0 failures" \
        in lines


def test_info_says_the_fullest_buffer_and_which_reader_read_it(tmp_path):
    from clockalign.report.run_info import info_lines
    from clockalign.store.reader import RunReader
    from clockalign.store.writer import RunWriter
    src = RunReader(os.path.join(DATA, "faults.ca"))
    for reader, name in (("native", "C"), ("python", "Python")):
        dst = tmp_path / f"{reader}.ca"
        w = RunWriter(dst, src.meta)
        w.close(dict(reason="target exited", drops={"cuda": 3}, ring_peak_fill=0.4321,
                     buffer_reader=reader))
        lines = info_lines(RunReader(dst), str(dst))
        assert (f"drops     3 (cuda 3); fullest event buffer 43%, read by the {name} reader "
                "thread") in lines
    # an older run file says neither
    assert "drops     0" in info_lines(src, "faults.ca")
