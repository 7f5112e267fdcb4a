"""record --gpu-activity on a real GPU (root, BPF, CUPTI): the self-stamping kernels of
scripts/workloads/stamp_kernels.py, their raw CUPTI times against their own %globaltimer, and
every mapped kernel inside [launch entry, return of the sync that waited for it].
Skipped with the reason where there is no GPU (conftest), no root or no CUPTI."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from clockalign.capture.gpu.cupti import CuptiMissing, find_cupti
from clockalign.capture.clocks.gpuclock import native_loop

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]


def _need_root_and_cupti():
    if os.geteuid() != 0:
        pytest.skip("record --gpu-activity needs root (BPF)")
    try:
        find_cupti()
    except CuptiMissing as e:
        pytest.skip(str(e))


def test_native_ping_pong_is_used():
    assert native_loop() is not None


def test_stamp_kernels_raw_times_and_containment(tmp_path):
    _need_root_and_cupti()
    run, stamps, out = tmp_path / "raw.ca", tmp_path / "st.npz", tmp_path / "check.json"
    p = subprocess.run([sys.executable, "-m", "clockalign.cli.main", "record", "--gpu-activity",
                        "--quiet", "-o", str(run), "--gpu-clock-period", "0.25", "--",
                        sys.executable, str(ROOT / "scripts/workloads/stamp_kernels.py"),
                        "--seconds", "3", "--out", str(stamps)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    c = subprocess.run([sys.executable, str(ROOT / "scripts/gpu/activity_check.py"), "--run",
                        str(run), "--stamps", str(stamps), "--out", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert c.returncode == 0, c.stderr
    res = json.loads(out.read_text())
    assert res["timestamps"] == "raw"
    assert res["cupti_stamp_kernels"] == res["stamp_kernels"] > 100
    a0, a1 = res["a_raw_start_minus_stamp_ns"], res["a_raw_end_minus_stamp_ns"]
    assert -2000 < a0["min"] <= a0["max"] <= 0 and 0 <= a1["min"] <= a1["max"] < 2000
    b = res["b_containment"]
    assert b["checked"] == res["stamp_kernels"]
    assert b["start_before_entry_beyond_unc"] == 0 and b["end_after_return_beyond_unc"] == 0
    assert np.isfinite(res["unc_ns"]["p99"])
