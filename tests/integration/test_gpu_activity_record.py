"""record --gpu-activity end to end with real BPF and a stand-in libcupti (tests/unit/
fakecupti.c) installed where $CLOCKALIGN_CUPTI points: the recorder finds it and the
injection library setup built for its headers (the real ones, linked), puts it into the
command's environment, and the records the command's "CUDA" hands to it reach the run file,
the trailer and the notices."""
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clockalign.capture.gpu.cupti import find_cupti
from clockalign.native.build import build
from clockalign.store.reader import RunReader
from clockalign.store.schema import Chunk, GpuKind

from ..unit.test_gpu_wire import CHILD    # what libcuda does at cuInit, then n launches
from .conftest import clockalign_cmd, run_clockalign, wait_for_file

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


# A running "CUDA" process: the stand-in libcuda mapped, the stand-in libcupti loaded (so
# the library's dlopen of it gets this same copy); 23 launches per fake_run, done only while
# a CUPTI client is subscribed, `want` times, then idle until `secs` have passed.
LIVE_TARGET = """
import ctypes, os, sys, threading, time
ctypes.CDLL(sys.argv[1])
fake = ctypes.CDLL(sys.argv[2], ctypes.RTLD_GLOBAL)
if sys.argv[5] == "taken":
    fake.fake_take_subscription()
want, runs = int(sys.argv[3]), 0
print(threading.get_native_id(), len(os.listdir("/proc/self/task")), flush=True)
end = time.monotonic() + float(sys.argv[4])
while time.monotonic() < end:
    if runs < want and fake.fake_run(23) == 0:
        runs += 1
        print("run", runs, flush=True)
    time.sleep(0.01)
print("done", runs, fake.fake_subscribed(), len(os.listdir("/proc/self/task")), flush=True)
"""


def _live_target(fakecuda, fake_install, want, secs, mode="free"):
    p = subprocess.Popen([sys.executable, "-c", LIVE_TARGET, str(fakecuda / "libcuda.so.1"),
                          str(fake_install / "lib" / "libcupti.so"), str(want), str(secs), mode],
                         stdout=subprocess.PIPE, text=True)
    tid, threads = map(int, p.stdout.readline().split())
    return p, tid, threads


