"""What a trace shows, independent of its file format: tracks, lanes, rows, annotations.

Both exporters read the run through ``Timeline.iter_events()`` a batch at a time and turn
each batch into *rows*: one row per event, a slice (CUDA call, connect(), off-CPU
interval) or an instant (thread start/rename/exit, process exit, signal, Xid), each with
its track, name, category and up to ``SLOTS`` annotations, sorted by start time.

Stream tracks.  A call that puts work on a stream (cuda_api.STREAM_WORK: launches, graph
launches, copies, memsets) is also drawn on one track per CUDA stream of its process, from
its stream argument (the legacy default stream, a thread's per-thread default stream for
the _ptsz/_ptds twins and CU_STREAM_PER_THREAD, or the handle), category "stream": what
was queued where, whichever thread queued it.

Ordering.  The recorder writes a CUDA call when it returns, stamped with its entry time,
so a batch is not in time order and a long call (a 2 s cuStreamSynchronize) shows up after
calls that started later on other threads.  No bounded buffer can restore a global time
order, but one *track* can be kept in order: the calls of one thread do not overlap (a
thread is in one driver call at a time), nor do the off-CPU intervals of one thread.  So
every track is its own writer (its own Perfetto trusted_packet_sequence_id), its slices are
emitted as complete BEGIN/END pairs, and a slice that would overlap one already written on
its track (a call nested inside another, a reordering) goes to the first overflow *lane*
(a child track, "overlapping #1", ...) where it fits.  Within every track the timestamps
are then non-decreasing and the slices balance, whatever the batch order.

    model = TraceModel(tl)
    for batch in model.batches():          # Batch: rows sorted by start
        ...                                # exporters encode batch.start/end/track/...
"""
import dataclasses
import os

import numpy as np

from ..store import cuda_api
from ..store.meta import target_label
from ..store.schema import CUDA_FUNCTIONS, Kind, task_state_name
from . import decode

BATCH_ROWS = 1 << 16

# Annotation slots per row (the most any kind uses) and value types.
SLOTS = 7
V_UINT, V_INT, V_PTR, V_STR, V_BOOL = 1, 2, 3, 4, 5

CATEGORIES = ["cuda", "net", "sched", "thread", "gpu", "fault", "stream"]
CAT = {c: i for i, c in enumerate(CATEGORIES)}

# Every debug-annotation name used, fixed so each writer interns them all up front.
ANN_NAMES = sorted({a for _, args in CUDA_FUNCTIONS.values() for a in args if a} | {
    "result", "unc_ns", "peer", "fd", "state", "wakeup_to_run_ns", "cpu_out", "cpu_in",
    "tid", "parent_tid", "comm", "group_dead", "exit_code", "sender_pid", "sender_comm",
    "code", "dev", "msg", "pid", "signal_result", "running_ns",
    "kind", "sources", "message", "gpu", "recovery_ns", "sightings", "step",
    "correlation", "end_unc_ns"})
ANN = {a: i for i, a in enumerate(ANN_NAMES)}
assert len(ANN_NAMES) < 64    # chrome_json packs a slot's name and type into 9 bits

NO_END = np.iinfo(np.int64).min // 4
_LOOKUP_IDS = np.asarray(cuda_api.ids("function"), dtype=np.int64)


def _stream_luts():
    """Per function id: the slot of its stream argument (-1: no stream work; 5: none, the
    synchronous copies and memsets use the default stream), and whether it is a
    per-thread-default-stream twin."""
    top = max(cuda_api.FUNCTIONS) + 1
    slot, per_thread = np.full(top, -1, np.int64), np.zeros(top, bool)
    for f in cuda_api.FUNCTIONS.values():
        if f.role in cuda_api.STREAM_WORK:
            k = f.slot("stream")
            slot[f.id], per_thread[f.id] = 5 if k is None else k, f.per_thread
    return slot, per_thread


_STREAM_SLOT, _STREAM_PER_THREAD = _stream_luts()
STREAM_HANDLE, STREAM_LEGACY, STREAM_PER_THREAD = 0, 1, 2     # Tracks.stream's cls


class Strings:
    """Interned strings shared by all writers: event names and string annotation values."""

    def __init__(self):
        self.ids = {}
        self.items = []

    def id(self, s: str) -> int:
        i = self.ids.get(s)
        if i is None:
            i = self.ids[s] = len(self.items)
            self.items.append(s)
        return i

    def ids_of(self, strings) -> np.ndarray:
        return np.array([self.id(s) for s in strings], dtype=np.int64)


@dataclasses.dataclass
class Track:
    idx: int
    uuid: int
    kind: str              # process, thread, offcpu, lane, xid, gpu, counter, faults
    name: str
    pid: int = 0
    tid: int = 0
    parent: "Track" = None
    json_pid: int = 0
    json_tid: int = 0
    unit: str = ""
    # Perfetto writer of the track's events: its trusted_packet_sequence_id
    seq: int = 0


