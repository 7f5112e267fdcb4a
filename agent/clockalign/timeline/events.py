"""BPF events on the MONOTONIC timeline (TIMELINE_DTYPE), their filters, and decoders
for the bytes some kinds carry in ``data`` (comm, Xid device and message, sockaddr).

    tev = to_timeline(raw_events)               # store EVENT_DTYPE -> TIMELINE_DTYPE
    tev = tev[select(tev, kinds=[Kind.CUDA], window=(t0, t1), tids=None)]
    decode_sockaddr(ev["data"], ev["a1"])       # '10.0.0.7:8000'
"""
import numpy as np

from ..store.event_text import cstring, decode_comm, decode_sockaddr, decode_xid  # noqa: F401
from ..store.schema import EVENT_DTYPE, KIND_NAMES, Kind
from .stamps import stamp_unc_ns

# EVENT_DTYPE with ts -> t_ns (signed), an uncertainty after it, dur -> dur_ns (signed)
_RENAMED = {"ts": ("t_ns", "<i8"), "dur": ("dur_ns", "<i8")}
TIMELINE_DTYPE = np.dtype(
    [(_RENAMED[n][0], _RENAMED[n][1]) if n in _RENAMED else (n, EVENT_DTYPE[n].str)
     for n in EVENT_DTYPE.names[:1]]
    + [("unc_ns", "<i8")]
    + [(_RENAMED[n][0], _RENAMED[n][1]) if n in _RENAMED else (n, EVENT_DTYPE[n].str)
       for n in EVENT_DTYPE.names[1:]])
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
