"""Reading a run's GPU activity (timeline/gpu_activity.py says what it means): one pass over
its GPU_ACTIVITY chunks, each mapped onto MONOTONIC as it is decoded and written straight
into the ACTIVITY_DTYPE rows (every field) or kept column by column in the narrowest types
(gpu_table.Concat: a few fields), then sorted by time a column at a time and joined to the
launching calls in blocks.  The callbacks are joined to their BPF calls first, so the
run's CUDA calls are let go before the executions are sorted.

    acts = load(tl)                          # rows: ACTIVITY_DTYPE, every field
    acts = load(tl, fields=("t_ns", ...))    # rows: a gpu_table.Table of those fields only

Mapping as a chunk is decoded needs the clock domain of each (pid, CUDA device) before the
whole run is read: it is taken from the DEVICE records seen so far (the library reports a
device before its activity).  Should a later DEVICE record name another domain for a pair
already mapped, the chunks are read once more with the final domains.  CUPTI's converted
timestamps need every CUPTI clock sandwich of the run: their rows keep their raw times and
are placed at the end.
"""
import numpy as np

from ..store.schema import GPU_FLAG_RAW, GPU_REC_DTYPE, Chunk, GpuKind
from .gpu_activity import (ACTIVITY_DTYPE, ACTIVITY_KINDS, CUPTI_STAMP_UNC_NS, KIND_NAMES,
                           LAUNCH_BPF, LAUNCH_CUPTI, LAUNCH_NONE, BpfCalls, GpuActivity,
                           _map_converted, _uuid_text, sampled_windows)
from .gpu_table import Concat, Table

# Rows mapped or joined at a time: each step's temporaries are a few of these long (the
# clock model's bounds make about a dozen int64 arrays of its input's length).
BLOCK = 1 << 18
_OTHER_KINDS = (GpuKind.DEVICE, GpuKind.CLOCK, GpuKind.DROPPED, GpuKind.INFO)
_API = ("pid", "corr", "tid", "aux", "start", "end")
_COPIED = ("kind", "pid", "device", "stream", "name", "corr", "grid", "block", "aux", "shmem")
_TIMES = ("t_ns", "end_ns", "launch_t_ns", "launch_end_ns")
# stored as a difference (from t_ns, or from the launch's start) in a Table (narrow), read
# back as the field: {field: (the columns it is computed from, fn)}
_DERIVED = {
    "end_ns": (("dur_ns",), lambda c: c["t_ns"] + c["dur_ns"]),
    "launch_t_ns": (("launch_lead_ns",), lambda c: np.where(
        c["launch_src"] != LAUNCH_NONE, c["t_ns"] - c["launch_lead_ns"], -1)),
    "launch_end_ns": (("launch_lead_ns", "launch_len_ns"), lambda c: np.where(
        c["launch_src"] != LAUNCH_NONE,
        c["t_ns"] - c["launch_lead_ns"] + c["launch_len_ns"], -1)),
}


def _blocks(n: int):
    for a in range(0, n, BLOCK):
        yield slice(a, min(n, a + BLOCK))


class _Domains:
    """The clock domain of each (pid, CUDA device) of the activity: by UUID (the DEVICE
    records); else the recorder's device of that CUDA ordinal (``devices``, the run's
    table: the target's ordinals are its own, so this holds only where both saw the same
    CUDA_VISIBLE_DEVICES, and a note says so), or the only probed GPU."""

    def __init__(self, clock_info, models, devices):
        self.by_uuid = {str(r.get("uuid")).lower(): r["domain"] for r in clock_info
                        if isinstance(r, dict) and r.get("uuid") and r.get("domain")}
        self.models, self.devices = models, devices
        self.gpus = sorted(d for d in models if d.startswith("GPU"))
        self.named = {}         # (pid, device) -> domain its DEVICE record names (or None)

    def add(self, dev):
        for r in dev:
            if int(r["aux"]):
                self.named[(int(r["pid"]), int(r["device"]))] = self.by_uuid.get(
                    _uuid_text(r["grid"], r["block"]).lower())

    def guess(self, p: int, d: int):
        same = [x.name for x in self.devices if x.cuda_ordinal == d and x.name in self.models]
        return same[0] if same else (self.gpus[0] if len(self.gpus) == 1 else None)

    def of(self, p: int, d: int):
        return self.named.get((p, d)) or self.guess(p, d)

    def final(self, pairs, notes) -> dict:
        """(pid, device) -> domain (or None: unmapped) for the DEVICE records and ``pairs``,
        with a note for each pair placed by a guess."""
        out = dict(self.named)
        for p, d in sorted(pairs):
            if out.get((p, d)):
                continue
            guess = self.guess(p, d)
            if guess:
                notes.append(f"process {p}'s CUDA device {d} had no UUID matching a probed "
                             f"GPU; its activity is mapped through {guess}")
            out[(p, d)] = guess
        return out


