"""GPU activity (record --gpu-activity) in the Perfetto trace.

One track per (GPU, process, CUDA stream), a child of the GPU's track, with each kernel,
copy and memset as a slice on MONOTONIC (clockalign's mapping of the GPU's own clock; the
uncertainty, and a CUDA graph's kernels "graph ID node ID", as annotations); a flow from
the launching driver call's slice on its thread track to the execution (or from its
instant, a call seen at its entry only: record --cuda-returns blocking).  The flows'
starts are put on the launch slices while the bulk events stream (TraceModel.gpu_flows =
LaunchFlows(acts)), their ends on the GPU slices here, after.

    model.gpu_flows = LaunchFlows(acts)
    ... stream(model, writer) ...
    write_gpu_activity(writer, acts)
"""
import dataclasses

import numpy as np

from ..store.schema import GpuKind, Kind, unpack_dims
from ..timeline.gpu_activity import activity_names, row_keys
from .rows import BATCH_ROWS, CAT, SLOTS, V_INT, V_STR, V_UINT, Batch, Slots

FLOW_BASE = 0xCB00_0000_0000_0000
# the BPF events a launch can be (timeline/gpu_activity.py joins both): a call with its
# return, or one seen at its entry only (record --cuda-returns blocking), an instant
_LAUNCH_KINDS = np.array([Kind.CUDA, Kind.CUDA_ENTRY], dtype=np.int64)


def flow_ids(rows) -> np.ndarray:
    """The flow id (uint64) of each GPU activity row index of ``rows``; its low 48 bits
    are the row + 1."""
    return np.uint64(FLOW_BASE) | (np.asarray(rows).astype(np.uint64) + np.uint64(1))


class LaunchFlows:
    """Flow ids for the launch calls (BPF CUDA and CUDA_ENTRY events) that GPU activity
    rows name."""

    def __init__(self, acts):
        r = acts.rows
        keep = np.flatnonzero(r["launch_src"] == 1)
        order = keep[np.lexsort((r["launch_tid"][keep], r["launch_t_ns"][keep]))]
        self.ts = r["launch_t_ns"][order].astype(np.int64)
        self.tid = r["launch_tid"][order].astype(np.int64)
        self.row = order
        self.matched = np.zeros(len(r), dtype=bool)

    def match(self, start, tid, kind, skip) -> tuple:
        """(rows, flow ids) of the flows that start on a batch's rows, sorted by row: the
        rows whose (start, tid) a launch names, found by one searchsorted over all of them
        (launches sorted by time, then tid); a row launching several executions (a graph)
        has several."""
        none = (np.zeros(0, np.int64), np.zeros(0, np.uint64))
        if not len(self.ts):
            return none
        cand = np.flatnonzero(np.isin(kind, _LAUNCH_KINDS) & ~skip)
        s = start[cand]
        lo = np.searchsorted(self.ts, s, "left")
        n = np.searchsorted(self.ts, s, "right") - lo
        hit = n > 0
        cand, lo, n = cand[hit], lo[hit], n[hit]
        which = np.repeat(np.arange(len(cand)), n)           # every launch of that start
        k = lo[which] + np.arange(len(which)) - np.repeat(np.cumsum(n) - n, n)
        ok = self.tid[k] == tid[cand[which]]
        rows, i = cand[which[ok]], self.row[k[ok]]
        self.matched[i] = True
        o = np.lexsort((i, rows))
        return rows[o].astype(np.int64), flow_ids(i[o])


@dataclasses.dataclass
class GpuBatch(Batch):
    """A batch of GPU slices: ``end_flows``, the flow each row terminates (0: none), one
    uint64 column that PerfettoWriter.encode writes with numpy (flows holds the rest)."""

    end_flows: np.ndarray = None


def _dims_str(packed) -> str:
    x, y, z = (int(v[0]) for v in unpack_dims(np.array([packed], dtype=np.uint64)))
    return f"{x}x{y}x{z}"


