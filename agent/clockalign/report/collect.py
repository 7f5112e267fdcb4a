"""One streaming pass over a run's events, keeping only the columns the report needs.

A 10-million-event run is read chunk by chunk (Timeline.iter_events) into compact
per-kind columns (~30 bytes an event instead of 136), so the report's memory follows what
it analyses, not the run file.

    data = collect(tl, progress=bar.update)
    data.cuda["dur"], data.sched["wake"], data.connect["peer"]
"""
import numpy as np

from ..export import labels
from ..store import cuda_api
from ..store.kinds import ENTRY_KINDS
from ..store.schema import KIND_NAMES, Kind
from ..timeline.gpu_table import Concat

_CUDA = ("t", "dur", "tid", "fn", "ret", "pid", "a0", "bytes")
# per function id: the slot holding the bytes moved, set or allocated (-1: none)
_BYTES_SLOT = np.full(1 << 16, -1, dtype=np.int8)
for _f in cuda_api.FUNCTIONS.values():
    _BYTES_SLOT[_f.id] = -1 if _f.slot("bytes") is None else _f.slot("bytes")
_LOOKUPS = np.asarray(cuda_api.ids("function"), dtype=np.uint16)


def _bytes(e) -> np.ndarray:
    slot = _BYTES_SLOT[e["code"]]
    out = np.zeros(len(e), dtype=np.uint64)
    for j in range(5):
        m = slot == j
        out[m] = e[f"a{j}"][m]
    return out
_ENTRY = ("t", "tid", "fn", "pid")
_SCHED = ("t", "dur", "tid", "pre", "wake", "state")
_CONN = ("t", "dur", "tid", "ret", "peer")


class Collected:
    """Per-kind column dicts (numpy), time-sorted, and the peers' names."""

    def __init__(self):
        self.cuda = {}
        self.unfinished = {}
        self.entries = {}         # calls seen at their entry only: no duration, no result
        self.sched = {}
        self.connect = {}
        self.peers = []           # connect["peer"] indexes this list
        self.kernels = {}         # (pid, func handle) -> kernel name (cuModuleGetFunction)
        self.counts = {}          # kind name -> events
        self.events = 0


def _sorted_columns(chunks) -> dict:
    """The chunks' columns joined and sorted by "t" (stable), a column at a time, each
    chunk's part let go once joined: one column's extra copy at a time, not all of them.
    An integer column other than "t" is kept in the narrowest type its values need
    (timeline/gpu_table.Concat: a tid, a result code, most byte counts fit in 1 to 4)."""
    order = np.argsort(np.concatenate([c["t"] for c in chunks]), kind="stable")
    cols = {}
    for k in list(chunks[0]):
        if k == "t":
            cols[k] = np.concatenate([c.pop(k) for c in chunks])[order]
            continue
        col = Concat()
        for c in chunks:
            col.add(c.pop(k))
        cols[k] = col.array()[order]
    return cols


def collect(tl, progress=None) -> Collected:
    parts = {"cuda": [], "unfinished": [], "entries": [], "sched": [], "connect": []}
    peer_ids = {}
    out = Collected()
    for ev in tl.iter_events():
        out.events += len(ev)
        kinds, counts = np.unique(ev["kind"], return_counts=True)
        for k, c in zip(kinds.tolist(), counts.tolist()):
            name = KIND_NAMES.get(k, str(k))
            out.counts[name] = out.counts.get(name, 0) + c
        for kind, key in ((Kind.CUDA, "cuda"), (Kind.CUDA_UNFINISHED, "unfinished")):
            e = ev[ev["kind"] == kind]
            if len(e):
                parts[key].append({"t": e["t_ns"].copy(), "dur": e["dur_ns"].copy(),
                                   "tid": e["tid"].copy(), "fn": e["code"].copy(),
                                   "ret": e["ret"].copy(), "pid": e["pid"].copy(),
                                   "a0": e["a0"].copy(), "bytes": _bytes(e)})
            if kind == Kind.CUDA and len(e):
                lk = e[np.isin(e["code"], _LOOKUPS) & (e["ret"] == 0)]
                for p, h, raw in zip(lk["pid"].tolist(), lk["a0"].tolist(), lk["data"]):
                    out.kernels[(p, h)] = labels.data_str(raw)
        e = ev[np.isin(ev["kind"], ENTRY_KINDS)]
        if len(e):
            parts["entries"].append({"t": e["t_ns"].copy(), "tid": e["tid"].copy(),
                                     "fn": e["code"].copy(), "pid": e["pid"].copy()})
        e = ev[ev["kind"] == Kind.SCHED]
        if len(e):
            parts["sched"].append({"t": e["t_ns"].copy(), "dur": e["dur_ns"].copy(),
                                   "tid": e["tid"].copy(), "pre": e["code"] == 1,
                                   "wake": e["a0"].astype(np.int64),
                                   "state": e["ret"].copy()})
        e = ev[ev["kind"] == Kind.CONNECT]
        if len(e):
            raw = labels.data_rows(e)
            alen = np.minimum(e["a1"], 56).astype(np.uint8)[:, None]
            names, idx = labels.unique_strings(
                np.concatenate([raw, alen], axis=1),
                lambda row: labels.peer_str(row[:56].tobytes(), int(row[56])))
            ids = np.array([peer_ids.setdefault(n, len(peer_ids)) for n in names],
                           dtype=np.int32)
            parts["connect"].append({"t": e["t_ns"].copy(), "dur": e["dur_ns"].copy(),
                                     "tid": e["tid"].copy(), "ret": e["ret"].copy(),
                                     "peer": ids[idx]})
        if progress:
            progress(len(ev))
    empty = {"cuda": _CUDA, "unfinished": _CUDA, "entries": _ENTRY, "sched": _SCHED,
             "connect": _CONN}
    for key, chunks in parts.items():
        if chunks:
            cols = _sorted_columns(chunks)
        else:
            cols = {k: np.zeros(0, dtype=np.int64) for k in empty[key]}
        setattr(out, key, cols)
    out.peers = sorted(peer_ids, key=peer_ids.get)
    return out
