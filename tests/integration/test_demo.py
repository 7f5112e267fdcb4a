"""`clockalign demo` on the host-only workload: a summary that fits a screen, naming the
faults that matter, the benign notes as one line, and where the report and trace are."""
import re

from .conftest import run_clockalign


def test_demo_summary_fits_a_screen(tmp_path):
    out = tmp_path / "demo"
    p = run_clockalign("demo", "-o", str(out), "--host-only", timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    lines = (p.stdout + p.stderr).splitlines()
    assert len(lines) <= 30, "\n".join(lines)
    text = p.stdout
    assert re.search(r"^demo: all \d+ known counts match the recording$", text, re.M)
    assert not re.search(r"^\s*ok ", text, re.M)
    assert "exactly as it predicts" in text
    # the faults that matter: the main part's two OOMs and the refused connect, nothing else
    m = re.search(r"^demo: (\d+) faults that matter:$", text, re.M)
    assert m and m.group(1) == "3", text
    matter = [x for x in text.splitlines() if x.startswith("  #")]
    assert [("OUT_OF_MEMORY" in x, "ECONNREFUSED" in x) for x in matter] == [
        (True, False), (True, False), (False, True)]
    assert re.search(r"^demo: \d+ known benign failures left out .*lookup not found", text, re.M)
    assert (out / "report" / "report.md").exists() and (out / "demo.pftrace").exists()
    assert f"report {out}/report/report.md" in text and f"trace {out}/demo.pftrace" in text
