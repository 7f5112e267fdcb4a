"""Which container a host process runs in: its pid inside its PID namespace, its cgroup, and
the container or pod id the cgroup names.

``--pid`` takes the host pid; a service's own logs and ``docker top`` speak of the pid in
its namespace and of the container, so the run file keeps both (recorder ``_meta``).

    describe(1234)   # {"nspid": 7, "nspids": [1234, 7], "cgroup": "/system.slice/docker-3f..
                     #  .scope", "container": {"runtime": "docker", "id": "3f..."}, ...}
"""
import os
import re

_HEX64 = r"([0-9a-f]{64})"
# (runtime, pattern) in the order tried on each cgroup path component
_RUNTIMES = [
    ("docker", re.compile(rf"^docker-{_HEX64}\.scope$")),
    ("containerd", re.compile(rf"^cri-containerd-{_HEX64}\.scope$")),
    ("cri-o", re.compile(rf"^crio-{_HEX64}\.scope$")),
    ("podman", re.compile(rf"^libpod-{_HEX64}\.scope$")),
]
_PARENTS = {"docker": "docker", "cri-containerd": "containerd", "crio": "cri-o",
            "libpod_parent": "podman", "machine.slice": "podman"}
_POD = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})"
                  r"(?:\.slice)?$")


def nspids(pid: int) -> list:
    """NSpid of /proc/PID/status: the pid in each PID namespace, the host's first and the
    process's own last ([pid] where the kernel has no NSpid line)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return [int(x) for x in line.split()[1:]]
    except (OSError, ValueError):
        pass
    return [pid]


def cgroup_path(pid: int):
    """The process's cgroup: the unified (v2) path, or on a v1 host the name=systemd path,
    else the first controller's that is not the root; None if unreadable."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            lines = [ln.rstrip("\n").split(":", 2) for ln in f if ln.count(":") >= 2]
    except OSError:
        return None
    return pick_cgroup(lines)


def pick_cgroup(lines) -> str:
    """lines: [hierarchy-id, controllers, path] of /proc/PID/cgroup."""
    v2 = [p for h, c, p in lines if h == "0" and c == ""]
    systemd = [p for h, c, p in lines if c == "name=systemd"]
    rest = [p for h, c, p in lines if c not in ("", "name=systemd")]
    for p in v2 + systemd + rest:
        if p not in ("", "/"):
            return p
    return (v2 + systemd + rest or ["/"])[0]


def container_of(cgroup: str):
    """{"runtime", "id"} and/or {"pod"} named by a cgroup path, or None.

    systemd drivers name the scope (docker-<id>.scope, cri-containerd-<id>.scope,
    crio-<id>.scope, libpod-<id>.scope; pods kubepods-burstable-pod<uid>.slice, the uid's
    dashes as underscores); cgroupfs drivers use directories (/docker/<id>,
    /kubepods/burstable/pod<uid>/<id>)."""
    if not cgroup:
        return None
    out = {}
    parts = [p for p in cgroup.split("/") if p]
    for i, part in enumerate(parts):
        for runtime, pat in _RUNTIMES:
            m = pat.match(part)
            if m:
                out.update(runtime=runtime, id=m.group(1))
        if re.fullmatch(_HEX64, part):
            parent = parts[i - 1] if i else ""
            runtime = _PARENTS.get(parent)
            if runtime is None and any(_POD.search(p) for p in parts[:i]):
                runtime = "kubernetes"
            if runtime is not None or "id" not in out:
                out.update(runtime=runtime, id=part)
        m = _POD.search(part)
        if m and part.startswith(("pod", "kubepods")):
            out["pod"] = m.group(1).replace("_", "-")
    return out or None


def namespace(pid, kind: str):
    """The namespace id (inode) of /proc/PID/ns/KIND, e.g. 'mnt:[4026531841]'; None."""
    try:
        return os.readlink(f"/proc/{pid}/ns/{kind}")
    except OSError:
        return None


def own_mount_namespace(pid: int) -> bool:
    """Whether pid sees other mounts than we do (a container's files are not ours)."""
    theirs, ours = namespace(pid, "mnt"), namespace("self", "mnt")
    return theirs is not None and ours is not None and theirs != ours


def describe(pid: int) -> dict:
    """What the run file keeps about a target's namespaces and container."""
    ns = nspids(pid)
    cg = cgroup_path(pid)
    return {"nspid": ns[-1], "nspids": ns, "cgroup": cg, "container": container_of(cg),
            "pid_ns": namespace(pid, "pid"), "mnt_ns": namespace(pid, "mnt"),
            "own_mount_ns": own_mount_namespace(pid)}
