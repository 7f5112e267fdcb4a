"""Native Perfetto trace (protobuf), streamed, built with Perfetto's own trace protos.

The file is a ``Trace``: a run of ``packet`` fields (tag 0x0a, varint length, one
serialized ``TracePacket``), written one after another, never held as one message.

Sequences: the first one carries the run's ClockSnapshot.  Every track is its own writer
(its own trusted_packet_sequence_id, lanes.py says why): its first packet clears incremental
state, sets the TracePacketDefaults and interns the annotation names and categories; then
its TrackDescriptor; then its events, each flagged SEQ_NEEDS_INCREMENTAL_STATE, in
non-decreasing time.  Event names and string values are interned per sequence the first
time a sequence needs them.

Small packets (issue 26).  An event track's defaults name its track
(``TrackEventDefaults.track_uuid``: its events carry none) and a sequence-scoped clock,
``SEQ_CLOCK`` (64), declared incremental by a ClockSnapshot on the sequence just before its
first event (paired with MONOTONIC at that event's time, so the first delta is 0): every
event's timestamp is then its distance in ns from the previous timestamped packet of the
sequence (clock_snapshot.proto, ``is_incremental``), written in its fewest varint bytes.
Tracks without events of their own (a GPU's group track with its counters, the clock
bands, the fault lists) keep absolute MONOTONIC timestamps.  Sequence ids are below 2^28
(4-byte varints, tracks.py).  The bulk events' packets are then deflated in bundles of at
most ``BUNDLE`` bytes, each one ``TracePacket.compressed_packets`` (at most 512 KB, as
trace_packet.proto asks; trace processor inflates them as it reads, as it does for traced's
own compressed traces); ``compress=False`` leaves them plain.

Timestamps are MONOTONIC, converted by clockalign (trace processor does not interpolate
between clock snapshots); the ClockSnapshot (BOOTTIME, MONOTONIC, REALTIME, from the run's
tightest CPU_CLOCK sandwiches) lets the trace merge with a system trace Perfetto took.

Hot path: packets of the bulk events are assembled with numpy (perfetto_packets.py, from
templates serialized by the Perfetto classes); everything else is built with the classes
directly, here.

    with open("run.pftrace", "wb") as f:
        stats = write_perfetto(tl, f)           # pipeline.export(tl, PerfettoWriter(f))
"""
import numpy as np
from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import (
    ClockSnapshot, CounterDescriptor, DebugAnnotationName, EventCategory, EventName,
    InternedData, InternedString, ProcessDescriptor, ThreadDescriptor, TracePacket,
    TracePacketDefaults, TrackDescriptor, TrackEvent, TrackEventDefaults)

from ..store.counter_fields import FIELDS
from . import varbytes as vb
from .gpu_tracks import write_gpu_activity
from .model import TraceModel
from .perfetto_packets import (CLEARED, E_DOUBLE, E_UUID, MONOTONIC, NEEDS, P_FLAGS_NEEDS,
                               P_TAIL_SEQ, P_TE, P_TS, SEQ_CLOCK, T_PACKET, TYPE_C,
                               batch_packets, message)
from .pipeline import export
from .rows import ANN_NAMES, CATEGORIES, V_STR

# tracks that carry events (model.py, gpu_tracks.py): an incremental clock, a default track
EVENT_TRACKS = {"process", "thread", "offcpu", "lane", "xid", "stream", "gpu_stream"}


