"""What a trace shows, independent of its file format: each event as a row (rows.py) on its
track (tracks.py, lanes.py), with its name, category and annotations, and the flows of the
fault chains.

Both exporters read the run through ``Timeline.iter_events()`` a batch at a time
(pipeline.stream) and TraceModel.build turns each batch into rows sorted by start time; a
CUDA call that puts work on a stream is a second row, on its stream's track.

    model = TraceModel(tl)
    for batch in model.batches():          # Batch: rows sorted by start
        ...                                # exporters encode batch.start/end/track/...
"""
import numpy as np

from ..store import cuda_api
from ..store.kinds import CALL_KINDS, KINDS, SPAN_KINDS
from ..store.meta import target_label
from ..store.schema import CUDA_FUNCTIONS, Kind, task_state_name
from ..timeline.gpu_activity import row_keys
from . import labels
from .lanes import Lanes
from .rows import (BATCH_ROWS, CAT, V_BOOL, V_INT, V_PTR, V_STR, V_UINT, Batch, Columns, Slots,
                   Strings, factorize)
from .tracks import STREAM_HANDLE, STREAM_LEGACY, STREAM_PER_THREAD, Tracks, run_salt

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
_CALLS = np.asarray(CALL_KINDS, dtype=np.int64)
_SPANS = np.asarray(SPAN_KINDS, dtype=np.int64)
# base track class per kind (_base_tracks), from the table's track; unknown kinds: process
_TRACK_CLASS = np.full(1 << 16, 2, dtype=np.int64)
for _k, _s in KINDS.items():
    _TRACK_CLASS[_k] = {"thread": 0, "offcpu": 1, "process": 2, "xid": 3}[_s.track]

