"""Reports and traces hold what run files hold (command lines, peers, thread names): 0600."""
import os
import stat

from clockalign.export import export_run
from clockalign.report import build_report
from clockalign.timeline import Timeline

DATA = os.path.join(os.path.dirname(__file__), "..", "data", "synthetic-report", "run.ca")


def _mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def test_report_files_are_private(tmp_path):
    old = os.umask(0o022)
    try:
        rep = build_report(Timeline.open(DATA), str(tmp_path / "rep"))
    finally:
        os.umask(old)
    assert rep.files
    for name in rep.files:
        assert _mode(tmp_path / "rep" / name) == 0o600, name


def test_traces_are_private(tmp_path):
    old = os.umask(0o022)
    try:
        for fmt, name in (("perfetto", "t.pftrace"), ("chrome-json", "t.json")):
            export_run(Timeline.open(DATA), str(tmp_path / name), fmt)
            assert _mode(tmp_path / name) == 0o600, name
    finally:
        os.umask(old)