PSEUDO = 1 << 30   # pseudo pid/tid for tracks Chrome JSON has no notion of (lanes, GPUs)

# Perfetto ids that another trace concatenated with ours (`cat run.pftrace system.pftrace`)
# does not use: traced numbers its writers' sequences 1, 2, ... and its track uuids are
# hashes, so clockalign's sequences start at 2^30 plus a window chosen by the run, and its
# uuids carry a 40-bit run salt above the track index.
SEQ_BASE = 1 << 30


def run_salt(meta: dict) -> int:
    """40 bits that differ between runs (host, start clocks, targets): two exports of
    different runs get disjoint uuids and, but for 1 in 16384, disjoint sequence windows."""
    import hashlib
    import json
    key = json.dumps([meta.get("host"), meta.get("clocks"), meta.get("targets")],
                     sort_keys=True, default=str)
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=5).digest(), "little")


class Tracks:
    """Every track of the trace, created on first use; parents are created first."""

    def __init__(self, threads: dict, processes: dict, salt: int = 0,
                 gpu_label=lambda g: f"GPU{g}"):
        self.threads = threads
        self.processes = processes
        self.gpu_label = gpu_label      # GPU n's track name: "GPU0 00000000:18:00.0"
        self.uuid_base = (salt & ((1 << 40) - 1)) << 24
        self.seq_base = SEQ_BASE + ((salt & 0x3FFF) << 16)
        self.clock_seq = self.seq_base + 1     # the clock snapshot's sequence
        self.all = []
        self.by_key = {}
        self.new = []          # created since the last take_new()
        self._pseudo = PSEUDO
        self.uuid_lut = np.zeros(0, dtype=np.uint64)
        self.seq_lut = np.zeros(0, dtype=np.int64)
        self.jpid_lut = np.zeros(0, dtype=np.int64)
        self.jtid_lut = np.zeros(0, dtype=np.int64)

    def _pseudo_id(self) -> int:
        self._pseudo += 1
        return self._pseudo

    def _add(self, key, **kw) -> Track:
        t = Track(idx=len(self.all), uuid=self.uuid_base + len(self.all) + 1, **kw)
        t.seq = self.seq_base + t.idx + 2
        self.all.append(t)
        self.by_key[key] = t
        self.new.append(t)
        return t

    def take_new(self) -> list:
        new, self.new = self.new, []
        if new:
            n = len(self.all)
            self.uuid_lut = np.array([t.uuid for t in self.all], dtype=np.uint64)
            self.seq_lut = np.array([t.seq for t in self.all], dtype=np.int64)
            self.jpid_lut = np.array([t.json_pid for t in self.all], dtype=np.int64)
            self.jtid_lut = np.array([t.json_tid for t in self.all], dtype=np.int64)
            assert len(self.uuid_lut) == n
        return new

    def process(self, pid: int) -> Track:
        key = ("process", pid)
        t = self.by_key.get(key)
        if t is None:
            name = self.processes.get(pid) or self.threads.get(pid) or f"process {pid}"
            t = self._add(key, kind="process", name=name, pid=pid, json_pid=pid,
                          json_tid=self._pseudo_id())
        return t

    def thread(self, pid: int, tid: int) -> Track:
        key = ("thread", pid, tid)
        t = self.by_key.get(key)
        if t is None:
            proc = self.process(pid)
            t = self._add(key, kind="thread", name=self.threads.get(tid) or f"thread {tid}",
                          pid=pid, tid=tid, parent=proc, json_pid=pid, json_tid=tid)
        return t

    def offcpu(self, pid: int, tid: int) -> Track:
        key = ("offcpu", pid, tid)
        t = self.by_key.get(key)
        if t is None:
            th = self.thread(pid, tid)
            t = self._add(key, kind="offcpu", name="off-CPU", pid=pid, tid=tid, parent=th,
                          json_pid=pid, json_tid=self._pseudo_id())
        return t

    def xid(self) -> Track:
        t = self.by_key.get(("xid",))
        if t is None:
            p = self._pseudo_id()
            t = self._add(("xid",), kind="xid", name="NVIDIA Xid", json_pid=p, json_tid=p)
        return t

    def lane(self, base: Track, lane: int) -> Track:
        key = ("lane", base.idx, lane)
        t = self.by_key.get(key)
        if t is None:
            t = self._add(key, kind="lane", name=f"{base.name} overlapping #{lane}",
                          pid=base.pid, tid=base.tid, parent=base, json_pid=base.json_pid,
                          json_tid=self._pseudo_id())
        return t

    def gpu(self, gpu: int) -> Track:
        key = ("gpu", gpu)
        t = self.by_key.get(key)
        if t is None:
            p = self._pseudo_id()
            t = self._add(key, kind="gpu", name=self.gpu_label(gpu), json_pid=p, json_tid=p)
        return t

    def counter(self, gpu: int, field: int, name: str, unit: str) -> Track:
        key = ("counter", gpu, field)
        t = self.by_key.get(key)
        if t is None:
            g = self.gpu(gpu)
            t = self._add(key, kind="counter", name=name, parent=g, unit=unit,
                          json_pid=g.json_pid, json_tid=g.json_tid)
        return t

    def clock(self, gpu: int) -> Track:
        """GPU n's clock domain: its band half-width over time, a counter under the GPU."""
        key = ("clock", gpu)
        t = self.by_key.get(key)
        if t is None:
            g = self.gpu(gpu)
            t = self._add(key, kind="counter", name=f"GPU{gpu} clock ±", parent=g, unit="ns",
                          json_pid=g.json_pid, json_tid=g.json_tid)
        return t

    def stream(self, pid: int, cls: int, value: int) -> Track:
        """The track of one CUDA stream of process pid: cls STREAM_HANDLE (value: the
        handle), STREAM_LEGACY (the legacy default stream), STREAM_PER_THREAD (value: the
        thread whose per-thread default stream it is)."""
        key = ("stream", pid, cls, value)
        t = self.by_key.get(key)
        if t is None:
            name = (f"stream {value:#x}" if cls == STREAM_HANDLE else
                    "stream: legacy default" if cls == STREAM_LEGACY else
                    f"stream: per-thread default of {self.threads.get(value) or 'thread'} "
                    f"{value}")
            proc = self.process(pid)
            t = self._add(key, kind="stream", name=name, pid=pid, parent=proc,
                          json_pid=pid, json_tid=self._pseudo_id())
        return t

    def gpu_stream(self, gpu: int, pid: int, stream: int) -> Track:
        """Executions (record --gpu-activity) of one CUDA stream of process pid on GPU gpu."""
        key = ("gpu_stream", gpu, pid, stream)
        t = self.by_key.get(key)
        if t is None:
            g = self.gpu(gpu)
            t = self._add(key, kind="gpu_stream", name=f"GPU{gpu} stream {stream} (pid {pid})",
                          pid=pid, parent=g, json_pid=g.json_pid, json_tid=self._pseudo_id())
        return t

    def faults(self, pid: int = None, gpu: int = None) -> Track:
        key = ("faults", pid, gpu)
        t = self.by_key.get(key)
        if t is None:
            parent = self.gpu(gpu) if gpu is not None else (
                self.process(pid) if pid else None)
            jp = parent.json_pid if parent else self._pseudo_id()
            t = self._add(key, kind="faults", name="faults", parent=parent, pid=pid or 0,
                          json_pid=jp, json_tid=self._pseudo_id())
        return t