class _Pass:
    """One pass over the GPU_ACTIVITY chunks: the activity rows that map, as columns (in
    file order), the callbacks, the other records, and the converted rows to place."""

    def __init__(self, tl, stored, doms, fixed=None, full=False):
        self.tl, self.stored, self.doms, self.fixed = tl, stored, doms, fixed
        self.cols = {} if full else {f: Concat() for f in stored}
        self.parts = 0           # chunks with activity so far: each a part of every column
        # every field: straight into the rows, one array sized by the chunks' row counts
        # (np.zeros: the pages of the rows that do not map are never touched)
        self.rows = np.zeros(tl.reader.count_rows(Chunk.GPU_ACTIVITY),
                             dtype=ACTIVITY_DTYPE) if full else None
        self.api = {f: Concat() for f in _API}
        self.other = []
        self.pending = []        # (part, positions, pid, device, gpu start, gpu end)
        self.used = {}           # (pid, device) -> domains its raw rows were mapped through
        self.pairs = set()
        self.unmapped = 0
        self.n = 0

    def run(self):
        for p in self.tl.reader.iter_columns(Chunk.GPU_ACTIVITY):
            self._chunk(p)
        return self

    def _chunk(self, p):
        kind = p["kind"]
        o = np.flatnonzero(np.isin(kind, _OTHER_KINDS))
        if len(o):
            rec = np.zeros(len(o), dtype=GPU_REC_DTYPE)
            for f in GPU_REC_DTYPE.names:
                rec[f] = p[f][o]
            self.other.append(rec)
            if self.fixed is None:
                self.doms.add(rec[rec["kind"] == GpuKind.DEVICE])
        c = np.flatnonzero(kind == GpuKind.API)
        if len(c):
            for f in _API:
                self.api[f].add(p[f][c])
        a = np.flatnonzero(np.isin(kind, ACTIVITY_KINDS))
        if not len(a):
            return
        pid, dev = p["pid"][a], p["device"][a]
        raw = (p["flags"][a] & GPU_FLAG_RAW) != 0
        gs, ge = p["start"][a], p["end"][a]
        n = len(a)
        t, e = np.full(n, -1, np.int64), np.full(n, -1, np.int64)
        u, eu = np.full(n, -1, np.int64), np.full(n, -1, np.int64)
        gpu = np.full(n, -1, np.int32)
        keep = ~raw                      # converted rows: placed at the end
        key = (pid.astype(np.int64) << 32) | dev.astype(np.int64)
        for v in np.unique(key).tolist():
            pair = (v >> 32, v & 0xFFFFFFFF)
            self.pairs.add(pair)
            m = raw & (key == v)
            if not m.any():
                continue
            dom = self.fixed[pair] if self.fixed is not None else self.doms.of(*pair)
            self.used.setdefault(pair, set()).add(dom)
            if dom is None or dom not in self.tl.models:
                self.unmapped += int(m.sum())
                continue
            ii = np.flatnonzero(m)
            for b in _blocks(len(ii)):
                i = ii[b]
                t[i], u[i] = self.tl.map(dom, gs[i].astype(np.int64), CUPTI_STAMP_UNC_NS["start"])
                e[i], eu[i] = self.tl.map(dom, ge[i].astype(np.int64), CUPTI_STAMP_UNC_NS["end"])
            gpu[m] = int(dom[3:]) if dom[3:].isdigit() else -1
            keep |= m
        sel = np.flatnonzero(keep)
        conv = np.flatnonzero(~raw[sel])
        if len(conv):
            s = sel[conv]
            self.pending.append((self.parts, conv, self.n + conv,
                                 pid[s], dev[s], gs[s], ge[s]))
        k = kind[a][sel] == GpuKind.KERNEL
        value = p["value"][a][sel]
        got = {"t_ns": t, "end_ns": e, "unc_ns": u, "end_unc_ns": eu, "gpu": gpu,
               "gpu_start": gs, "gpu_end": ge, "raw": raw}
        for f in self.stored:
            if f == "dur_ns":
                col = e[sel] - t[sel]
            elif f == "bytes":
                col = np.where(k, 0, value)
            elif f == "graph_node":
                col = np.where(k, value, 0)
            elif f in got:
                col = got[f][sel]
            else:
                col = p[f][a][sel]
            if self.rows is not None:
                self.rows[f][self.n:self.n + len(sel)] = col
            else:
                self.cols[f].add(col)
        self.n += len(sel)
        self.parts += 1

    def place_converted(self, domains, notes):
        """Put the converted rows on MONOTONIC (every CUPTI clock sandwich is known now);
        -> mask of the rows to keep (those that could be placed), or None: all."""
        if not self.pending:
            return None
        other = self.others()
        clocks = other[other["kind"] == GpuKind.CLOCK]
        pid = np.concatenate([x[3] for x in self.pending])
        dev = np.concatenate([x[4] for x in self.pending])
        t = _map_converted(np.concatenate([x[5] for x in self.pending]), pid, clocks)
        e = _map_converted(np.concatenate([x[6] for x in self.pending]), pid, clocks)
        gpu = np.full(len(pid), -1, np.int64)
        ok = t >= 0
        for (p, d), dom in domains.items():
            m = ok & (pid == p) & (dev == d)
            gpu[m] = int(dom[3:]) if dom and dom[3:].isdigit() else int(d)
        notes.append(f"{len(pid)} GPU activity records carry CUPTI's converted "
                     "timestamps: placed through CUPTI's clock, with no stated bound "
                     "(unc_ns -1)")
        vals = {"t_ns": t, "end_ns": e, "dur_ns": e - t, "gpu": gpu}
        at = 0
        for part, pos, where, *_ in self.pending:
            sl = slice(at, at + len(pos))
            for f, v in vals.items():
                if self.rows is not None and f in ACTIVITY_DTYPE.names:
                    self.rows[f][where] = v[sl]
                elif f in self.cols:
                    self.cols[f].patch(part, pos, v[sl])
            at += len(pos)
        drop = np.concatenate([x[2] for x in self.pending])[~ok]
        self.pending = []
        if not len(drop):
            return None
        keep = np.ones(self.n, dtype=bool)
        keep[drop] = False
        return keep

    def others(self):
        if isinstance(self.other, list):
            self.other = (np.concatenate(self.other) if self.other
                          else np.zeros(0, dtype=GPU_REC_DTYPE))
        return self.other


