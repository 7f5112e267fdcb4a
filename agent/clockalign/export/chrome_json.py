"""Chrome JSON trace (Trace Event Format), streamed: the format every trace viewer reads.

Slices are complete events (``"ph":"X"``, so nothing needs balancing), instants ``"i"``,
GPU counters ``"C"`` (one pseudo-process per GPU), fault chains flows ``"s"``/``"t"``/``"f"``
bound to the enclosing slice, names ``"M"`` (process_name, thread_name).  Times are µs
with the nanoseconds as three decimals (``"ts":1000001.003778``), MONOTONIC like the
native export.  JSON has no child tracks: off-CPU tracks and overflow lanes (model.py) are
pseudo-threads with tids from 2^30 up, named "<tid> off-CPU" etc. in their metadata.

    with open("run.json", "wb") as f:
        stats = write_chrome_json(tl, f)
"""
import json

import numpy as np

from ..store.counter_fields import FIELDS
from . import varbytes as vb
from .clocks import clock_snapshot
from .model import (ANN_NAMES, CATEGORIES, V_BOOL, V_INT, V_PTR, V_STR, V_UINT, TraceModel,
                    stream)

SEP = b",\n"


def _js(s) -> bytes:
    return json.dumps(s, ensure_ascii=False).encode()


# Rows share one layout: a short value is padded with spaces, which JSON allows between
# tokens (varbytes.py says why); a string column is as wide as its longest string in the
# batch.  Absent annotations are left out (a mask).
_SP = 32
_PH = vb.Table([b"X", b"i"])
_CATS = vb.Table([_js(c) for c in CATEGORIES])
_KEYS = vb.Table([_js(a) + b":" for a in ANN_NAMES], pad=b" ")
_COMMA = vb.Table([b" ", b","])
_BOOLS = vb.Table([b"false", b"true"], pad=b" ")


