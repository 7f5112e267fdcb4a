"""Live aggregation of a recording into bounded state: counters and fixed-bucket histograms.

An Aggregator is a recorder sink (capture/transport/sinks.py): it is handed every chunk the run file
would get — event batches (numpy columns of EVENT_DTYPE), counter samples, GPU clock
sandwiches, status rows — and folds each into totals at once; no event is kept.  Memory
is bounded by the label values (pids, peers, results: each capped, the rest counted as
"other"), a few hundred counter samples per GPU, about ten seconds of clock sandwiches per
GPU and at most MAX_PENDING allocation failures waiting for their next free-memory sample.

    agg = Aggregator()
    agg.open(meta); agg.write_columns(Chunk.EVENTS, cols); ...
    snap = agg.snapshot()          # plain copies, for the Prometheus collector
"""
import collections
import threading
import time

import numpy as np

from ..store import cuda_api
from ..store.counter_fields import CLOCK_REASONS, FIELD_BY_NAME
from ..store.event_text import cstring, decode_sockaddr
from ..store.kinds import ENTRY_KINDS
from ..store.devices import bus_key
from ..store.schema import KIND_NAMES, Chunk, Kind, TcpCode
from ..timeline import benign
from ..timeline.codes import cuda_result_name, errno_name
from .histogram import (CONNECT_BOUNDS_NS, CUDA_CALL_BOUNDS_NS, MODULE_LOAD_BOUNDS_NS,
                        WAKEUP_BOUNDS_NS, Histogram)

OTHER = "other"
MAX_PIDS = 256              # distinct pid label values (followed children can be many)
# an exited target's series stay this long (Prometheus scrapes their last values, the rules'
# windows see the end), then go and free their pid slot: a crash loop under --follow would
# otherwise fill MAX_PIDS with the dead and count every later process as "other"
EXITED_KEEP_NS = 300_000_000_000
MAX_PEERS = 64              # distinct connect() peers
MAX_RESULTS = 64            # distinct CUDA results / errno names
ENTRY_ONLY = "ENTRY_ONLY"   # the result label of a call recorded at its entry only
MAX_PENDING = 1024          # allocation failures waiting for the free-memory sample after them
STALE_NS = 5_000_000_000    # no sample that long after the call (counters off): not judged
FREE_SAMPLES = 600          # free-memory samples kept per GPU (60 s at the 0.1 s default)
CLOCK_CHUNKS = 10           # GPU clock bursts kept per GPU for the live fit (~10 s)
MODULE_IDS = cuda_api.ids("module")
ALLOC_IDS = np.array(cuda_api.ALLOC_IDS, dtype=np.uint16)
MEM_FREE = FIELD_BY_NAME["mem_free"]
CLOCK_EVENT_REASONS = FIELD_BY_NAME["clock_event_reasons"]
OOM = 2                     # CUDA_ERROR_OUT_OF_MEMORY
# a non-blocking connect() returns EINPROGRESS and finishes later: not an error
CONNECT_NOT_ERRORS = ("EINPROGRESS", "EALREADY", "EISCONN")
# a connect() failing as a known probe expects (timeline/benign.py: nscd, MPS): not an error
KNOWN_PROBE = "known_probe"
_BYTES_SLOT = {f.id: f.slot("bytes") for f in cuda_api.FUNCTIONS.values() if f.allocates}
_DEVICE_SLOT = {f.id: f.slot("device") for f in cuda_api.FUNCTIONS.values()
                if f.allocates and f.slot("device") is not None}


class Capped:
    """Label values as first seen, at most ``limit`` of them; later ones read as 'other'."""

    def __init__(self, limit):
        self.limit = limit
        self.seen = set()
        self.folded = 0           # values turned into "other"

    def release(self, value: str) -> None:
        self.seen.discard(value)

    def __call__(self, value: str) -> str:
        if value in self.seen:
            return value
        if len(self.seen) < self.limit:
            self.seen.add(value)
            return value
        self.folded += 1
        return OTHER


