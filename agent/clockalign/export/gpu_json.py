"""GPU activity (record --gpu-activity) in the Chrome JSON trace.

Each GPU's pseudo-process holds one thread per (process, CUDA stream), named as in the
Perfetto export ("GPU0 stream 13 (pid 4242)"; its overflow lanes are threads of their
own), with each kernel, copy and memset as a complete event ("X", cat "gpu") on MONOTONIC.
Its args are dump's fields of that execution: unc_ns/end_unc_ns (null for CUPTI's converted
timestamps, which carry no bound: "timestamps":"converted"), pid, device, gpu, stream,
correlation, grid/block/shared_mem/graph (CUDA graph id and node id; 0: none) or bytes (value for memsets), and the launching call.
A flow ("s" on the launch call's slice, "f" bound to the execution's enclosing slice,
cat "gpu", name "launch") joins each execution to the BPF-probed call that launched it;
ids are the execution's row + 1: a viewer pairs flow events by id, category and name
(Perfetto's JSON importer: FlowTracker::GetFlowIdForV1Event(id, cat, name)), so they are
apart from the fault chains' ids (cat "fault") however small.  A call
seen at its entry only (record --cuda-returns blocking) is an instant "i": its "s" is
written too, but an "s" binds to an enclosing slice, so a viewer (Perfetto's JSON importer
among them) may draw no flow from it; the Perfetto export puts the flow on the instant.

    flows = LaunchFlows(acts); model.gpu_flows = flows     # launch ends while streaming
    ... stream(model, writer) ...                          # JsonWriter.encode: the "s"
    write_gpu_json(writer, acts, flows)                    # the "X" and "f" records

Args holding their default (jsonrows.DEFAULTS: "timestamps":"raw", no CUDA graph) are left
out, said once in the trace's "clockalign" metadata record.
"""
import numpy as np

from ..store.schema import GpuKind, unpack_dims
from ..timeline.gpu_activity import LAUNCH_BPF, LAUNCH_NONE
from . import jsontext as jt
from .jsonrows import SEP, Row, Texts, gather, interleave, js, text
from .gpu_tracks import activity_names, batches, layout, take, take_rows
from .pipeline import in_order
from .rows import BATCH_ROWS

JSON_FLOW_BASE = 0          # flow id = row + 1 + this (see above)
_FLOW = b'"cat":"gpu","name":"launch","id":'


def _num(row: Row, values, signed: bool = False):
    """An integer column: constant text where all rows agree, else a hole."""
    v = np.asarray(values, dtype=np.int64)
    lo, hi = int(v.min()), int(v.max())
    if lo == hi:
        row.const(b"%d" % lo)
    elif signed or lo < 0:
        row.hole(jt.decimal_digits(max(abs(lo), abs(hi))) + 1, jt.put_signed, v)
    else:
        row.hole(jt.decimal_digits(hi), jt.put_decimal, v)


def _text(row: Row, texts: Texts, ids):
    ids = np.asarray(ids, dtype=np.intp)
    if ids.min() == ids.max():
        row.const(texts.items[int(ids[0])])
    else:
        row.hole(int(texts.n[ids].max()), gather, texts.b, ids)


def _micros(row: Row, ns):
    row.hole(jt.micros_width(ns), jt.put_micros, ns)


def _track_ts(row: Row, tr, ns, tracks):
    """',' + the "pid"/"tid" text of track ids ``tr`` (JsonWriter's track texts) + ',"ts":'
    and the MONOTONIC ns as microseconds."""
    row.const(b",")
    row.hole(int(tracks[2][tr].max()), gather, tracks[1], tr)
    row.const(b',"ts":')
    _micros(row, ns)


def flow_starts(b, tracks) -> bytes:
    """The "s" records of the GPU flows that start on batch ``b``'s rows (the launch calls;
    ``tracks``: JsonWriter's track texts snapshot)."""
    if b.launch is None or not len(b.launch[0]):
        return b""
    at = b.launch[0]
    ids = (b.launch[1] & np.uint64(0xFFFF_FFFF_FFFF)).astype(np.int64) + JSON_FLOW_BASE
    row = Row(SEP + b'{"ph":"s",' + _FLOW)
    _num(row, ids)
    _track_ts(row, b.track[at], b.start[at], tracks)
    row.const(b"}")
    return text(row.build(len(at))).tobytes()