def layout(model, r) -> tuple:
    """(start, end, order by start, track idx) of GPU activity rows ``r``: each on its
    (GPU, process, stream) track, or the overflow lane of it where it would overlap one
    already there (a slice ends where the next starts, give or take the mapping)."""
    tr = model.tracks
    gpu = np.where(r["gpu"] >= 0, r["gpu"], r["device"]).astype(np.int64)
    uniq, inv = row_keys(gpu, r["pid"], r["stream"])
    lut = np.array([tr.gpu_stream(g, p, s).idx for g, p, s in uniq], dtype=np.int64)
    base = lut[inv]
    start = r["t_ns"].astype(np.int64)
    end = np.maximum(r["end_ns"].astype(np.int64), start)
    order = np.argsort(start, kind="stable")
    return start, end, order, model.lanes.assign(base, start, end, order)


def _graph_strings(model, r, kernel):
    """Interned "graph ID node ID" texts, and each row's index into them (-1: none)."""
    ix = np.full(len(r), -1, dtype=np.int64)
    g = np.flatnonzero(kernel & (r["aux"] != 0))
    if not len(g):
        return np.zeros(0, dtype=np.int64), ix
    pairs, inv = np.unique(np.stack([r["aux"][g].astype(np.uint64), r["graph_node"][g]], axis=1),
                           axis=0, return_inverse=True)
    ix[g] = inv.reshape(-1)
    return model.strings.ids_of([f"graph {a} node {b}" for a, b in pairs.tolist()]), ix


def write_gpu_activity(w, acts, flows: LaunchFlows = None, batch_rows: int = BATCH_ROWS) -> int:
    """The GPU slices of ``acts`` on their stream tracks, through the writer's bulk path
    (PerfettoWriter.write_batch: prepare and encode, as the BPF events); returns how many
    were written."""
    r = acts.rows
    if not len(r):
        return 0
    model = w.model
    start, end, order, track = layout(model, r)
    texts, ni = activity_names(acts, r)
    sid = model.strings.ids_of(texts)[ni]
    kernel = r["kind"] == GpuKind.KERNEL
    memset = r["kind"] == GpuKind.MEMSET
    raw = r["raw"]
    grid_sid = model.strings.ids_of([_dims_str(v) for v in np.unique(r["grid"]).tolist()])
    block_sid = model.strings.ids_of([_dims_str(v) for v in np.unique(r["block"]).tolist()])
    grid_ix = np.searchsorted(np.unique(r["grid"]), r["grid"])
    block_ix = np.searchsorted(np.unique(r["block"]), r["block"])
    graph_sid, graph_ix = _graph_strings(model, r, kernel)
    for a in range(0, len(r), batch_rows):
        rows = order[a:a + batch_rows]
        n = len(rows)
        sl = Slots(n, SLOTS + 1)          # + a graph kernel's "graph ID node ID"
        j = np.arange(n)
        k, ms = kernel[rows], memset[rows]
        g = graph_ix[rows] >= 0
        sl.put(7, j[g], "graph", V_STR, graph_sid[graph_ix[rows][g]])
        sl.put(0, j, "unc_ns", V_INT, np.where(raw[rows], r["unc_ns"][rows], -1))
        sl.put(1, j, "end_unc_ns", V_INT, np.where(raw[rows], r["end_unc_ns"][rows], -1))
        sl.put(2, j[k], "grid", V_STR, grid_sid[grid_ix[rows][k]])
        sl.put(3, j[k], "block", V_STR, block_sid[block_ix[rows][k]])
        sl.put(2, j[~k], "bytes", V_UINT, r["bytes"][rows][~k])
        sl.put(3, j[ms], "value", V_UINT, r["aux"][rows][ms])
        sl.put(4, j, "stream", V_UINT, r["stream"][rows])
        sl.put(5, j, "correlation", V_UINT, r["corr"][rows])
        launched = r["launch_src"][rows] != 0
        sl.put(6, j[launched], "tid", V_UINT, r["launch_tid"][rows][launched])
        ends = np.zeros(n, dtype=np.uint64)
        if flows is not None:
            m = flows.matched[rows]
            ends[m] = flow_ids(rows[m])
        b = GpuBatch(n=n, start=start[rows], end=end[rows], slice=np.ones(n, dtype=bool),
                     track=track[rows], cat=np.full(n, CAT["gpu"], dtype=np.int64),
                     name=sid[rows], slots=sl, kind=r["kind"][rows].astype(np.int64),
                     tid=r["launch_tid"][rows], flows={}, end_flows=ends)
        w.write_batch(b)
    return len(r)