class Lanes:
    """Keeps each track's slices in time order and non-overlapping (see module doc)."""

    def __init__(self, tracks: Tracks):
        self.tracks = tracks
        self.base_end = np.zeros(0, dtype=np.int64)   # last end on lane 0, per base track idx
        self.extra = {}                               # base idx -> [last end of lane 1, 2, ...]

    def _grow(self):
        n = len(self.tracks.all)
        if len(self.base_end) < n:
            self.base_end = np.concatenate(
                [self.base_end, np.full(n - len(self.base_end) + 64, NO_END, np.int64)])

    def assign(self, base: np.ndarray, start: np.ndarray, end: np.ndarray,
               by_start: np.ndarray = None) -> np.ndarray:
        """Track idx per row: its base track, or the first overflow lane it fits in.
        ``by_start``: np.argsort(start, kind="stable"), if the caller has it."""
        self._grow()
        n = len(base)
        out = base.copy()
        if n == 0:
            return out
        if by_start is None:
            by_start = np.argsort(start, kind="stable")
        order = by_start[_stable_order(base[by_start])]       # == np.lexsort((start, base))
        b, s, e = base[order], start[order], end[order]
        first = np.empty(n, dtype=bool)
        first[0] = True
        first[1:] = b[1:] != b[:-1]
        gid = np.cumsum(first) - 1
        lo = int(s.min())
        rel = e - lo
        span = int(rel.max()) + 1
        ngroups = int(gid[-1]) + 1
        if span * ngroups < (1 << 62):
            off = gid * span
            cm = np.maximum.accumulate(rel + off) - off
        else:                      # a span of centuries: do it group by group
            cm = np.empty(n, dtype=np.int64)
            starts = np.flatnonzero(first)
            for a, z in zip(starts, list(starts[1:]) + [n]):
                cm[a:z] = np.maximum.accumulate(rel[a:z])
        seed = np.maximum(self.base_end[b], NO_END + lo) - lo
        prev = np.empty(n, dtype=np.int64)
        prev[0] = seed[0]
        prev[1:] = np.where(first[1:], seed[1:], np.maximum(cm[:-1], seed[1:]))
        bad = (s - lo) < prev
        last = np.flatnonzero(np.r_[first[1:], True])
        bad_group = np.zeros(ngroups, dtype=bool)
        bad_group[gid[bad]] = True
        good_last = last[~bad_group]
        self.base_end[b[good_last]] = np.maximum(self.base_end[b[good_last]], cm[good_last] + lo)
        for g in np.flatnonzero(bad_group):
            a = int(np.flatnonzero(first)[g])
            z = int(last[g]) + 1
            bi = int(b[a])
            ends = [int(self.base_end[bi])] + self.extra.get(bi, [])
            for k in range(a, z):
                si, ei = int(s[k]), int(e[k])
                for lane, le in enumerate(ends):
                    if si >= le:
                        break
                else:
                    lane = len(ends)
                    ends.append(NO_END)
                ends[lane] = ei
                if lane:
                    out[order[k]] = self.tracks.lane(self.tracks.all[bi], lane).idx
            self.base_end[bi] = ends[0]
            self.extra[bi] = ends[1:]
        return out