def _shape_text(e, start, end, track, texts, name_ix, fn_ix, tracks) -> np.ndarray:
    """The "X" records of ACTIVITY_DTYPE rows ``e`` of one shape (kind, raw, gpu known,
    launch source, name); the other arguments are theirs, row for row."""
    k, raw = int(e["kind"][0]), bool(e["raw"][0])
    row = Row(SEP + b'{"ph":"X","cat":"gpu","name":')
    _text(row, texts, name_ix)
    _track_ts(row, track, start, tracks)
    row.const(b',"dur":')
    _micros(row, end - start)
    row.const(b',"args":{"unc_ns":')
    if raw:
        _num(row, e["unc_ns"])
        row.const(b',"end_unc_ns":')
        _num(row, e["end_unc_ns"])
        row.const(b',"pid":')                     # "timestamps":"raw": jsonrows.DEFAULTS
    else:
        row.const(b'null,"end_unc_ns":null,"timestamps":"converted","pid":')
    for key, col in (("pid", None), ("device", b',"device":'), ("gpu", b',"gpu":'),
                     ("stream", b',"stream":'), ("corr", b',"correlation":')):
        if col is not None:
            row.const(col)
        if key == "gpu" and e["gpu"][0] < 0:
            row.const(b"null")
        else:
            _num(row, e[key])
    if k == GpuKind.KERNEL:
        for key in ("grid", "block"):
            row.const(b',"%s":[' % key.encode())
            for j, dim in enumerate(unpack_dims(e[key])):
                row.const(b"," if j else b"")
                _num(row, dim.astype(np.int64))
            row.const(b"]")
        row.const(b',"shared_mem":')
        _num(row, e["shmem"])
        if e["aux"].any() or e["graph_node"].any():     # none: jsonrows.DEFAULTS
            row.const(b',"graph":{"id":')
            _num(row, e["aux"])
            row.const(b',"node":')
            _num(row, e["graph_node"])
            row.const(b"}")
    else:
        row.const(b',"bytes":')
        _num(row, e["bytes"])
        if k == GpuKind.MEMSET:
            row.const(b',"value":')
            _num(row, e["aux"])
    src = int(e["launch_src"][0])
    if src == LAUNCH_NONE:
        row.const(b',"launch":null}}')
    else:
        row.const(b',"launch":{"tid":')
        _num(row, e["launch_tid"])
        row.const(b',"t_ns":')
        _num(row, e["launch_t_ns"], signed=True)
        row.const(b',"end_ns":')
        _num(row, e["launch_end_ns"], signed=True)
        row.const(b',"fn":')
        _text(row, texts, fn_ix)
        row.const(b',"source":"bpf"}}}' if src == LAUNCH_BPF else
                  b',"source":"cupti callback"}}}')
    return row.build(len(e))


def _flow_ends(rows, start, track, tracks) -> bytes:
    """The "f" records of the executions ``rows`` (their start and track given)."""
    row = Row(SEP + b'{"ph":"f","bp":"e",' + _FLOW)
    _num(row, rows.astype(np.int64) + JSON_FLOW_BASE + 1)
    _track_ts(row, track, start, tracks)
    row.const(b"}")
    return text(row.build(len(rows))).tobytes()


def _fn_key(r, idx) -> np.ndarray:
    """(pid, launch function id) of rows ``idx`` as one int64."""
    return (take(r, "pid", idx).astype(np.int64) << 32) | take(r, "launch_fn", idx).astype(np.int64)


def write_gpu_json(w, acts, flows=None, batch_rows: int = BATCH_ROWS) -> int:
    """The GPU executions of ``acts`` (and the ends of their launch flows) into JsonWriter
    ``w``; returns how many were written."""
    r = acts.rows
    if not len(r):
        return 0
    order, track = layout(w.model, r)
    tracks = w.track_texts()
    texts = Texts()
    names, name_ix = activity_names(acts, r)
    name_ix = name_ix.astype(np.int32)
    fu = np.unique(np.concatenate([np.unique(_fn_key(r, np.arange(a, min(len(r), a + batch_rows))))
                                   for a in range(0, len(r), batch_rows)]))
    texts.extend([js(s) for s in names] + [js(acts.launch_function(
        {"pid": k >> 32, "launch_fn": k & 0xFFFFFFFF})) for k in fu.tolist()])
    matched = flows.matched if flows is not None else np.zeros(len(r), dtype=bool)

    def text(rows):          # on a worker thread: reads only what is made above
        e = take_rows(r, rows)
        start = e["t_ns"].copy()
        end = np.maximum(e["end_ns"], start)
        tr, ni = track[rows].astype(np.int64), name_ix[rows].astype(np.int64)
        fi = np.searchsorted(fu, _fn_key(e, slice(None))) + len(names)
        shape = ((e["kind"].astype(np.int64) << 8) | (e["raw"].astype(np.int64) << 4)
                 | ((e["gpu"] >= 0).astype(np.int64) << 3) | e["launch_src"].astype(np.int64))
        shape = shape * len(names) + ni    # the name is constant text of a shape: no row is
        # padded to the longest kernel name of its batch
        uniq, inv = np.unique(shape, return_inverse=True)
        inv = inv.reshape(-1)
        parts = [(at, _shape_text(e[at], start[at], end[at], tr[at], texts, ni[at], fi[at],
                                  tracks))
                 for at in (np.flatnonzero(inv == j) for j in range(len(uniq)))]
        m = np.flatnonzero(matched[rows])
        return (interleave(len(rows), parts), len(rows),
                _flow_ends(rows[m], start[m], tr[m], tracks) if len(m) else b"", len(m))

    for blob, n, ends, m in in_order(text, batches(len(r), order, batch_rows)):
        w.raw(blob, n)
        if m:
            w.raw(ends, m)
    return len(r)