def _ts(ns) -> list:
    ns = np.asarray(ns, dtype=np.int64)
    return [vb.decimal(ns // 1000, pad=True), vb.const(b"."), vb.decimal(ns % 1000, 3)]


def _blank(parts, keep, n) -> vb.Part:
    """The parts side by side as one part, present only on rows where keep is true."""
    w = sum(p.width for p in parts)
    b = np.empty((n, w), dtype=np.uint8)
    off = 0
    for p in parts:
        b[:, off:off + p.width] = p.b
        off += p.width
    return vb.Part(b, w, keep)


def _value(vtype, value, present, names, n) -> vb.Part:
    """One annotation value per row as JSON text, padded with spaces to one width."""
    groups = []
    for vt, fn in ((V_UINT, lambda v: vb.decimal(v, pad=True)),
                   (V_INT, lambda v: vb.signed_decimal(v.view(np.int64), pad=True)),
                   (V_PTR, lambda v: _quoted(vb.hexadecimal(v, pad=True))),
                   (V_STR, lambda v: names.take(v.astype(np.intp))),
                   (V_BOOL, lambda v: _BOOLS.take((v != 0).astype(np.intp)))):
        idx = np.flatnonzero(present & (vtype == vt))
        if len(idx):
            groups.append((idx, fn(value[idx])))
    w = max([p.width for _, p in groups] + [1])
    b = np.full((n, w), _SP, dtype=np.uint8)
    for idx, p in groups:
        b[idx, :p.width] = p.b
    return vb.Part(b, w)


def _quoted(p: vb.Part) -> vb.Part:
    b = np.empty((p.b.shape[0], p.width + 2), dtype=np.uint8)
    b[:, 0] = b[:, -1] = ord('"')
    b[:, 1:-1] = p.b
    return vb.Part(b, p.width + 2)


class JsonWriter:
    def __init__(self, f, model: TraceModel):
        self.f = f
        self.model = model
        self.bytes = 0
        self.records = 0
        self._names = None
        self._names_len = -1

    def raw(self, blob: bytes, records: int):
        self.f.write(blob)
        self.bytes += len(blob)
        self.records += records

    def count(self, b):
        self.records += b.n

    def record(self, obj: dict, ts_ns: int = None):
        """One record; ``ts_ns`` is written as exact µs text (a float could round it)."""
        text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
        if ts_ns is not None:
            text = text[:-1] + f',"ts":{_us(int(ts_ns))}}}'
        self.raw(SEP + text.encode(), 1)

    def names(self):
        """(event names, string values): the same strings, exact and space-padded."""
        items = self.model.strings.items
        if len(items) != self._names_len:
            js = [_js(s) for s in items]
            self._names = (vb.Table(js), vb.Table(js, pad=b" "))
            self._names_len = len(items)
        return self._names

    def declare(self, tracks):
        for t in tracks:
            if t.kind == "process":
                self.record({"ph": "M", "name": "process_name", "pid": t.pid, "tid": t.pid,
                             "args": {"name": t.name}})
            if t.kind in ("gpu", "xid") or (t.kind == "faults" and t.parent is None):
                self.record({"ph": "M", "name": "process_name", "pid": t.json_pid,
                             "tid": t.json_tid, "args": {"name": t.name}})
                self.record({"ph": "M", "name": "process_sort_index", "pid": t.json_pid,
                             "tid": t.json_tid, "args": {"sort_index": -1}})
            if t.kind == "counter":
                continue
            label = {"thread": t.name, "offcpu": f"{t.tid} off-CPU",
                     "process": "process events", "lane": t.name,
                     "faults": "faults"}.get(t.kind, t.name)
            self.record({"ph": "M", "name": "thread_name", "pid": t.json_pid,
                         "tid": t.json_tid, "args": {"name": label}})
            if t.kind in ("offcpu", "lane"):
                self.record({"ph": "M", "name": "thread_sort_index", "pid": t.json_pid,
                             "tid": t.json_tid, "args": {"sort_index": t.parent.json_tid}})

    def prepare(self, b):
        """Main-thread part of a batch: metadata of new tracks; returns the encode context."""
        tr = self.model.tracks
        self.declare(tr.take_new())
        return (tr.jpid_lut, tr.jtid_lut, self.names())

    @staticmethod
    def encode(b, ctx) -> bytes:
        """The batch's records (thread-safe: reads only ``b`` and ``ctx``)."""
        jpid, jtid, (names, padded) = ctx
        n = b.n
        parts = [vb.const(SEP + b'{"ph":"'), _PH.take(~b.slice), vb.const(b'",'),
                 vb.masked(vb.const(b'"s":"t",'), ~b.slice), vb.const(b'"cat":'),
                 _CATS.take(b.cat), vb.const(b',"name":'),
                 names.take(b.name), vb.const(b',"pid":'), vb.decimal(jpid[b.track], pad=True),
                 vb.const(b',"tid":'), vb.decimal(jtid[b.track], pad=True),
                 vb.const(b',"ts":')]
        parts += _ts(b.start)
        parts.append(_blank([vb.const(b',"dur":')] + _ts(b.end - b.start), b.slice, n))
        parts.append(vb.const(b',"args":{'))
        sl = b.slots
        seen = np.zeros(n, dtype=bool)
        for k in range(sl.present.shape[0]):
            pres = sl.present[k]
            if not pres.any():
                continue
            parts.append(_blank([_COMMA.take(seen.astype(np.intp)), _KEYS.take(sl.name[k]),
                                 _value(sl.vtype[k], sl.value[k], pres, padded, n)], pres, n))
            seen |= pres
        parts.append(vb.const(b"}}"))
        return vb.flatten(parts, n)

    def counters(self, rows):
        tr = self.model.tracks
        for g in np.unique(rows["gpu"]).tolist():
            tr.gpu(int(g))
        self.declare(tr.take_new())
        out = []
        for g, f, t, v in zip(rows["gpu"].tolist(), rows["field"].tolist(),
                              rows["t_ns"].tolist(), rows["value"].tolist()):
            name, unit = FIELDS.get(f, (f"field {f}", ""))[:2]
            out.append(f'{{"ph":"C","name":{json.dumps(f"{name} ({unit})")},'
                       f'"pid":{tr.gpu(g).json_pid},"ts":{t // 1000}.{t % 1000:03d},'
                       f'"args":{{"value":{json.dumps(float(v)) if np.isfinite(v) else "null"}}}}}')
            if len(out) >= 65536:
                self.raw(SEP + ",\n".join(out).encode(), len(out))
                out = []
        if out:
            self.raw(SEP + ",\n".join(out).encode(), len(out))

    def faults(self, faults, unmatched):
        tr = self.model.tracks
        hits = {}
        for fi, step, track, ts, last in self.model.flow_hits:
            hits.setdefault(fi, []).append((ts, step, track.json_pid, track.json_tid, last))
        for fi, step, last in unmatched:
            f = faults[fi]
            t = tr.faults(pid=f.pid if f.gpu is None else None, gpu=f.gpu)
            ts = int(f.chain[step]["t_ns"])
            hits.setdefault(fi, []).append((ts, step, t.json_pid, t.json_tid, last))
            self.declare(tr.take_new())
            self.record({"ph": "i", "s": "t", "cat": "fault", "pid": t.json_pid,
                         "tid": t.json_tid,
                         "name": f"after {f.name}: {f.chain[step].get('what', 'step')}",
                         "args": {"step": step}}, ts)
        for i, f in enumerate(faults):
            t = tr.faults(pid=f.pid if f.gpu is None else None, gpu=f.gpu)
            self.declare(tr.take_new())
            args = {"kind": f.kind, "code": f.code, "unc_ns": int(f.unc_ns or 0),
                    "sources": [dict(s) for s in (f.sightings or [])]}
            if f.message:
                args["message"] = f.message
            if f.recovery_ns is not None:
                args["recovery_ns"] = int(f.recovery_ns)
            if f.gpu is not None:
                args["gpu"] = int(f.gpu)
            if f.pid:
                args["pid"] = int(f.pid)
            self.record({"ph": "i", "s": "t", "cat": "fault", "name": f.name,
                         "pid": t.json_pid, "tid": t.json_tid, "args": _jsonable(args)},
                        int(f.t_ns))
            steps = sorted(hits.get(i, []))
            if not steps:
                continue
            self.record({"ph": "s", "cat": "fault", "name": "fault chain", "id": i + 1,
                         "pid": t.json_pid, "tid": t.json_tid}, int(f.t_ns))
            for ts, _, pid, tid, last in steps:
                self.record({"ph": "f" if last else "t", "bp": "e", "cat": "fault",
                             "name": "fault chain", "id": i + 1, "pid": pid, "tid": tid}, ts)


def _us(ns: int) -> str:
    return f"{ns // 1000}.{ns % 1000:03d}"


def _jsonable(v):
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating,)):
        return float(v)
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    return str(v)