def _stable_order(keys: np.ndarray) -> np.ndarray:
    """np.argsort(keys, kind="stable") of small non-negative ints, by radix sort when it can."""
    if len(keys) and 0 <= keys.min() and keys.max() < (1 << 16):
        keys = keys.astype(np.uint16)
    return np.argsort(keys, kind="stable")


def factorize(values) -> tuple:
    """(the distinct values, ascending; index of each value in them), as np.unique gives,
    without a sort when the values span a small range (function ids, result codes)."""
    v = np.asarray(values)
    if not len(v):
        return v[:0], np.zeros(0, dtype=np.intp)
    lo, hi = v.min(), v.max()
    if lo == hi:
        return v[:1].copy(), np.zeros(len(v), dtype=np.intp)
    if v.dtype.kind in "iu" and int(hi) - int(lo) < (1 << 16):
        off = (v - lo).astype(np.intp)
        nz = np.flatnonzero(np.bincount(off))
        lut = np.zeros(int(hi) - int(lo) + 1, dtype=np.intp)
        lut[nz] = np.arange(len(nz))
        return nz.astype(v.dtype) + lo, lut[off]
    uniq, inv = np.unique(v, return_inverse=True)
    return uniq, inv.reshape(-1)


class _Columns:
    """Fields of some rows of a TIMELINE_DTYPE batch, gathered one field at a time when
    first asked for (a whole-row copy of the structured array is several times slower)."""

    def __init__(self, ev, rows):
        self.ev, self.rows, self.cols = ev, rows, {}

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, name):
        c = self.cols.get(name)
        if c is None:
            c = self.cols[name] = self.ev[name][self.rows]
        return c


class Slots:
    """Up to SLOTS debug annotations per row: name id, value type and 64-bit value."""

    def __init__(self, n: int):
        self.present = np.zeros((SLOTS, n), dtype=bool)
        self.name = np.zeros((SLOTS, n), dtype=np.int16)      # index in ANN_NAMES
        self.vtype = np.zeros((SLOTS, n), dtype=np.int8)
        self.value = np.zeros((SLOTS, n), dtype=np.uint64)

    def put(self, k: int, rows, name: str, vtype: int, values, keep=None):
        rows = np.asarray(rows)
        values = np.asarray(values)
        if values.dtype.kind == "i":
            values = values.astype(np.int64).view(np.uint64)
        else:
            values = values.astype(np.uint64)
        if keep is not None:
            rows, values = rows[keep], np.broadcast_to(values, keep.shape)[keep]
        self.present[k, rows] = True
        self.name[k, rows] = ANN[name]
        self.vtype[k, rows] = vtype
        self.value[k, rows] = values


@dataclasses.dataclass
class Batch:
    """Rows of one batch, sorted by start (see module doc)."""

    n: int
    start: np.ndarray        # int64 ns, MONOTONIC
    end: np.ndarray          # int64 ns; == start for instants
    slice: np.ndarray        # bool
    track: np.ndarray        # Track.idx
    cat: np.ndarray          # index in CATEGORIES
    name: np.ndarray         # Strings id
    slots: Slots
    kind: np.ndarray         # event kind, for counting
    tid: np.ndarray
    flows: dict              # row -> (flow_ids, terminating_flow_ids)