_JOINED = ("launch_src", "launch_tid", "launch_fn", "launch_t_ns", "launch_end_ns")


def _stored(fields, full: bool) -> tuple:
    """The columns kept while reading: what sorting and joining need, then the fields
    wanted (end_ns as its difference from t_ns, unless every field is); the launch_*
    fields come from the join."""
    out = ["t_ns", "pid", "corr", "kind"]
    for f in fields:
        f = "dur_ns" if f == "end_ns" and not full else f
        if f not in out and f not in _JOINED:
            out.append(f)
    return tuple(out)


def narrow_index(i: np.ndarray) -> np.ndarray:
    """An index array as uint32 where it fits (half the memory of numpy's int64)."""
    return i.astype(np.uint32) if len(i) < 1 << 32 else i


def _sorted_rows(ps, keep) -> np.ndarray:
    """The pass's rows (every field), without those ``keep`` leaves out, sorted by time
    (stable: a tie keeps file order), in place a field at a time (one column's copy at a
    time instead of the whole table's)."""
    rows = ps.rows[:ps.n]
    kept = np.arange(ps.n) if keep is None else np.flatnonzero(keep)
    idx = kept[np.argsort(rows["t_ns"][kept], kind="stable")]
    del kept
    for f in rows.dtype.names:
        rows[f][:len(idx)] = rows[f][idx]
    return rows[:len(idx)]


