"""Timeline: one run file with every clock domain put on MONOTONIC.

BPF events are already on MONOTONIC; counter samples (REALTIME) and GPU clocks are mapped
through the alignment models of clockalign.align, each mapped time with its uncertainty.

    tl = Timeline.open("run.ca")
    for ev in tl.iter_events(kinds=["cuda"], window=(tl.start_ns, tl.start_ns + 10**9)):
        ...
    c = tl.counters(fields=["sm_clock"])
    for f in tl.faults(): print(f.kind, f.name, f.t_ns, f.unc_ns)

Decoding: each pass over the events decodes every EVENTS chunk once, and the first full pass
of any query also gathers what the Timeline needs of the whole run (its span and thread
names; the events faults are made of, timeline/fault_events.Collector), so those cost no
pass of their own.  Clock sandwiches and counter samples (``columns``) are decoded once
and kept: they grow with the run's length, not with its events.  ``reader.decodes``
counts the chunks decoded.
"""
import numpy as np

from ..errors import ClockalignError
from ..store.counter_fields import FIELD_BY_NAME, FIELDS
from ..store.devices import Devices
from ..store.reader import RunReader
from ..store.schema import Chunk, Kind
from .events import TIMELINE_DTYPE, decode_xid, select, to_timeline
from .fault_events import Collector
from .folds import CALL_DTYPE, CallsFold, IndexFold  # noqa: F401  (CALL_DTYPE: cuda_calls' layout)
from .heap import bounded_heap

COUNTER_DTYPE = np.dtype([
    ("gpu", "u1"),
    ("field", "<u2"),
    ("t_ns", "<i8"),
    ("unc_ns", "<i8"),
    ("value", "<f8"),
    ("window_ns", "<i8"),
])

REFERENCE = "MONOTONIC"
SIDE_CHUNKS = (Chunk.CPU_CLOCK, Chunk.GPU_CLOCK, Chunk.COUNTERS)

