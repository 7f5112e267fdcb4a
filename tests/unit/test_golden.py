"""Behaviour unchanged: dump, report, Perfetto and Chrome JSON outputs on tests/data and the
synthetic corpus are byte-identical to the digests in tests/data/golden.json.

An intended output change regenerates them: ``PYTHONPATH=agent python -m tests.golden --update``.
"""
import pytest

from tests import golden


@pytest.fixture(scope="module")
def want():
    return golden.load()


def test_golden_covers_every_data_run_and_output(want):
    assert set(want["runs"]) == set(golden.corpus())
    for name, outs in want["runs"].items():
        assert {"dump.jsonl", "report/report.md", "report/report.json", "trace.pftrace",
                "trace.json"} <= set(outs), name


def test_outputs_match_golden(want):
    figures = want["figures_env"] == golden.figures_env()
    if not figures:
        print(f"figures not compared: drawn under {want['figures_env']}, "
              f"here {golden.figures_env()}")
    diffs = golden.compare(want, golden.produce(), figures=figures)
    assert not diffs, ("outputs changed (regenerate with `PYTHONPATH=agent python -m "
                       "tests.golden --update` if intended):\n  " + "\n  ".join(diffs))


def test_a_changed_output_is_named(want, tmp_path):
    """The comparison sees one changed byte of one output, and a missing one."""
    name = "synthetic/aligned"
    got = golden.produce({name})
    assert not golden.compare({"runs": {name: want["runs"][name]}}, got)
    changed = dict(got[name])
    changed["trace.json"] = "0" * 64
    del changed["report/report.md"]
    assert golden.compare({"runs": {name: want["runs"][name]}}, {name: changed}) == [
        f"{name}: report/report.md missing", f"{name}: trace.json differs"]
