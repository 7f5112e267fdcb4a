"""fit_run on a run file written with RunWriter, and the ``clockalign align`` command."""
import json

import numpy as np
import pytest

from clockalign.align import fit_run
from clockalign.cli.main import main
from clockalign.store.reader import RunReader
from clockalign.store.schema import Chunk, ClockDomain
from clockalign.store.writer import RunWriter

from .test_align_fit import synthetic


def _run(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return e.value.code, out, err


@pytest.fixture
def gpu_draw():
    return synthetic(21, tick=32, burst=8, per_s=10, seconds=20)


@pytest.fixture
def run_file(tmp_path, gpu_draw):
    d = gpu_draw
    rt = synthetic(22, tick=1, burst=1, per_s=20, seconds=20, skew_ppm=0.0)
    path = tmp_path / "run.ca"
    n = d.t0.size
    with RunWriter(path, {"host": "test"}) as w:
        w.write_rows(Chunk.CLOCK_INFO, [{"domain": "GPU0", "tick_ns": 32, "method": "ping"}])
        half = n // 2       # two chunks, both probe methods: they are fitted together
        for sl, method in ((slice(0, half), 1), (slice(half, n), 2)):
            w.write_columns(Chunk.GPU_CLOCK, {
                "gpu": np.zeros(sl.stop - sl.start, dtype=np.uint8),
                "method": np.full(sl.stop - sl.start, method, dtype=np.uint8),
                "t0": d.t0[sl], "remote": d.remote[sl], "t1": d.t1[sl]})
        w.write_columns(Chunk.CPU_CLOCK, {
            "domain": np.full(rt.t0.size, ClockDomain.REALTIME, dtype=np.uint8),
            "t0": rt.t0, "remote": rt.remote, "t1": rt.t1})
        w.write_columns(Chunk.CPU_CLOCK, {   # one BOOTTIME row cannot be fitted: left out
            "domain": np.array([ClockDomain.BOOTTIME], dtype=np.uint8),
            "t0": rt.t0[:1], "remote": rt.t0[:1], "t1": rt.t1[:1]})
    return path


def test_fit_run_names_domains_and_uses_recorded_ticks(run_file, gpu_draw):
    models = fit_run(RunReader(run_file))
    assert list(models) == ["REALTIME", "GPU0"]
    assert models["GPU0"].tick_ns == 32 and models["REALTIME"].tick_ns == 0
    assert models["GPU0"].summary()["samples_total"] == gpu_draw.t0.size
    host, unc = models["GPU0"].map(gpu_draw.ev_r)
    assert np.mean(np.abs(host - gpu_draw.ev_h) <= unc) >= 0.99


def test_fit_run_without_clock_chunks_is_empty(tmp_path):
    path = tmp_path / "empty.ca"
    with RunWriter(path, {}) as w:
        w.write_rows(Chunk.NOTICES, [{"t_ns": 1, "level": "info", "text": "x"}])
    assert fit_run(RunReader(path)) == {}


def test_align_run_file_text(run_file, capsys):
    code, out, err = _run(["align", str(run_file)], capsys)
    assert code == 0 and err == ""
    assert "REALTIME:" in out and "GPU0:" in out and "BOOTTIME" not in out
    assert "band half-width p50" in out and "tick 32 ns" in out and "steps: none found" in out
    assert out.count("assumption:") == 1 and "asymmetry" in out


def test_align_run_file_json_and_map(run_file, gpu_draw, capsys):
    t = str(gpu_draw.ev_r[100])
    code, out, _ = _run(["align", str(run_file), "--json", "--domain", "GPU0", "--map", t],
                        capsys)
    assert code == 0
    doc = json.loads(out)
    assert set(doc) == {"REALTIME", "GPU0"}
    (m,) = doc["GPU0"]["map"]
    assert m["remote_ns"] == int(t) and abs(m["host_ns"] - gpu_draw.ev_h[100]) <= m["unc_ns"]
    code, _, err = _run(["align", str(run_file), "--map", t], capsys)
    assert code != 0 and "--map needs --domain" in err


def test_write_pairs_round_trips_through_pairs(run_file, tmp_path, capsys):
    """--write-pairs writes each domain's sandwiches (GPUs first, with their probe method),
    and --pairs on a written file fits what the run file's own fit found."""
    out_dir = tmp_path / "pairs"
    code, out, err = _run(["align", str(run_file), "--json", "--write-pairs", str(out_dir)],
                          capsys)
    assert code == 0
    whole = json.loads(out)
    names = [line.split(":")[0] for line in err.splitlines()]
    assert names == [str(out_dir / "gpu0_sandwiches.csv"),
                     str(out_dir / "cpu_REALTIME_sandwiches.csv"),
                     str(out_dir / "cpu_BOOTTIME_sandwiches.csv")]
    gpu = (out_dir / "gpu0_sandwiches.csv").read_text().splitlines()
    assert gpu[0] == "t0_ns,remote_ns,t1_ns,method" and len(gpu) - 1 == int(err.split()[1])
    assert {line.rsplit(",", 1)[1] for line in gpu[1:]} == {"1", "2"}
    code, out, _ = _run(["align", "--pairs", str(out_dir / "gpu0_sandwiches.csv"), "--tick",
                         "32", "--json"], capsys)
    assert code == 0
    alone = json.loads(out)
    for key in ("skew_ppm", "offset_ns", "halfwidth_ns", "samples_total"):
        assert alone[key] == whole["GPU0"][key], key


@pytest.fixture
def pairs_csv(tmp_path):
    d = synthetic(23, tick=32, step_ns=-3_000_000, step_at_s=14.2)
    path = tmp_path / "pairs.csv"
    rows = "\n".join(f"{a},{b},{c}" for a, b, c in zip(d.t0, d.remote, d.t1))
    path.write_text("t0_ns,remote_ns,t1_ns\n" + rows + "\n")
    return path, d


def test_pairs_json(pairs_csv, capsys):
    path, d = pairs_csv
    code, out, _ = _run(["align", "--pairs", str(path), "--tick", "32", "--json"], capsys)
    assert code == 0
    doc = json.loads(out)
    assert set(doc) >= {"segments", "skew_ppm", "offset_ns", "halfwidth_ns", "steps", "tick_ns",
                        "min_rtt_ns", "floor_ns", "samples_used", "samples_total", "assumption"}
    assert set(doc["halfwidth_ns"]) == {"p50", "p99", "max"} and doc["tick_ns"] == 32
    assert doc["samples_total"] == d.t0.size and len(doc["steps"]) == 1
    assert abs(doc["steps"][0]["remote_jump_ns"] + 3_000_000) < 3_000


def test_pairs_map_prints_one_line_per_timestamp(pairs_csv, capsys):
    path, d = pairs_csv
    picks = [5, 2000, 3999]
    argv = ["align", "--pairs", str(path), "--tick", "32", "--window", "2"]
    for i in picks:
        argv += ["--map", str(d.ev_r[i])]
    code, out, _ = _run(argv, capsys)
    assert code == 0
    lines = [ln for ln in out.splitlines() if " -> " in ln]
    assert len(lines) == len(picks)
    for ln, i in zip(lines, picks):
        remote, _, host, _, unc, _ = ln.split()
        assert int(remote) == d.ev_r[i] and abs(int(host) - d.ev_h[i]) <= int(unc)
    code, out, _ = _run(argv + ["--json"], capsys)
    assert [m["remote_ns"] for m in json.loads(out)["map"]] == [int(d.ev_r[i]) for i in picks]


@pytest.mark.parametrize("content, sentence", [
    (None, "does not exist"),
    ("a,b,c\n1,2,3\n4,5,6\n", "needs a header with columns t0_ns,remote_ns,t1_ns"),
    ("t0_ns,remote_ns,t1_ns\n1,2,3\n4,x5,6\n", "line 3: remote_ns 'x5' is not an integer"),
    ("t0_ns,remote_ns,t1_ns\n1,2.5,3\n4,5,6\n", "line 2: remote_ns '2.5' is not an integer"),
    ("t0_ns,remote_ns,t1_ns\n1,2,3\n", "has 1 sandwich rows; at least 2"),
    ("t0_ns,remote_ns,t1_ns\n1,2,3\n9,5,6\n", "line 3: t1_ns is before t0_ns"),
    ("t0_ns,remote_ns,t1_ns\n1,2,3\n4,5\n", "line 3: t1_ns '' is not an integer"),
])
def test_pairs_bad_input_is_one_sentence(tmp_path, capsys, content, sentence):
    path = tmp_path / "bad.csv"
    if content is not None:
        path.write_text(content)
    code, out, err = _run(["align", "--pairs", str(path)], capsys)
    assert code == 2 and out == ""
    assert err.startswith("clockalign: ") and sentence in err and err.count("\n") == 1


@pytest.mark.parametrize("argv, sentence", [
    (["align"], "give either a run FILE or --pairs"),
    (["align", "x.ca", "--pairs", "p.csv"], "give either a run FILE or --pairs"),
    (["align", "/nonexistent/run.ca"], "does not exist"),
    (["align", "--pairs", "p.csv", "--window", "0"], "--window must be a positive"),
    (["align", "--pairs", "p.csv", "--write-pairs", "d"], "it takes no --pairs"),
])
def test_align_usage_errors(capsys, argv, sentence):
    code, _, err = _run(argv, capsys)
    assert code == 2 and sentence in err


def test_bad_map_value_and_unknown_domain(run_file, pairs_csv, capsys):
    path, _ = pairs_csv
    code, _, err = _run(["align", "--pairs", str(path), "--map", "12.5"], capsys)
    assert code == 2 and "--map value '12.5' is not an integer" in err
    code, _, err = _run(["align", str(run_file), "--domain", "GPU7", "--map", "1"], capsys)
    assert code == 2 and "no clock domain GPU7" in err


def test_not_a_run_file(tmp_path, capsys):
    path = tmp_path / "junk.ca"
    path.write_bytes(b"hello")
    code, _, err = _run(["align", str(path)], capsys)
    assert code == 2 and "not a clockalign run" in err


def test_help_has_examples(capsys):
    code, out, _ = _run(["align", "--help"], capsys)
    assert code == 0 and "clockalign align --pairs pairs.csv" in out
