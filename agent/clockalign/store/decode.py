"""Turn raw event fields into readable values (socket peers, strings, one dict per event).

    peer(ev["data"][i].tobytes())        # "127.0.0.1:8080", "[::1]:443", "unix:/run/x.sock"
    for d in event_dicts(events): print(json.dumps(d))
"""
import errno as _errno
import ipaddress
import struct

import numpy as np

from .schema import CUDA_FUNCTIONS, KIND_NAMES, Kind, task_state_name, unpack_dims

AF_UNIX, AF_INET, AF_INET6 = 1, 2, 10


def cstr(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode(errors="replace")


def peer(raw: bytes) -> str:
    """A sockaddr as host:port / [v6]:port / unix:path."""
    if len(raw) < 2:
        return "?"
    fam = struct.unpack_from("<H", raw)[0]
    if fam == AF_INET and len(raw) >= 8:
        port = struct.unpack_from(">H", raw, 2)[0]
        return f"{ipaddress.IPv4Address(raw[4:8])}:{port}"
    if fam == AF_INET6 and len(raw) >= 24:
        port = struct.unpack_from(">H", raw, 2)[0]
        return f"[{ipaddress.IPv6Address(raw[8:24])}]:{port}"
    if fam == AF_UNIX:
        path = raw[2:]
        if path[:1] == b"\0":
            return "unix:@" + cstr(path[1:])
        return "unix:" + cstr(path)
    return f"family{fam}"


def errno_name(err: int) -> str:
    return _errno.errorcode.get(err, str(err))


def cuda_fn_name(fid: int) -> str:
    return CUDA_FUNCTIONS.get(int(fid), (f"fn{fid}",))[0]


def event_dicts(ev: np.ndarray, t_field="ts"):
    """One JSON-ready dict per event (dump's schema: kind, t_ns, pid, tid + per-kind fields)."""
    data = ev["data"]
    for i in range(len(ev)):
        e = ev[i]
        kind = int(e["kind"])
        d = {"kind": KIND_NAMES.get(kind, str(kind)), "t_ns": int(e[t_field]),
             "pid": int(e["pid"]), "tid": int(e["tid"])}
        if kind in (Kind.CUDA, Kind.CUDA_UNFINISHED):
            fid = int(e["code"])
            name, argnames = CUDA_FUNCTIONS.get(fid, (f"fn{fid}", ("",) * 5))
            d["fn"] = name
            if kind == Kind.CUDA:
                d["ret"] = int(e["ret"])
                d["dur_ns"] = int(e["dur"])
            else:
                d["ret"] = None
                d["unfinished"] = True
                d["running_ns"] = int(e["dur"])
            for j, a in enumerate(argnames):
                if not a:
                    continue
                v = int(e[f"a{j}"])
                if a in ("grid", "block"):
                    x, y, z = unpack_dims(v)
                    d[a] = [int(x), int(y), int(z)]
                else:
                    d[a] = v
        elif kind == Kind.CONNECT:
            ret = int(e["ret"])
            d.update(fd=int(e["a0"]), dur_ns=int(e["dur"]), ret=ret,
                     errno=errno_name(-ret) if ret < 0 else None,
                     peer=peer(data[i].tobytes()[:int(min(e["a1"], 56))]))
        elif kind == Kind.SCHED:
            d.update(off_cpu_ns=int(e["dur"]), prev_state=task_state_name(int(e["ret"])),
                     preempted=bool(e["code"]), wakeup_to_run_ns=int(e["a0"]),
                     cpu_out=int(e["a1"]), cpu_in=int(e["a2"]))
        elif kind == Kind.XID:
            raw = data[i].tobytes()
            d.update(code=int(e["ret"]), dev=cstr(raw[:16]), msg=cstr(raw[16:]))
        elif kind in (Kind.THREAD_NEW, Kind.THREAD_NAME, Kind.THREAD_EXIT):
            d["comm"] = cstr(data[i].tobytes())
            if kind == Kind.THREAD_NEW:
                d["parent_tid"] = int(e["a0"])
            if kind == Kind.THREAD_EXIT:
                d["group_dead"] = bool(e["code"])
        elif kind == Kind.PROC_EXIT:
            d["exit_code"] = int(e["ret"])
        elif kind == Kind.SIGNAL:
            d.update(signal=int(e["ret"]), sender_pid=int(e["a0"]), result=int(e["code"]))
        yield d