def test_running_process_gets_cupti_records_flow_and_it_is_left_as_it_was(
        fakecuda, fake_install, tmp_path):
    out = tmp_path / "live.ca"
    target, tid, threads = _live_target(fakecuda, fake_install, 5, 8)
    env = dict(os.environ, CLOCKALIGN_CUPTI=str(fake_install))
    rec = subprocess.Popen(clockalign_cmd("record", "--pid", str(target.pid), "-o", str(out),
                                          *BASE, "--gpu-activity", "--duration", "60"),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        lines = [target.stdout.readline().strip() for _ in range(5)]
        assert lines == [f"run {i}" for i in range(1, 6)]       # only once attached
        rec.send_signal(signal.SIGINT)
        _, err = rec.communicate(timeout=60)
        assert rec.returncode == 0, err
        assert "started in the running process through ptrace and dlopen" in err
        assert "detached: activity and callbacks off, CUPTI unsubscribed, the library's " \
               "thread gone" in err
        # dlopen, attach, detach: each call's return trap, seen by the BPF signal probe
        assert "the 3 SIGSEGV signals of its main thread at the attach and the detach were " \
               "clockalign's" in err
        # left as it was: unsubscribed, its own thread count, it runs on to its normal end
        assert target.stdout.readline().split() == ["done", "5", "0", str(threads)]
        assert target.wait(timeout=30) == 0
    finally:
        rec.kill()
        target.kill()
    r = RunReader(out)
    assert r.clean, r.truncated
    c = r.columns(Chunk.GPU_ACTIVITY)
    k = c["kind"]
    assert (k == GpuKind.KERNEL).sum() == 5 * 23 and (k == GpuKind.API).sum() == 5 * 25
    assert (c["tid"][k == GpuKind.API] == tid).all()
    assert set(c["pid"].tolist()) == {target.pid}
    assert r.trailer["counts"]["gpu_kernel"] == 115
    assert r.trailer["counts"]["signal"] == 3           # the three return traps, no more
    assert (k == GpuKind.MODE).sum() == 2          # on at the attach, off at the detach
    assert c["value"][k == GpuKind.MODE][-1] == 0
    names = {row["name"] for row in r.rows(Chunk.GPU_NAMES)}
    assert {"k_fake0", "cuLaunchKernel"} <= names


def test_a_subscriber_already_present_is_named_and_the_rest_recorded(
        fakecuda, fake_install, tmp_path):
    target, _, _ = _live_target(fakecuda, fake_install, 1, 20, "taken")
    env = dict(os.environ, CLOCKALIGN_CUPTI=str(fake_install))
    try:
        p = run_clockalign("record", "--pid", str(target.pid), "-o", str(tmp_path / "s.ca"),
                           *BASE, "--gpu-activity", "--duration", "1", env=env)
        assert target.poll() is None
    finally:
        target.kill()
    assert p.returncode == 0, p.stderr
    assert f"process {target.pid} has a CUPTI subscriber already (a profiler" in p.stderr
    assert RunReader(tmp_path / "s.ca").clean


def test_pid_without_libcuda_is_said_and_the_rest_recorded(fake_install, tmp_path):
    sleeper = subprocess.Popen(["sleep", "20"])
    env = dict(os.environ, CLOCKALIGN_CUPTI=str(fake_install))
    try:
        p = run_clockalign("record", "--pid", str(sleeper.pid), "-o", str(tmp_path / "p.ca"),
                           *BASE, "--gpu-activity", "--duration", "1", env=env)
    finally:
        sleeper.kill()
    assert p.returncode == 0, p.stderr
    assert f"process {sleeper.pid} has not loaded libcuda" in p.stderr
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
        from clockalign.capture.probes.libcuda import resolve_like_loader
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


# A container with its own root: a tmpfs holding /usr, /etc, /dev, /proc and the given
# directories (the tests', the checkout, the interpreter's) bound in, and its own /tmp
# (writable or not), entered with chroot.
CHROOT = r"""
set -e
R=$1; shift; BINDS=$1; shift; WITH_TMP=$1; shift
mount -t tmpfs none "$R"
for d in usr etc dev proc; do mkdir -p "$R/$d"; mount --rbind "/$d" "$R/$d"; done
for l in bin lib lib64 sbin; do if [ -L "/$l" ]; then ln -s "$(readlink "/$l")" "$R/$l"; fi; done
IFS=:; for T in $BINDS; do
    if [ ! -d "$R$T" ] || [ -z "$(ls -A "$R$T")" ]; then mkdir -p "$R$T"; mount --rbind "$T" "$R$T"; fi
done; unset IFS
mkdir -p "$R/tmp"; chmod 1777 "$R/tmp"
if [ "$WITH_TMP" = no ]; then mount --rbind "$R/tmp" "$R/tmp"; mount -o remount,ro,bind "$R/tmp"; fi
exec chroot "$R" "$@"
"""


@pytest.mark.skipif(not shutil.which("unshare"), reason="unshare (util-linux) not found")
@pytest.mark.parametrize("with_tmp", ["yes", "no"])
def test_container_with_its_own_root(fakecuda, fake_install, tmp_path, with_tmp):
    """The library and the FIFO are put in the container's /tmp and the records flow; a
    root with no writable /tmp is said in one sentence and the rest recorded."""
    root = tmp_path / "root"
    root.mkdir()
    top = os.path.commonpath([str(fakecuda), str(fake_install), str(tmp_path)])
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    binds = sorted({top, here, os.path.realpath(sys.base_prefix),
                    os.path.dirname(os.path.realpath(sys.executable))}, key=len)
    target = subprocess.Popen(
        ["unshare", "--mount", "--fork", "--propagation", "private", "sh", "-c", CHROOT, "sh",
         str(root), ":".join(binds), with_tmp, sys.executable, "-c", LIVE_TARGET,
         str(fakecuda / "libcuda.so.1"), str(fake_install / "lib" / "libcupti.so"), "3", "10",
         "free"], stdout=subprocess.PIPE, text=True)
    out = tmp_path / "c.ca"
    rec = pid = None
    try:
        target.stdout.readline()
        pid = int(open(f"/proc/{target.pid}/task/{target.pid}/children").read().split()[0])
        assert os.readlink(f"/proc/{pid}/root") != "/"
        env = dict(os.environ, CLOCKALIGN_CUPTI=str(fake_install))
        rec = subprocess.Popen(clockalign_cmd("record", "--pid", str(pid), "-o", str(out),
                                              *BASE, "--gpu-activity", "--duration", "60"),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        lines = [target.stdout.readline().strip() for _ in range(3 if with_tmp == "yes" else 0)]
        wait_for_file(out)
        rec.send_signal(signal.SIGINT)
        _, err = rec.communicate(timeout=60)
        assert rec.returncode == 0, err
        assert lines == ["run 1", "run 2", "run 3"][:len(lines)], err
        staged = f"/proc/{pid}/root/tmp/clockalign-cupti"
        fifos_left = [f for f in os.listdir(staged) if f.endswith(".fifo")] \
            if os.path.isdir(staged) else []
    finally:
        if rec is not None:
            rec.kill()
        if pid is not None:
            os.kill(pid, signal.SIGKILL)      # the process in the chroot, then unshare
        target.kill()
    r = RunReader(out)
    assert r.clean
    if with_tmp == "yes":
        assert f"process {pid} has its own root: the CUPTI library, and the FIFO were copied " \
               "to /tmp/clockalign-cupti in it" in err
        k = r.columns(Chunk.GPU_ACTIVITY)["kind"]
        assert (k == GpuKind.KERNEL).sum() == 3 * 23
        assert fifos_left == []
    else:
        assert f"GPU activity of process {pid} is off: process {pid}'s root has no writable /tmp " \
            "to put the CUPTI library in (Read-only file system)" in err


# A libcuda whose cuLaunchKernel is what CUPTI sees: the stand-in libcupti's fake_launch,
# called from inside it (so the callbacks fall inside the BPF-probed call, as with the real one)
LAUNCHING_LIBCUDA = r"""
#include <stdint.h>
int fake_launch(uint32_t corr);
static uint32_t next_corr = 1000;
int cuInit(unsigned flags) { (void)flags; return 0; }
int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                   unsigned bz, unsigned shmem, void *stream, void **params, void **extra)
{
    (void)f; (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)shmem;
    (void)stream; (void)params; (void)extra;
    return fake_launch(next_corr++) < 0 ? 0 : 0;
}
"""

JOIN_TARGET = """
import ctypes, sys, threading, time
fake = ctypes.CDLL(sys.argv[2], ctypes.RTLD_GLOBAL)
cuda = ctypes.CDLL(sys.argv[1])
print(threading.get_native_id(), flush=True)
n = 0
end = time.monotonic() + 30
while time.monotonic() < end and n < 23:
    if fake.fake_subscribed():
        cuda.cuLaunchKernel(*([None] + [1] * 7 + [None] * 3))
        n += 1
    time.sleep(0.02)
print("launched", n, flush=True)
time.sleep(30)
"""


def _launching_target(tmp_path, fake_install, script, *args):
    """``script`` run with LAUNCHING_LIBCUDA (built here) and the stand-in libcupti."""
    d = tmp_path / "cuda"
    d.mkdir()
    (d / "libcuda.c").write_text(LAUNCHING_LIBCUDA)
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", str(d / "libcuda.c"),
                    "-o", str(d / "libcuda.so.1")], check=True)
    return subprocess.Popen([sys.executable, "-c", script, str(d / "libcuda.so.1"),
                             str(fake_install / "lib" / "libcupti.so"), *args],
                            stdout=subprocess.PIPE, text=True)


