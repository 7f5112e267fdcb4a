"""Targets in their own mount and PID namespaces (issue 13), built here with unshare.

A "container" is `unshare --mount --pid --fork` running the known-count target, with a
different stand-in libcuda (other compiler flags: other code, other offsets) bind-mounted
over the host's stand-in at the same path.  The target maps `.../libcuda.so.1`; on the host
that name is another file, so a probe on the host's file traces none of its calls.
"""
import json
import os
import secrets
import shutil
import subprocess

import numpy as np
import pytest

from clockalign.capture.targets.container import pick_cgroup
from clockalign.workloads.standin import HERE, write_ids
from clockalign.store.reader import RunReader
from clockalign.store.schema import Kind

from .conftest import clockalign_cmd, run_clockalign, wait_for_file
from .test_record_fakecuda import BASE, check_workload, env_for, start_waiting_target

pytestmark = pytest.mark.skipif(not shutil.which("unshare"), reason="unshare (util-linux) "
                                "not installed")


def build_variant(d, opt):
    """A stand-in libcuda.so.1 built with -O<opt>: the same behaviour at other offsets."""
    os.makedirs(d, exist_ok=True)
    write_ids(os.path.join(d, "cuda_ids.h"))
    lib = os.path.join(d, "libcuda.so.1")
    subprocess.run(["gcc", "-shared", "-fPIC", f"-O{opt}", f"-I{d}", "-Wl,-soname,libcuda.so.1",
                    "-o", lib, os.path.join(HERE, "libcuda.c")], check=True)
    return lib


@pytest.fixture(scope="module")
def variants(tmp_path_factory):
    d = tmp_path_factory.mktemp("variants")
    return {opt: build_variant(str(d / f"O{opt}"), opt) for opt in ("0", "2")}


def symbol_offset(lib, sym="cuLaunchKernel"):
    out = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True,
                         check=True).stdout
    return next(int(line.split()[0], 16) for line in out.splitlines() if line.endswith(" " + sym))