class TraceModel:
    """Turns a Timeline into batches of rows, and keeps the tracks and strings they use."""

    def __init__(self, tl, batch_rows: int = BATCH_ROWS, select=None):
        self.tl = tl
        self.select = select          # export/window.Selection, or None: every event
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
            if self.select is not None:
                ev = ev[self.select.events(ev)]
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
        m = np.isin(kind, _CALLS) & known
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
        uniq, inv = row_keys(ev["pid"], cls, value.view(np.int64))
        lut = np.array([self.tracks.stream(p, c, v & 0xFFFF_FFFF_FFFF_FFFF).idx
                        for p, c, v in uniq], dtype=np.int64)
        return lut[inv]

    def _fn_name_ids(self, fids, suffix=""):
        uniq, inv = factorize(fids)
        lut = np.empty(len(uniq), dtype=np.int64)
        for i, f in enumerate(uniq.tolist()):
            key = (f, suffix)
            if key not in self._fn_sid:
                self._fn_sid[key] = self.strings.id(labels.cuda_function_name(f) + suffix)
            lut[i] = self._fn_sid[key]
        return lut[inv]

    def _str_ids(self, values, fn):
        """String ids of fn(v) for each distinct v of a small-cardinality column."""
        uniq, inv = factorize(values)
        return self.strings.ids_of([fn(v) for v in uniq.tolist()])[inv]

    def build(self, ev) -> Batch:
        n0 = len(ev)
        work = self._stream_work(ev)
        # the stream work again, for the stream tracks: row i of the batch is ev's row
        # src[i] (indexes, not a copy of the rows: a field is gathered when read)
        src = np.concatenate([np.arange(n0), work]) if len(work) else np.arange(n0)
        n = len(src)
        copy = np.zeros(n, dtype=bool)
        copy[n0:] = True
        kind = ev["kind"][src].astype(np.int64)
        start = ev["t_ns"][src].astype(np.int64)
        dur = np.maximum(ev["dur_ns"][src].astype(np.int64), 0)
        is_slice = np.isin(kind, _SPANS)
        end = np.where(is_slice, start + dur, start)
        cls = _TRACK_CLASS[kind]
        base = self._base_tracks(ev, cls[:n0])
        if len(work):
            base = np.concatenate([base, self._stream_tracks(Columns(ev, work))])
        order = np.argsort(start, kind="stable")
        track = self.lanes.assign(base, start, end, order)

        kind, start, end, is_slice, track, copy = (
            kind[order], start[order], end[order], is_slice[order], track[order], copy[order])
        order = src[order]               # ev's row of each sorted row
        tid = ev["tid"][order]
        cat = np.full(n, CAT["thread"], dtype=np.int64)
        name = np.zeros(n, dtype=np.int64)
        slots = Slots(n)

        for k in factorize(kind)[0].tolist():
            rows = np.flatnonzero(kind == k)
            sub = Columns(ev, order[rows])
            self.counts[k] = self.counts.get(k, 0) + int((~copy[rows]).sum())
            if k in CALL_KINDS:
                cat[rows] = CAT["cuda"]
                fids = sub["code"].astype(np.int64)
                if k == Kind.CUDA:
                    ret = sub["ret"].astype(np.int64)
                    ok = ret == 0
                    nm = self._fn_name_ids(fids)
                    if not ok.all():
                        bad = ~ok
                        nm[bad] = self.strings.ids_of(
                            [f"{labels.cuda_function_name(f)}: {labels.cuda_result_name(r)}"
                             for f, r in zip(fids[bad].tolist(), ret[bad].tolist())])
                    name[rows] = nm
                    slots.put(5, rows, "result", V_STR,
                              self._str_ids(ret, labels.cuda_result_name))
                elif k == Kind.CUDA_UNFINISHED:
                    name[rows] = self._fn_name_ids(fids, " (unfinished)")
                    slots.put(5, rows, "running_ns", V_UINT, sub["dur_ns"])
                else:                          # seen at its entry only: an instant
                    name[rows] = self._fn_name_ids(fids)
                    slots.put(5, rows, "result", V_STR, np.full(
                        len(rows), self.strings.id("not seen (entry only)"), np.int64))
                if k == Kind.CUDA:
                    self._note_kernels(sub, fids)
                for f in np.unique(fids).tolist():
                    sel = fids == f
                    r = rows[sel]
                    fn = cuda_api.FUNCTIONS.get(f)
                    keep_str = fn.string_slot if fn else None
                    if keep_str is not None:
                        texts, idx = labels.unique_strings(labels.data_rows(sub)[sel],
                                                           labels.data_str)
                    for j, arg in enumerate(CUDA_FUNCTIONS.get(f, ("", ("",) * 5))[1]):
                        if not arg:
                            continue
                        vals = sub[f"a{j}"][sel]
                        if j == keep_str:
                            slots.put(j, r, arg, V_STR, self.strings.ids_of(texts)[idx]
                                      if texts else np.zeros(0, np.int64))
                        elif arg == "func" and fn.role == "launch" and self.kernel_names:
                            self._put_func(slots, j, r, sub["pid"][sel], vals)
                        elif arg in labels.DIMS_ARGS:
                            slots.put(j, r, arg, V_STR, self._str_ids(vals, labels.dims_str))
                        elif arg in labels.POINTER_ARGS:
                            slots.put(j, r, arg, V_PTR, vals)
                        else:
                            slots.put(j, r, arg, V_UINT, vals)
                unc = sub["unc_ns"]
                slots.put(6, rows, "unc_ns", V_UINT, unc, keep=unc != 0)
            elif k == Kind.CONNECT:
                cat[rows] = CAT["net"]
                ret = sub["ret"].astype(np.int64)
                res = self._str_ids(ret, labels.connect_result)
                name[rows] = self._str_ids(
                    ret, lambda r: "connect" if r >= 0 else f"connect: {labels.errno_name(r)}")
                raw = labels.data_rows(sub)
                alen = np.minimum(sub["a1"], 56).astype(np.uint8)[:, None]
                peers, idx = labels.unique_strings(
                    np.concatenate([raw, alen], axis=1),
                    lambda row: labels.peer_str(row[:56].tobytes(), int(row[56])))
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
        launch = None if self.gpu_flows is None else self.gpu_flows.match(start, tid, kind, copy)
        return Batch(n=n, start=start, end=end, slice=is_slice, track=track, cat=cat,
                     name=name, slots=slots, kind=kind, tid=tid, flows=flows, launch=launch)

    def _note_kernels(self, sub, fids):
        """Kernel names of the batch's successful lookups, before its launches are named."""
        m = np.isin(fids, _LOOKUP_IDS) & (sub["ret"] == 0)
        if m.any():
            raw = labels.data_rows(sub)[m]
            for p, h, row in zip(sub["pid"][m].tolist(), sub["a0"][m].tolist(), raw):
                self.kernel_names[(p, h)] = labels.data_str(row)

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
        raw = labels.data_rows(sub)
        tid = sub["tid"]
        if k in (Kind.THREAD_NEW, Kind.THREAD_NAME, Kind.THREAD_EXIT):
            cat[rows] = CAT["thread"]
            label = {Kind.THREAD_NEW: "thread start", Kind.THREAD_NAME: "thread rename",
                     Kind.THREAD_EXIT: "thread exit"}[k]
            name[rows] = self.strings.id(label)
            slots.put(0, rows, "tid", V_UINT, tid)
            comms, idx = labels.unique_strings(raw[:, :16], labels.comm_str)
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
            name[rows] = self._str_ids(sub["ret"].astype(np.int64), labels.signal_name)
            slots.put(0, rows, "sender_pid", V_UINT, sub["a0"])
            comms, idx = labels.unique_strings(raw[:, :16], labels.comm_str)
            slots.put(1, rows, "sender_comm", V_STR, self.strings.ids_of(comms)[idx])
            slots.put(2, rows, "signal_result", V_UINT, sub["code"])
        elif k == Kind.XID:
            cat[rows] = CAT["gpu"]
            name[rows] = self._str_ids(sub["ret"].astype(np.int64), labels.xid_name)
            slots.put(0, rows, "code", V_INT, sub["ret"].astype(np.int64))
            devs, idx = labels.unique_strings(raw[:, :16], labels.comm_str)
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
