"""The packets of the Perfetto export's bulk events, assembled with numpy.

A batch of rows (rows.Batch, gpu_tracks.GpuBatch) becomes its TracePackets here: each
row a BEGIN (or INSTANT) packet with its timestamp as a delta on its sequence's
incremental clock, its interned name and category, its debug annotations and flows, and a
slice's END packet; every field written from the key bytes of Perfetto's own classes
(``tag``) and varbytes.py's columns, then deflated in ``compressed_packets`` bundles.
perfetto.py (the writer: sequences, tracks, interning, counters, faults) calls
``batch_packets`` from its encoder threads.

    blob = batch_packets(b, seq, prev, compress=True)    # seq, prev: PerfettoWriter.prepare
"""
import zlib

import numpy as np
from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import (
    BuiltinClock, DebugAnnotation, Trace, TracePacket, TrackEvent)

from . import varbytes as vb
from .rows import V_BOOL, V_INT, V_PTR, V_STR, V_UINT

MONOTONIC = BuiltinClock.BUILTIN_CLOCK_MONOTONIC
SEQ_CLOCK = 64                 # first sequence-scoped clock id (clock_snapshot.proto)
BUNDLE = 256 * 1024            # plain bytes deflated into one compressed_packets
ZLIB_LEVEL = 1
CLEARED = TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
NEEDS = TracePacket.SEQ_NEEDS_INCREMENTAL_STATE

def tag(cls, field: str, width: int = None) -> bytes:
    """The key bytes of one field of a Perfetto message class (from its descriptor)."""
    f = cls.DESCRIPTOR.fields_by_name[field]
    return vb.field_key(f.number, f.type, width)


T_PACKET = tag(Trace, "packet")
P_TS = tag(TracePacket, "timestamp")
P_TE = tag(TracePacket, "track_event")
P_TAIL_SEQ = tag(TracePacket, "trusted_packet_sequence_id")
P_FLAGS_NEEDS = TracePacket(sequence_flags=NEEDS).SerializeToString()
P_BUNDLE = tag(TracePacket, "compressed_packets")
E_UUID = tag(TrackEvent, "track_uuid")
E_NAME = tag(TrackEvent, "name_iid")
E_CAT = tag(TrackEvent, "category_iids")
E_ANN = tag(TrackEvent, "debug_annotations")
E_DOUBLE = tag(TrackEvent, "double_counter_value")
TYPE_B = TrackEvent(type=TrackEvent.TYPE_SLICE_BEGIN).SerializeToString()
TYPE_E = TrackEvent(type=TrackEvent.TYPE_SLICE_END).SerializeToString()
TYPE_I = TrackEvent(type=TrackEvent.TYPE_INSTANT).SerializeToString()
TYPE_C = TrackEvent(type=TrackEvent.TYPE_COUNTER).SerializeToString()
A_NAME = tag(DebugAnnotation, "name_iid")
_VALUE_FIELDS = {V_UINT: "uint_value", V_INT: "int_value", V_PTR: "pointer_value",
                 V_STR: "string_value_iid", V_BOOL: "bool_value"}
A_VALUE = {k: tag(DebugAnnotation, f) for k, f in _VALUE_FIELDS.items()}
_VTAGS = vb.ByteTable([A_VALUE.get(i, A_VALUE[V_UINT]) for i in range(max(A_VALUE) + 1)])
_TYPES = vb.ByteTable([TYPE_B, TYPE_I])


E_FLOW = tag(TrackEvent, "flow_ids")
E_FLOW_END = tag(TrackEvent, "terminating_flow_ids")


def _flow_fields(ids, terminating) -> bytes:
    """TrackEvent(flow_ids=ids, terminating_flow_ids=terminating) serialized, by its field
    keys (a message object a row made the flows of a big batch cost seconds)."""
    return b"".join([E_FLOW + f.to_bytes(8, "little") for f in ids]
                    + [E_FLOW_END + f.to_bytes(8, "little") for f in terminating])


assert _flow_fields([1, 1 << 63], [2]) == TrackEvent(
    flow_ids=[1, 1 << 63], terminating_flow_ids=[2]).SerializeToString()


