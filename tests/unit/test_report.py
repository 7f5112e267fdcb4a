"""clockalign report: sections, numbers that match the run file, valid figures, anomalies."""
import os

import numpy as np
import pytest

from clockalign.cli.main import main as cli_main
from clockalign.report import Options, build_report
from clockalign.report.analysis import offcpu_in_calls, pct
from clockalign.report.anomaly import robust_z
from clockalign.report.render import fmt_count, fmt_ns
from clockalign.store.reader import RunReader
from clockalign.store.schema import CUDA_FUNCTIONS, Kind
from clockalign.timeline import Timeline

DATA = os.path.join(os.path.dirname(__file__), "..", "data", "synthetic-report", "run.ca")
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    rep = build_report(Timeline.open(DATA), str(out))
    return out, rep


@pytest.fixture(scope="module")
def events():
    return RunReader(DATA).events()


def _row(md, first_cell):
    for line in md.splitlines():
        if line.startswith(f"| {first_cell} |"):
            return [c.strip() for c in line.strip("|").split("|")]
    raise AssertionError(f"no table row for {first_cell}")


def test_report_has_every_section(report):
    out, rep = report
    md = (out / "report.md").read_text()
    for title in ("Alignment", "Uncertainty budget", "CUDA calls", "Context-switch jitter",
                  "connect()", "GPU counters", "Faults", "Anomalies before faults"):
        assert title in md, title
    for name in ("== Alignment ==", "== CUDA calls ==", "== Faults =="):
        assert name in rep.text


def test_figures_are_valid_pngs(report):
    out, rep = report
    import matplotlib.image as mpimg
    pngs = [f for f in rep.files if f.endswith(".png")]
    assert {"alignment.png", "cuda_latency.png", "offcpu_heatmap.png", "wakeup_latency.png",
            "connect_latency.png", "counters_gpu0.png", "anomalies.png"} <= set(pngs)
    md = (out / "report.md").read_text()
    for f in pngs:
        data = (out / f).read_bytes()
        assert data[:8] == PNG and len(data) > 5000, f
        img = mpimg.imread(str(out / f))
        assert img.shape[0] > 200 and img.shape[1] > 200 and img.std() > 0.01, f
        assert f"({f})" in md, f"{f} not linked from report.md"


def test_cuda_numbers_match_the_run(report, events):
    out, _ = report
    md = (out / "report.md").read_text()
    cuda = events[events["kind"] == Kind.CUDA]
    for fid in np.unique(cuda["code"]).tolist():
        sel = cuda[cuda["code"] == fid]
        row = _row(md, CUDA_FUNCTIONS[fid][0])
        assert row[1] == fmt_count(len(sel))
        assert row[2] == fmt_count(int((sel["ret"] != 0).sum()))
        d = np.sort(sel["dur"].astype(np.int64))
        p50 = int(d[int(np.ceil(0.5 * len(d))) - 1])
        assert row[3] == fmt_ns(p50)
        assert row[6] == fmt_ns(int(d.max()))


def test_connect_numbers_match_the_run(report, events):
    out, rep = report
    conn = events[events["kind"] == Kind.CONNECT]
    rows = {r["peer"]: r for r in rep.numbers["connect"]}
    assert sum(r["count"] for r in rows.values()) == len(conn)
    assert rows["10.0.0.7:8000"]["error_names"] == {"ECONNREFUSED": 2}
    assert _row((out / "report.md").read_text(), "10.0.0.7:8000")[1] == \
        fmt_count(rows["10.0.0.7:8000"]["count"])


def test_jitter_numbers_match_the_run(report, events):
    _, rep = report
    j = rep.numbers["jitter"]
    sched = events[events["kind"] == Kind.SCHED]
    assert j["intervals"] == len(sched)
    assert j["preempted"] == int((sched["code"] == 1).sum())
    w = sched["a0"][sched["a0"] > 0].astype(np.int64)
    assert j["wake_p50_ns"] == pct(w, 50) and j["wake_max_ns"] == int(w.max())


def test_offcpu_inside_calls_known_values():
    cuda = {"t": np.array([100, 1000, 100], np.int64), "dur": np.array([500, 100, 50], np.int64),
            "tid": np.array([1, 1, 2], np.uint32), "fn": np.array([1, 9, 1]),
            "ret": np.zeros(3, np.int32)}
    sched = {"t": np.array([150, 300, 700, 1010, 120], np.int64),
             "dur": np.array([50, 400, 100, 20, 10], np.int64),
             "tid": np.array([1, 1, 1, 1, 2], np.uint32),
             "pre": np.array([True, False, False, True, True]),
             "wake": np.zeros(5, np.int64)}
    got = offcpu_in_calls(cuda, sched)
    # call 0 [100,600): 50 + (300..600 = 300); interval at 700 is between calls
    assert got["per_call_ns"].tolist() == [350, 20, 10]
    assert got["preempted_per_call"].tolist() == [1, 1, 1]
    assert got["total_ns"] == 380


def test_anomalies_before_the_xid(report):
    _, rep = report
    xid = [a for a in rep.numbers["anomalies"] if a["fault_kind"] == "xid"]
    assert xid, "signals that left their band before the Xid"
    sig = {s["signal"]: s for s in xid[0]["signals"]}
    assert "launch latency (median per bin)" in sig
    assert "GPU0 sm_clock" in sig
    lead = sig["GPU0 sm_clock"]["lead_ns"]
    assert 1.5e9 <= lead <= 2.5e9          # the synthetic run drops clocks 2 s before
    assert sig["GPU0 sm_clock"]["peak_z"] < 0


def test_robust_z_flags_a_step_not_noise():
    rng = np.random.default_rng(3)
    x = rng.normal(100, 1, 300)
    x[200:] += 20
    z = robust_z(x, window=50)
    assert np.nanmax(np.abs(z[60:200])) < 6
    assert z[200] > 10
    assert np.isnan(z[:10]).all()


def test_options_change_the_band(tmp_path):
    rep = build_report(Timeline.open(DATA), str(tmp_path), Options(threshold=1e9))
    assert rep.numbers["anomalies"] == []


def _cli(args, capsys):
    with pytest.raises(SystemExit) as e:
        cli_main(args)
    return e.value.code, capsys.readouterr()


def test_cli_report(tmp_path, capsys):
    code, io = _cli(["report", DATA, "-o", str(tmp_path / "r")], capsys)
    assert code == 0
    assert "== CUDA calls ==" in io.out and (tmp_path / "r" / "report.md").exists()


def test_cli_report_bad_input(tmp_path, capsys):
    bad = tmp_path / "bad.ca"
    bad.write_bytes(b"\x00" * 64)
    code, io = _cli(["report", str(bad), "-o", str(tmp_path / "r")], capsys)
    assert code == 2 and io.err.count("\n") == 1 and "not a clockalign run" in io.err


def test_cli_report_truncated_run_exits_3(tmp_path, capsys):
    data = open(DATA, "rb").read()
    cut = tmp_path / "cut.ca"
    cut.write_bytes(data[:len(data) // 2])
    code, io = _cli(["report", str(cut), "-o", str(tmp_path / "r")], capsys)
    assert code == 3 and "truncated at byte" in io.err and io.err.count("\n") == 1
    assert (tmp_path / "r" / "report.md").exists()
