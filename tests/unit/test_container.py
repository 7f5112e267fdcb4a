"""Containers without root: cgroup names, NSpid, resolving a library inside another root
(symbolic links restarting at that root, its ld.so.cache parsed), and the labels shown."""
import os
import shutil
import struct
import subprocess

import pytest

from clockalign.capture.targets import container
from clockalign.capture.probes import libcuda
from clockalign.capture.targets.container import container_of, pick_cgroup
from clockalign.store.meta import target_label as label

CID = "3f" * 32
UID = "1c2d3e4f-aaaa-bbbb-cccc-0123456789ab"


@pytest.mark.parametrize("path, want", [
    (f"/system.slice/docker-{CID}.scope", {"runtime": "docker", "id": CID}),
    (f"/docker/{CID}", {"runtime": "docker", "id": CID}),
    (f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID.replace('-', '_')}"
     f".slice/cri-containerd-{CID}.scope", {"runtime": "containerd", "id": CID, "pod": UID}),
    (f"/kubepods/besteffort/pod{UID}/{CID}", {"runtime": "kubernetes", "id": CID, "pod": UID}),
    (f"/machine.slice/libpod-{CID}.scope", {"runtime": "podman", "id": CID}),
    (f"/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/crio-{CID}.scope",
     {"runtime": "cri-o", "id": CID, "pod": UID}),
    ("/user.slice/user-1000.slice/session-2.scope", None),
    ("/", None), ("", None), (None, None),
])
def test_container_of_names_runtime_id_and_pod(path, want):
    assert container_of(path) == want


def test_pick_cgroup_prefers_v2_then_systemd_then_a_controller():
    v2 = [["0", "", f"/system.slice/docker-{CID}.scope"]]
    assert pick_cgroup(v2) == f"/system.slice/docker-{CID}.scope"
    hybrid = [["9", "name=systemd", f"/docker/{CID}"], ["4", "memory", "/other"],
              ["0", "", "/"]]
    assert pick_cgroup(hybrid) == f"/docker/{CID}"
    v1 = [["4", "memory", "/mem"], ["1", "cpu", "/"]]
    assert pick_cgroup(v1) == "/mem"
    assert pick_cgroup([["0", "", "/"]]) == "/"
    assert pick_cgroup([]) == "/"


def test_describe_this_process():
    d = container.describe(os.getpid())
    assert d["nspid"] == d["nspids"][-1]
    assert d["nspids"][0] == os.getpid()
    assert d["own_mount_ns"] is False
    assert container.nspids(999999999) == [999999999]      # gone: the host pid alone
    assert container.cgroup_path(999999999) is None


def test_label():
    assert label({"pid": 5, "nspid": 5, "cgroup": "/"}) == ""
    t = {"pid": 1234, "nspid": 7, "cgroup": f"/docker/{CID}",
         "container": {"runtime": "docker", "id": CID}}
    assert label(t) == f"pid 7 in its namespace, container docker {CID[:12]}, cgroup /docker/{CID}"
    assert label({"pid": 1, "container": {"id": CID, "runtime": None, "pod": UID}}) == (
        f"container {CID[:12]}, pod {UID}")
    assert label({"pid": "x", "nspid": "y", "container": "z", "cgroup": 3}) == "cgroup 3"


def make_cache(entries, old=False):
    """ld.so.cache bytes: glibc's new format (optionally after an old-format part)."""
    strings = b""
    offs = []
    base = 48 + 24 * len(entries)
    for name, path, _ in entries:
        offs.append((base + len(strings), base + len(strings) + len(name) + 1))
        strings += name.encode() + b"\0" + path.encode() + b"\0"
    head = struct.pack("<20sII4xI12x", b"glibc-ld.so.cache1.1", len(entries), len(strings), 0)
    body = b"".join(struct.pack("<iIIIQ", flags, k, v, 0, 0)
                    for (_, _, flags), (k, v) in zip(entries, offs))
    new = head + body + strings
    if not old:
        return new
    return b"ld.so-1.7.0\0" + struct.pack("<I", 0) + new     # no old entries, then the new part


@pytest.mark.parametrize("old", [False, True], ids=["new", "old+new"])
def test_parse_ld_so_cache(old):
    data = make_cache([("libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1", 0x0303),
                       ("libcuda.so.1", "/usr/lib/i386-linux-gnu/libcuda.so.1", 0x0003),
                       ("libcuda.so.1", "/second/libcuda.so.1", 0x0303),
                       ("libm.so.6", "/lib/x86_64-linux-gnu/libm.so.6", 0x0303)], old=old)
    got = libcuda.parse_ld_so_cache(data)
    assert got == {"libcuda.so.1": "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
                   "libm.so.6": "/lib/x86_64-linux-gnu/libm.so.6"}
    for cut in (0, 10, 30, 60, len(data) - 5):        # truncated: never an exception
        assert isinstance(libcuda.parse_ld_so_cache(data[:cut]), dict)
    assert libcuda.parse_ld_so_cache(b"not a cache at all" * 4) == {}