class Timeline:
    """Query API over one run (see docs/timeline-api.md for the contract)."""

    def __init__(self, reader: RunReader, models: dict = None):
        bounded_heap()
        self.reader = reader
        self.path = reader.path
        self.meta = reader.meta
        self.truncated = reader.truncated
        self._models = models
        self._index = None
        self._fault_data = None
        self._side = {}
        self._faults = None
        self._gpu_events = None
        self._calls = None
        self._gpu_activity = (None, None)     # (the fields asked for, GpuActivity)
        self._spool = None                    # timeline/spool.EventSpool, if asked for
        self._devices = None
        self._fit_error = None
        self._fit_failures = {}
        self.notes = []
        self.benign = []      # timeline/benign.py's notes, one a rule; set by faults()

    @classmethod
    def open(cls, path, models: dict = None) -> "Timeline":
        """Read ``path`` (NotARunFile / UnsupportedVersion raised here; a truncated file
        opens, with ``truncated`` set).  ``models`` overrides align.fit_run (tests)."""
        return cls(RunReader(path), models)

    # ------------------------------------------------------------------ clocks
    @property
    def models(self) -> dict:
        """{domain: model} fitted by clockalign.align.fit_run (empty if the run has no
        clock samples, or if this installation has no align module)."""
        if self._models is None:
            try:
                from ..align import fit_run
            except ImportError:
                self._models = {}
                self.notes.append("clockalign.align.fit_run is not available: only MONOTONIC "
                                  "stamps are usable, other domains are not mapped")
            else:
                try:
                    fits = fit_run(self)
                except ClockalignError as e:
                    # BPF stamps are MONOTONIC already: faults and events stay usable
                    self._models = {}
                    self._fit_error = str(e)
                    self.notes.append(f"clock fit failed ({e}): no domain is mapped")
                    return self._models
                self._models = dict(fits)
                # one domain that does not fit leaves the others mapped; BPF stamps are
                # MONOTONIC already, so events and faults stay usable either way
                self._fit_failures = dict(fits.failed)
                for name, why in fits.failed.items():
                    self.notes.append(f"the {name} clock fit failed ({why}): {name} times are "
                                      "not mapped; the other domains are")
        return self._models

    @property
    def fit_failures(self) -> dict:
        """{domain: why its clock fit failed}; every other domain is in ``models``."""
        self.models
        return dict(self._fit_failures)

    def map(self, domain: str, remote_ns, stamp_unc_ns=None):
        """Map timestamps of ``domain`` onto MONOTONIC -> (t_ns int64, unc_ns int64).

        ``stamp_unc_ns`` is how uncertain the remote stamps are themselves (added to the
        model's own uncertainty).  Scalars in, scalars out; arrays in, arrays out.
        """
        scalar = np.ndim(remote_ns) == 0
        remote = np.atleast_1d(np.asarray(remote_ns, dtype=np.int64))
        stamp = None if stamp_unc_ns is None else np.broadcast_to(
            np.asarray(stamp_unc_ns, dtype=np.int64), remote.shape)
        if domain == REFERENCE:
            t = remote.copy()
            u = np.zeros_like(t) if stamp is None else np.array(stamp, dtype=np.int64)
        else:
            model = self.models.get(domain)
            if model is None:
                if self._fit_error:
                    raise ClockalignError(f"cannot map {domain} times of {self.path}: the clock "
                                          f"fit failed ({self._fit_error})")
                if domain in self.fit_failures:
                    raise ClockalignError(f"cannot map {domain} times of {self.path}: the "
                                          f"{domain} clock fit failed "
                                          f"({self.fit_failures[domain]})")
                have = ", ".join(sorted(self.models)) or "none"
                raise ClockalignError(f"{self.path} has no {domain} clock samples to map with "
                                      f"(domains fitted: {have})")
            t, u = model.map(remote, stamp_unc_ns=stamp)
            t = np.asarray(t, dtype=np.int64)
            u = np.asarray(u, dtype=np.int64)
        if scalar:
            return int(t[0]), int(u[0])
        return t, u

    # ------------------------------------------------------------------ decoding
    def columns(self, ctype) -> dict:
        """{name: ndarray} of every chunk of a side type (SIDE_CHUNKS: CPU and GPU clock
        sandwiches, counter samples), decoded once and kept."""
        if ctype not in SIDE_CHUNKS:
            raise ValueError(f"Timeline.columns serves {SIDE_CHUNKS}, not {ctype!r}: "
                             "events stream through iter_events")
        if ctype not in self._side:
            self._side[ctype] = self.reader.columns(ctype)
        return self._side[ctype]

    def rows(self, ctype) -> list:
        """The rows of a row chunk type (THREADS, CLOCK_INFO, ...), as the reader has them."""
        return self.reader.rows(ctype)

    def spool(self, directory=None) -> bool:
        """Keep the events of the first full pass decoded in a temporary file in
        ``directory`` (timeline/spool.py), so that the passes after it read them back
        instead of decoding every chunk again: for a command that reads the events twice
        (export).  False where the first pass is over already."""
        if self._index is not None or self._spool is not None:
            return self._spool is not None and not self._spool.state == "off"
        from .spool import EventSpool
        self._spool = EventSpool(directory, self.reader.count_rows(Chunk.EVENTS))
        return True

    def _chunks(self):
        """(i, EVENT_DTYPE) of every EVENTS chunk: from the spool once it is written,
        else decoded (and spooled, on the pass that writes it)."""
        sp = self._spool
        if sp is not None and sp.done:
            yield from sp.chunks()
            return
        writing = sp is not None and sp.begin()
        complete = False
        try:
            for i, ev in enumerate(self.reader.iter_events()):
                if writing and sp.writing():
                    sp.add(ev)
                yield i, ev
            complete = True
        finally:
            if writing:
                if complete and sp.writing():
                    sp.finish()
                else:
                    sp.abandon()

    def event_chunks(self, want=None):
        """The events of each EVENTS chunk, read by field name (ev["ts"], ev["ret"]...),
        skipping chunk i undecoded where ``want(i)`` is False: for a partial pass (the
        fault chains' second one), from the spool where there is one (EVENT_DTYPE, XID_MSG
        parts taken out), else decoded (reader.iter_columns: the chunk as it is)."""
        sp = self._spool
        if sp is not None and sp.done:
            for _, ev in sp.chunks(want):
                yield ev
            return
        yield from self.reader.iter_columns(Chunk.EVENTS, want)

    def _raw_events(self):
        """Every EVENTS chunk as EVENT_DTYPE (XID_MSG parts taken out), decoded once; the
        whole-run folds still missing ride along and are kept once the pass reaches the
        end (a pass left early keeps nothing)."""
        folds = []
        if self._index is None:
            folds.append(("_index", IndexFold(self)))
        if self._fault_data is None:
            folds.append(("_fault_data", Collector()))
        if self._calls is None and Chunk.GPU_ACTIVITY in self.reader.chunk_types():
            folds.append(("_calls", CallsFold(self.reader)))
        for _, ev in self._chunks():
            for _, f in folds:
                f.feed(ev)
            yield ev
        for attr, f in folds:
            if getattr(self, attr) is None:      # a nested pass may have finished first
                setattr(self, attr, f.result())

    def _whole_pass(self):
        for _ in self._raw_events():
            pass

    def _ensure_index(self):
        """Span of the run and thread names, from the first full pass over the events."""
        if self._index is None:
            self._whole_pass()
        return self._index

    def fault_events(self) -> dict:
        """The events faults are made of (timeline/fault_events.Collector), from the first
        full pass over the events."""
        if self._fault_data is None:
            self._whole_pass()
        return self._fault_data

    @property
    def start_ns(self) -> int:
        """MONOTONIC time of the first thing recorded (0 for a run with nothing in it)."""
        return self._ensure_index()["start"]

    @property
    def end_ns(self) -> int:
        """MONOTONIC time of the last thing recorded (the trailer if the run ended cleanly)."""
        return self._ensure_index()["end"]

    @property
    def threads(self) -> dict:
        """{tid: comm}: the last name each thread had in the run."""
        return {tid: hist[-1][1] for tid, hist in self._ensure_index()["names"].items()}

    @property
    def thread_pids(self) -> dict:
        """{tid: pid (tgid)} for every thread seen by name."""
        return dict(self._ensure_index()["pids"])

    def thread_name(self, tid, t_ns=None):
        """The thread's name at ``t_ns`` (its first known name if it was renamed later;
        its last name when t_ns is None); None if the thread was never named."""
        hist = self._ensure_index()["names"].get(int(tid)) if tid is not None else None
        if not hist:
            return None
        if t_ns is None:
            return hist[-1][1]
        name = hist[0][1]
        for t, comm in hist:
            if t <= t_ns:
                name = comm
            else:
                break
        return name

    def cuda_calls(self, keep: bool = True) -> np.ndarray:
        """The run's CUDA calls as CALL_DTYPE (t_ns, dur_ns, tid, code; 22 bytes a call), in
        file order, from the first full pass over the events of a run with GPU activity
        (what joins an execution to its launching call).  A call seen at its entry only
        (--cuda-returns blocking) has dur_ns -1: its return is unknown.  ``keep=False``:
        the Timeline lets them go (the GPU activity join, their one reader, has them)."""
        if self._calls is None and Chunk.GPU_ACTIVITY in self.reader.chunk_types():
            self._whole_pass()
        if self._calls is None or self._calls is False:
            fold = CallsFold(self.reader)        # a pass of their own
            for ev in self.reader.iter_events():
                fold.feed(ev)
            return fold.result()
        calls = self._calls
        if not keep:
            self._calls = False      # given away: a later ask reads the events again
        return calls

    # ------------------------------------------------------------------ events
    def iter_events(self, kinds=None, window=None, tids=None):
        """Yield TIMELINE_DTYPE arrays, one per EVENTS chunk (file order, bounded memory)."""
        for ev in self._raw_events():
            tev = to_timeline(ev)
            keep = select(tev, kinds, window, tids)
            if keep.any():
                yield tev[keep]

    def events(self, kinds=None, window=None, tids=None, gpu=None) -> np.ndarray:
        """All matching events as one TIMELINE_DTYPE array sorted by t_ns.

        ``gpu=n`` keeps only events that name a device, i.e. XID events of GPU n (CUDA
        events do not say which device a call went to).
        """
        parts = list(self.iter_events(kinds, window, tids))
        ev = np.concatenate(parts) if parts else np.zeros(0, dtype=TIMELINE_DTYPE)
        if gpu is not None:
            keep = np.zeros(len(ev), dtype=bool)
            for i in np.flatnonzero(ev["kind"] == Kind.XID):
                keep[i] = self.gpu_of_pci(decode_xid(ev["data"][i])[0]) == int(gpu)
            ev = ev[keep]
        return ev[np.argsort(ev["t_ns"], kind="stable")]

    def xid_text(self, ev) -> tuple:
        """(dev, whole message, whole?) of an XID row that this timeline has yielded."""
        return self.reader.xid_messages.of(ev)

    # ------------------------------------------------------------------ GPUs
    @property
    def devices(self) -> Devices:
        """The run's GPUs, one name (GPU<n>) and bus id each (store/devices.py)."""
        if self._devices is None:
            self._devices = Devices.from_meta(self.meta, self.reader.rows(Chunk.CLOCK_INFO))
        return self._devices

    def gpu_of_pci(self, name):
        """n of the GPU<n> at PCI address ``name`` (any spelling: the Xid tracepoint's,
        NVML's); if the run saw exactly one GPU that one; None if unknown."""
        d = self.devices.by_bus(name)
        if d is None and len(self.devices) == 1:
            d = self.devices.all[0]
        return None if d is None else d.number

    def gpu_events(self) -> list:
        """GPU_EVENTS rows (NVML/DCGM, stamped on receipt) with ``t_ns``/``unc_ns`` on
        MONOTONIC and the ``domain`` the time came from."""
        if self._gpu_events is not None:
            return self._gpu_events
        out = []
        for row in self.reader.rows(Chunk.GPU_EVENTS):
            r = dict(row)
            unc = int(r.get("unc_ns") or 0)
            if r.get("t_mono_ns") is not None:
                r["t_ns"], r["unc_ns"], r["domain"] = int(r["t_mono_ns"]), unc, REFERENCE
            elif r.get("t_real_ns") is not None and "REALTIME" in self.models:
                r["t_ns"], r["unc_ns"] = self.map("REALTIME", int(r["t_real_ns"]), unc)
                r["domain"] = "REALTIME"
            elif r.get("recv_mono_ns") is not None:
                # no REALTIME model: the receipt, no earlier than the event itself
                r["t_ns"], r["unc_ns"], r["domain"] = int(r["recv_mono_ns"]), unc, "receipt"
            else:
                continue
            out.append(r)
        self._gpu_events = out
        return out

    def gpu_activity(self, fields=None):
        """GPU kernels, copies and memsets (record --gpu-activity) on MONOTONIC with their
        uncertainty and launching call: timeline/gpu_activity.GpuActivity (cached).
        ``fields``: only these ACTIVITY_DTYPE fields, as narrow columns (gpu_table.Table):
        a fraction of the memory of the whole rows, for a reader that needs a few."""
        key = None if fields is None else tuple(fields)
        if self._gpu_activity[0] != key or self._gpu_activity[1] is None:
            from .gpu_activity import load
            self._gpu_activity = (key, None)         # the previous one let go first
            acts = load(self, fields)
            self._gpu_activity = (key, acts)
            self.notes.extend(n for n in acts.notes if n not in self.notes)
        return self._gpu_activity[1]

    # ------------------------------------------------------------------ counters
    def counters(self, gpu=None, fields=None) -> np.ndarray:
        """Counter samples on MONOTONIC: COUNTER_DTYPE (gpu, field, t_ns, unc_ns, value,
        window_ns), sorted by (gpu, field, t_ns).  ``fields``: ids or names.

        t_real_ns goes through the REALTIME model with the sample's latency_ns as its stamp
        uncertainty.  With no REALTIME model the time is the receipt (recv_mono_ns), and
        unc_ns covers how much older than its receipt the sample was by its own REALTIME
        stamps (relative to the freshest sample) plus latency_ns; see ``notes``.
        """
        want = None
        if fields is not None:
            if isinstance(fields, (int, str)):
                fields = [fields]
            want = []
            for f in fields:
                if isinstance(f, str):
                    if f not in FIELD_BY_NAME:
                        raise ValueError(f"unknown counter field {f!r}")
                    want.append(FIELD_BY_NAME[f])
                else:
                    want.append(int(f))
        cols = self.columns(Chunk.COUNTERS)
        if not cols:
            return np.zeros(0, dtype=COUNTER_DTYPE)
        keep = np.ones(len(cols["gpu"]), dtype=bool)
        if gpu is not None:
            keep &= cols["gpu"] == int(gpu)
        if want is not None:
            keep &= np.isin(cols["field"], np.asarray(want, dtype=np.uint16))
        out = np.zeros(int(keep.sum()), dtype=COUNTER_DTYPE)
        if not len(out):
            return out
        cols = {k: np.asarray(v)[keep] for k, v in cols.items()}
        latency = cols["latency_ns"].astype(np.int64)
        t_real = cols["t_real_ns"].astype(np.int64)
        if "REALTIME" in self.models:
            t, u = self.map("REALTIME", t_real, latency)
        else:
            recv = cols["recv_mono_ns"].astype(np.int64)
            age = np.maximum(recv - t_real - self._freshest_receipt(), 0)
            t, u = recv, age + latency
            note = ("no REALTIME clock samples: counter times are receipt times (recv_mono_ns); "
                    "their uncertainty is the sample's age at receipt relative to the freshest "
                    "sample plus its latency, and excludes the freshest sample's own delay")
            if note not in self.notes:
                self.notes.append(note)
        out["gpu"] = cols["gpu"]
        out["field"] = cols["field"]
        out["t_ns"] = t
        out["unc_ns"] = u
        out["value"] = cols["value"]
        out["window_ns"] = cols["window_ns"]
        return out[np.lexsort((out["t_ns"], out["field"], out["gpu"]))]

    def _freshest_receipt(self) -> int:
        """min(recv_mono_ns - t_real_ns) over every counter row of the run (mixed clocks:
        only differences from it mean something)."""
        cols = self.columns(Chunk.COUNTERS)
        d = cols["recv_mono_ns"].astype(np.int64) - cols["t_real_ns"].astype(np.int64)
        return int(d.min()) if len(d) else 0

    @staticmethod
    def field_name(fid: int) -> str:
        return FIELDS.get(int(fid), (f"field {int(fid)}",))[0]

    # ------------------------------------------------------------------ faults
    def faults(self, kinds=None) -> list:
        """Faults of every source, merged (one Xid seen twice is one Fault), time order.

        ``kinds``: keep only these fault kinds ('cuda_error', 'xid', ...).
        """
        if self._faults is None:
            from .faults import find_faults
            self._faults = find_faults(self)
        if kinds is None:
            return list(self._faults)
        if isinstance(kinds, str):
            kinds = [kinds]
        return [f for f in self._faults if f.kind in set(kinds)]
