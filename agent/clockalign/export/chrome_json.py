"""Chrome JSON trace (Trace Event Format), streamed: the format every trace viewer reads.

Slices are complete events (``"ph":"X"``, so nothing needs balancing), instants ``"i"``
(thread-scoped: the format's default scope, so no ``"s"``),
GPU counters ``"C"`` (one pseudo-process per GPU), fault chains flows ``"s"``/``"t"``/``"f"``
bound to the enclosing slice, names ``"M"`` (process_name, thread_name); the GPU executions
of a --gpu-activity run, one thread per GPU stream, with flows from their launch calls
(gpu_json.py).  Times are µs
with only the decimals their nanoseconds need (``"ts":1000001.003``, ``1000001.5``,
``1000001``: exact to the ns), MONOTONIC like the native export; pointers are hex strings
(``"0x7f0000001040"``).  JSON has no child tracks: off-CPU tracks and overflow lanes
(model.py) are pseudo-threads with tids from 2^30 up, named "<tid> off-CPU" etc. in their
metadata.  The text is as small as the format lets it be: no whitespace but one newline
a record (jsonrows.py), and args that hold their usual value (a call's CUDA_SUCCESS, a
launch's shared_mem 0, a GPU execution's raw timestamps and no CUDA graph) left out and
said once, as the rules jsonrows.DEFAULTS, in the args of the first record ("M",
"clockalign": "defaults"); uncertainties (unc_ns, end_unc_ns) are written wherever they
are not 0.

    with open("run.json", "wb") as f:
        stats = write_chrome_json(tl, f)        # pipeline.export(tl, JsonWriter(f))
"""
import json

import numpy as np

from ..store.counter_fields import FIELDS
from . import jsontext as jt
from .gpu_json import flow_starts, write_gpu_json
from .jsonrows import DEFAULTS, SEP, Row, Texts, defaults_for, gather, interleave, js
from .model import TraceModel
from .pipeline import export
from .rows import ANN_NAMES, CATEGORIES, V_BOOL, V_INT, V_PTR, V_STR

_CAT_JS = [js(c) for c in CATEGORIES]
_KEY_JS = [js(a) + b":" for a in ANN_NAMES]
_HEAD = {True: b'{"ph":"X","cat":', False: b'{"ph":"i","cat":'}   # "i": thread scope, the default
_BOOLS = np.array([list(b"false"), list(b"true\0")], dtype=np.uint8)      # \0: jt.PAD


def _put_bools(dst, v):
    dst[:] = _BOOLS[(v != 0).astype(np.intp)]


def _shapes(b) -> list:
    """Row indexes of each shape of row in the batch (ascending within a shape)."""
    sl = b.slots
    present = np.zeros(b.n, dtype=np.int64)
    layout = np.zeros(b.n, dtype=np.uint64)        # name and type of every slot, 9 bits each
    for k in range(sl.present.shape[0]):
        p = sl.present[k]
        present |= p.astype(np.int64) << k
        code = (sl.name[k].astype(np.uint64) << np.uint64(3)) + sl.vtype[k].astype(np.uint64) + 1
        layout = (layout << np.uint64(9)) | np.where(p, code, np.uint64(0))
    key = (b.name.astype(np.int64) << 27) | (b.kind.astype(np.int64) << 11) | (
        b.cat.astype(np.int64) << 8) | (b.slice.astype(np.int64) << 7) | present
    uniq, inv = np.unique(key, return_inverse=True)
    if len(uniq) == 1:
        groups = [np.arange(b.n)]
    else:
        inv = inv.reshape(-1).astype(np.uint16 if len(uniq) < 65536 else np.int64)
        order = np.argsort(inv, kind="stable")
        groups = np.split(order, np.cumsum(np.bincount(inv))[:-1])
    out = []
    for rows in groups:
        lay = layout[rows]
        if lay.min() == lay.max():
            out.append(rows)
        else:          # same kind and name, other annotations: split by them
            u, i = np.unique(lay, return_inverse=True)
            i = i.reshape(-1)
            out.extend(rows[i == j] for j in range(len(u)))
    return out


