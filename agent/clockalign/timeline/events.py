"""BPF events on the MONOTONIC timeline (TIMELINE_DTYPE), their filters, and decoders
for the bytes some kinds carry in ``data`` (comm, Xid device and message, sockaddr).

    tev = to_timeline(raw_events)               # store EVENT_DTYPE -> TIMELINE_DTYPE
    tev = tev[select(tev, kinds=[Kind.CUDA], window=(t0, t1), tids=None)]
    decode_sockaddr(ev["data"], ev["a1"])       # '10.0.0.7:8000'
"""
import ipaddress
import socket
import struct

import numpy as np

from ..store.schema import KIND_NAMES, Kind
from .stamps import stamp_unc_ns

TIMELINE_DTYPE = np.dtype([
    ("t_ns", "<i8"),
    ("unc_ns", "<i8"),
    ("dur_ns", "<i8"),
    ("pid", "<u4"),
    ("tid", "<u4"),
    ("kind", "<u2"),
    ("code", "<u2"),
    ("ret", "<i4"),
    ("a0", "<u8"),
    ("a1", "<u8"),
    ("a2", "<u8"),
    ("a3", "<u8"),
    ("a4", "<u8"),
    ("data", "V56"),
])

_KIND_BY_NAME = {name: k for k, name in KIND_NAMES.items()}


def to_timeline(ev: np.ndarray) -> np.ndarray:
    """EVENT_DTYPE -> TIMELINE_DTYPE: ts is already MONOTONIC; add the stamping uncertainty."""
    out = np.empty(len(ev), dtype=TIMELINE_DTYPE)
    out["t_ns"] = ev["ts"].astype(np.int64)
    out["unc_ns"] = stamp_unc_ns(ev["kind"])
    out["dur_ns"] = ev["dur"].astype(np.int64)
    for name in ("pid", "tid", "kind", "code", "ret", "a0", "a1", "a2", "a3", "a4", "data"):
        out[name] = ev[name]
    return out


def kind_numbers(kinds):
    """Kinds given as Kind, int or name ('cuda', 'CUDA') -> sorted list of ints, or None."""
    if kinds is None:
        return None
    if isinstance(kinds, (int, str, Kind)):
        kinds = [kinds]
    out = set()
    for k in kinds:
        if isinstance(k, str):
            key = k.lower()
            if key not in _KIND_BY_NAME:
                raise ValueError(f"unknown event kind {k!r}; known: "
                                 f"{', '.join(KIND_NAMES.values())}")
            out.add(int(_KIND_BY_NAME[key]))
        else:
            out.add(int(k))
    return sorted(out)


def select(ev: np.ndarray, kinds=None, window=None, tids=None) -> np.ndarray:
    """Boolean mask over TIMELINE_DTYPE rows.

    ``window=(start_ns, end_ns)`` keeps events whose span [t_ns, t_ns + dur_ns] overlaps
    [start_ns, end_ns) (either end may be None); instants are kept when start <= t < end.
    """
    keep = np.ones(len(ev), dtype=bool)
    kinds = kind_numbers(kinds)
    if kinds is not None:
        keep &= np.isin(ev["kind"], np.asarray(kinds, dtype=np.uint16))
    if window is not None:
        start, end = window
        if end is not None:
            keep &= ev["t_ns"] < int(end)
        if start is not None:
            keep &= ev["t_ns"] + np.maximum(ev["dur_ns"], 0) >= int(start)
    if tids is not None:
        if isinstance(tids, (int, np.integer)):
            tids = [tids]
        keep &= np.isin(ev["tid"], np.asarray(list(tids), dtype=np.uint32))
    return keep


def cstring(raw, start: int = 0, length: int = None) -> str:
    """NUL-terminated text from a bytes-like (or a numpy void) slice."""
    b = bytes(raw)[start:] if length is None else bytes(raw)[start:start + length]
    return b.split(b"\0", 1)[0].decode("utf-8", "replace")


def decode_comm(data) -> str:
    return cstring(data, 0, 16)


def decode_xid(data):
    """(pci device name, message) from an XID event's data: dev[16] + msg[40]."""
    return cstring(data, 0, 16), cstring(data, 16, 40)


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
