"""The report's section builders and assemblers, on the synthetic faults run (its contents are
written out in scripts/data/make_test_runs.py)."""
import os

import pytest

from clockalign.report import Options, assemble
from clockalign.report.collect import collect
from clockalign.report.sections import Context, Section, faults, run
from clockalign.timeline import Timeline

DATA = os.path.join(os.path.dirname(__file__), "..", "data", "synthetic", "faults.ca")


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    tl = Timeline.open(DATA)
    return Context(tl, collect(tl), str(tmp_path_factory.mktemp("sections")), Options())


def test_faults_section_pins_rows(ctx):
    sec = faults.build(ctx)
    assert sec.title == "Faults" and sec.files == []
    lines = sec.text.splitlines()
    # 13 faults: 5 of them the sticky 700s after the ILLEGAL_ADDRESS, which the terminal leaves out
    assert lines[0] == "  13 fault(s), 5 of them repeats of a sticky error"
    rows = [ln.split() for ln in lines[3:]]
    assert len(rows) == 13 - 5 and not any("cuda_sticky_error" in r for r in rows)
    assert rows[0][:4] == ["+0.100000", "s", "cuda_error", "CUDA_ERROR_OUT_OF_MEMORY"]
    # the OOM at +100 ms recovers with the retry that succeeds at +150 ms (100 us long)
    assert "50.100 ms" in lines[3] and lines[3].endswith(
        "retry CUDA_ERROR_OUT_OF_MEMORY +1.000 ms; success +50.000 ms")
    # the terminal cuts a long chain to 60 characters; report.md keeps it whole
    ill = next(ln for ln in lines if "cuda_error" in ln and "ILLEGAL_ADDRESS" in ln)
    assert ill.endswith("sticky...")
    # report.md lists the first errors too (the sticky repeats are in their chains)
    md_rows = [ln for ln in sec.markdown.splitlines() if ln.startswith("| +")]
    assert len(md_rows) == 13 - 5
    assert md_rows[3].endswith("; ... 3 more |")
    assert "\nXid messages, whole:\n\n- +0.499500 s Xid 31 (GPU memory page fault): `PCI " \
        "0000:18:00.0: pid=4242" in sec.markdown
    nums = sec.numbers["faults"]
    assert [f["kind"] for f in nums].count("cuda_sticky_error") == 5
    assert nums[0]["recovery_ns"] == 50_100_000 and nums[0]["chain"] == 2


def test_run_head(ctx):
    head = run.build(ctx)
    assert head.text.splitlines()[1] == ("  host synthetic, kernel 6.1.0-test, driver 570.00; "
                                         "1.200 s on MONOTONIC; clean")
    assert head.text.splitlines()[3:] == ["  target pid 4242", "  target pid 5000"]
    assert head.numbers["run"]["events"] == sum(head.numbers["run"]["counts"].values())


def test_assemblers_title_and_join():
    head = Section("Run", "head text", "# head\n", {"run": 1})
    secs = [Section("A", "  a", "a md", {"a": 2}, ["a.png"]), Section("B", "  b", "b md", {"b": 3})]
    assert assemble.text(head, secs) == "head text\n\n== A ==\n  a\n\n== B ==\n  b\n"
    assert assemble.markdown(head, secs) == "# head\n\n## A\n\na md\n\n## B\n\nb md\n"
    assert list(assemble.numbers([head] + secs).items()) == [("run", 1), ("a", 2), ("b", 3)]
