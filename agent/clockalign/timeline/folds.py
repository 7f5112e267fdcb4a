"""What the first full pass over a run's events gathers for the Timeline, fed each events
chunk (EVENT_DTYPE) in file order: the run's span and thread names (IndexFold), and on a run
with GPU activity its CUDA calls (CallsFold, what the executions are joined to).  The fault
events are timeline/fault_events.Collector's.
"""
import numpy as np

from ..store.schema import Chunk, Kind
from .events import decode_comm

CALL_DTYPE = np.dtype([("t_ns", "<i8"), ("dur_ns", "<i8"), ("tid", "<u4"), ("code", "<u2")])
_CALL_KINDS = np.array([Kind.CUDA, Kind.CUDA_ENTRY], dtype=np.uint16)


class CallsFold:
    """The CUDA calls of a pass (Timeline.cuda_calls), filled a chunk at a time into one
    array sized by the chunks' row counts (np.zeros: the pages left unfilled are never
    mapped)."""

    def __init__(self, reader):
        self.out = np.zeros(reader.count_rows(Chunk.EVENTS), dtype=CALL_DTYPE)
        self.at = 0

    def feed(self, ev):
        ev = ev[np.isin(ev["kind"], _CALL_KINDS)]
        dst = self.out[self.at:self.at + len(ev)]
        dst["t_ns"] = ev["ts"].astype(np.int64)
        dst["dur_ns"] = ev["dur"].astype(np.int64)
        dst["tid"] = ev["tid"]
        dst["code"] = ev["code"]
        dst["dur_ns"][ev["kind"] == Kind.CUDA_ENTRY] = -1
        self.at += len(ev)

    def result(self) -> np.ndarray:
        return self.out[:self.at]


class IndexFold:
    """The run's span and thread names, fed every events chunk of a pass in file order."""

    NAME_KINDS = np.array([Kind.THREAD_NEW, Kind.THREAD_NAME], dtype=np.uint16)

    def __init__(self, tl):
        self.tl = tl
        self.lo, self.hi = None, None
        self.names = {}   # tid -> [(t, comm)]
        self.pids = {}
        for row in tl.rows(Chunk.THREADS):
            tid = int(row["tid"])
            self.names.setdefault(tid, []).append((int(row.get("t_ns") or 0), str(row["comm"])))
            self.pids[tid] = int(row["pid"])

    def _span(self, lo: int, hi: int):
        self.lo = lo if self.lo is None else min(self.lo, lo)
        self.hi = hi if self.hi is None else max(self.hi, hi)

    def feed(self, ev):
        if not len(ev):
            return
        ts = ev["ts"].astype(np.int64)
        end = ts + ev["dur"].astype(np.int64)
        self._span(int(ts.min()), int(end.max()))
        names, pids = self.names, self.pids
        for e in ev[np.isin(ev["kind"], self.NAME_KINDS)]:
            tid = int(e["tid"])
            names.setdefault(tid, []).append((int(e["ts"]), decode_comm(e["data"])))
            pids[tid] = int(e["pid"])
        for e in ev[ev["kind"] == Kind.THREAD_EXIT]:
            pids.setdefault(int(e["tid"]), int(e["pid"]))
            tid = int(e["tid"])
            if tid not in names:   # a thread seen only as it exited: its comm then
                names[tid] = [(int(e["ts"]), decode_comm(e["data"]))]

    def result(self) -> dict:
        tl = self.tl
        for ctype in (Chunk.CPU_CLOCK, Chunk.GPU_CLOCK):
            cols = tl.columns(ctype)
            if "t0" in cols and len(cols["t0"]):
                self._span(int(cols["t0"].min()), int(cols["t1"].max()))
        lo, hi = self.lo, self.hi
        v = (tl.meta.get("clocks") or {}).get("MONOTONIC")   # the recorder's start snapshot
        if isinstance(v, int) and v > 0:
            lo = v if lo is None else min(lo, v)
        if tl.reader.trailer and isinstance(tl.reader.trailer.get("t_ns"), int):
            t = tl.reader.trailer["t_ns"]
            hi = t if hi is None else max(hi, t)
        for tid in self.names:
            self.names[tid].sort(key=lambda x: x[0])
        if lo is None:
            lo = hi if hi is not None else 0
        return {"start": lo, "end": hi if hi is not None else lo,
                "names": self.names, "pids": self.pids}
