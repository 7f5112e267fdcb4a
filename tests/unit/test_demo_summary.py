"""The demo's fault summary on real H200 recordings (the GPU path of `clockalign demo`):
one line a fault, sticky repeats counted on their first error, benign notes one line."""
import os

from clockalign.cli.demo import _faults
from clockalign.report.brief import counts_line
from clockalign.timeline import Timeline

H200 = os.path.join(os.path.dirname(__file__), "..", "data", "gpu-h200")


def test_faults_one_line_each_sticky_repeats_counted(capsys):
    assert _faults(Timeline.open(os.path.join(H200, "faults.ca")), None)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "demo: 4 faults (and 6 sticky repeats):"
    assert [x.split()[0] for x in out[1:5]] == ["#1", "#2", "#3", "#4"]
    assert "CUDA_ERROR_ILLEGAL_ADDRESS (700) in 623/623 (python3); 6 sticky repeats; not " \
           "healthy again before the run ended" in out[3]
    assert out[5] == "demo: 1 known benign failure left out (notes, not faults): 1 MPS probe"
    assert len(out) == 6


def test_known_counts_one_line_or_each_mismatch():
    rows = [("a calls", 3, 3, True), ("b calls", 5, 5, True)]
    assert counts_line(rows) == ["all 2 known counts match the recording"]
    rows.append(("c calls", 7, 6, False))
    assert counts_line(rows) == ["1 of 3 known counts DIFFER from the recording:",
                                 "  DIFF c calls: expected 7, recorded 6"]