class TraceModel:
    """Turns a Timeline into batches of rows, and keeps the tracks and strings they use."""

    def __init__(self, tl, batch_rows: int = BATCH_ROWS):
        self.tl = tl
        self.batch_rows = batch_rows
        processes = {}
        for t in (tl.meta or {}).get("targets", []) or []:
            if isinstance(t, dict) and t.get("pid"):
                cmd = t.get("cmdline") or ""
                cmd = " ".join(map(str, cmd)) if isinstance(cmd, (list, tuple)) else str(cmd)
                where = target_label(t)
                processes[int(t["pid"])] = f"{cmd} [{where}]" if where else cmd
        self.tracks = Tracks(dict(tl.threads or {}), processes, run_salt(tl.meta or {}),
                             gpu_label=tl.devices.label)
        self.lanes = Lanes(self.tracks)
        self.strings = Strings()
        self.counts = {}              # kind -> events exported
        self._fn_sid = {}
        # (pid, func handle) -> kernel name, from cuModuleGetFunction/cuLibraryGetKernel seen
        # so far: a handle is looked up before it can be launched, so one pass suffices
        self.kernel_names = {}
        self._chain = None
        self.flow_hits = []           # (fault index, step, Track, t_ns, terminating)
        self.gpu_flows = None         # export/gpu_tracks.LaunchFlows: launch -> execution

    # --- fault chains, matched to the events they name while streaming
    def set_chains(self, faults):
        """Give the fault list (tl.faults()) so chain steps on exported events get flows."""
        ts, tids, who = [], [], []
        for i, f in enumerate(faults):
            chain = list(getattr(f, "chain", None) or [])
            # step -1 is the faulting event itself (the failed call), when it has a thread
            steps = [(-1, {"t_ns": f.t_ns, "tid": f.tid})] if f.tid is not None else []
            steps += list(enumerate(chain))
            for j, step in steps:
                last = j == len(chain) - 1
                if step.get("t_ns") is None:
                    continue
                if step.get("tid") is None:
                    if j >= 0:
                        who.append((i, j, last))      # unmatched: drawn on the fault track
                        ts.append(-1)
                        tids.append(-1)
                    continue
                ts.append(int(step["t_ns"]))
                tids.append(int(step["tid"]))
                who.append((i, j, last))
        order = np.argsort(np.asarray(ts, dtype=np.int64), kind="stable")
        self._chain = (np.asarray(ts, dtype=np.int64)[order],
                       np.asarray(tids, dtype=np.int64)[order], [who[k] for k in order])
        self._chain_used = set()

    @staticmethod
    def flow_id(fault_index: int) -> int:
        return 0xCA00_0000_0000_0000 | (fault_index + 1)

    def _match_chains(self, start, tid, track, kind, skip=None):
        flows = {}
        if not self._chain or not len(self._chain[0]):
            return flows
        cts, ctid, who = self._chain
        m = np.isin(start, cts) & (kind != Kind.SCHED)
        if skip is not None:
            m &= ~skip
        hit = np.flatnonzero(m)
        for r in hit:
            lo = np.searchsorted(cts, start[r], "left")
            hi = np.searchsorted(cts, start[r], "right")
            for k in range(lo, hi):
                if k in self._chain_used or ctid[k] != tid[r]:
                    continue
                self._chain_used.add(k)
                fi, step, last = who[k]
                fid = self.flow_id(fi)
                ids, term = flows.setdefault(int(r), ([], []))
                (term if last else ids).append(fid)
                self.flow_hits.append((fi, step, self.tracks.all[int(track[r])],
                                       int(start[r]), last))
        return flows

    def unmatched_steps(self):
        """Chain steps that named no exported event (drawn on the fault's own track)."""
        if not self._chain:
            return []
        return [self._chain[2][k] for k in range(len(self._chain[0]))
                if k not in self._chain_used and self._chain[2][k][1] >= 0]

    # --- batches
    def _raw_batches(self):
        buf, n = [], 0
        for ev in self.tl.iter_events():
            if len(ev) == 0:
                continue
            buf.append(ev)
            n += len(ev)
            if n >= self.batch_rows:
                yield buf[0] if len(buf) == 1 else np.concatenate(buf)
                buf, n = [], 0
        if buf:
            yield buf[0] if len(buf) == 1 else np.concatenate(buf)

    def batches(self):
        for ev in self._raw_batches():
            b = self.build(ev)
            if b.n:
                yield b

    def _base_tracks(self, ev, cls):
        """Base track idx per event; cls 0 thread, 1 off-CPU, 2 process, 3 xid."""
        key = (cls.astype(np.uint64) << np.uint64(56)) | (
            ev["pid"].astype(np.uint64) << np.uint64(28)) | ev["tid"].astype(np.uint64)
        uniq, inv = np.unique(key, return_inverse=True)
        lut = np.empty(len(uniq), dtype=np.int64)
        for i, k in enumerate(uniq.tolist()):
            c, pid, tid = k >> 56, (k >> 28) & ((1 << 28) - 1), k & ((1 << 28) - 1)
            t = (self.tracks.thread(pid, tid) if c == 0 else self.tracks.offcpu(pid, tid)
                 if c == 1 else self.tracks.process(pid) if c == 2 else self.tracks.xid())
            lut[i] = t.idx
        return lut[inv.reshape(-1)]

    @staticmethod
    def _stream_work(ev) -> np.ndarray:
        """Indexes of the CUDA calls of ev that put work on a stream."""
        kind = ev["kind"]
        code = ev["code"].astype(np.int64)
        known = code < len(_STREAM_SLOT)
        m = ((kind == Kind.CUDA) | (kind == Kind.CUDA_UNFINISHED)) & known
        m[m] = _STREAM_SLOT[code[m]] >= 0
        return np.flatnonzero(m)

    def _stream_tracks(self, ev) -> np.ndarray:
        """Stream track idx per event of ev (all stream work), from its stream argument."""
        code = ev["code"].astype(np.int64)
        args = np.stack([ev[f"a{j}"].astype(np.uint64) for j in range(5)] +
                        [np.zeros(len(ev), np.uint64)])          # slot 5: stream 0
        h = args[_STREAM_SLOT[code], np.arange(len(ev))]
        pt = (h == cuda_api.STREAM_PER_THREAD) | ((h == 0) & _STREAM_PER_THREAD[code])
        legacy = ~pt & ((h == 0) | (h == cuda_api.STREAM_LEGACY))
        cls = np.where(pt, STREAM_PER_THREAD, np.where(legacy, STREAM_LEGACY, STREAM_HANDLE))
        value = np.where(pt, ev["tid"].astype(np.uint64), np.where(legacy, np.uint64(0), h))
        keys = np.stack([ev["pid"].astype(np.uint64), cls.astype(np.uint64), value], axis=1)
        uniq, inv = np.unique(keys, axis=0, return_inverse=True)
        lut = np.array([self.tracks.stream(int(p), int(c), int(v)).idx
                        for p, c, v in uniq.tolist()], dtype=np.int64)
        return lut[inv.reshape(-1)]

    def _fn_name_ids(self, fids, suffix=""):
        uniq, inv = factorize(fids)
        lut = np.empty(len(uniq), dtype=np.int64)
        for i, f in enumerate(uniq.tolist()):
            key = (f, suffix)
            if key not in self._fn_sid:
                self._fn_sid[key] = self.strings.id(decode.cuda_function_name(f) + suffix)
            lut[i] = self._fn_sid[key]
        return lut[inv]

    def _str_ids(self, values, fn):
        """String ids of fn(v) for each distinct v of a small-cardinality column."""
        uniq, inv = factorize(values)
        return self.strings.ids_of([fn(v) for v in uniq.tolist()])[inv]

    def build(self, ev) -> Batch:
        n0 = len(ev)
        work = self._stream_work(ev)
        if len(work):                    # stream work again, for the stream tracks
            ev = np.concatenate([ev, ev[work]])
        n = len(ev)
        copy = np.zeros(n, dtype=bool)
        copy[n0:] = True
        kind = ev["kind"].astype(np.int64)
        start = ev["t_ns"].astype(np.int64)
        dur = np.maximum(ev["dur_ns"].astype(np.int64), 0)
        is_slice = np.isin(kind, [Kind.CUDA, Kind.CUDA_UNFINISHED, Kind.CONNECT, Kind.SCHED])
        end = np.where(is_slice, start + dur, start)
        cls = np.full(n, 2, dtype=np.int64)
        cls[np.isin(kind, [Kind.CUDA, Kind.CUDA_UNFINISHED, Kind.CONNECT])] = 0
        cls[kind == Kind.SCHED] = 1
        cls[kind == Kind.XID] = 3
        base = self._base_tracks(ev[:n0], cls[:n0])
        if len(work):
            base = np.concatenate([base, self._stream_tracks(ev[n0:])])
        order = np.argsort(start, kind="stable")
        track = self.lanes.assign(base, start, end, order)

        kind, start, end, is_slice, track, copy = (
            kind[order], start[order], end[order], is_slice[order], track[order], copy[order])
        tid = ev["tid"][order]
        cat = np.full(n, CAT["thread"], dtype=np.int64)
        name = np.zeros(n, dtype=np.int64)
        slots = Slots(n)

        for k in factorize(kind)[0].tolist():
            rows = np.flatnonzero(kind == k)
            sub = _Columns(ev, order[rows])
            self.counts[k] = self.counts.get(k, 0) + int((~copy[rows]).sum())
            if k in (Kind.CUDA, Kind.CUDA_UNFINISHED):
                cat[rows] = CAT["cuda"]
                fids = sub["code"].astype(np.int64)
                if k == Kind.CUDA:
                    ret = sub["ret"].astype(np.int64)
                    ok = ret == 0
                    nm = self._fn_name_ids(fids)
                    if not ok.all():
                        bad = ~ok
                        nm[bad] = self.strings.ids_of(
                            [f"{decode.cuda_function_name(f)}: {decode.cuda_result_name(r)}"
                             for f, r in zip(fids[bad].tolist(), ret[bad].tolist())])
                    name[rows] = nm
                    slots.put(5, rows, "result", V_STR,
                              self._str_ids(ret, decode.cuda_result_name))
                else:
                    name[rows] = self._fn_name_ids(fids, " (unfinished)")
                    slots.put(5, rows, "running_ns", V_UINT, sub["dur_ns"])
                if k == Kind.CUDA:
                    self._note_kernels(sub, fids)
                for f in np.unique(fids).tolist():
                    sel = fids == f
                    r = rows[sel]
                    fn = cuda_api.FUNCTIONS.get(f)
                    keep_str = fn.string_slot if fn else None
                    if keep_str is not None:
                        texts, idx = decode.unique_strings(decode.data_rows(sub)[sel],
                                                           decode.data_str)
                    for j, arg in enumerate(CUDA_FUNCTIONS.get(f, ("", ("",) * 5))[1]):
                        if not arg:
                            continue
                        vals = sub[f"a{j}"][sel]
                        if j == keep_str:
                            slots.put(j, r, arg, V_STR, self.strings.ids_of(texts)[idx]
                                      if texts else np.zeros(0, np.int64))
                        elif arg == "func" and fn.role == "launch" and self.kernel_names:
                            self._put_func(slots, j, r, sub["pid"][sel], vals)
                        elif arg in decode.DIMS_ARGS:
                            slots.put(j, r, arg, V_STR, self._str_ids(vals, decode.dims_str))
                        elif arg in decode.POINTER_ARGS:
                            slots.put(j, r, arg, V_PTR, vals)
                        else:
                            slots.put(j, r, arg, V_UINT, vals)
                unc = sub["unc_ns"]
                slots.put(6, rows, "unc_ns", V_UINT, unc, keep=unc != 0)
            elif k == Kind.CONNECT:
                cat[rows] = CAT["net"]
                ret = sub["ret"].astype(np.int64)
                res = self._str_ids(ret, decode.connect_result)
                name[rows] = self._str_ids(
                    ret, lambda r: "connect" if r >= 0 else f"connect: {decode.errno_name(r)}")
                raw = decode.data_rows(sub)
                alen = np.minimum(sub["a1"], 56).astype(np.uint8)[:, None]
                peers, idx = decode.unique_strings(
                    np.concatenate([raw, alen], axis=1),
                    lambda row: decode.peer_str(row[:56].tobytes(), int(row[56])))
                slots.put(0, rows, "peer", V_STR, self.strings.ids_of(peers)[idx]
                          if peers else np.zeros(0, np.int64))
                slots.put(1, rows, "fd", V_UINT, sub["a0"])
                slots.put(2, rows, "result", V_STR, res)
                unc = sub["unc_ns"]
                slots.put(6, rows, "unc_ns", V_UINT, unc, keep=unc != 0)
            elif k == Kind.SCHED:
                cat[rows] = CAT["sched"]
                state = sub["ret"].astype(np.int64)
                pre = sub["code"] == 1
                key = np.where(pre, -1, state)
                name[rows] = self._str_ids(
                    key, lambda s: "preempted" if s == -1 else
                    f"blocked ({task_state_name(int(s))})")
                slots.put(0, rows, "state", V_STR,
                          self._str_ids(state, lambda s: task_state_name(int(s))))
                w = sub["a0"]
                slots.put(1, rows, "wakeup_to_run_ns", V_UINT, w, keep=w != 0)
                slots.put(2, rows, "cpu_out", V_UINT, sub["a1"])
                slots.put(3, rows, "cpu_in", V_UINT, sub["a2"])
            else:
                self._instants(k, rows, sub, name, cat, slots)
        cat[copy] = CAT["stream"]
        flows = self._match_chains(start, tid, track, kind, skip=copy)
        if self.gpu_flows is not None:
            self.gpu_flows.match(start, tid, kind, copy, flows)
        return Batch(n=n, start=start, end=end, slice=is_slice, track=track, cat=cat,
                     name=name, slots=slots, kind=kind, tid=tid, flows=flows)

    def _note_kernels(self, sub, fids):
        """Kernel names of the batch's successful lookups, before its launches are named."""
        m = np.isin(fids, _LOOKUP_IDS) & (sub["ret"] == 0)
        if m.any():
            raw = decode.data_rows(sub)[m]
            for p, h, row in zip(sub["pid"][m].tolist(), sub["a0"][m].tolist(), raw):
                self.kernel_names[(p, h)] = decode.data_str(row)

    def _put_func(self, slots, j, rows, pids, funcs):
        """A launch's func: the kernel's name where a lookup named that handle, else the
        pointer."""
        names = [self.kernel_names.get((p, h)) for p, h in zip(pids.tolist(), funcs.tolist())]
        known = np.array([n is not None for n in names], dtype=bool)
        slots.put(j, rows, "func", V_PTR, funcs, keep=~known)
        if known.any():
            sids = self.strings.ids_of([f"{n} @{h:#x}" for n, h in zip(names, funcs.tolist())
                                        if n is not None])
            slots.put(j, rows[known], "func", V_STR, sids)

    def _instants(self, k, rows, sub, name, cat, slots):
        raw = decode.data_rows(sub)
        tid = sub["tid"]
        if k in (Kind.THREAD_NEW, Kind.THREAD_NAME, Kind.THREAD_EXIT):
            cat[rows] = CAT["thread"]
            label = {Kind.THREAD_NEW: "thread start", Kind.THREAD_NAME: "thread rename",
                     Kind.THREAD_EXIT: "thread exit"}[k]
            name[rows] = self.strings.id(label)
            slots.put(0, rows, "tid", V_UINT, tid)
            comms, idx = decode.unique_strings(raw[:, :16], decode.comm_str)
            slots.put(1, rows, "comm", V_STR, self.strings.ids_of(comms)[idx])
            if k == Kind.THREAD_NEW:
                slots.put(2, rows, "parent_tid", V_UINT, sub["a0"])
            elif k == Kind.THREAD_EXIT:
                slots.put(2, rows, "group_dead", V_BOOL, sub["code"] != 0)
        elif k == Kind.PROC_EXIT:
            cat[rows] = CAT["thread"]
            name[rows] = self.strings.id("process exit")
            slots.put(0, rows, "exit_code", V_INT, sub["ret"].astype(np.int64))
            slots.put(1, rows, "tid", V_UINT, tid)
        elif k == Kind.SIGNAL:
            cat[rows] = CAT["thread"]
            name[rows] = self._str_ids(sub["ret"].astype(np.int64), decode.signal_name)
            slots.put(0, rows, "sender_pid", V_UINT, sub["a0"])
            comms, idx = decode.unique_strings(raw[:, :16], decode.comm_str)
            slots.put(1, rows, "sender_comm", V_STR, self.strings.ids_of(comms)[idx])
            slots.put(2, rows, "signal_result", V_UINT, sub["code"])
        elif k == Kind.XID:
            cat[rows] = CAT["gpu"]
            name[rows] = self._str_ids(sub["ret"].astype(np.int64), decode.xid_name)
            slots.put(0, rows, "code", V_INT, sub["ret"].astype(np.int64))
            devs, idx = decode.unique_strings(raw[:, :16], decode.comm_str)
            slots.put(1, rows, "dev", V_STR, self.strings.ids_of(devs)[idx])
            msgs = [self.tl.xid_text(e)[1] for e in sub.ev[sub.rows]]
            slots.put(2, rows, "msg", V_STR, self.strings.ids_of(msgs))
            slots.put(3, rows, "pid", V_UINT, sub["pid"])
        else:
            cat[rows] = CAT["thread"]
            name[rows] = self.strings.id(f"event kind {k}")
            slots.put(0, rows, "code", V_INT, sub["ret"].astype(np.int64))
        unc = sub["unc_ns"]
        slots.put(6, rows, "unc_ns", V_UINT, unc, keep=unc != 0)


