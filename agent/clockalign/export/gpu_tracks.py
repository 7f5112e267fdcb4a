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
    write_gpu_activity(writer, acts, flows)

The executions are read as narrow columns (Timeline.gpu_activity(fields=EXPORT_FIELDS):
gpu_table.Table, a fraction of the whole rows' 139 bytes) and widened to ACTIVITY_DTYPE a
batch at a time (take_rows); what is kept for all of them is a few bytes each (their track,
their name's index, the launch flows).
"""
import dataclasses

import numpy as np

from ..store.schema import GpuKind, Kind, unpack_dims
from ..timeline.gpu_table import group_ids
from ..timeline.gpu_activity import ACTIVITY_DTYPE
from ..timeline.gpu_load import narrow_index
from ..timeline.gpu_table import Table
from .rows import BATCH_ROWS, CAT, SLOTS, V_INT, V_STR, V_UINT, Batch, Slots

FLOW_BASE = 0xCB00_0000_0000_0000
# the BPF events a launch can be (timeline/gpu_activity.py joins both): a call with its
# return, or one seen at its entry only (record --cuda-returns blocking), an instant
_LAUNCH_KINDS = np.array([Kind.CUDA, Kind.CUDA_ENTRY], dtype=np.int64)
# every field the Perfetto and Chrome JSON writers read (not the GPU's own raw stamps)
EXPORT_FIELDS = tuple(f for f in ACTIVITY_DTYPE.names if f not in ("gpu_start", "gpu_end"))
# rows laid out on lanes at a time (Lanes.assign's temporaries are a dozen of these long)
LAYOUT_BLOCK = 1 << 18


def take(r, name: str, idx) -> np.ndarray:
    """r[name][idx] of GPU activity rows (ACTIVITY_DTYPE) or columns (gpu_table.Table: a
    derived field computed for those rows only)."""
    return r.take(name, idx) if isinstance(r, Table) else r[name][idx]


def take_rows(r, idx) -> np.ndarray:
    """Rows ``idx`` of GPU activity ``r`` as ACTIVITY_DTYPE rows (from a Table: the fields
    it has, each in its ACTIVITY_DTYPE type; the others 0)."""
    if not isinstance(r, Table):
        return r[idx]
    out = np.zeros(len(idx), dtype=ACTIVITY_DTYPE)
    for f in r.names:
        if f in ACTIVITY_DTYPE.names:
            out[f] = r.take(f, idx)
    return out


def keyed(r, **derived) -> Table:
    """GPU activity ``r`` (rows or a Table) as a Table with ``derived`` fields ({name:
    fn(columns) -> array}) too: what group_ids reads a block at a time."""
    if isinstance(r, Table):
        return Table(r.cols, {**r.derived, **derived})
    return Table({f: r[f] for f in r.dtype.names}, derived)


def activity_names(acts, r) -> tuple:
    """(names, index per row), as timeline/gpu_activity.activity_names gives them (the
    distinct (kind, pid, name, copy kind) in order), found a block of rows at a time."""
    keys, ix = group_ids(keyed(r, copy=lambda c: c["aux"] & 0xFF),
                         ("kind", "pid", "name", "copy"))
    return [acts.name({"kind": k, "pid": p, "name": n, "aux": a}) for k, p, n, a in keys], ix


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
        ts = np.asarray(take(r, "launch_t_ns", keep), dtype=np.int64)
        tid = take(r, "launch_tid", keep)
        o = np.lexsort((tid, ts))
        self.ts, self.tid, self.row = ts[o], tid[o], narrow_index(keep[o])
        del ts, tid, keep, o
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
        rows, i = cand[which[ok]], self.row[k[ok]].astype(np.int64)
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


def _ends(r, idx, start) -> np.ndarray:
    return np.maximum(np.asarray(take(r, "end_ns", idx), dtype=np.int64), start)


def layout(model, r) -> tuple:
    """(order by start, or None where the rows are in it already; track idx (int32)) of
    GPU activity rows ``r``: each on its (GPU, process, stream) track, or the overflow lane
    of it where it would overlap one already there (a slice ends where the next starts,
    give or take the mapping).  A track's rows go through Lanes.assign a block at a time,
    the tracks in the order of their idx: the lanes are those, and made in the order, that
    one call over all rows would give (Lanes keeps each track's last ends between calls)."""
    tr = model.tracks
    uniq, inv = group_ids(keyed(r, on=lambda c: np.where(c["gpu"] >= 0, c["gpu"], c["device"])),
                          ("on", "pid", "stream"))
    lut = np.array([tr.gpu_stream(g, p, s).idx for g, p, s in uniq], dtype=np.int32)
    base = lut[inv]
    del inv
    start = np.asarray(r["t_ns"], dtype=np.int64)
    order = None
    if len(start) > 1 and (start[1:] < start[:-1]).any():
        order = narrow_index(np.argsort(start, kind="stable"))
    by_base = np.argsort(base if order is None else base[order], kind="stable")
    seq = narrow_index(by_base if order is None else order[by_base])   # by (track, start)
    del by_base
    track = base.copy()
    cut = np.flatnonzero(np.diff(base[seq])) + 1
    for a, z in zip(np.r_[0, cut].tolist(), np.r_[cut, len(seq)].tolist()):
        for b in range(a, z, LAYOUT_BLOCK):
            idx = seq[b:min(z, b + LAYOUT_BLOCK)].astype(np.int64)
            s = start[idx]
            track[idx] = model.lanes.assign(base[idx].astype(np.int64), s, _ends(r, idx, s),
                                            np.arange(len(idx)))
    return order, track


def _graph_strings(model, r, kernel):
    """Interned "graph ID node ID" texts, and each row's index into them (-1: none)."""
    ix = np.full(len(r), -1, dtype=np.int32)
    g = np.flatnonzero(kernel & (r["aux"] != 0))
    if not len(g):
        return np.zeros(0, dtype=np.int64), ix
    pairs, inv = np.unique(np.stack([np.asarray(r["aux"][g], np.uint64),
                                     np.asarray(r["graph_node"][g], np.uint64)], axis=1),
                           axis=0, return_inverse=True)
    ix[g] = inv.reshape(-1)
    return model.strings.ids_of([f"graph {a} node {b}" for a, b in pairs.tolist()]), ix


def batches(n: int, order, batch_rows: int):
    """The row indices of each batch, in start order (``order``: layout's)."""
    for a in range(0, n, batch_rows):
        yield np.arange(a, min(n, a + batch_rows)) if order is None else \
            order[a:a + batch_rows].astype(np.int64)


def write_gpu_activity(w, acts, flows: LaunchFlows = None, batch_rows: int = BATCH_ROWS) -> int:
    """The GPU slices of ``acts`` on their stream tracks, through the writer's bulk path
    (pipeline.stream: prepare here, encode on other threads, as the BPF events); returns
    how many were written."""
    from .pipeline import stream
    if len(acts.rows):
        stream(gpu_batches(w.model, acts, flows, batch_rows), w)
    return len(acts.rows)


def gpu_batches(model, acts, flows: LaunchFlows = None, batch_rows: int = BATCH_ROWS):
    """The GpuBatch of each ``batch_rows`` GPU slices of ``acts``, in start order."""
    r = acts.rows
    order, track = layout(model, r)
    texts, ni = activity_names(acts, r)
    sid = model.strings.ids_of(texts)
    ni = ni.astype(np.int32)
    grids, blocks = np.unique(r["grid"]), np.unique(r["block"])
    grid_sid = model.strings.ids_of([_dims_str(v) for v in grids.tolist()])
    block_sid = model.strings.ids_of([_dims_str(v) for v in blocks.tolist()])
    kernel = r["kind"] == GpuKind.KERNEL
    graph_sid, graph_ix = _graph_strings(model, r, kernel)
    del kernel
    for rows in batches(len(r), order, batch_rows):
        e = take_rows(r, rows)
        n = len(rows)
        sl = Slots(n, SLOTS + 1)          # + a graph kernel's "graph ID node ID"
        j = np.arange(n)
        k, ms = e["kind"] == GpuKind.KERNEL, e["kind"] == GpuKind.MEMSET
        gi = graph_ix[rows]
        g = gi >= 0
        sl.put(7, j[g], "graph", V_STR, graph_sid[gi[g]])
        sl.put(0, j, "unc_ns", V_INT, np.where(e["raw"], e["unc_ns"], -1))
        sl.put(1, j, "end_unc_ns", V_INT, np.where(e["raw"], e["end_unc_ns"], -1))
        sl.put(2, j[k], "grid", V_STR, grid_sid[np.searchsorted(grids, e["grid"][k])])
        sl.put(3, j[k], "block", V_STR, block_sid[np.searchsorted(blocks, e["block"][k])])
        sl.put(2, j[~k], "bytes", V_UINT, e["bytes"][~k])
        sl.put(3, j[ms], "value", V_UINT, e["aux"][ms])
        sl.put(4, j, "stream", V_UINT, e["stream"])
        sl.put(5, j, "correlation", V_UINT, e["corr"])
        launched = e["launch_src"] != 0
        sl.put(6, j[launched], "tid", V_UINT, e["launch_tid"][launched])
        ends = np.zeros(n, dtype=np.uint64)
        if flows is not None:
            m = flows.matched[rows]
            ends[m] = flow_ids(rows[m])
        start = e["t_ns"].copy()
        b = GpuBatch(n=n, start=start, end=np.maximum(e["end_ns"], start),
                     slice=np.ones(n, dtype=bool), track=track[rows].astype(np.int64),
                     cat=np.full(n, CAT["gpu"], dtype=np.int64), name=sid[ni[rows]], slots=sl,
                     kind=e["kind"].astype(np.int64), tid=e["launch_tid"].copy(), flows={},
                     end_flows=ends)
        yield b