class Container:
    """The target in new mount and PID namespaces, its libcuda path bind-mounted to lib."""

    def __init__(self, fakecuda, lib, *extra, cgroup_procs=None, setup=None, env=None):
        host_lib = str(fakecuda / "libcuda.so.1")
        script = ((setup or f"mount --bind {lib} {host_lib}") +
                  f" && exec {fakecuda / 'target'} --wait " + " ".join(extra))
        self.unshare = subprocess.Popen(
            ["unshare", "--mount", "--pid", "--fork", "--propagation", "private",
             "sh", "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True, env=env or env_for(fakecuda))
        line = self.unshare.stdout.readline()
        assert line.startswith("ready"), line
        self.nspid = int(line.split()[1])
        with open(f"/proc/{self.unshare.pid}/task/{self.unshare.pid}/children") as f:
            self.pid = int(f.read().split()[0])            # the host pid of the target
        if cgroup_procs:
            with open(cgroup_procs, "w") as f:
                f.write(str(self.pid))
        with open(f"/proc/{self.pid}/cgroup") as f:
            self.cgroup = pick_cgroup([ln.rstrip("\n").split(":", 2) for ln in f])

    def go(self):
        self.unshare.stdin.write("go\n")
        self.unshare.stdin.flush()
        info = json.loads(self.unshare.stdout.readline())
        self.unshare.wait(timeout=30)
        return info

    def kill(self):
        if self.unshare.poll() is None:
            self.unshare.kill()
            self.unshare.wait()


def host_view(ev, info, host_pid):
    """The target's own ids (its namespace's) turned into the host's, which the events
    carry: its main thread is the host pid, and its two workers are the two threads it
    created, in creation order (a fresh PID namespace numbers them in that order too)."""
    new = ev[(ev["kind"] == Kind.THREAD_NEW) & (ev["pid"] == host_pid)]
    host_tids = new["tid"][np.argsort(new["ts"], kind="stable")].tolist()
    assert len(host_tids) == 2, host_tids
    by_ns = dict(zip(sorted([info["tid_a"], info["tid_b"]]), host_tids))
    return {**info, "pid": host_pid, "tid_main": host_pid, "tid_a": by_ns[info["tid_a"]],
            "tid_b": by_ns[info["tid_b"]]}


def record(out, *pids):
    args = [a for p in pids for a in ("--pid", str(p))]
    return subprocess.Popen(clockalign_cmd("record", *args, "-o", str(out), *BASE),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def record_container(c, out):
    """Record container c with --pid until its workload is done: (RunReader, the workload's
    own report, the recorder's stderr)."""
    rec = record(out, c.pid)
    wait_for_file(out)
    info = c.go()
    _, err = rec.communicate(timeout=60)
    assert rec.returncode == 0, err
    return RunReader(out), info, err


def check_container_target(ev, meta, c, info, lib):
    assert info["pid"] == c.nspid == 1 and info["tid_main"] == 1
    assert 1 < info["tid_a"] < info["tid_b"] < 10     # its own numbering: mount was pid 2
    check_workload(ev[ev["pid"] == c.pid], host_view(ev, info, c.pid))
    t = next(t for t in meta["targets"] if t["pid"] == c.pid)
    assert t["nspid"] == 1 and t["nspids"] == [c.pid, 1]
    assert t["own_mount_ns"] is True
    assert t["libcuda_how"] == "maps" or t["libcuda_how"] == "LD_LIBRARY_PATH"
    st = os.stat(lib)                # the file probed is the variant, by device and inode
    assert t["libcuda_ino"] == st.st_ino
    assert t["libcuda_dev"] == f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}"
    assert t["cgroup"] == c.cgroup
    return t


@pytest.mark.parametrize("late", [False, True], ids=["loaded", "dlopen-late"])
def test_container_target_traced_from_its_own_libcuda(fakecuda, variants, tmp_path, late):
    """Every call of a target whose libcuda.so.1 is, in its mount namespace, another file
    than the host's at that path: exact counts (0 before issue 13), its NSpid and cgroup."""
    lib = variants["0"]
    assert symbol_offset(lib) != symbol_offset(str(fakecuda / "libcuda.so.1"))
    c = Container(fakecuda, lib, *(["--dlopen"] if late else []))
    try:
        out = tmp_path / "ns.ca"
        r, info, err = record_container(c, out)
        assert r.clean
        t = check_container_target(r.events(), r.meta, c, info, lib)
        assert ("has not loaded libcuda yet" if late else "another mount namespace") in err
        assert t["libcuda"].startswith(f"/proc/{c.pid}/")
        assert t["libcuda_in_target"] == str(fakecuda / "libcuda.so.1")
        p = run_clockalign("info", str(out))
        assert p.returncode == 0, p.stderr
        line = next(ln for ln in p.stdout.splitlines() if ln.startswith("target"))
        assert f"pid {c.pid} (pid 1 in its namespace" in line, line
    finally:
        c.kill()


def test_two_containers_and_the_host_in_one_recording(fakecuda, variants, tmp_path):
    """Three processes, three different files at one library path: each its own probes."""
    offs = {symbol_offset(variants["0"]), symbol_offset(variants["2"]),
            symbol_offset(str(fakecuda / "libcuda.so.1"))}
    c0 = Container(fakecuda, variants["0"])
    c2 = Container(fakecuda, variants["2"], "--dlopen")
    host = start_waiting_target(fakecuda)
    try:
        out = tmp_path / "three.ca"
        rec = record(out, c0.pid, c2.pid, host.pid)
        wait_for_file(out)
        i0, i2 = c0.go(), c2.go()
        host.stdin.write("go\n")
        host.stdin.flush()
        ih = json.loads(host.stdout.readline())
        host.wait(timeout=30)
        _, err = rec.communicate(timeout=60)
        assert rec.returncode == 0, err
        r = RunReader(out)
        ev = r.events()
        check_container_target(ev, r.meta, c0, i0, variants["0"])
        check_container_target(ev, r.meta, c2, i2, variants["2"])
        check_workload(ev[ev["pid"] == host.pid], ih)
        libs = r.meta["cuda_libraries"]
        assert len(libs) == 3 and sorted(p for v in libs.values() for p in v["pids"]) == sorted(
            [c0.pid, c2.pid, host.pid])
        assert len(offs) >= 2      # the variants really differ in code layout
        h = next(t for t in r.meta["targets"] if t["pid"] == host.pid)
        assert h["nspid"] == host.pid and h["own_mount_ns"] is False
        assert h["libcuda"] == os.path.realpath(fakecuda / "libcuda.so.1")
    finally:
        c0.kill()
        c2.kill()
        host.kill()
        host.wait()


def _cgroup2_root():
    with open("/proc/self/mounts") as f:
        for line in f:
            dev, mnt, fstype = line.split()[:3]
            if fstype == "cgroup2":
                return mnt
    return None


@pytest.fixture
def docker_like_cgroup():
    """A cgroup named as Docker's systemd driver names a container's, for the target."""
    root = _cgroup2_root()
    if root is None or not os.access(root, os.W_OK):
        pytest.skip("no writable cgroup2 hierarchy to place the target in a docker-like scope")
    cid = secrets.token_hex(32)
    d = os.path.join(root, f"docker-{cid}.scope")
    try:
        os.mkdir(d)
    except OSError as e:
        pytest.skip(f"cannot create a cgroup under {root} ({e.strerror})")
    yield cid, d
    for _ in range(50):
        try:
            os.rmdir(d)
            break
        except OSError:
            import time
            time.sleep(0.1)


def test_container_named_from_its_cgroup(fakecuda, variants, tmp_path, docker_like_cgroup):
    """A target in docker-<64 hex>.scope: the run file, and info, name the container."""
    cid, d = docker_like_cgroup
    c = Container(fakecuda, variants["0"], cgroup_procs=os.path.join(d, "cgroup.procs"))
    try:
        out = tmp_path / "docker.ca"
        r, info, _ = record_container(c, out)
        t = check_container_target(r.events(), r.meta, c, info, variants["0"])
        assert t["cgroup"] == f"/docker-{cid}.scope"
        assert t["container"] == {"runtime": "docker", "id": cid}
        p = run_clockalign("info", str(out))
        line = next(ln for ln in p.stdout.splitlines() if ln.startswith("target"))
        assert f"container docker {cid[:12]}" in line, line
    finally:
        c.kill()


def test_container_without_a_libcuda_inside_is_one_sentence(fakecuda, tmp_path):
    """LD_LIBRARY_PATH names a directory that holds a libcuda on the host but, in the
    target's mount namespace, nothing: refused in one sentence, not recorded without CUDA."""
    from clockalign.capture.probes.libcuda import resolve_like_loader
    if resolve_like_loader({})[0]:
        pytest.skip("this host has a libcuda in its default directories or ld.so.cache, "
                    "which the unshared target (same root) would load")
    d = tmp_path / "libdir"
    d.mkdir()
    shutil.copy(fakecuda / "libcuda.so.1", d / "libcuda.so.1")
    env = {**env_for(fakecuda), "LD_LIBRARY_PATH": str(d)}
    c = Container(fakecuda, None, "--dlopen", setup=f"mount -t tmpfs none {d}", env=env)
    try:
        p = run_clockalign("record", "--pid", str(c.pid), "-o", str(tmp_path / "x.ca"), *BASE,
                           "--duration", "1")
        assert p.returncode != 0 and "Traceback" not in p.stderr
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1, lines
        assert lines[0].startswith(f"clockalign: process {c.pid} has not loaded libcuda and "
                                   "none can be found the way its loader would look inside "
                                   "its root"), lines
        assert not (tmp_path / "x.ca").exists()
    finally:
        c.kill()