def stream(model: TraceModel, writer, progress=None, workers: int = None):
    """Drive a writer over all batches, encoding on a second thread.

    ``writer.prepare(batch)`` runs here, in order (it owns the writer's state: tracks
    declared, strings interned) and may write packets; ``writer.encode(batch, ctx)`` is
    mostly numpy, which releases the GIL, so encoding runs on the other cores while this
    thread reads and builds the next batch; it returns bytes or a 1-D uint8 array.  Output order is kept: a batch's bytes follow what its
    prepare wrote, batches in order.  Memory stays bounded: at most workers + 1 batches wait.
    """
    import collections
    import io
    from concurrent.futures import ThreadPoolExecutor

    workers = workers or max(1, min(4, os.cpu_count() or 1))
    depth = workers + 1
    pending = collections.deque()
    out = writer.f

    def drain(k):
        while len(pending) > k:
            head, fut, nrows = pending.popleft()
            if head:
                out.write(head)
            blob = fut.result()
            out.write(blob)
            writer.bytes += len(blob)
            if progress:
                progress(nrows)

    with ThreadPoolExecutor(workers, thread_name_prefix="clockalign-export") as pool:
        try:
            for b in model.batches():
                buf = io.BytesIO()
                writer.f = buf
                try:
                    ctx = writer.prepare(b)
                finally:
                    writer.f = out
                pending.append((buf.getvalue(), pool.submit(writer.encode, b, ctx), b.n))
                writer.count(b)
                drain(depth)
            drain(0)
        finally:
            for _, fut, _ in pending:
                fut.cancel()