def test_kernels_launched_after_the_attach_are_joined_to_their_bpf_launch(fake_install,
                                                                          tmp_path):
    target = _launching_target(tmp_path, fake_install, JOIN_TARGET)
    out = tmp_path / "j.ca"
    env = dict(os.environ, CLOCKALIGN_CUPTI=str(fake_install))
    rec = None
    try:
        tid = int(target.stdout.readline())
        rec = subprocess.Popen(clockalign_cmd(
            "record", "--pid", str(target.pid), "-o", str(out), "--counters", "none",
            "--no-gpu-clock", "--quiet", "--gpu-activity", "--gpu-activity-timestamps",
            "converted", "--duration", "60"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, env=env)
        assert target.stdout.readline().split() == ["launched", "23"]
        time.sleep(0.5)                 # the library's next flush
        rec.send_signal(signal.SIGINT)
        _, err = rec.communicate(timeout=60)
        assert rec.returncode == 0, err
    finally:
        if rec is not None:
            rec.kill()
        target.kill()
    from clockalign.timeline import Timeline
    from clockalign.timeline.gpu_activity import LAUNCH_BPF
    acts = Timeline.open(out).gpu_activity()
    k = acts.rows[acts.rows["kind"] == GpuKind.KERNEL]
    assert len(k) == 23
    assert (k["launch_src"] == LAUNCH_BPF).all() and (k["launch_tid"] == tid).all()
    assert acts.stats["joined_bpf"] == 23
    assert {acts.launch_function(x) for x in k} == {"cuLaunchKernel"}
    # each kernel's launch is the BPF call that holds its CUPTI callback, before the kernel
    assert (k["launch_t_ns"] < k["t_ns"]).all()
    assert len(set(k["launch_t_ns"].tolist())) == 23


SAMPLED_TARGET = """
import ctypes, sys, threading, time
fake = ctypes.CDLL(sys.argv[2], ctypes.RTLD_GLOBAL)
cuda = ctypes.CDLL(sys.argv[1])
print(threading.get_native_id(), flush=True)
n = windows = 0
was = False
end = time.monotonic() + float(sys.argv[3])
while time.monotonic() < end:
    on = fake.fake_launch(n + 1) == 0     # queued only while CUPTI is subscribed
    n += on
    windows += on and not was
    was = on
    time.sleep(0.005)
print("launched", n, "windows", windows, flush=True)
"""


def test_sampled_activity_attaches_for_windows_and_says_so(fake_install, tmp_path):
    """--gpu-activity-duty 0.5 --gpu-activity-duty-period 2: CUPTI attached one second of
    every two in the running process; every window is in the trailer, the target saw as
    many subscriptions, the kernels of each window reached the run (a launch racing a
    detach's disable may be lost: at most one a window), info and report say SAMPLED."""
    target = _launching_target(tmp_path, fake_install, SAMPLED_TARGET, "12")
    out = tmp_path / "s.ca"
    env = dict(os.environ, CLOCKALIGN_CUPTI=str(fake_install))
    rec = None
    try:
        target.stdout.readline()
        rec = subprocess.Popen(clockalign_cmd(
            "record", "--pid", str(target.pid), "-o", str(out), *BASE, "--gpu-activity",
            "--gpu-activity-timestamps", "converted", "--gpu-activity-duty", "0.5",
            "--gpu-activity-duty-period", "2", "--duration", "7"),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        _, err = rec.communicate(timeout=90)
        assert rec.returncode == 0, err
        words = target.stdout.readline().split()
        assert target.wait(timeout=30) == 0            # it ran on to its normal end
    finally:
        if rec is not None:
            rec.kill()
        target.kill()
    launched, seen = int(words[1]), int(words[3])
    assert "GPU activity sampled (--gpu-activity-duty): CUPTI on 1 s of every 2 s (50%)" in err
    r = RunReader(out)
    assert r.clean
    duty = r.trailer["helpers"]["gpu_activity"]["duty"]
    windows = duty["windows"]
    assert 3 <= len(windows) <= 4 and seen == len(windows), (windows, seen)
    for a, b in windows:
        assert 0.9e9 <= b - a <= 1.5e9
    for (_, b), (c, _) in zip(windows, windows[1:]):
        assert 0.9e9 <= c - b <= 1.6e9                  # off for the other half
    assert r.meta["gpu_activity"]["duty"] == {"share": 0.5, "period_s": 2.0}
    c = r.columns(Chunk.GPU_ACTIVITY)
    kernels = int((c["kind"] == GpuKind.KERNEL).sum())
    assert launched - len(windows) <= kernels <= launched, (kernels, launched)
    assert launched > 100
    assert r.trailer["counts"]["signal"] == 3 * len(windows)    # dlopen, attach, detach each
    assert f"GPU activity sampled: {len(windows)} windows of CUPTI on" in err
    info = run_clockalign("info", str(out))
    assert f"activity SAMPLED: CUPTI attached 50% of each 2.0 s (--gpu-activity-duty): " \
           f"kernels, copies and memsets recorded only inside {len(windows)} windows" \
           in info.stdout, info.stdout
    rep = run_clockalign("report", str(out), "-o", str(tmp_path / "rep"))
    assert rep.returncode == 0, rep.stderr
    md = (tmp_path / "rep" / "report.md").read_text()
    assert f"SAMPLED (--gpu-activity-duty): CUPTI on 50% of every 2 s, {len(windows)} windows" \
        in md


@pytest.mark.parametrize("args, says", [
    (["--gpu-activity-duty", "0.5"], "needs --gpu-activity"),
    (["--gpu-activity", "--gpu-activity-duty", "0.5", "--", "true"],
     "samples the GPU activity of running processes (--pid)"),
    (["--gpu-activity", "--gpu-activity-duty", "0.05", "--pid", "1"],
     "leaves a window on or off shorter than 1 s"),
])
def test_sampled_activity_refusals_are_one_sentence(args, says, tmp_path):
    r = run_clockalign("record", "-o", str(tmp_path / "x.ca"), *args)
    assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr, r.stderr