@pytest.mark.skipif(not (shutil.which("ldconfig") or os.path.exists("/sbin/ldconfig"))
                    or not os.path.exists("/etc/ld.so.cache"),
                    reason="no ldconfig or /etc/ld.so.cache on this host to compare with")
def test_parse_ld_so_cache_agrees_with_ldconfig():
    exe = shutil.which("ldconfig") or "/sbin/ldconfig"
    text = subprocess.run([exe, "-p"], capture_output=True, text=True, timeout=30).stdout
    want = {}
    for line in text.splitlines():
        if "=>" in line and "x86-64" in line:
            left, path = line.split("=>", 1)
            want.setdefault(left.strip().split()[0], path.strip())
    assert libcuda.ldconfig_cache("/") == want


@pytest.fixture
def fake_root(tmp_path):
    """A container root: libcuda.so.1 an absolute link (to be read inside the root), the
    host's path outside it holding nothing."""
    root = tmp_path / "root"
    lib = root / "usr/lib/x86_64-linux-gnu"
    lib.mkdir(parents=True)
    (lib / "libcuda.so.570.1").write_bytes(b"\x7fELF container")
    os.symlink("/usr/lib/x86_64-linux-gnu/libcuda.so.570.1", lib / "libcuda.so.1")
    (root / "compat").mkdir()
    (root / "compat/libcuda.so.580.9").write_bytes(b"\x7fELF compat")
    os.symlink("libcuda.so.580.9", root / "compat/libcuda.so.1")
    os.symlink("../compat", root / "usr/compat")
    (root / "etc").mkdir()
    return root


def test_in_root_follows_links_inside_the_root(fake_root):
    r = str(fake_root)
    assert libcuda.in_root(r, "/usr/lib/x86_64-linux-gnu/libcuda.so.1") == (
        r + "/usr/lib/x86_64-linux-gnu/libcuda.so.570.1")
    assert libcuda.in_root(r, "/usr/compat/libcuda.so.1") == r + "/compat/libcuda.so.580.9"
    assert libcuda.in_root(r, "/../../usr/compat/../compat/libcuda.so.1") == (
        r + "/compat/libcuda.so.580.9")
    assert libcuda.in_root(r, "/nonexistent/libcuda.so.1") is None
    os.symlink("loop", fake_root / "loop")
    assert libcuda.in_root(r, "/loop") is None


def test_resolve_like_loader_inside_a_root(fake_root):
    r = str(fake_root)
    # default directories, under the root
    assert libcuda.resolve_like_loader({}, r) == (
        r + "/usr/lib/x86_64-linux-gnu/libcuda.so.570.1", "default library path")
    # its ld.so.cache, naming a path inside it
    (fake_root / "etc/ld.so.cache").write_bytes(
        make_cache([("libcuda.so.1", "/usr/compat/libcuda.so.1", 0x0303)]))
    assert libcuda.resolve_like_loader({}, r) == (r + "/compat/libcuda.so.580.9", "ld.so.cache")
    # its LD_LIBRARY_PATH first; a directory without the library is passed over
    env = {"LD_LIBRARY_PATH": "/nowhere::/usr/lib/x86_64-linux-gnu"}
    assert libcuda.resolve_like_loader(env, r) == (
        r + "/usr/lib/x86_64-linux-gnu/libcuda.so.570.1", "LD_LIBRARY_PATH")
    assert libcuda.resolve_like_loader({}, str(fake_root / "empty")) == (None, None)


def test_probe_path_checks_device_and_inode(tmp_path):
    """The mapping of this very process: its own path, checked by device and inode; a
    mapping whose inode matches no path from here is refused (None)."""
    with open("/proc/self/maps") as f:
        line = next(ln for ln in f if "libc.so" in ln or "libpython" in ln)
    parts = line.split(None, 5)
    m = {"path": parts[5].strip(), "dev": parts[3], "ino": int(parts[4]), "range": parts[0]}
    assert libcuda.probe_path(os.getpid(), m) == m["path"]
    assert libcuda.same_file(m["path"], m["dev"], m["ino"])
    assert not libcuda.same_file(m["path"], m["dev"], m["ino"] + 1)
    wrong = {**m, "ino": m["ino"] + 1, "range": "0-1"}
    assert libcuda.probe_path(os.getpid(), wrong) is None