def _launch_flows(b, n: int, levels: int = 4) -> list:
    """The flow_ids fields of the GPU launch flows starting on batch b's rows: the j-th
    flow of every row as one column (a row with more than ``levels``, a big graph
    launch, gets the rest by a per-row table)."""
    rows, ids = b.launch
    rank = np.arange(len(rows)) - np.searchsorted(rows, rows, "left")
    parts = []
    for j in range(min(int(rank.max()) + 1, levels)):
        m = rank == j
        col = np.zeros(n, dtype=np.uint64)
        col[rows[m]] = ids[m]
        keep = np.zeros(n, dtype=bool)
        keep[rows[m]] = True
        parts += _keep([vb.const(E_FLOW), vb.fixed64(col)], keep)
    rest = rank >= levels
    if rest.any():
        more = {}
        for r, f in zip(rows[rest].tolist(), ids[rest].tolist()):
            more.setdefault(r, []).append(f)
        at = sorted(more)
        idx = np.zeros(n, dtype=np.int64)
        idx[at] = np.arange(1, len(at) + 1)
        parts.append(vb.ByteTable([b""] + [_flow_fields(more[r], []) for r in at]).take(idx))
    return parts


def message(tag_bytes: bytes, parts: list, rows: int) -> list:
    """A length-delimited field whose body is ``parts`` (its length known: vb.grouped)."""
    n = vb.total(parts, rows)
    if isinstance(n, int):
        head = [vb.const(tag_bytes + vb.varint_scalar(n))]
    else:
        head = [vb.const(tag_bytes), vb.varint_min(n)]
    return vb.grouped(head + parts, vb.total(head, rows) + n)


def bundles(blob: bytes, lengths, level: int = ZLIB_LEVEL, limit: int = BUNDLE) -> bytes:
    """Packets (``blob``: whole packets of ``lengths`` bytes each, in order) deflated in
    bundles of at most ``limit`` plain bytes (one packet longer than that is a bundle of
    its own), each a TracePacket with compressed_packets, as traced writes them."""
    if not len(blob):
        return b""
    ends = np.cumsum(lengths)
    cuts = np.unique(ends[np.maximum(np.searchsorted(
        ends, np.arange(limit, int(ends[-1]), limit), side="right") - 1, 0)])
    out = []
    mv = memoryview(blob)
    a = 0
    for b in cuts.tolist() + ([int(ends[-1])] if not len(cuts) or cuts[-1] != ends[-1] else []):
        z = zlib.compress(mv[a:b], level)
        body = P_BUNDLE + vb.varint_scalar(len(z))
        out += [T_PACKET, vb.varint_scalar(len(body) + len(z)), body, z]
        a = b
    return b"".join(out)


def _keep(parts: list, keep) -> list:
    return [vb.masked(p, keep) for p in parts]


def batch_packets(b, seq, prev, compress: bool = True) -> bytes:
    """Batch ``b``'s packets: ``seq``, each row's sequence id; ``prev``, the time of the
    packet before it on its sequence (PerfettoWriter.prepare); deflated in bundles unless
    ``compress`` is False."""
    n = b.n
    sl = b.slots
    te = [_TYPES.take(~b.slice), vb.const(E_NAME), vb.varint_min(b.name + 1),
          vb.const(E_CAT), vb.varint(b.cat + 1)]
    for k in range(sl.present.shape[0]):
        present = sl.present[k]
        if not present.any():
            continue
        vals = sl.value[k].copy()
        vals[sl.vtype[k] == V_STR] += np.uint64(1)
        inner = [vb.const(A_NAME), vb.varint(sl.name[k] + 1), _VTAGS.take(sl.vtype[k]),
                 vb.varint_min(vals)]
        te += _keep(message(E_ANN, inner, n), present)
    if b.flows:
        rows = sorted(b.flows)
        extra = [b""] + [_flow_fields(*b.flows[r]) for r in rows]
        idx = np.zeros(n, dtype=np.int64)
        idx[rows] = np.arange(1, len(rows) + 1)
        te.append(vb.ByteTable(extra).take(idx))
    if b.launch is not None and len(b.launch[0]):
        te += _launch_flows(b, n)
    ends = getattr(b, "end_flows", None)       # gpu_tracks.GpuBatch
    if ends is not None and ends.any():
        te += _keep([vb.const(E_FLOW_END), vb.fixed64(ends)], ends != 0)
    seq_part = [vb.const(P_TAIL_SEQ), vb.varint(seq), vb.const(P_FLAGS_NEEDS)]
    begin = message(T_PACKET, [vb.const(P_TS), vb.varint_min(b.start - prev)]
                 + message(P_TE, te, n) + seq_part, n)
    end = message(T_PACKET, [vb.const(P_TS), vb.varint_min(b.end - b.start),
                          vb.const(P_TE + vb.varint_scalar(len(TYPE_E)) + TYPE_E)]
               + seq_part, n)
    parts = begin + _keep(end, b.slice)
    blob = vb.flatten(parts, n)
    if not compress:
        return blob
    return bundles(blob, np.broadcast_to(vb.total(parts, n), (n,)))

