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


def armed_after(stderr, line):
    """line is said before the probes are armed (before anything of the command runs)."""
    lines = stderr.splitlines()
    armed = next(i for i, ln in enumerate(lines) if ln.startswith("clockalign: probes armed"))
    return lines.index(line) < armed


def with_driver(cmd):
    """cmd as it runs on a host with an NVIDIA driver loaded: where this one has none, in a
    private mount namespace whose /proc/driver holds a stand-in driver version line (the
    stand-in "CUDA" of CHILD loads the injection library itself)."""
    if os.path.exists("/proc/driver/nvidia/version"):
        return cmd
    line = "NVRM version: stand-in driver of test_gpu_activity_record"
    return ["unshare", "-m", "sh", "-c",
            "mount -t tmpfs tmpfs /proc/driver && mkdir /proc/driver/nvidia && "
            f"echo '{line}' > /proc/driver/nvidia/version && exec \"$@\"", "sh", *cmd]


def test_spawned_command_gets_cupti_and_its_records_reach_the_run(fake_install, fakecuda,
                                                                  tmp_path):
    out = tmp_path / "act.ca"
    env = dict(os.environ, CLOCKALIGN_CUPTI=str(fake_install), LD_LIBRARY_PATH=str(fakecuda))
    p = subprocess.run(with_driver(clockalign_cmd(
        "record", "-o", str(out), *BASE, "--gpu-activity", "--", sys.executable, "-c", CHILD,
        "23", "0")), capture_output=True, text=True, env=env, timeout=180)
    assert p.returncode == 0, p.stderr
    tid = int(p.stdout.split()[0])
    first = next(ln for ln in p.stderr.splitlines() if "GPU activity" in ln)
    assert armed_after(p.stderr, first) and first == (f"clockalign: GPU activity: each process of the command that starts CUDA "
                     f"is to load CUPTI {fake_install}/lib/libcupti.so (from $CLOCKALIGN_CUPTI) "
                     "through CUDA_INJECTION64_PATH, raw timestamps"), p.stderr
    assert "no process of the command loaded" not in p.stderr
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


@pytest.mark.parametrize("host", ["no-driver", "no-libcuda", "no-process-loads-it"])
def test_where_it_cannot_work_it_says_so_once_first(fake_install, fakecuda, tmp_path, host):
    """No driver, or no libcuda for the command: the first line says GPU activity will not
    be recorded and why, nothing is injected, nothing more is said about it.  Everything
    in place but the command starts no CUDA: the first line promises nothing, the last
    says no process loaded CUPTI."""
    out = tmp_path / "none.ca"
    env = dict(os.environ, CLOCKALIGN_CUPTI=str(fake_install), LD_LIBRARY_PATH=str(fakecuda))
    probe = [sys.executable, "-c", "import os; print(os.environ.get('CUDA_INJECTION64_PATH'))"]
    cmd = clockalign_cmd("record", "-o", str(out), *BASE, "--gpu-activity", "--", *probe)
    if host == "no-driver":
        if os.path.exists("/proc/driver/nvidia/version"):
            pytest.skip("this host has an NVIDIA driver loaded")
    elif host == "no-libcuda":
        from clockalign.capture.libcuda import resolve_like_loader
        env.pop("LD_LIBRARY_PATH")
        if resolve_like_loader(env)[0] is not None:
            pytest.skip("this host's loader finds a libcuda.so.1")
        cmd = with_driver(cmd)
    else:
        cmd = with_driver(cmd)
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=180)
    assert p.returncode == 0, p.stderr
    about = [ln for ln in p.stderr.splitlines() if "GPU activity" in ln or "CUPTI" in ln]
    if host == "no-process-loads-it":
        assert p.stdout.strip() != "None"                      # offered to the command
        assert armed_after(p.stderr, about[0]) and "is to load CUPTI" in about[0]
        assert len(about) == 2 and about[1] == (
            "clockalign: GPU activity: no process of the command loaded the CUPTI library "
            "(it used no CUDA, or CUPTI failed to start: see its stderr)"), p.stderr
        return
    why = ("no NVIDIA driver is loaded on this host" if host == "no-driver"
           else "the command's loader finds no libcuda.so.1")
    assert len(about) == 1 and armed_after(p.stderr, about[0]), p.stderr   # first, once
    assert about[0].startswith(f"clockalign: GPU activity will not be recorded: {why}")
    assert about[0].endswith("; recording the rest")
    assert p.stdout.strip() == "None"                           # nothing injected
    r = RunReader(out)
    assert r.clean and "gpu_activity" not in r.meta
