"""Where tracefs is and what its tracepoint formats say.

    tracefs_dir()                                   # "/sys/kernel/tracing" or None
    tracepoint_exists("sched", "sched_switch")      # True
"""
import os

CANDIDATES = ("/sys/kernel/tracing", "/sys/kernel/debug/tracing")


def tracefs_dir():
    for d in CANDIDATES:
        if os.path.isdir(os.path.join(d, "events")):
            return d
    return None


def mount_tracefs() -> bool:
    """Mount tracefs at /sys/kernel/tracing if it is not mounted (needs root)."""
    if tracefs_dir():
        return True
    if os.geteuid() != 0:
        return False
    os.system("mount -t tracefs nodev /sys/kernel/tracing >/dev/null 2>&1")
    return tracefs_dir() is not None


def tracepoint_format(category: str, event: str):
    d = tracefs_dir()
    if not d:
        return None
    try:
        with open(os.path.join(d, "events", category, event, "format")) as f:
            return f.read()
    except OSError:
        return None


def tracepoint_exists(category: str, event: str) -> bool:
    return tracepoint_format(category, event) is not None


def tracepoint_field_is_dataloc(category: str, event: str, field: str) -> bool:
    fmt = tracepoint_format(category, event) or ""
    for line in fmt.splitlines():
        decl = line.strip().split(";")[0]
        if decl.startswith("field:") and decl.split()[-1].split("[")[0] == field:
            return "__data_loc" in decl
    return False


def tracepoint_fields(category: str, event: str) -> dict:
    """{field name: (declaration, offset, size)} of a tracepoint ({} where it is absent)."""
    out = {}
    for line in (tracepoint_format(category, event) or "").splitlines():
        parts = dict(p.strip().split(":", 1) for p in line.strip().split(";") if ":" in p)
        if "field" in parts and "offset" in parts and "size" in parts:
            decl = parts["field"]
            out[decl.split()[-1].split("[")[0]] = (decl, int(parts["offset"]),
                                                   int(parts["size"]))
    return out
