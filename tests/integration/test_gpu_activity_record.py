"""record --gpu-activity end to end with real BPF and a stand-in libcupti (tests/unit/
fakecupti.c) installed where $CLOCKALIGN_CUPTI points: the recorder finds it, builds the
injection library, puts it into the command's environment, and the records the command's
"CUDA" hands to it reach the run file, the trailer and the notices."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from clockalign.capture.cupti import find_cupti
from clockalign.native import build
from clockalign.store.reader import RunReader
from clockalign.store.schema import Chunk, GpuKind

from ..unit.test_gpu_wire import CHILD    # what libcuda does at cuInit, then n launches
from .conftest import clockalign_cmd, run_clockalign

UNIT = Path(__file__).parent.parent / "unit"
BASE = ["--no-cuda", "--counters", "none", "--no-gpu-clock", "--quiet"]


@pytest.fixture(scope="module")
def fake_install(tmp_path_factory):
    real = find_cupti()
    d = tmp_path_factory.mktemp("cupti")
    (d / "lib").mkdir()
    os.symlink(real.include, d / "include")
    so = build("fakecupti", [str(UNIT / "fakecupti.c")],
               include_dirs=[real.include, *real.extra_includes], cflags=["-fvisibility=hidden"])
    shutil.copy(so, d / "lib" / "libcupti.so")
    return d


def test_spawned_command_gets_cupti_and_its_records_reach_the_run(fake_install, tmp_path):
    out = tmp_path / "act.ca"
    env = dict(os.environ, CLOCKALIGN_CUPTI=str(fake_install))
    p = subprocess.run(clockalign_cmd("record", "-o", str(out), *BASE, "--gpu-activity", "--",
                                      sys.executable, "-c", CHILD, "23", "0"),
                       capture_output=True, text=True, env=env, timeout=180)
    assert p.returncode == 0, p.stderr
    tid = int(p.stdout.split()[0])
    assert "injected through CUDA_INJECTION64_PATH, raw timestamps" in p.stderr
    r = RunReader(out)
    assert r.clean, r.truncated
    c = r.columns(Chunk.GPU_ACTIVITY)
    k = c["kind"]
    assert (k == GpuKind.KERNEL).sum() == 23 and (k == GpuKind.API).sum() == 25
    assert (c["tid"][k == GpuKind.API] == tid).all()
    assert set(c["pid"].tolist()) == {int(r.meta["targets"][0]["pid"])}
    assert r.trailer["counts"]["gpu_kernel"] == 23
    assert r.trailer["counts"]["gpu_launch_call"] == 25
    assert r.meta["gpu_activity"]["libcupti"] == str(fake_install / "lib" / "libcupti.so")
    names = {row["name"] for row in r.rows(Chunk.GPU_NAMES)}
    assert {"k_fake0", "cuLaunchKernel"} <= names
    # no GPU clock was probed: nothing to map the raw GPU times with, and dump says so
    d = run_clockalign("dump", str(out))
    assert d.returncode == 0 and '"gpu_kernel"' not in d.stdout
    assert "could not be mapped" in d.stderr


def test_pid_mode_says_it_cannot_inject_and_records_the_rest(tmp_path):
    sleeper = subprocess.Popen(["sleep", "20"])
    try:
        p = run_clockalign("record", "--pid", str(sleeper.pid), "-o", str(tmp_path / "p.ca"),
                           *BASE, "--gpu-activity", "--duration", "1")
    finally:
        sleeper.kill()
    assert p.returncode == 0, p.stderr
    assert "--gpu-activity needs spawn mode" in p.stderr
    assert RunReader(tmp_path / "p.ca").clean
