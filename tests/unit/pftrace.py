"""Test support: a Perfetto trace decoded with Perfetto's own classes into what a reader
sees, whatever encoding the writer chose, and that content in one canonical form.

``packets`` expands deflate'd ``compressed_packets`` bundles (as trace processor's
tokenizer does) and resolves, per trusted_packet_sequence_id: TracePacketDefaults
(timestamp_clock_id, TrackEventDefaults.track_uuid) and sequence-scoped clocks (ids 64-127)
declared by a ClockSnapshot on the sequence, incremental ones as deltas from the previous
packet on that clock (clock_snapshot.proto).  Each packet comes back with an absolute
timestamp on a builtin clock and its TrackEvent's track_uuid filled in; interning is left
to ``content``, which reads the interned tables per sequence.

    trace = decode(open("run.pftrace", "rb").read())   # a Trace of resolved packets
    c = content(trace)                                 # {"slices": [...], ...}, sorted
    digests(c)                                         # one sha256 per part of it
"""
import collections
import hashlib
import json
import zlib

from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace, TracePacket, TrackEvent

SEQ_CLOCKS = range(64, 128)


def raw_packets(data: bytes):
    """The top-level packets, with compressed_packets bundles expanded in place."""
    t = Trace()
    t.ParseFromString(data)
    for p in t.packet:
        if p.HasField("compressed_packets"):
            inner = Trace()
            inner.ParseFromString(zlib.decompress(p.compressed_packets))
            assert not any(q.HasField("compressed_packets") for q in inner.packet)
            yield from inner.packet
        else:
            yield p


def packets(data: bytes):
    """Resolved packets (module doc), in file order."""
    defaults = {}                 # seq -> TracePacketDefaults
    clocks = {}        # (seq, clock id) -> [incremental, its ts, builtin id, builtin ts, last]
    for p in raw_packets(data):
        s = p.trusted_packet_sequence_id
        if p.sequence_flags & TracePacket.SEQ_INCREMENTAL_STATE_CLEARED:
            defaults.pop(s, None)
        if p.HasField("trace_packet_defaults"):
            defaults[s] = p.trace_packet_defaults
        if p.HasField("clock_snapshot"):
            cs = list(p.clock_snapshot.clocks)
            builtin = [c for c in cs if c.clock_id not in SEQ_CLOCKS]
            for c in cs:
                if c.clock_id in SEQ_CLOCKS:
                    assert s, "a sequence-scoped clock needs a sequence id"
                    assert builtin, "a sequence-scoped clock with no builtin clock beside it"
                    assert not c.unit_multiplier_ns or c.unit_multiplier_ns == 1
                    b = builtin[0]
                    clocks[(s, c.clock_id)] = [c.is_incremental, c.timestamp, b.clock_id,
                                               b.timestamp, c.timestamp]
        q = TracePacket()
        q.CopyFrom(p)
        d = defaults.get(s)
        if p.HasField("timestamp"):
            cid = p.timestamp_clock_id or (d.timestamp_clock_id if d is not None else 0)
            if cid in SEQ_CLOCKS:
                st = clocks[(s, cid)]                    # KeyError: no snapshot before use
                v = st[4] + p.timestamp if st[0] else p.timestamp
                st[4] = v
                q.timestamp = st[3] + (v - st[1])
                q.timestamp_clock_id = st[2]
            else:
                q.timestamp_clock_id = cid
        if p.HasField("track_event") and not p.track_event.HasField("track_uuid"):
            if d is not None and d.track_event_defaults.HasField("track_uuid"):
                q.track_event.track_uuid = d.track_event_defaults.track_uuid
        yield q


def decode(data: bytes) -> Trace:
    t = Trace()
    t.packet.extend(packets(data))
    return t


def _value(a, strings):
    if a.HasField("string_value_iid"):
        return strings[a.string_value_iid]
    kind = a.WhichOneof("value")
    return [kind, getattr(a, kind)]


def content(trace: Trace) -> dict:
    """What the trace shows, independent of sequences, interning, packet order and time
    encoding: tracks (by uuid), slices, instants, counters (each with its clock and
    absolute time), flows and clock snapshots, each list sorted."""
    names, cats, anames, strings = (collections.defaultdict(dict) for _ in range(4))
    tracks, slices, instants, counters, snaps = [], [], [], [], []
    open_ = collections.defaultdict(list)
    for p in trace.packet:
        s = p.trusted_packet_sequence_id
        if p.sequence_flags & TracePacket.SEQ_INCREMENTAL_STATE_CLEARED:
            for tab in (names, cats, anames, strings):
                tab.pop(s, None)
        i = p.interned_data
        for tab, items, val in ((names, i.event_names, "name"), (cats, i.event_categories, "name"),
                                (anames, i.debug_annotation_names, "name"),
                                (strings, i.debug_annotation_string_values, "str")):
            for x in items:
                v = getattr(x, val)
                tab[s][x.iid] = v.decode() if isinstance(v, bytes) else v
        if p.HasField("clock_snapshot"):
            builtin = sorted([c.clock_id, c.timestamp] for c in p.clock_snapshot.clocks
                             if c.clock_id not in SEQ_CLOCKS)
            if len(builtin) > 1:           # the run's snapshot (not a sequence's own clock)
                snaps.append(builtin)
        if p.HasField("track_descriptor"):
            d = p.track_descriptor
            tracks.append([d.uuid, d.name, d.parent_uuid, d.process.pid, d.process.process_name,
                           d.thread.pid, d.thread.tid, d.thread.thread_name,
                           int(d.child_ordering), d.HasField("counter"), int(d.counter.unit),
                           d.counter.unit_name])
        if not p.HasField("track_event"):
            continue
        e = p.track_event
        t = [p.timestamp_clock_id, p.timestamp]
        if e.type == TrackEvent.TYPE_COUNTER:
            counters.append([e.track_uuid] + t + [e.double_counter_value, e.counter_value])
            continue
        name = e.name if e.HasField("name") else names[s][e.name_iid] if e.name_iid else ""
        row = {"track": e.track_uuid, "name": name, "t": t,
               "cats": [cats[s][c] for c in e.category_iids] + list(e.categories),
               "args": sorted([a.name if a.HasField("name") else anames[s][a.name_iid],
                               a.string_value if a.HasField("string_value")
                               else _value(a, strings[s])] for a in e.debug_annotations),
               "flows": sorted(e.flow_ids), "ends": sorted(e.terminating_flow_ids)}
        if e.type == TrackEvent.TYPE_SLICE_BEGIN:
            open_[e.track_uuid].append(row)
        elif e.type == TrackEvent.TYPE_SLICE_END:
            b = open_[e.track_uuid].pop()
            b["end"] = t
            b["end_flows"] = sorted(e.flow_ids) + sorted(e.terminating_flow_ids)
            slices.append(b)
        else:
            row["type"] = int(e.type)
            instants.append(row)
    assert not any(open_.values()), "slices left open"
    key = lambda r: json.dumps(r, sort_keys=True)       # noqa: E731
    return {"tracks": sorted(tracks), "slices": sorted(slices, key=key),
            "instants": sorted(instants, key=key), "counters": sorted(counters),
            "snapshots": sorted(snaps)}


def digests(c: dict) -> dict:
    """sha256 and count of each part of content(): equal digests, equal content."""
    return {k: {"n": len(v), "sha256": hashlib.sha256(
        json.dumps(v, sort_keys=True).encode()).hexdigest()} for k, v in c.items()}
