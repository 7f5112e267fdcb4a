"""The rows a trace is made of, whatever its file format: one row an event, a slice (CUDA
call, connect(), off-CPU interval) or an instant (thread start/rename/exit, process exit,
signal, Xid), each with its track, name, category and up to ``SLOTS`` annotations.

    b = Batch(...)                          # TraceModel.build makes them (export/model.py)
    b.start, b.end, b.track, b.cat, b.name  # one entry a row, sorted by start
    b.slots.present[k], b.slots.name[k], b.slots.vtype[k], b.slots.value[k]
    strings.items[b.name[i]]                # names and string values, interned in Strings
"""
import dataclasses

import numpy as np

from ..store.schema import CUDA_FUNCTIONS

BATCH_ROWS = 1 << 16

# Annotation slots per row (the most any kind uses) and value types.
SLOTS = 7
V_UINT, V_INT, V_PTR, V_STR, V_BOOL = 1, 2, 3, 4, 5

CATEGORIES = ["cuda", "net", "sched", "thread", "gpu", "fault", "stream"]
CAT = {c: i for i, c in enumerate(CATEGORIES)}

# Every debug-annotation name used, fixed so each writer interns them all up front.
ANN_NAMES = sorted({a for _, args in CUDA_FUNCTIONS.values() for a in args if a} | {
    "result", "unc_ns", "peer", "fd", "state", "wakeup_to_run_ns", "cpu_out", "cpu_in",
    "tid", "parent_tid", "comm", "group_dead", "exit_code", "sender_pid", "sender_comm",
    "code", "dev", "msg", "pid", "signal_result", "running_ns",
    "kind", "sources", "message", "gpu", "recovery_ns", "sightings", "step",
    "correlation", "end_unc_ns", "graph"})
ANN = {a: i for i, a in enumerate(ANN_NAMES)}
assert len(ANN_NAMES) < 64    # chrome_json packs a slot's name and type into 9 bits


class Strings:
    """Interned strings shared by all writers: event names and string annotation values."""

    def __init__(self):
        self.ids = {}
        self.items = []

    def id(self, s: str) -> int:
        i = self.ids.get(s)
        if i is None:
            i = self.ids[s] = len(self.items)
            self.items.append(s)
        return i

    def ids_of(self, strings) -> np.ndarray:
        return np.array([self.id(s) for s in strings], dtype=np.int64)


def factorize(values) -> tuple:
    """(the distinct values, ascending; index of each value in them), as np.unique gives,
    without a sort when the values span a small range (function ids, result codes)."""
    v = np.asarray(values)
    if not len(v):
        return v[:0], np.zeros(0, dtype=np.intp)
    lo, hi = v.min(), v.max()
    if lo == hi:
        return v[:1].copy(), np.zeros(len(v), dtype=np.intp)
    if v.dtype.kind in "iu" and int(hi) - int(lo) < (1 << 16):
        off = (v - lo).astype(np.intp)
        nz = np.flatnonzero(np.bincount(off))
        lut = np.zeros(int(hi) - int(lo) + 1, dtype=np.intp)
        lut[nz] = np.arange(len(nz))
        return nz.astype(v.dtype) + lo, lut[off]
    uniq, inv = np.unique(v, return_inverse=True)
    return uniq, inv.reshape(-1)


class Columns:
    """Fields of some rows of a TIMELINE_DTYPE batch, gathered one field at a time when
    first asked for (a whole-row copy of the structured array is several times slower)."""

    def __init__(self, ev, rows):
        self.ev, self.rows, self.cols = ev, rows, {}

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, name):
        c = self.cols.get(name)
        if c is None:
            c = self.cols[name] = self.ev[name][self.rows]
        return c


class Slots:
    """Up to SLOTS debug annotations per row: name id, value type and 64-bit value."""

    def __init__(self, n: int, slots: int = SLOTS):
        self.present = np.zeros((slots, n), dtype=bool)
        self.name = np.zeros((slots, n), dtype=np.int16)      # index in ANN_NAMES
        self.vtype = np.zeros((slots, n), dtype=np.int8)
        self.value = np.zeros((slots, n), dtype=np.uint64)

    def put(self, k: int, rows, name: str, vtype: int, values, keep=None):
        rows = np.asarray(rows)
        values = np.asarray(values)
        if values.dtype.kind == "i":
            values = values.astype(np.int64).view(np.uint64)
        else:
            values = values.astype(np.uint64)
        if keep is not None:
            rows, values = rows[keep], np.broadcast_to(values, keep.shape)[keep]
        self.present[k, rows] = True
        self.name[k, rows] = ANN[name]
        self.vtype[k, rows] = vtype
        self.value[k, rows] = values


@dataclasses.dataclass
class Batch:
    """Rows of one batch, sorted by start (see module doc)."""

    n: int
    start: np.ndarray        # int64 ns, MONOTONIC
    end: np.ndarray          # int64 ns; == start for instants
    slice: np.ndarray        # bool
    track: np.ndarray        # Track.idx
    cat: np.ndarray          # index in CATEGORIES
    name: np.ndarray         # Strings id
    slots: Slots
    kind: np.ndarray         # event kind, for counting
    tid: np.ndarray
    flows: dict              # row -> (flow_ids, terminating_flow_ids)
    # GPU launch flows starting on rows: (rows, flow ids), sorted by row (gpu_tracks.py)
    launch: tuple = None
