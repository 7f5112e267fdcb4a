"""GPU activity (record --gpu-activity) in the Perfetto trace.

One track per (GPU, process, CUDA stream), a child of the GPU's track, with each kernel,
copy and memset as a slice on MONOTONIC (clockalign's mapping of the GPU's own clock; the
uncertainty as annotations); a flow from the launching driver call's slice on its thread
track to the execution.  The flows' starts are put on the launch slices while the bulk
events stream (TraceModel.gpu_flows = LaunchFlows(acts)), their ends on the GPU slices
here, after.

    model.gpu_flows = LaunchFlows(acts)
    ... stream(model, writer) ...
    write_gpu_activity(writer, acts)
"""
import numpy as np
from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import TracePacket, TrackEvent

from ..store.schema import GpuKind, Kind, unpack_dims
from .model import ANN_NAMES, CATEGORIES

FLOW_BASE = 0xCB00_0000_0000_0000
NEEDS = TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
_ANN = {a: i + 1 for i, a in enumerate(ANN_NAMES)}
_CAT = CATEGORIES.index("gpu") + 1


def flow_id(row_index: int) -> int:
    return FLOW_BASE | (row_index + 1)


class LaunchFlows:
    """Flow ids for the launch calls (BPF CUDA events) that GPU activity rows name."""

    def __init__(self, acts):
        r = acts.rows
        keep = np.flatnonzero(r["launch_src"] == 1)
        order = keep[np.lexsort((r["launch_tid"][keep], r["launch_t_ns"][keep]))]
        self.ts = r["launch_t_ns"][order].astype(np.int64)
        self.tid = r["launch_tid"][order].astype(np.int64)
        self.row = order
        self.matched = np.zeros(len(r), dtype=bool)

    def match(self, start, tid, kind, skip, flows: dict) -> None:
        """Add each matching launch row's flow ids to ``flows`` (row -> (ids, terminating))."""
        if not len(self.ts):
            return
        cand = np.flatnonzero((kind == Kind.CUDA) & ~skip & np.isin(start, self.ts))
        for r in cand.tolist():
            lo = np.searchsorted(self.ts, start[r], "left")
            hi = np.searchsorted(self.ts, start[r], "right")
            for k in range(lo, hi):
                if self.tid[k] == tid[r]:
                    i = int(self.row[k])
                    self.matched[i] = True
                    flows.setdefault(int(r), ([], []))[0].append(flow_id(i))


def _dims(packed) -> list:
    x, y, z = unpack_dims(packed)
    return [f"{a}x{b}x{c}" for a, b, c in zip(x.tolist(), y.tolist(), z.tolist())]


def _ann(ev, name, value):
    a = ev.debug_annotations.add()
    a.name_iid = _ANN[name]
    if isinstance(value, str):
        a.string_value = value
    elif value < 0:
        a.int_value = value
    else:
        a.uint_value = value


def write_gpu_activity(w, acts, flows: LaunchFlows = None) -> int:
    """The GPU slices of ``acts`` on their stream tracks; returns how many were written."""
    r = acts.rows
    if not len(r):
        return 0
    model = w.model
    tr = model.tracks
    gpu = np.where(r["gpu"] >= 0, r["gpu"], r["device"]).astype(np.int64)
    keys = np.stack([gpu, r["pid"].astype(np.int64), r["stream"].astype(np.int64)], axis=1)
    uniq, inv = np.unique(keys, axis=0, return_inverse=True)
    lut = np.array([tr.gpu_stream(int(g), int(p), int(s)).idx for g, p, s in uniq.tolist()],
                   dtype=np.int64)
    base = lut[inv.reshape(-1)]
    start = r["t_ns"].astype(np.int64)
    end = np.maximum(r["end_ns"].astype(np.int64), start)
    order = np.argsort(start, kind="stable")
    track = model.lanes.assign(base, start, end, order)
    w.declare(tr.take_new())
    sid = model.strings.ids_of(_names(acts, r))
    seq = tr.seq_lut[track]
    empty = np.zeros(0, np.int64)
    w.intern(seq, sid, empty, empty)
    grid, block = _dims(r["grid"]), _dims(r["block"])
    for i in order.tolist():
        t = tr.all[int(track[i])]
        x = r[i]
        ev = TrackEvent(type=TrackEvent.TYPE_SLICE_BEGIN, track_uuid=t.uuid,
                        name_iid=int(sid[i]) + 1, category_iids=[_CAT])
        raw = bool(x["raw"])
        _ann(ev, "unc_ns", int(x["unc_ns"]) if raw else -1)
        _ann(ev, "end_unc_ns", int(x["end_unc_ns"]) if raw else -1)
        if int(x["kind"]) == GpuKind.KERNEL:
            _ann(ev, "grid", grid[i])
            _ann(ev, "block", block[i])
            _ann(ev, "shared_mem", int(x["shmem"]))
        else:
            _ann(ev, "bytes", int(x["bytes"]))
        _ann(ev, "stream", int(x["stream"]))
        _ann(ev, "correlation", int(x["corr"]))
        if int(x["launch_src"]):
            _ann(ev, "tid", int(x["launch_tid"]))
        if flows is not None and flows.matched[i]:
            ev.terminating_flow_ids.append(flow_id(i))
        w.packet(TracePacket(timestamp=int(start[i]), trusted_packet_sequence_id=t.seq,
                             sequence_flags=NEEDS, track_event=ev))
        w.packet(TracePacket(timestamp=int(end[i]), trusted_packet_sequence_id=t.seq,
                             sequence_flags=NEEDS, track_event=TrackEvent(
                                 type=TrackEvent.TYPE_SLICE_END, track_uuid=t.uuid)))
    return len(r)


def _names(acts, r) -> list:
    """acts.name() per row, computed once per distinct (kind, pid, name, copy kind)."""
    key = np.stack([r["kind"].astype(np.int64), r["pid"].astype(np.int64),
                    r["name"].astype(np.int64), (r["aux"] & 0xFF).astype(np.int64)], axis=1)
    uniq, inv = np.unique(key, axis=0, return_inverse=True)
    proto = np.zeros(1, dtype=r.dtype)
    out = []
    for k, p, n, a in uniq.tolist():
        proto["kind"], proto["pid"], proto["name"], proto["aux"] = k, p, n, a
        out.append(acts.name(proto[0]))
    return [out[j] for j in inv.reshape(-1).tolist()]
