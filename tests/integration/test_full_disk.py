"""A full disk during a recording: one sentence, exit 2, the run file closed and readable.

The run file goes to a tmpfs this test mounts with room for its header and a few chunks; a
launch storm (target --burst) then fills it."""
import os
import subprocess

import pytest

from clockalign.store.reader import RunReader

from .conftest import run_clockalign
from .test_record_fakecuda import BASE, env_for


@pytest.fixture
def small_fs(tmp_path):
    d = tmp_path / "small"
    d.mkdir()
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=96k", "tmpfs", str(d)],
                       capture_output=True, text=True)
    if p.returncode != 0:
        if os.environ.get("CI"):
            pytest.fail(f"cannot mount a tmpfs under CI: {p.stderr.strip()}")
        pytest.skip(f"cannot mount a tmpfs here: {p.stderr.strip()}")
    yield d
    subprocess.run(["umount", "-l", str(d)], check=False)


def test_full_disk_is_one_sentence_and_the_file_stays_readable(fakecuda, small_fs):
    out = small_fs / "full.ca"
    p = run_clockalign("record", "-o", str(out), *BASE, "--", str(fakecuda / "target"),
                       "--burst", "200000", env=env_for(fakecuda), timeout=300)
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr
    errors = [ln for ln in p.stderr.splitlines() if "No space" in ln or "full" in ln]
    assert errors, p.stderr
    r = RunReader(out)                     # readable: header and the chunks before the failure
    assert r.chunk_count >= 1
    assert not r.clean
