"""Find the libcuda a process uses, or the one it will load — as that process sees files.

A process that already loaded libcuda shows it in /proc/PID/maps, with the device and inode
of the file mapped.  The name there is a name in the process's own mount namespace: in a
container, ``/usr/lib/x86_64-linux-gnu/libcuda.so.1`` on the host is another file (or none),
and uprobes attach to an inode, so probing the host's file traces nothing.  The library is
therefore reached through the process's root (``/proc/PID/root/...``) or its mapping
(``/proc/PID/map_files/START-END``), and kept only where its device and inode are the
mapping's.

One that has not loaded libcuda yet (it will after ``import torch``), and every spawned
command, gets the library its dynamic loader would pick for ``dlopen("libcuda.so.1")``: its
LD_LIBRARY_PATH, then the ld.so.cache, then the default directories — all inside its root,
symbolic links followed as they resolve there, and the cache file parsed rather than
ldconfig run (nothing is run inside a container).

    path, how = resolve_for_pid(1234)     # ("/usr/lib/x86_64-linux-gnu/libcuda.so.580.1", "maps")
    loc = locate(1234)                    # {"probe": "/proc/1234/root/usr/lib/...", ...}
"""
import os
import struct

from ...errors import ClockalignError
from ..targets.container import own_mount_namespace

SONAME = "libcuda.so.1"
DEFAULT_DIRS = ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64",
                "/lib", "/usr/lib", "/usr/local/nvidia/lib64", "/usr/lib/wsl/lib")