def _call_counts(pid, code, ret):
    """[((pid, function id, result), calls)] of one batch.  CUresults fit 16 bits, so the
    three pack into one uint64 and a plain numeric sort counts them: 33 ns an event against
    1484 for np.unique over rows, which sorts a void view element by element holding the
    GIL (scripts/bench/watch_aggregate.py); any other result takes the row-wise way."""
    ret = ret.astype(np.int64)
    if len(ret) and (ret.min() < 0 or ret.max() > 0xFFFF):
        keys, counts = np.unique(np.stack([pid.astype(np.int64), code.astype(np.int64), ret],
                                          axis=1), axis=0, return_counts=True)
        return zip(map(tuple, keys.tolist()), counts.tolist())
    u = np.uint64
    key = ((pid.astype(u) << u(32)) | (code.astype(u) << u(16)) | ret.astype(u))
    keys, counts = np.unique(key, return_counts=True)
    return (((k >> 32, (k >> 16) & 0xFFFF, k & 0xFFFF), n)
            for k, n in zip(keys.tolist(), counts.tolist()))


class Aggregator:
    def __init__(self, on_open=None):
        self._on_open = on_open                         # called once the probes are armed
        self._lock = threading.Lock()
        self._pid = Capped(MAX_PIDS)
        self._peer = Capped(MAX_PEERS)
        self._result = Capped(MAX_RESULTS)
        self.cuda_calls = collections.Counter()        # (pid, function, result)
        self.cuda_duration = {}                         # function -> Histogram
        self.offcpu_in_cuda_ns = collections.Counter()  # (pid, state)
        self.wakeup = Histogram(WAKEUP_BOUNDS_NS)
        self.connects = collections.Counter()           # (pid, peer, result)
        self.connect_duration = {}                      # peer -> Histogram
        self.tcp_resets = collections.Counter()         # (pid, direction)
        self.tcp_retransmits = collections.Counter()    # (pid,)
        self.alloc_failures = collections.Counter()     # (pid, function)
        self.fragmentation = collections.Counter()      # (pid, gpu)
        self.fragmentation_unjudged = collections.Counter()   # (pid, why)
        self.module_load = Histogram(MODULE_LOAD_BOUNDS_NS)
        self.xids = collections.Counter()               # (gpu, code)
        self.events = collections.Counter()             # kind name -> events aggregated
        self.dropped = {}                               # kind -> total (the probes' own)
        self.own_drops = collections.Counter()          # what the aggregator had to give up
        self.counters = {}                              # (gpu, field id) -> (value, recv_mono_ns)
        self.clock_unc_ns = {}                          # gpu -> ns
        self.clock_errors = 0
        self.gpus = []
        self.armed = False
        self.cuda_share = 1.0             # --cuda-duty (capture/probes/duty.py)
        self.closed = False
        self.scrapes = 0                                # set by the server (watch/server.py)
        self._xid_from_bpf = False
        self._pci = {}
        self._free = {}                                 # gpu -> deque[(t_from, t_to, bytes)]
        self._pending = collections.deque()             # (pid, gpu, entry, end, bytes)
        self._latest_ns = 0                             # the latest CUDA call's entry
        self._clock = {}                                # gpu -> deque of (t0, remote, t1)
        self._ticks = {}
        self._cflags = []
        self.targets = set()                            # tgids attached now
        self.targets_attached = 0                       # attached since the start
        self.target_exits = 0                           # attached ones that exited
        self._exited = {}                               # pid label -> when it exited (mono ns)
        self.pids_forgotten = 0                         # exited pids whose series went
        self.cuda_calls_seen = 0                        # every call, forgotten pids' too

    # ------------------------------------------------------------- the sink interface
    def open(self, meta: dict) -> None:
        with self._lock:
            self.gpus = list(meta.get("gpus") or [])
            self._pci = {bus_key(g.get("pci_bus_id")): g["index"] for g in self.gpus
                         if bus_key(g.get("pci_bus_id")) is not None}
            self._cflags = list(meta.get("cflags") or [])
            self._xid_from_bpf = "-DCA_XID" in self._cflags
            self.cuda_share = float((meta.get("cuda_duty") or {}).get("share", 1.0))
            self._set_targets(t["pid"] for t in meta.get("targets") or [] if "pid" in t)
            self.armed = True
        if self._on_open:
            self._on_open()

    def close(self, trailer: dict = None) -> None:
        with self._lock:
            if trailer and trailer.get("drops") is not None:
                self.dropped = dict(trailer["drops"])
            self.closed = True

    def write_rows(self, ctype: int, rows: list) -> None:
        if ctype == Chunk.STATUS:
            with self._lock:
                for r in rows:
                    self.dropped = dict(r.get("drops") or {})
                    if r.get("targets") is not None:
                        self._set_targets(r["targets"])
        elif ctype == Chunk.GPU_EVENTS and not self._xid_from_bpf:
            with self._lock:
                for r in rows:
                    if r.get("type") == "xid":
                        self.xids[(str(r.get("gpu")), str(r.get("code")))] += 1
        elif ctype == Chunk.CLOCK_INFO:
            with self._lock:
                for r in rows:
                    if isinstance(r, dict) and str(r.get("domain", "")).startswith("GPU"):
                        self._ticks[r["domain"][3:]] = int(r.get("tick_ns") or 0)

    def write_columns(self, ctype: int, cols: dict) -> None:
        if ctype == Chunk.EVENTS:
            with self._lock:
                self._events(cols)
        elif ctype == Chunk.COUNTERS:
            with self._lock:
                self._counters(cols)
        elif ctype == Chunk.GPU_CLOCK:
            self._gpu_clock(cols)

    # ------------------------------------------------------------- targets
    def _set_targets(self, pids, now_ns=None):
        """The tgids attached now (the recorder's STATUS rows say, each second and at once
        when --follow attaches or loses one): counts arrivals and exits, gives each new one
        its series at 0, and forgets the series of those that exited EXITED_KEEP_NS ago."""
        now_ns = time.monotonic_ns() if now_ns is None else now_ns
        now = {int(p) for p in pids}
        new, gone = now - self.targets, self.targets - now
        self.target_exits += len(gone)
        self.targets_attached += len(new)
        self.targets = now
        for pid in gone:
            self._exited[str(pid)] = now_ns
        for pid in new:
            self._exited.pop(str(pid), None)        # a reused pid continues its series
        for label, t in list(self._exited.items()):
            if now_ns - t >= EXITED_KEEP_NS:        # before the new ones take their slots
                self._forget(label)
        for pid in sorted(new):
            self._zero_series(pid)

    def _forget(self, label):
        """Every series of one exited pid goes (each pid-labelled family's first label)."""
        del self._exited[label]
        if label == OTHER or label not in self._pid.seen:
            return
        for series in (self.cuda_calls, self.offcpu_in_cuda_ns, self.connects,
                       self.tcp_resets, self.tcp_retransmits, self.alloc_failures,
                       self.fragmentation, self.fragmentation_unjudged):
            for key in [k for k in series if k[0] == label]:
                del series[key]
        self._pid.release(label)
        self.pids_forgotten += 1

    def _zero_series(self, pid):
        """Series whose label values are known once a process is attached, at 0: a counter
        that first appears already at N is no increase to rate()/increase(), so without
        them the first burst (the first preemption, reset or refused allocation) of every
        process would be invisible to the shipped rules.  Peers, error names and Xid
        codes are not known in advance (the rules catch a series' first value instead)."""
        label = self._pid(str(pid))
        if label == OTHER:
            return
        if "-DCA_SCHED" in self._cflags:
            for state in ("preempted", "blocked"):
                self.offcpu_in_cuda_ns[(label, state)] += 0
        if "-DCA_TCP" in self._cflags:
            self.tcp_retransmits[(label,)] += 0
            for direction in ("sent", "received"):
                self.tcp_resets[(label, direction)] += 0
        if "-DCA_CUDA" in self._cflags:
            for fid in ALLOC_IDS.tolist():
                self.alloc_failures[(label, cuda_api.function_name(fid))] += 0
            for g in self.gpus:
                self.fragmentation[(label, str(g["index"]))] += 0

    # ------------------------------------------------------------- events
    def _events(self, c):
        kind = np.asarray(c["kind"])
        if not len(kind):
            return
        present = {}
        for k, n in zip(*np.unique(kind, return_counts=True)):
            self.events[KIND_NAMES.get(int(k), str(k))] += int(n)
            present[int(k)] = int(n)
        # each kind's row numbers (a batch of one kind, the usual launch-heavy one, is taken
        # whole: no gather of its columns)
        sel = {k: np.flatnonzero(kind == k) if 0 < present.get(k, 0) < len(kind)
               else np.arange(present.get(k, 0))
               for k in (Kind.CUDA, Kind.SCHED, Kind.CONNECT, Kind.TCP, Kind.XID) + ENTRY_KINDS}

        def rows(k, fields):
            whole = present.get(k) == len(kind)
            return {f: np.asarray(c[f]) if whole else np.asarray(c[f])[sel[k]] for f in fields}
        if present.get(Kind.CUDA):
            self._cuda(rows(Kind.CUDA, ("ts", "dur", "pid", "code", "ret", "a0", "a1", "a2",
                                        "a3", "a4")))
        for k in ENTRY_KINDS:
            if present.get(k):
                self._cuda_entries(rows(k, ("ts", "pid", "code")))
        if present.get(Kind.SCHED):
            self._sched(rows(Kind.SCHED, ("dur", "pid", "code", "a0", "a3")))
        for i in sel[Kind.CONNECT]:
            self._connect(int(c["pid"][i]), int(c["ret"][i]), int(c["dur"][i]),
                          decode_sockaddr(c["data"][i], c["a1"][i]))
        for i in sel[Kind.TCP]:
            pid, code = self._pid(str(int(c["pid"][i]))), int(c["code"][i])
            if code == TcpCode.RETRANSMIT:
                self.tcp_retransmits[(pid,)] += 1
            elif code in (TcpCode.RESET_SENT, TcpCode.RESET_RECEIVED):
                self.tcp_resets[(pid, "sent" if code == TcpCode.RESET_SENT
                                 else "received")] += 1
        for i in sel[Kind.XID]:
            dev = cstring(c["data"][i], 0, 16)
            gpu = self._pci.get(bus_key(dev))
            self.xids[(str(gpu) if gpu is not None else dev or "unknown",
                       str(int(c["ret"][i])))] += 1

    def _cuda(self, e):
        self._latest_ns = max(self._latest_ns, int(e["ts"].max()))
        self.cuda_calls_seen += len(e["ts"])
        for (pid, fid, ret), n in _call_counts(e["pid"], e["code"], e["ret"]):
            self.cuda_calls[(self._pid(str(pid)), cuda_api.function_name(fid),
                             self._result(cuda_result_name(ret)))] += n
        for fid in np.unique(e["code"]).tolist():
            m = e["code"] == fid
            name = cuda_api.function_name(fid)
            h = self.cuda_duration.get(name)
            if h is None:
                h = self.cuda_duration[name] = Histogram(CUDA_CALL_BOUNDS_NS)
            h.observe(e["dur"][m].astype(np.int64))
            if fid in MODULE_IDS:
                self.module_load.observe(e["dur"][m].astype(np.int64))
        self._judge_stale()
        failed = np.flatnonzero(np.isin(e["code"], ALLOC_IDS) & (e["ret"] != 0))
        for i in failed.tolist():
            fid, pid = int(e["code"][i]), self._pid(str(int(e["pid"][i])))
            self.alloc_failures[(pid, cuda_api.function_name(fid))] += 1
            if int(e["ret"][i]) == OOM:
                self._alloc_refused(pid, fid, e, i)

    def _cuda_entries(self, e):
        """Calls recorded at their entry only (record --cuda-returns blocking): counted as
        calls, result ENTRY_ONLY; no duration to observe."""
        self._latest_ns = max(self._latest_ns, int(e["ts"].max()))
        self.cuda_calls_seen += len(e["ts"])
        for (pid, fid, _), n in _call_counts(e["pid"], e["code"], np.zeros(len(e["ts"]),
                                                                           np.int32)):
            self.cuda_calls[(self._pid(str(pid)), cuda_api.function_name(fid), ENTRY_ONLY)] += n

    def _sched(self, e):
        inside = e["a3"] != 0
        for pid, preempted, dur in zip(e["pid"][inside].tolist(), e["code"][inside].tolist(),
                                       e["dur"][inside].tolist()):
            self.offcpu_in_cuda_ns[(self._pid(str(pid)),
                                    "preempted" if preempted else "blocked")] += dur
        woke = e["a0"] > 0
        self.wakeup.observe(e["a0"][woke].astype(np.int64))

    def _connect(self, pid, ret, dur, peer):
        result = ("ok" if ret == 0 else KNOWN_PROBE if benign.match_connect(peer, -ret)
                  else self._result(errno_name(ret)))
        peer = self._peer(peer)
        self.connects[(self._pid(str(pid)), peer, result)] += 1
        h = self.connect_duration.get(peer)
        if h is None:
            h = self.connect_duration[peer] = Histogram(CONNECT_BOUNDS_NS)
        h.observe([dur])

    # ------------------------------------------------------------- fragmentation
    def _alloc_gpu(self, fid, e, i):
        """The GPU an allocation was for: its device argument, or the only GPU; None when
        it cannot be known (several GPUs, the current context's device not recorded)."""
        slot = _DEVICE_SLOT.get(fid)
        if slot is not None:
            dev = int(e[f"a{slot}"][i])
            return str(dev) if any(g["index"] == dev for g in self.gpus) else None
        return str(self.gpus[0]["index"]) if len(self.gpus) == 1 else None

    def _alloc_refused(self, pid, fid, e, i):
        gpu = self._alloc_gpu(fid, e, i)
        if gpu is None:
            self.fragmentation_unjudged[(pid, "no GPU" if not self.gpus else "device unknown")] \
                += 1
            return
        slot = _BYTES_SLOT[fid]
        entry = int(e["ts"][i])
        item = (pid, gpu, entry, entry + int(e["dur"][i]), int(e[f"a{slot}"][i]))
        if len(self._pending) >= MAX_PENDING:
            self._pending.popleft()
            self.own_drops["fragmentation_pending"] += 1
        self._pending.append(item)
        self._judge_pending()

    def _judge_stale(self):
        if self._pending and self._latest_ns - self._pending[0][3] > STALE_NS:
            self._judge_pending()

    def _judge_pending(self):
        """Judge every waiting failure whose GPU has a free-memory sample taken entirely
        after the call returned: fragmentation when the sample before the call and the
        one after both showed at least the bytes asked for."""
        keep = collections.deque()
        for pid, gpu, entry, end, nbytes in self._pending:
            samples = self._free.get(gpu)
            after = next((s for s in samples if s[0] >= end), None) if samples else None
            if after is None:
                if self._latest_ns - end > STALE_NS:
                    self.fragmentation_unjudged[(pid, "no sample after")] += 1
                else:
                    keep.append((pid, gpu, entry, end, nbytes))
                continue
            before = next((s for s in reversed(samples) if s[1] <= entry), None)
            if before is None:
                self.fragmentation_unjudged[(pid, "no sample before")] += 1
            elif before[2] >= nbytes and after[2] >= nbytes:
                self.fragmentation[(pid, gpu)] += 1
        self._pending = keep

    # ------------------------------------------------------------- counters and clocks
    def _counters(self, c):
        gpu, field = np.asarray(c["gpu"]), np.asarray(c["field"])
        value, recv = np.asarray(c["value"]), np.asarray(c["recv_mono_ns"])
        lat = np.asarray(c["latency_ns"])
        for g, f, v, t in zip(gpu.tolist(), field.tolist(), value.tolist(), recv.tolist()):
            self.counters[(g, f)] = (v, t)
        free = np.flatnonzero(field == MEM_FREE)
        for i in free.tolist():
            # the value was taken at most latency_ns before the recorder received it
            d = self._free.setdefault(str(int(gpu[i])), collections.deque(maxlen=FREE_SAMPLES))
            d.append((int(recv[i]) - int(lat[i]), int(recv[i]), int(value[i])))
        if len(free) and self._pending:
            self._judge_pending()

    def preload(self):
        """Called by the recorder before the probes fire: align imports scipy.optimize
        (~0.3 s holding the GIL in stretches), which at the first GPU clock chunk would
        stall the recording mid-run (capture/helpers.py preload says why that matters)."""
        from .. import align  # noqa: F401

    def _gpu_clock(self, c):
        """Fit each GPU's recent sandwiches (align/, the same fit as the run file's) and keep
        the uncertainty of mapping its latest reading."""
        from ..align import fit_sandwiches
        gpus = np.asarray(c["gpu"])
        for g in np.unique(gpus).tolist():
            m = gpus == g
            with self._lock:
                d = self._clock.setdefault(str(g), collections.deque(maxlen=CLOCK_CHUNKS))
                d.append(tuple(np.asarray(c[k])[m].astype(np.int64) for k in ("t0", "remote",
                                                                               "t1")))
                t0, remote, t1 = (np.concatenate([x[j] for x in d]) for j in range(3))
                tick = self._ticks.get(str(g), 0)
            if len(t0) < 2:
                continue
            try:
                model = fit_sandwiches(t0, remote, t1, tick_ns=tick)
                _, unc = model.map(remote[-1:])
            except Exception:            # a failed fit leaves the previous value
                with self._lock:
                    self.clock_errors += 1
                continue
            with self._lock:
                self.clock_unc_ns[str(g)] = int(unc[0])

    # ------------------------------------------------------------- reading
    def snapshot(self) -> dict:
        """Copies of every total, taken under the lock (the collector formats them)."""
        with self._lock:
            return {
                "cuda_calls": dict(self.cuda_calls),
                "cuda_duration": {k: h.copy() for k, h in self.cuda_duration.items()},
                "offcpu_in_cuda_ns": dict(self.offcpu_in_cuda_ns),
                "wakeup": self.wakeup.copy(),
                "connects": dict(self.connects),
                "connect_duration": {k: h.copy() for k, h in self.connect_duration.items()},
                "tcp_resets": dict(self.tcp_resets),
                "tcp_retransmits": dict(self.tcp_retransmits),
                "alloc_failures": dict(self.alloc_failures),
                "fragmentation": dict(self.fragmentation),
                "fragmentation_unjudged": dict(self.fragmentation_unjudged),
                "module_load": self.module_load.copy(),
                "xids": dict(self.xids),
                "events": dict(self.events),
                "dropped": {**self.dropped, **self.own_drops},
                "counters": dict(self.counters),
                "clock_unc_ns": dict(self.clock_unc_ns),
                "gpus": list(self.gpus),
                "armed": self.armed and not self.closed,
                "cuda_share": self.cuda_share,
                "targets": len(self.targets), "targets_attached": self.targets_attached,
                "target_exits": self.target_exits, "pids_forgotten": self.pids_forgotten,
                "cuda_calls_seen": self.cuda_calls_seen,
                "folded": {"pid": self._pid.folded, "peer": self._peer.folded,
                           "result": self._result.folded},
            }

    def status_text(self) -> str:
        with self._lock:
            calls = self.cuda_calls_seen
            failed = sum(n for (_, _, r), n in self.cuda_calls.items()
                         if r not in ("CUDA_SUCCESS", ENTRY_ONLY))
            allocs = sum(self.alloc_failures.values())
        return (f"cuda calls {calls} ({failed} failed, {allocs} allocation failures)  "
                f"scrapes {self.scrapes}")


def reasons_active(mask: float) -> dict:
    """{reason name: 1 or 0} for every clock event reason bit (PromQL has no bitwise and)."""
    m = int(mask)
    return {name: int(bool(m & bit)) for bit, name in CLOCK_REASONS.items()}