def _shape_text(b, rows, texts, tracks) -> np.ndarray:
    """The records of one shape of row as a (rows, width) matrix."""
    items, tb, tn = texts
    r0 = int(rows[0])
    sliced = bool(b.slice[r0])
    row = Row(SEP + _HEAD[sliced] + _CAT_JS[int(b.cat[r0])] + b',"name":'
               + items[int(b.name[r0])] + b",")
    tr = b.track[rows]
    if tr.min() == tr.max():
        row.const(tracks[0][int(tr[0])])
    else:
        row.hole(int(tracks[2][tr].max()), gather, tracks[1], tr)
    start = b.start[rows]
    row.const(b',"ts":')
    row.hole(jt.micros_width(start), jt.put_micros, start)
    if sliced:
        dur = b.end[rows] - start
        row.const(b',"dur":')
        row.hole(jt.micros_width(dur), jt.put_micros, dur)
    row.const(b',"args":{')
    sl = b.slots
    sep = b""
    present = np.flatnonzero(sl.present[:, r0]).tolist()
    dflt = defaults_for("X" if sliced else "i", CATEGORIES[int(b.cat[r0])],
                        [ANN_NAMES[int(sl.name[k, r0])] for k in present])
    for k in present:
        vt = int(sl.vtype[k, r0])
        v = sl.value[k, rows]
        lo, hi = int(v.min()), int(v.max())
        const = _value_text(vt, lo, items) if lo == hi else None
        if const is not None and dflt.get(ANN_NAMES[int(sl.name[k, r0])]) == const:
            continue                       # the default, said once (jsonrows.DEFAULTS)
        row.const(sep + _KEY_JS[int(sl.name[k, r0])])
        sep = b","
        if const is not None:
            row.const(const)
        elif vt == V_INT:
            vi = v.view(np.int64)
            m = max(abs(int(vi.min())), abs(int(vi.max())))
            row.hole(jt.decimal_digits(m) + 1, jt.put_signed, vi)
        elif vt == V_PTR:
            nd = jt.hex_digits(v)
            row.const(b'"0x')
            row.hole(int(nd.max()) + 1, jt.put_hex, v, nd)
        elif vt == V_STR:
            ids = v.astype(np.intp)
            row.hole(int(tn[ids].max()), gather, tb, ids)
        elif vt == V_BOOL:
            row.hole(5, _put_bools, v)
        else:                                  # V_UINT
            row.hole(jt.decimal_digits(hi), jt.put_decimal, v)
    row.const(b"}}")
    return row.build(len(rows))


def _value_text(vt: int, v: int, items) -> bytes:
    if vt == V_STR:
        return items[v]
    if vt == V_PTR:
        return b'"0x%x"' % v
    if vt == V_BOOL:
        return b"true" if v else b"false"
    if vt == V_INT:
        return b"%d" % (v - (1 << 64) if v >= 1 << 63 else v)
    return b"%d" % v


class JsonWriter:
    """Writes Trace Event Format records to a binary file as they are made; a writer of
    pipeline.export."""

    CLOCK_BANDS = False           # JSON has no counter tracks under a GPU to draw them on

    def __init__(self, f):
        self.f = f
        self.model = None
        self.bytes = 0
        self.records = 0
        self._texts = Texts()           # JSON of each interned string, by string id
        self._tracks = Texts()          # '"pid":P,"tid":T' of each track, by track idx

    def begin(self, model: TraceModel, tl, snap):
        self.model = model
        head = {"ph": "M", "name": "clockalign", "pid": 0, "tid": 0,
                "args": {"clock": "MONOTONIC", "clock_snapshot": snap.describe(),
                         "run": str(tl.path), "defaults": DEFAULTS}}
        self.raw(b'{"traceEvents":[\n' + _dumps(head).encode(), 1)

    def end(self, tl, snap):
        self.raw(b'\n],"displayTimeUnit":"ns","otherData":' + _dumps(
            {"clock": "MONOTONIC", "clock_snapshot": snap.describe(),
             "truncated": tl.truncated}).encode() + b"}\n", 0)

    def stats(self) -> dict:
        return {"records": self.records}

    def gpu_activity(self, acts, flows) -> int:
        return write_gpu_json(self, acts, flows)

    def raw(self, blob: bytes, records: int):
        self.f.write(blob)
        self.bytes += len(blob)
        self.records += records

    def count(self, b):
        self.records += b.n

    def record(self, obj: dict, ts_ns: int = None):
        """One record; ``ts_ns`` is written as exact µs text (a float could round it)."""
        text = _dumps(obj)
        if ts_ns is not None:
            text = text[:-1] + f',"ts":{_us(int(ts_ns))}}}'
        self.raw(SEP + text.encode(), 1)

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

    def track_texts(self):
        """Metadata of new tracks written; '"pid":P,"tid":T' of every track (a snapshot)."""
        tr = self.model.tracks
        self.declare(tr.take_new())
        self._tracks.extend([b'"pid":%d,"tid":%d' % (t.json_pid, t.json_tid)
                             for t in tr.all[len(self._tracks.items):]])
        return self._tracks.snapshot()

    def prepare(self, b):
        """Main-thread part of a batch: metadata of new tracks, texts of new strings and
        tracks; returns the encode context."""
        tracks = self.track_texts()
        items = self.model.strings.items
        self._texts.extend([js(s) for s in items[len(self._texts.items):]])
        return self._texts.snapshot(), tracks

    @staticmethod
    def encode(b, ctx):
        """The batch's records as bytes (thread-safe: reads only ``b`` and ``ctx``), then
        the starts of the GPU launch flows on its rows (gpu_json.py)."""
        texts, tracks = ctx
        blob = interleave(b.n, [(rows, _shape_text(b, rows, texts, tracks))
                                 for rows in _shapes(b)])
        if b.launch is not None:
            starts = flow_starts(b, tracks)
            if starts:
                return b"".join((blob, starts))
        return blob

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
                       f'"pid":{tr.gpu(g).json_pid},"ts":{_us(t)},'
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
            self.record({"ph": "i", "cat": "fault", "pid": t.json_pid,
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
            self.record({"ph": "i", "cat": "fault", "name": f.name,
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
    """Exact µs text of int ns, with only the decimals it needs (jsontext.put_micros)."""
    frac = f"{abs(ns) % 1000:03d}".rstrip("0")
    return f"{'-' if ns < 0 else ''}{abs(ns) // 1000}" + (f".{frac}" if frac else "")


def _dumps(obj) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


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
    return export(tl, JsonWriter(f), progress, batch_rows)