def mapping_of_libcuda(pid: int):
    """{"path", "dev", "ino", "range"} of the first libcuda mapping of pid, or None.
    dev is maps' "major:minor" in hex; path has no " (deleted)" suffix."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) < 6:
                    continue
                path = parts[5].rstrip("\n")
                deleted = path.endswith(" (deleted)")
                path = path[:-len(" (deleted)")] if deleted else path
                if os.path.basename(path).startswith("libcuda.so") and int(parts[4]):
                    return {"path": path, "dev": parts[3], "ino": int(parts[4]),
                            "range": parts[0], "deleted": deleted}
    except (OSError, ValueError):
        return None
    return None


def loaded_libcuda(pid: int):
    """A path to the libcuda file mapped into pid, usable from here, or None."""
    m = mapping_of_libcuda(pid)
    return probe_path(pid, m) if m else None


def _dev_of(maps_dev: str):
    major, minor = maps_dev.split(":")
    return os.makedev(int(major, 16), int(minor, 16))


def same_file(path: str, maps_dev: str, ino: int) -> bool:
    """Whether path is the file maps names by device and inode."""
    try:
        st = os.stat(path)
        return st.st_ino == ino and st.st_dev == _dev_of(maps_dev)
    except (OSError, ValueError):
        return False


def probe_path(pid: int, m: dict):
    """Where to attach for mapping m of pid: the name itself where it is the mapped file
    here too, else the name under the process's root, else the mapping itself; None when
    none of these is the mapped file."""
    own = not own_mount_namespace(pid)
    candidates = ([m["path"]] if own else []) + [
        in_root(f"/proc/{pid}/root", m["path"]) or f"/proc/{pid}/root{m['path']}",
        f"/proc/{pid}/map_files/{m['range']}"]
    for c in candidates:
        if same_file(c, m["dev"], m["ino"]):
            return c
    # btrfs subvolumes and overlayfs stat with another device than maps shows; the
    # mapping's own link is the mapped file by construction
    try:
        if os.stat(candidates[-1]).st_ino == m["ino"]:
            return candidates[-1]
    except OSError:
        pass
    return None


def in_root(root: str, path: str, cwd: str = "/"):
    """path as a process whose root is root would resolve it, as a path usable here (under
    root, no symbolic link left in it), or None if it does not exist there.  An absolute
    link target restarts at root, not at our own /."""
    if root in ("", "/"):
        return os.path.realpath(path) if os.path.exists(path) else None
    todo = [p for p in (path if path.startswith("/") else cwd.rstrip("/") + "/" + path)
            .split("/") if p]
    done = []
    hops = 0
    while todo:
        part = todo.pop(0)
        if part == ".":
            continue
        if part == "..":
            if done:
                done.pop()
            continue
        here = root + "/" + "/".join(done + [part])
        try:
            target = os.readlink(here)
        except FileNotFoundError:
            return None
        except OSError:                 # not a link (EINVAL) or unreadable: keep the part
            if not os.path.lexists(here):
                return None
            done.append(part)
            continue
        hops += 1
        if hops > 40:                   # ELOOP, as the kernel would say
            return None
        if target.startswith("/"):
            done = []
        todo = [p for p in target.split("/") if p] + todo
    full = root + "/" + "/".join(done)
    return full if os.path.exists(full) else None


# ld.so.cache (glibc's elf/cache.c): the "new" format, alone (glibc >= 2.32 writes only it)
# or after the old one.  Entries flagged FLAG_ELF_LIBC6 | FLAG_X8664_LIB64.
_NEW_MAGIC = b"glibc-ld.so.cache1.1"
_OLD_MAGIC = b"ld.so-1.7.0"
_X86_64_LIBC6 = 0x0303


def parse_ld_so_cache(data: bytes) -> dict:
    """{soname: path} of the x86-64 entries of an ld.so.cache file's bytes, in the cache's
    order (the first of a name is the one the loader takes); {} for bytes that are not one."""
    start = 0
    if data.startswith(_OLD_MAGIC):
        if len(data) < 16:
            return {}
        nold = struct.unpack_from("<I", data, 12)[0]
        start = 16 + nold * 12
        start = (start + 7) & ~7
        if not data.startswith(_NEW_MAGIC, start):
            found = data.find(_NEW_MAGIC, 16)
            if found < 0:
                return _parse_old(data, nold)
            start = found
    if not data.startswith(_NEW_MAGIC, start) or len(data) < start + 48:
        return {}
    n = struct.unpack_from("<I", data, start + 20)[0]
    out = {}
    for i in range(n):
        at = start + 48 + i * 24
        if at + 24 > len(data):
            break
        flags, key, value = struct.unpack_from("<iII", data, at)
        if flags & 0xFFFF != _X86_64_LIBC6:
            continue
        name, path = _cstr(data, start + key), _cstr(data, start + value)
        if name and path:
            out.setdefault(name, path)
    return out


def _parse_old(data: bytes, n: int) -> dict:
    strings = 16 + n * 12
    out = {}
    for i in range(n):
        flags, key, value = struct.unpack_from("<iII", data, 16 + i * 12)
        if flags & 0xFFFF == _X86_64_LIBC6:
            name, path = _cstr(data, strings + key), _cstr(data, strings + value)
            if name and path:
                out.setdefault(name, path)
    return out


def _cstr(data: bytes, at: int):
    if not 0 <= at < len(data):
        return None
    end = data.find(b"\0", at)
    return data[at:end if end >= 0 else len(data)].decode(errors="replace")


def ldconfig_cache(root: str = "/") -> dict:
    """{soname: path} for x86-64 entries of root's /etc/ld.so.cache (paths as seen in root)."""
    path = in_root(root, "/etc/ld.so.cache")
    try:
        with open(path, "rb") as f:
            return parse_ld_so_cache(f.read())
    except (OSError, TypeError):
        return {}


def resolve_like_loader(env: dict, root: str = "/", cwd: str = "/"):
    """(path, how) of the libcuda a dlopen("libcuda.so.1") would load with env in a process
    whose root is root (a path usable here), or (None, None)."""
    for d in (env.get("LD_LIBRARY_PATH") or "").split(":"):
        if d:
            p = in_root(root, os.path.join(d, SONAME), cwd)
            if p and os.path.isfile(p):
                return p, "LD_LIBRARY_PATH"
    cached = ldconfig_cache(root).get(SONAME)
    if cached:
        p = in_root(root, cached)
        if p and os.path.isfile(p):
            return p, "ld.so.cache"
    for d in DEFAULT_DIRS:
        p = in_root(root, os.path.join(d, SONAME))
        if p and os.path.isfile(p):
            return p, "default library path"
    return None, None


def process_environ(pid: int) -> dict:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return {}
    env = {}
    for item in raw.split(b"\0"):
        if b"=" in item:
            k, v = item.split(b"=", 1)
            env[k.decode(errors="replace")] = v.decode(errors="replace")
    return env