def _columns(ps, keep) -> dict:
    """The pass's columns, without the rows ``keep`` leaves out, sorted by time (stable: a
    tie keeps file order), one column at a time."""
    t = ps.cols["t_ns"].array(np.int64)
    if keep is not None:
        t = t[keep]
    order = narrow_index(np.argsort(t, kind="stable"))
    t.sort(kind="stable")                 # t[order], in place
    if keep is not None:
        order = narrow_index(np.flatnonzero(keep))[order]
    cols = {"t_ns": t}
    del t
    for f, c in ps.cols.items():
        if f != "t_ns":
            a = c.array()
            cols[f] = a[order]
            del a
    return cols


def _callbacks(api, calls) -> dict:
    """The CUPTI callbacks sorted by (pid, corr) ("key"), each with its launching call:
    the BPF CUDA event of its thread around it (launch_src LAUNCH_BPF, its entry and, where
    its return was probed, its end), else the callback's own stamps (LAUNCH_CUPTI).  Done
    before the executions are sorted, so the run's CUDA calls (``calls``) go first."""
    a = {f: c.array() for f, c in api.items()}
    key = (a.pop("pid").astype(np.uint64) << np.uint64(32)) | a.pop("corr").astype(np.uint64)
    order = np.argsort(key, kind="stable")
    cb = {"key": key[order]}
    del key
    for f in ("tid", "aux", "start", "end"):
        cb[f] = a.pop(f)[order]
    del order
    n = len(cb["key"])
    lt, le = cb.pop("start").astype(np.int64), cb.pop("end").astype(np.int64)
    src = np.full(n, LAUNCH_CUPTI, np.uint8)
    for b in _blocks(n):
        bi = calls.find(cb["tid"][b].astype(np.int64), lt[b], le[b], sorted_index=True)
        hb = np.flatnonzero(bi >= 0) + b.start
        bi = bi[bi >= 0]
        lt[hb] = calls.t[bi]
        d = calls.dur[bi]
        known = d >= 0                                 # the return probed: its end
        le[hb[known]] = calls.t[bi[known]] + d[known]
        src[hb] = LAUNCH_BPF
    cb.update(t=lt, end=le, src=src, calls=len(calls.t))
    return cb


def _join(cols, cb, full: bool, stats, notes) -> dict:
    """The launching call of every row, by its (pid, corr): the launch_* columns (with
    ``full``, ``cols`` is the rows: written there, {} returned)."""
    n = len(cols["t_ns"])
    key_a = cb["key"]
    out = {} if full else {f: Concat() for f in ("launch_tid", "launch_fn", "launch_src",
                                                 "launch_lead_ns", "launch_len_ns")}
    has_n = hb_n = 0
    for b in _blocks(n):
        t = cols["t_ns"][b]
        m = len(t)
        tid, fn = np.zeros(m, np.uint32), np.zeros(m, np.uint32)
        lt, le = np.full(m, -1, np.int64), np.full(m, -1, np.int64)
        src = np.full(m, LAUNCH_NONE, np.uint8)
        if len(key_a):
            key_r = (cols["pid"][b].astype(np.uint64) << np.uint64(32)) | \
                cols["corr"][b].astype(np.uint64)
            pos = np.minimum(np.searchsorted(key_a, key_r), len(key_a) - 1)
            has = key_a[pos] == key_r
            ai = pos[has]
            tid[has], fn[has] = cb["tid"][ai], cb["aux"][ai]
            lt[has], le[has], src[has] = cb["t"][ai], cb["end"][ai], cb["src"][ai]
            has_n += int(has.sum())
            hb_n += int((src == LAUNCH_BPF).sum())
        if full:
            for f, v in (("launch_tid", tid), ("launch_fn", fn), ("launch_src", src),
                         ("launch_t_ns", lt), ("launch_end_ns", le)):
                cols[f][b] = v
            continue
        out["launch_tid"].add(tid)
        out["launch_fn"].add(fn)
        out["launch_src"].add(src)
        out["launch_lead_ns"].add(np.where(src != LAUNCH_NONE, t - lt, 0))
        out["launch_len_ns"].add(np.where(src != LAUNCH_NONE, le - lt, 0))
    if len(key_a) and n:
        stats["joined_callback"] = has_n
    stats["joined_bpf"] = hb_n
    if has_n and cb["calls"] and hb_n < has_n:
        notes.append(f"{has_n - hb_n} launching calls seen by CUPTI had no BPF "
                     "CUDA event around them (an unprobed function, or events lost); their "
                     "launch time is CUPTI's callback stamp")
    return {f: c.array() for f, c in out.items()}


