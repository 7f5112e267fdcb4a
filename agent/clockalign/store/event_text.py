"""Turn the raw bytes some events carry into text, and events into JSON-ready dicts.

The one place these decoders live: timeline/, export/ and report/ use them too.

    decode_sockaddr(ev["data"][i], ev["a1"][i])   # "127.0.0.1:8080", "[::1]:443", "unix:/run/x.sock"
    for d in event_dicts(events): print(json.dumps(d))
"""
import errno
import ipaddress
import socket
import struct

import numpy as np

from . import cuda_api
from .schema import (CUDA_FUNCTIONS, EVENT_DTYPE, KIND_NAMES, XID_PART_LEN, Kind, TcpCode,
                     task_state_name, unpack_dims)


def cstring(raw, start: int = 0, length: int = None) -> str:
    """NUL-terminated text from a bytes-like (or a numpy void) slice."""
    b = bytes(raw)[start:] if length is None else bytes(raw)[start:start + length]
    return b.split(b"\0", 1)[0].decode("utf-8", "replace")


def decode_comm(data) -> str:
    return cstring(data, 0, 16)


def decode_xid(data):
    """(pci device name, message start) from an XID event's data: dev[16] + msg[40]; the
    whole message is in XidMessages."""
    return cstring(data, 0, 16), cstring(data, 16, 40)


_PART_AT = EVENT_DTYPE.fields["a0"][1]
_XID_HEAD_ROOM = 39          # message bytes the XID record itself keeps (msg[40], NUL)


class XidMessages:
    """Whole Xid messages, joined from the XID_MSG records the probe sends before each XID
    record (same ts, pid, tid).  A reader hands every events batch through take(), in file
    order, so the parts of an Xid are all in hand when its record is decoded.

        msgs = XidMessages()
        ev = msgs.take(batch)                     # the batch without its XID_MSG rows
        dev, msg, whole = msgs.of(ev[ev["kind"] == Kind.XID][0])
    """

    def __init__(self):
        self._parts = {}     # (pid, tid, ts) -> {part index: bytes}

    def take(self, ev: np.ndarray) -> np.ndarray:
        """ev (EVENT_DTYPE) without its XID_MSG rows, whose bytes are kept here."""
        m = ev["kind"] == Kind.XID_MSG
        if not m.any():
            return ev
        for e in ev[m]:
            key = (int(e["pid"]), int(e["tid"]), int(e["ts"]))
            self._parts.setdefault(key, {})[int(e["code"])] = \
                e.tobytes()[_PART_AT:_PART_AT + XID_PART_LEN]
        return ev[~m]

    def of(self, e) -> tuple:
        """(dev, message, whole) of one XID row (EVENT_DTYPE or TIMELINE_DTYPE): the whole
        message where every part arrived, else the start the record keeps (a part dropped,
        or a file from before the parts, which said no length); whole says which."""
        dev, head = decode_xid(e["data"])
        length = int(e["a0"])
        ts = int(e["ts"] if "ts" in e.dtype.names else e["t_ns"])
        parts = self._parts.get((int(e["pid"]), int(e["tid"]), ts), {})
        n = -(-length // XID_PART_LEN)
        if length and all(i in parts for i in range(n)):
            raw = b"".join(parts[i] for i in range(n))[:length]
            return dev, raw.decode("utf-8", "replace"), True
        return dev, head, length == len(head.encode()) or (not length and
                                                            len(head.encode()) < _XID_HEAD_ROOM)


def decode_sockaddr(data, addrlen=None) -> str:
    """A connect() target as text: '10.0.0.7:8000', '[::1]:443', 'unix:/run/x.sock'."""
    b = bytes(data)
    if addrlen is not None and 0 < int(addrlen) < len(b):
        b = b[:int(addrlen)]
    if len(b) < 2:
        return "?"
    family = struct.unpack_from("<H", b, 0)[0]
    if family == socket.AF_INET and len(b) >= 8:
        port = struct.unpack_from(">H", b, 2)[0]
        return f"{ipaddress.IPv4Address(b[4:8])}:{port}"
    if family == socket.AF_INET6 and len(b) >= 24:
        port = struct.unpack_from(">H", b, 2)[0]
        return f"[{ipaddress.IPv6Address(b[8:24])}]:{port}"
    if family == socket.AF_UNIX:
        path = b[2:]
        if path[:1] == b"\0":
            return "unix:@" + path[1:].split(b"\0", 1)[0].decode("utf-8", "replace")
        return "unix:" + path.split(b"\0", 1)[0].decode("utf-8", "replace")
    if family == socket.AF_UNSPEC:
        return "AF_UNSPEC"
    return f"family {family}"



def event_dicts(ev: np.ndarray, t_field="ts", xid_messages: XidMessages = None,
                devices=None):
    """One JSON-ready dict per event (dump's schema: kind, t_ns, pid, tid + per-kind fields);
    an Xid's whole message comes from xid_messages (the reader's), its device name (gpu:
    "GPU0", bus_id) from ``devices`` (store/devices.Devices of the run)."""
    xid_messages = xid_messages or XidMessages()
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
            fn = cuda_api.FUNCTIONS.get(fid)
            for j, a in enumerate(argnames):
                if not a:
                    continue
                v = int(e[f"a{j}"])
                if fn is not None and j == fn.string_slot:
                    d[a] = cstring(data[i])        # the string itself, kept in data
                elif a in ("grid", "block"):
                    x, y, z = unpack_dims(v)
                    d[a] = [int(x), int(y), int(z)]
                else:
                    d[a] = v
        elif kind == Kind.CONNECT:
            ret = int(e["ret"])
            d.update(fd=int(e["a0"]), dur_ns=int(e["dur"]), ret=ret,
                     errno=errno.errorcode.get(-ret, str(-ret)) if ret < 0 else None,
                     peer=decode_sockaddr(data[i], e["a1"]))
        elif kind == Kind.SCHED:
            d.update(off_cpu_ns=int(e["dur"]), prev_state=task_state_name(int(e["ret"])),
                     preempted=bool(e["code"]), wakeup_to_run_ns=int(e["a0"]),
                     cpu_out=int(e["a1"]), cpu_in=int(e["a2"]),
                     in_cuda=cuda_api.function_name(e["a3"]) if int(e["a3"]) else None)
        elif kind == Kind.XID:
            dev, msg, whole = xid_messages.of(e)
            d.update(code=int(e["ret"]), dev=dev, msg=msg, msg_whole=whole)
            g = devices.by_bus(dev) if devices is not None else None
            if g is not None:
                d.update(gpu=g.name, bus_id=g.bus_id)
        elif kind in (Kind.THREAD_NEW, Kind.THREAD_NAME, Kind.THREAD_EXIT):
            d["comm"] = decode_comm(data[i])
            if kind == Kind.THREAD_NEW:
                d["parent_tid"] = int(e["a0"])
            if kind == Kind.THREAD_EXIT:
                d["group_dead"] = bool(e["code"])
        elif kind == Kind.PROC_EXIT:
            d["exit_code"] = int(e["ret"])
        elif kind == Kind.SIGNAL:
            d.update(signal=int(e["ret"]), sender_pid=int(e["a0"]),
                     sender_comm=decode_comm(data[i]), result=int(e["code"]))
        elif kind == Kind.TCP:
            code = int(e["code"])
            d.update(event=TcpCode(code).name.lower() if code in TcpCode._value2member_map_
                     else str(code), local=decode_sockaddr(bytes(data[i])[:28]),
                     remote=decode_sockaddr(bytes(data[i])[28:56]), state=int(e["ret"]))
        yield d