def locate(pid: int) -> dict:
    """Where pid's libcuda is, or would be: {"probe": path to attach from here (None: not
    found), "how": "maps" | "LD_LIBRARY_PATH" | "ld.so.cache" | "default library path",
    "in_target": its name inside the process, "dev"/"ino" of the mapping (maps only),
    "unverified": a mapping none of whose paths here is the mapped file}."""
    m = mapping_of_libcuda(pid)
    if m:
        p = probe_path(pid, m)
        return {"probe": p, "how": "maps", "in_target": m["path"], "dev": m["dev"],
                "ino": m["ino"], "unverified": p is None}
    foreign = own_mount_namespace(pid)
    root = f"/proc/{pid}/root" if foreign else "/"
    p, how = resolve_like_loader(process_environ(pid), root)
    inside = p[len(root):] if p and foreign and p.startswith(root + "/") else p
    return {"probe": p, "how": how, "in_target": inside, "unverified": False}


def resolve_for_pid(pid: int):
    """(path, how): 'maps' when already loaded, else how the loader would find it; the path
    is usable from here (under /proc/PID/root for a process in another mount namespace)."""
    loc = locate(pid)
    return (loc["probe"], loc["how"]) if loc["probe"] else (None, None)


class TargetLibraries:
    """Which libcuda file the CUDA probes of each target go on (what the header says about
    each is kept in ``found``); notice(text) is told what the user should know."""

    def __init__(self, notice):
        self.notice = notice
        self.found = {}             # pid -> locate()'s answer, with the file's dev/inode

    def resolve(self, o, spawned: bool, pids, env):
        """The libcuda to probe: a path (--libcuda, spawn mode), or in pid mode
        {path: [pids]}, one entry per library file — two targets in two containers may map
        two different files at one name, and each gets its own probes."""
        self.found = {}
        if not o.cuda:
            return None
        if o.libcuda:
            if not os.path.exists(o.libcuda):
                raise ClockalignError(f"--libcuda {o.libcuda} does not exist")
            return os.path.realpath(o.libcuda)
        if spawned:
            path, how = resolve_like_loader(env)
            if not path:
                raise ClockalignError(
                    "no libcuda.so.1 can be found the way the command's loader would look "
                    "(LD_LIBRARY_PATH, ld.so.cache, default directories); pass --libcuda "
                    "PATH or record without CUDA probes with --no-cuda")
            self.notice(f"CUDA probes armed on {path} (found via {how}) before the command starts")
            return path
        by_file = {}
        for pid in pids:
            path, key = self.of(pid)
            by_file.setdefault(key, (path, []))[1].append(pid)
        return dict(by_file.values())

    def of(self, pid):
        """(path to probe, file key) of the libcuda process pid maps or would load; a
        notice where it is not loaded yet or in another mount namespace; ClockalignError
        where none can be probed."""
        loc = locate(pid)
        where = (" inside its root (another mount namespace: a container?)"
                 if own_mount_namespace(pid) else "")
        if loc["unverified"]:
            raise ClockalignError(
                f"process {pid} maps libcuda {loc['in_target']} (device {loc['dev']}, inode "
                f"{loc['ino']}), but no path from here reaches that file; pass --libcuda "
                "PATH or record without CUDA probes with --no-cuda")
        path = loc["probe"]
        if not path:
            raise ClockalignError(
                f"process {pid} has not loaded libcuda and none can be found the way its "
                f"loader would look{where} (LD_LIBRARY_PATH, ld.so.cache, default "
                "directories); pass --libcuda PATH or record without CUDA probes with "
                "--no-cuda")
        if loc["how"] != "maps":
            self.notice(f"process {pid} has not loaded libcuda yet; probes armed on {path} "
                        f"(found via {loc['how']}{where}), so a later dlopen is traced")
        elif where:
            self.notice(f"process {pid} runs in another mount namespace: probes armed on the "
                        f"libcuda it maps, {loc['in_target']}, reached as {path}")
        try:
            st = os.stat(path)
            key = (st.st_dev, st.st_ino)
            loc = {**loc, "dev": f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}",
                   "ino": st.st_ino}
        except OSError:
            key = path
        self.found[pid] = loc
        return path, key