class PerfettoWriter:
    """Writes TracePackets to a binary file as they are made (bounded memory); a writer of
    pipeline.export."""

    CLOCK_BANDS = True            # each GPU clock's band as a counter track

    def __init__(self, f, compress: bool = True):
        self.f = f
        self.model = None
        self.bytes = 0
        self.packets = 0
        self.compress = compress
        self._names = {}          # seq -> set of interned event-name string ids
        self._strs = {}           # seq -> set of interned string-value ids
        self._anns = {}           # seq -> set of interned annotation names (ANN_NAMES index)
        self._cats = {}           # seq -> set of interned categories (CATEGORIES index)
        # per track idx: the last time written on its sequence's incremental clock
        # (-1: clock not declared yet); only event tracks (EVENT_TRACKS) have one
        self._last = np.zeros(0, dtype=np.int64)
        self._event_track = np.zeros(0, dtype=bool)

    def begin(self, model: TraceModel, tl, snap):
        """The ClockSnapshot, on its own sequence."""
        self.model = model
        self.packet(TracePacket(trusted_packet_sequence_id=model.tracks.clock_seq,
                                clock_snapshot=ClockSnapshot(clocks=[
                                    ClockSnapshot.Clock(clock_id=cid, timestamp=ts)
                                    for cid, ts in snap.clocks])))

    def end(self, tl, snap):
        pass

    def stats(self) -> dict:
        return {"packets": self.packets}

    def gpu_activity(self, acts, flows) -> int:
        return write_gpu_activity(self, acts, flows)

    def raw(self, blob: bytes, packets: int):
        self.f.write(blob)
        self.bytes += len(blob)
        self.packets += packets

    def count(self, b):
        self.packets += b.n + int(b.slice.sum())

    def packet(self, pkt: TracePacket):
        body = pkt.SerializeToString()
        self.raw(T_PACKET + vb.varint_scalar(len(body)) + body, 1)

    # --- sequences, tracks, interning
    def start_sequence(self, seq: int, events_of=None):
        """The sequence's first packet; ``events_of``: the track whose events it carries
        (its default track, on the incremental clock), or None (absolute MONOTONIC).
        Names, categories and annotation names are interned as the sequence first needs
        them (``intern``): a run of many small tracks repeats none it does not use."""
        defaults = TracePacketDefaults(timestamp_clock_id=MONOTONIC)
        if events_of is not None:
            defaults = TracePacketDefaults(
                timestamp_clock_id=SEQ_CLOCK,
                track_event_defaults=TrackEventDefaults(track_uuid=events_of.uuid))
        self.packet(TracePacket(
            trusted_packet_sequence_id=seq, sequence_flags=CLEARED,
            first_packet_on_sequence=True, trace_packet_defaults=defaults))
        for sent in (self._names, self._strs, self._anns, self._cats):
            sent[seq] = set()

    def _grow(self):
        n = len(self.model.tracks.all)
        if len(self._last) < n:
            add = n - len(self._last) + 64
            self._last = np.concatenate([self._last, np.full(add, -1, np.int64)])
            self._event_track = np.concatenate([self._event_track, np.zeros(add, bool)])

    def declare(self, tracks):
        self._grow()
        for t in tracks:
            events = t.kind in EVENT_TRACKS
            self._event_track[t.idx] = events
            self.start_sequence(t.seq, t if events else None)
            d = TrackDescriptor(uuid=t.uuid, name=t.name)
            if t.parent is not None:
                d.parent_uuid = t.parent.uuid
            if t.kind == "process":
                d.process.CopyFrom(ProcessDescriptor(pid=t.pid, process_name=t.name))
            elif t.kind == "thread":
                d.ClearField("name")
                d.ClearField("parent_uuid")
                d.thread.CopyFrom(ThreadDescriptor(pid=t.pid, tid=t.tid, thread_name=t.name))
            elif t.kind == "gpu":
                d.child_ordering = TrackDescriptor.EXPLICIT
            self.packet(TracePacket(trusted_packet_sequence_id=t.seq, track_descriptor=d))

    def intern(self, track: np.ndarray, names: np.ndarray, strs_track: np.ndarray,
               strs: np.ndarray, anns_track=None, anns=None, cats=None):
        """Interned-data packets for the (track's sequence, item) pairs not yet sent: event
        names and string values (Strings ids), annotation names (ANN_NAMES index, of the
        rows anns_track) and categories (CATEGORIES index, of the rows ``track``)."""
        items = self.model.strings.items
        seq_lut = self.model.tracks.seq_lut
        span = max(len(items), len(ANN_NAMES), len(CATEGORIES)) + 1
        need = {}
        for table, tk, ids, sent in ((0, track, names, self._names),
                                     (1, strs_track, strs, self._strs),
                                     (2, anns_track, anns, self._anns),
                                     (3, track, cats, self._cats)):
            if ids is None or not len(ids):
                continue
            key = tk.astype(np.int64) * span + ids.astype(np.int64)
            if len(seq_lut) * span <= 1 << 22:       # a small range: count, do not sort
                pairs = np.flatnonzero(np.bincount(key))
            else:
                pairs = np.unique(key)
            for p in pairs.tolist():
                t, i = divmod(p, span)
                s = int(seq_lut[t])
                if i not in sent[s]:
                    sent[s].add(i)
                    need.setdefault(s, ([], [], [], []))[table].append(i)
        for s, (nm, st, an, ct) in sorted(need.items()):
            self._interned(s, nm, st, an, ct)

    def _interned(self, seq, names=(), strs=(), anns=(), cats=()):
        items = self.model.strings.items
        self.packet(TracePacket(
            trusted_packet_sequence_id=seq, sequence_flags=NEEDS,
            interned_data=InternedData(
                event_names=[EventName(iid=i + 1, name=items[i]) for i in names],
                debug_annotation_string_values=[
                    InternedString(iid=i + 1, str=items[i].encode()) for i in strs],
                debug_annotation_names=[DebugAnnotationName(iid=i + 1, name=ANN_NAMES[i])
                                        for i in anns],
                event_categories=[EventCategory(iid=i + 1, name=CATEGORIES[i])
                                  for i in cats])))

    def _ensure(self, seq, ev: TrackEvent):
        """Intern what one TrackEvent built here refers to, where its sequence lacks it."""
        anns = {a.name_iid - 1 for a in ev.debug_annotations} - self._anns[seq]
        cats = {c - 1 for c in ev.category_iids} - self._cats[seq]
        if anns or cats:
            self._anns[seq] |= anns
            self._cats[seq] |= cats
            self._interned(seq, anns=sorted(anns), cats=sorted(cats))

    # --- bulk events
    def prepare(self, b):
        """Main-thread part of a batch: declare new tracks, intern new strings, declare
        the incremental clock of sequences whose first event this is, and find each row's
        previous time on its sequence."""
        tr = self.model.tracks
        self.declare(tr.take_new())
        seq = tr.seq_lut[b.track]
        sl = b.slots
        str_mask = sl.present & (sl.vtype == V_STR)
        per_slot = np.broadcast_to(b.track, sl.present.shape)
        self.intern(b.track, b.name, per_slot[str_mask], sl.value[str_mask],
                    per_slot[sl.present], sl.name[sl.present], b.cat)
        return seq, self._previous(b, seq)

    def _previous(self, b, seq) -> np.ndarray:
        """Per row, the time of the packet before its BEGIN on its sequence (rows of a
        track are in time order and do not overlap, lanes.py): the previous row's end,
        or what earlier batches left; a sequence's first event gets its clock here."""
        if not len(b.track):
            return np.zeros(0, np.int64)
        o = np.argsort(b.track, kind="stable")
        t = b.track[o]
        first = np.r_[True, t[1:] != t[:-1]]
        last = np.r_[first[1:], True]
        if not self._event_track[t[first]].all():
            raise AssertionError("events on a track that has no incremental clock")
        start, end = b.start[o], b.end[o]
        prev = np.empty(len(t), dtype=np.int64)
        prev[1:] = end[:-1]
        fresh = np.flatnonzero(first)[self._last[t[first]] < 0]
        for i in fresh.tolist():
            self._clock(int(seq[o[i]]), int(start[i]))
            self._last[t[i]] = start[i]
        prev[first] = self._last[t[first]]
        if (start < prev).any():
            raise AssertionError("a track's events go back in time")
        self._last[t[last]] = end[last]
        out = np.empty_like(prev)
        out[o] = prev
        return out

    def _clock(self, seq: int, t0: int):
        """The sequence's incremental clock, at MONOTONIC t0."""
        self.packet(TracePacket(
            trusted_packet_sequence_id=seq, sequence_flags=NEEDS,
            clock_snapshot=ClockSnapshot(clocks=[
                ClockSnapshot.Clock(clock_id=MONOTONIC, timestamp=t0),
                ClockSnapshot.Clock(clock_id=SEQ_CLOCK, timestamp=t0, is_incremental=True)])))

    def encode(self, b, ctx) -> bytes:
        """The batch's packets (thread-safe: reads only ``b`` and ``ctx``)."""
        seq, prev = ctx
        return batch_packets(b, seq, prev, self.compress)

    # --- counters
    def counters(self, cnt):
        """Every GPU's counter samples, one GPU after another, each in time order."""
        for g in np.unique(cnt["gpu"]).tolist():
            rows = cnt[cnt["gpu"] == g]
            self._gpu_counters(int(g), rows[np.argsort(rows["t_ns"], kind="stable")])

    def _gpu_counters(self, gpu: int, rows):
        """One GPU's counter samples (sorted by time) on its group track's sequence."""
        if not len(rows):
            return
        tr = self.model.tracks
        g = tr.gpu(gpu)
        fields = np.unique(rows["field"]).tolist()
        cts = {f: tr.counter(gpu, f, _field_name(f), _field_unit(f)) for f in fields}
        for t in tr.take_new():
            if t.kind != "counter":
                self.declare([t])
                continue
            t.seq = g.seq              # a GPU's counter tracks share its writer
            d = TrackDescriptor(uuid=t.uuid, name=f"{t.name} ({t.unit})" if t.unit else t.name,
                                parent_uuid=g.uuid)
            self._counter_desc(d, t.unit)
            self.packet(TracePacket(trusted_packet_sequence_id=g.seq, track_descriptor=d))
        lut = np.zeros(max(fields) + 1, dtype=np.uint64)
        for f, t in cts.items():
            lut[f] = t.uuid
        for a in range(0, len(rows), 1 << 16):
            part = rows[a:a + (1 << 16)]
            n = len(part)
            te = [vb.const(TYPE_C + E_UUID), vb.varint(lut[part["field"]]), vb.const(E_DOUBLE),
                  vb.fixed64(np.ascontiguousarray(part["value"], dtype=np.float64))]
            pkt = message(T_PACKET, [vb.const(P_TS), vb.varint(part["t_ns"])]
                          + message(P_TE, te, n)
                          + [vb.const(P_TAIL_SEQ + vb.varint_scalar(g.seq) + P_FLAGS_NEEDS)], n)
            self.raw(vb.flatten(pkt, n), n)

    def clock_band(self, gpu: int, t_ns, unc_ns):
        """GPU n's clock domain as a counter under its GPU: the half-width (ns) of the band
        a GPU time is mapped with, at host times t_ns."""
        if not len(t_ns):
            return
        tr = self.model.tracks
        g = tr.gpu(gpu)
        t = tr.clock(gpu)
        self.declare([x for x in tr.take_new() if x.kind != "counter"])
        self.start_sequence(t.seq)      # its own writer: its times need not follow g's
        d = TrackDescriptor(uuid=t.uuid, name=f"{t.name} ({t.unit})", parent_uuid=g.uuid)
        self._counter_desc(d, t.unit)
        self.packet(TracePacket(trusted_packet_sequence_id=t.seq, track_descriptor=d))
        for ts, u in zip(np.asarray(t_ns).tolist(), np.asarray(unc_ns).tolist()):
            self.packet(TracePacket(
                timestamp=int(ts), trusted_packet_sequence_id=t.seq, sequence_flags=NEEDS,
                track_event=TrackEvent(type=TrackEvent.TYPE_COUNTER, track_uuid=t.uuid,
                                       double_counter_value=float(u))))

    @staticmethod
    def _counter_desc(d, unit):
        c = d.counter
        if unit == "bytes":
            c.unit = CounterDescriptor.UNIT_SIZE_BYTES
        elif unit == "ns":
            c.unit = CounterDescriptor.UNIT_TIME_NS
        elif unit in ("count", ""):
            c.unit = CounterDescriptor.UNIT_COUNT
        else:
            c.unit_name = unit

    # --- faults
    def faults(self, faults, unmatched):
        """Fault instants (sources and uncertainty as annotations) and flow starts."""
        tr = self.model.tracks
        per_track = {}
        chained = {fi for fi, *_ in self.model.flow_hits} | {fi for fi, _, _ in unmatched}
        for i, f in enumerate(faults):
            t = tr.faults(pid=f.pid if f.gpu is None else None, gpu=f.gpu)
            per_track.setdefault(t.idx, []).append((int(f.t_ns), 0, i, f))
        for fi, step, last in unmatched:
            f = faults[fi]
            t = tr.faults(pid=f.pid if f.gpu is None else None, gpu=f.gpu)
            per_track.setdefault(t.idx, []).append(
                (int(f.chain[step]["t_ns"]), 1, fi, (step, last)))
        self.declare(tr.take_new())
        for idx, items in per_track.items():
            t = tr.all[idx]
            items.sort(key=lambda x: (x[0], x[1]))
            for ts, is_step, fi, obj in items:
                ev = TrackEvent(type=TrackEvent.TYPE_INSTANT, track_uuid=t.uuid,
                                category_iids=[CATEGORIES.index("fault") + 1])
                if is_step:
                    step, last = obj
                    what = faults[fi].chain[step]
                    ev.name = f"after {faults[fi].name}: {what.get('what', 'step')}"
                    _ann(ev, "step", step)
                    _ann(ev, "message", str(what.get("what", "")))
                    (ev.terminating_flow_ids if last else ev.flow_ids).append(
                        TraceModel.flow_id(fi))
                else:
                    f = obj
                    ev.name = f.name
                    _ann(ev, "kind", f.kind)
                    _ann(ev, "code", int(f.code) if f.code is not None else 0)
                    if f.message:
                        _ann(ev, "message", str(f.message))
                    _ann(ev, "unc_ns", int(f.unc_ns or 0))
                    _ann(ev, "sources", "; ".join(
                        f"{s.get('source')} @{int(s.get('t_ns', ts)) - ts:+d} ns "
                        f"±{int(s.get('unc_ns') or 0)} ns ({s.get('domain', '')})"
                        for s in (f.sightings or [])))
                    _ann(ev, "sightings", len(f.sightings or []))
                    if f.recovery_ns is not None:
                        _ann(ev, "recovery_ns", int(f.recovery_ns))
                    if f.gpu is not None:
                        _ann(ev, "gpu", int(f.gpu))
                    if f.pid:
                        _ann(ev, "pid", int(f.pid))
                    if fi in chained:
                        ev.flow_ids.append(TraceModel.flow_id(fi))
                self._ensure(t.seq, ev)
                self.packet(TracePacket(timestamp=ts, trusted_packet_sequence_id=t.seq,
                                        sequence_flags=NEEDS, track_event=ev))


def _ann(ev: TrackEvent, name: str, value):
    a = ev.debug_annotations.add()
    a.name_iid = ANN_NAMES.index(name) + 1
    if isinstance(value, str):
        a.string_value = value
    elif isinstance(value, bool):
        a.bool_value = value
    elif value < 0:
        a.int_value = value
    else:
        a.uint_value = value


def _field_name(f: int) -> str:
    name, unit = FIELDS.get(int(f), (f"field {f}", ""))[:2]
    return name


def _field_unit(f: int) -> str:
    return FIELDS.get(int(f), ("", ""))[:2][1]


def write_perfetto(tl, f, progress=None, batch_rows=None) -> dict:
    """Stream the whole run into ``f`` (binary); returns counts for the CLI and tests."""
    return export(tl, PerfettoWriter(f), progress, batch_rows)
