"""What the kernel says about a loaded BPF program: struct bpf_prog_info through bpf(2).

The kernel runs no BPF program of the perf-event kinds (tracepoints, kprobes) while another
one runs on the same CPU: it skips it and counts a recursion miss in the program's
statistics.  A target's sched_switch record skipped that way is an event lost without any
buffer being full, so the recorder reads these counts at the stop (Probes.skipped_runs) and
reports them beside the drops (not among them: most runs of the host-wide tracepoints are
other processes', and a skip of one loses nothing).  The benchmark (scripts/bench/probe_cost.py) reads the run counts
and times of every program of the system from here too.

struct bpf_prog_info's offsets are those of include/uapi/linux/bpf.h (stable: fields are
only ever appended; a kernel fills what it knows and leaves the rest 0).
"""
import ctypes
import os
import platform
import struct

NR_BPF = {"x86_64": 321, "aarch64": 280}.get(platform.machine(), 321)
BPF_PROG_GET_NEXT_ID, BPF_PROG_GET_FD_BY_ID, BPF_OBJ_GET_INFO_BY_FD = 11, 13, 15
PROG_INFO = {"jited_prog_len": 16, "name": 64, "run_time_ns": 192, "run_cnt": 200,
             "recursion_misses": 208}
PROG_INFO_LEN = 216             # through recursion_misses (5.12)


class _IdAttr(ctypes.Structure):
    """union bpf_attr for BPF_PROG_GET_NEXT_ID (start_id, next_id) and
    BPF_PROG_GET_FD_BY_ID (prog_id in the first field)."""
    _fields_ = [("id", ctypes.c_uint32), ("next_id", ctypes.c_uint32),
                ("open_flags", ctypes.c_uint32)]


class _InfoAttr(ctypes.Structure):
    """union bpf_attr for BPF_OBJ_GET_INFO_BY_FD."""
    _fields_ = [("bpf_fd", ctypes.c_uint32), ("info_len", ctypes.c_uint32),
                ("info", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)


def _bpf_call(cmd, attr) -> int:
    return _libc.syscall(NR_BPF, cmd, ctypes.byref(attr), ctypes.sizeof(attr))


def prog_info(fd: int):
    """{name, jited, run_time_ns, run_cnt, recursion_misses} of the program behind fd, or
    None where the kernel refuses (names are cut to 15 characters; run counts and times
    move only while kernel.bpf_stats_enabled is 1, recursion misses always)."""
    buf = ctypes.create_string_buffer(PROG_INFO_LEN)
    info = _InfoAttr(bpf_fd=fd, info_len=PROG_INFO_LEN, info=ctypes.addressof(buf))
    if _bpf_call(BPF_OBJ_GET_INFO_BY_FD, info) != 0:
        return None
    raw = buf.raw
    out = {k: struct.unpack_from("<Q", raw, PROG_INFO[k])[0]
           for k in ("run_time_ns", "run_cnt", "recursion_misses")}
    out["name"] = raw[PROG_INFO["name"]:PROG_INFO["name"] + 16].split(b"\0")[0].decode(
        errors="replace")
    out["jited"] = struct.unpack_from("<I", raw, PROG_INFO["jited_prog_len"])[0] > 0
    return out


def system_progs() -> dict:
    """{id: prog_info} of every BPF program loaded now.  A program unloaded between its id
    and its fd is skipped."""
    out, attr = {}, _IdAttr()
    while _bpf_call(BPF_PROG_GET_NEXT_ID, attr) == 0:     # -1 with ENOENT: the last one
        pid = attr.next_id
        attr = _IdAttr(id=pid)
        fd = _bpf_call(BPF_PROG_GET_FD_BY_ID, _IdAttr(id=pid))
        if fd < 0:
            continue
        try:
            info = prog_info(fd)
            if info is not None:
                out[pid] = info
        finally:
            os.close(fd)
    return out
