"""One clock domain that does not fit leaves every other one mapped (issue 16 item 2).

The H200 fault recording copied with its GPU0 %globaltimer stuck (every ping reads the same
value): GPU0 cannot be fitted; REALTIME, BOOTTIME, MONOTONIC_RAW and the counters must be
exactly as in the original, and align, report and faults must name GPU0 and why.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from clockalign.align import fit_run
from clockalign.store.reader import RunReader
from clockalign.store.schema import Chunk
from clockalign.store.writer import RunWriter
from clockalign.timeline import Timeline

SRC = os.path.join(os.path.dirname(__file__), "..", "data", "gpu-h200", "faults.ca")


@pytest.fixture(scope="module")
def stuck(tmp_path_factory):
    """faults.ca with GPU0's remote stamps all equal to its first one."""
    dst = str(tmp_path_factory.mktemp("stuck") / "stuck.ca")
    r = RunReader(SRC)
    first = r.columns(Chunk.GPU_CLOCK)["remote"][0]
    w = RunWriter(dst, r.meta)
    for ctype, payload in r.iter_chunks():
        if ctype == Chunk.TRAILER:
            continue
        if "rows" in payload:
            w.write_rows(ctype, payload["rows"])
            continue
        cols = dict(r.decode_payload(payload))
        if ctype == Chunk.GPU_CLOCK:
            cols["remote"] = np.full_like(cols["remote"], first)
        w.write_columns(ctype, cols)
    w.close({k: v for k, v in r.trailer.items() if k != "chunks"})
    return dst


def cli(*args):
    return subprocess.run([sys.executable, "-m", "clockalign.cli.main", *args],
                          capture_output=True, text=True, timeout=300)


def test_fit_run_keeps_the_domains_that_fit(stuck):
    ref = fit_run(RunReader(SRC))
    got = fit_run(RunReader(stuck))
    assert set(got.failed) == {"GPU0"} and "stuck" in got.failed["GPU0"]
    assert set(got) == set(ref) - {"GPU0"} == {"REALTIME", "BOOTTIME", "MONOTONIC_RAW"}
    for name in got:
        assert got[name].summary() == ref[name].summary()


def test_timeline_maps_realtime_and_counters_with_gpu0_stuck(stuck):
    ref, tl = Timeline.open(SRC), Timeline.open(stuck)
    assert set(tl.fit_failures) == {"GPU0"}
    a, b = ref.counters(), tl.counters()
    assert len(b) > 50 and np.array_equal(a["t_ns"], b["t_ns"]) and \
        np.array_equal(a["unc_ns"], b["unc_ns"])
    assert [e["domain"] for e in tl.gpu_events()] == [e["domain"] for e in ref.gpu_events()]
    assert any("GPU0 clock fit failed" in n for n in tl.notes)
    with pytest.raises(Exception, match="GPU0 clock fit failed"):
        tl.map("GPU0", 1)


def test_align_report_faults_name_the_failing_domain(stuck, tmp_path):
    p = cli("align", stuck)
    assert p.returncode == 0, p.stderr
    assert "GPU0: the fit failed (no line fits" in p.stdout and "REALTIME:" in p.stdout
    j = json.loads(cli("align", stuck, "--json").stdout)
    assert "error" in j["GPU0"] and j["REALTIME"]["halfwidth_ns"]["p99"] > 0
    p = cli("align", stuck, "--domain", "GPU0", "--map", "1")
    assert p.returncode == 2 and "GPU0" in p.stderr and "Traceback" not in p.stderr
    p = cli("report", stuck, "-o", str(tmp_path / "rep"))
    assert p.returncode == 0, p.stderr
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "no clock samples" not in md and "| REALTIME |" in md
    assert "GPU0: the fit failed" in md
    nums = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert set(nums["alignment_failed"]) == {"GPU0"}
    p = cli("faults", stuck)
    assert p.returncode == 0, p.stderr
    assert "GPU0 clock fit failed" in p.stdout + p.stderr
