"""Turn the raw bytes some events carry into text.

The one place these decoders live: store/kinds.py (the table of kinds, dump's fields),
timeline/, export/ and report/ use them.

    decode_sockaddr(ev["data"][i], ev["a1"][i])   # "127.0.0.1:8080", "[::1]:443", "unix:/run/x.sock"
"""
import ipaddress
import socket
import struct

import numpy as np

from .schema import EVENT_DTYPE, XID_PART_LEN, Kind


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