def load(tl, fields=None) -> GpuActivity:
    """Every GPU activity record of ``tl``'s run, mapped and joined; ``fields``: keep only
    these ACTIVITY_DTYPE fields, as a gpu_table.Table (default: all, one structured array)."""
    reader = tl.reader
    full = fields is None
    fields = tuple(ACTIVITY_DTYPE.names if full else fields)
    notes, stats = [], {}
    names = {(int(r["pid"]), int(r["space"]), int(r["id"])): str(r["name"])
             for r in reader.rows(Chunk.GPU_NAMES) if isinstance(r, dict)}
    if Chunk.GPU_ACTIVITY not in reader.chunk_types():
        rows = np.zeros(0, ACTIVITY_DTYPE)
        return GpuActivity(rows if full else Table({f: rows[f] for f in fields}), names,
                           stats, notes, {})
    models = tl.models
    # the run's CUDA calls, by thread: taken from the Timeline (its first pass gathered
    # them) before the activity is read, so its copy is let go first
    calls = BpfCalls(tl.cuda_calls(keep=False))
    stored = _stored(fields, full)
    doms = _Domains(reader.rows(Chunk.CLOCK_INFO), models, tl.devices)
    ps = _Pass(tl, stored, doms, full=full).run()
    domains = doms.final(ps.pairs, notes)
    if any(used != {domains.get(pair)} for pair, used in ps.used.items()):
        notes.clear()        # a DEVICE record came after activity it names: read again
        ps = None
        ps = _Pass(tl, stored, doms, fixed=domains, full=full).run()
        domains = doms.final(ps.pairs, notes)
    if ps.unmapped:
        stats["unmapped"] = ps.unmapped
    keep = ps.place_converted(domains, notes)
    if ps.unmapped:
        notes.append(f"{ps.unmapped} GPU activity records of a GPU with no clock "
                     "samples could not be mapped and are left out")
    other = ps.others()
    cb = _callbacks(ps.api, calls)
    del calls
    if full:
        cols = _sorted_rows(ps, keep)
        del ps, keep
        stats["activity"] = int(len(cols))
        _join(cols, cb, True, stats, notes)
    else:
        cols = _columns(ps, keep)
        del ps, keep
        stats["activity"] = int(len(cols["t_ns"]))
        cols.update(_join(cols, cb, False, stats, notes))
    del cb
    for k, name in KIND_NAMES.items():
        stats[name] = int((cols["kind"] == k).sum())
    dropped = other["kind"] == GpuKind.DROPPED
    stats["cupti_dropped"] = int(other["value"][dropped].sum())
    if stats["cupti_dropped"]:
        notes.append(f"CUPTI dropped {stats['cupti_dropped']} activity records (full buffers)")
    info = other[other["kind"] == GpuKind.INFO]
    stats["processes"] = sorted(set(info["pid"].tolist()))
    if full:
        rows = cols
    else:
        derived = {f: _DERIVED[f] for f in fields if f in _DERIVED}
        need = set(fields) | {c for s, _ in derived.values() for c in s} | (
            {"t_ns", "launch_src"} if derived else set())
        rows = Table({f: c for f, c in cols.items() if f in need},
                     {f: fn for f, (_, fn) in derived.items()})
    return GpuActivity(rows, names, stats, notes, domains, sampled_windows(reader, stats))