def write_chrome_json(tl, f, progress=None, batch_rows=None) -> dict:
    """Stream the whole run into ``f`` (binary) as Chrome JSON; returns counts."""
    model = TraceModel(tl, **({"batch_rows": batch_rows} if batch_rows else {}))
    faults = tl.faults()
    model.set_chains(faults)
    w = JsonWriter(f, model)
    snap = clock_snapshot(tl)
    head = {"ph": "M", "name": "clockalign", "pid": 0, "tid": 0,
            "args": {"clock": "MONOTONIC", "clock_snapshot": snap.describe(),
                     "run": str(tl.path)}}
    w.raw(b'{"traceEvents":[\n' + json.dumps(head).encode(), 1)
    stream(model, w, progress)
    cnt = tl.counters()
    if cnt is not None and len(cnt):
        w.counters(cnt)
    w.faults(faults, model.unmatched_steps())
    w.raw(b'\n],"displayTimeUnit":"ns","otherData":' + json.dumps(
        {"clock": "MONOTONIC", "clock_snapshot": snap.describe(),
         "truncated": tl.truncated}).encode() + b"}\n", 0)
    return {"events": dict(model.counts), "records": w.records, "bytes": w.bytes,
            "tracks": len(model.tracks.all), "faults": len(faults),
            "counters": 0 if cnt is None else len(cnt), "clock_snapshot": snap.describe()}
