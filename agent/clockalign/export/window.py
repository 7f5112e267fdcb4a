"""What part of a run an export writes: a time window, pids and kinds (export --from/--to,
--pid, --kind).  pipeline.export applies one Selection to everything it writes, so every
format gets the same part.

    sel = Selection.parse(tl, start="12.5", end="14", pids=[1234], kinds=["cuda", "gpu_kernel"])
    keep = sel.events(tev)           # mask over a TIMELINE_DTYPE chunk

Times: a decimal number is seconds since the run's start (``12.5``); an integer with an
``ns`` suffix is an absolute CLOCK_MONOTONIC time (``123456789012ns``).  The window is
[from, to): an instant is kept when from <= t < to; a slice (CUDA call, off-CPU interval,
GPU execution) is kept whole, unclipped, when it overlaps the window, so a slice crossing
an edge shows its true start and end.  Counter samples and fault instants are kept when
their time lies in the window; a flow is written only when both its ends are written.
Kinds: the event kinds of the dump (store/schema.KIND_NAMES: cuda, sched, connect, ...),
gpu_kernel, gpu_copy, gpu_memset, counters (the samples and the GPU clock bands) and faults.
Counters belong to a GPU, not a process: --pid leaves them out unless --kind counters asks
for them.
"""
import dataclasses
import re

import numpy as np

from ..errors import ClockalignError
from ..store.schema import KIND_NAMES, GpuKind, Kind

GPU_KINDS = {"gpu_kernel": GpuKind.KERNEL, "gpu_copy": GpuKind.MEMCPY,
             "gpu_memset": GpuKind.MEMSET}
OTHER_KINDS = ("counters", "faults")
# an Xid's message parts (XID_MSG) are folded into its XID event: --kind xid has them
_EVENT_KINDS = {name: int(k) for k, name in KIND_NAMES.items() if k != Kind.XID_MSG}
KIND_CHOICES = tuple(_EVENT_KINDS) + tuple(GPU_KINDS) + OTHER_KINDS
_NS = re.compile(r"^\s*(-?\d+)\s*ns\s*$")


def parse_time(text: str, run_start_ns: int, option: str) -> int:
    """``12.5`` (seconds since the run's start) or ``123456789012ns`` (MONOTONIC) -> ns."""
    m = _NS.match(str(text))
    if m:
        return int(m.group(1))
    try:
        s = float(text)
    except ValueError:
        s = float("nan")
    if not np.isfinite(s):
        raise ClockalignError(f"{option} {text!r} is not a time: give seconds since the run's "
                              "start (12.5) or a CLOCK_MONOTONIC time in ns (123456789012ns)")
    return run_start_ns + int(round(s * 1e9))


@dataclasses.dataclass
class Selection:
    """A window [start, end) in MONOTONIC ns (None: open) and pid/kind sets (None: all)."""

    start: int = None
    end: int = None
    pids: frozenset = None
    kinds: frozenset = None          # names of KIND_CHOICES

    @classmethod
    def parse(cls, tl, start=None, end=None, pids=None, kinds=None) -> "Selection":
        """From the CLI's texts; one ClockalignError sentence (exit 2) on bad input."""
        kinds = [k.lower() for k in kinds or ()]
        bad = [k for k in kinds if k not in KIND_CHOICES]
        if bad:
            raise ClockalignError(f"unknown --kind {bad[0]!r}; choose from "
                                  f"{', '.join(KIND_CHOICES)}")
        pids = list(pids or ())
        if any(int(p) <= 0 for p in pids):
            raise ClockalignError(f"--pid {min(pids)} is not a process id")
        t0 = t1 = None
        if start is not None or end is not None:
            tl.spool()        # the span needs the first pass: the export reads them again
            lo, hi = tl.start_ns, tl.end_ns
            t0 = None if start is None else parse_time(start, lo, "--from")
            t1 = None if end is None else parse_time(end, lo, "--to")
            for opt, t, text in (("--from", t0, start), ("--to", t1, end)):
                if t is not None and not lo <= t <= hi:
                    raise ClockalignError(
                        f"{opt} {text} lies outside the run, which spans 0 to "
                        f"{(hi - lo) / 1e9:.3f} s ({lo}ns to {hi}ns)")
            if t0 is not None and t1 is not None and t0 >= t1:
                raise ClockalignError(f"--from {start} is not before --to {end}")
        return cls(t0, t1, frozenset(int(p) for p in pids) or None, frozenset(kinds) or None)

    @property
    def everything(self) -> bool:
        return self.start is None and self.end is None and not self.pids and not self.kinds

    def _time(self, t, end=None) -> np.ndarray:
        keep = np.ones(len(t), dtype=bool)
        if self.end is not None:
            keep &= t < self.end
        if self.start is not None:
            keep &= (t if end is None else np.maximum(end, t)) >= self.start
        return keep

    def wants(self, kind: str) -> bool:
        return self.kinds is None or kind in self.kinds

    def events(self, ev) -> np.ndarray:
        """Mask over TIMELINE_DTYPE rows (span [t, t + dur] overlapping the window)."""
        keep = self._time(ev["t_ns"], ev["t_ns"] + np.maximum(ev["dur_ns"], 0))
        if self.pids:
            keep &= np.isin(ev["pid"], np.fromiter(self.pids, np.int64))
        if self.kinds is not None:
            want = [v for k, v in _EVENT_KINDS.items() if k in self.kinds]
            keep &= np.isin(ev["kind"], np.asarray(want, dtype=np.int64))
        return keep

    def gpu_activity(self, acts):
        """The GpuActivity rows selected (a copy of acts with fewer rows)."""
        r = acts.rows
        keep = self._time(r["t_ns"], r["end_ns"])
        if self.pids:
            keep &= np.isin(r["pid"], np.fromiter(self.pids, np.int64))
        if self.kinds is not None:
            want = [int(v) for k, v in GPU_KINDS.items() if k in self.kinds]
            keep &= np.isin(r["kind"], np.asarray(want, dtype=np.int64))
        return acts if keep.all() else dataclasses.replace(acts, rows=r[keep])

    @property
    def gpu_wide(self) -> bool:
        """Whether counters (samples and GPU clock bands, a GPU's, no process's) are wanted."""
        if self.pids:
            return bool(self.kinds) and "counters" in self.kinds
        return self.wants("counters")

    def counters(self, cnt):
        if cnt is None:
            return cnt
        return cnt[self._time(cnt["t_ns"])] if self.gpu_wide else cnt[:0]

    def band(self, t, u):
        """A GPU clock band's points in the window (a counter track: none unless gpu_wide)."""
        t, u = np.asarray(t, dtype=np.int64), np.asarray(u)
        keep = self._time(t) & self.gpu_wide
        return t[keep], u[keep]

    def faults(self, faults) -> list:
        """Faults at a time in the window, of a selected pid (a GPU's faults: no pid)."""
        if not self.wants("faults"):
            return []
        t = np.asarray([int(f.t_ns) for f in faults], dtype=np.int64)
        keep = self._time(t)
        return [f for f, k in zip(faults, keep.tolist())
                if k and (not self.pids or f.pid in self.pids)]

    def steps(self, faults, unmatched) -> list:
        """Chain steps drawn on a fault's track, those in the window."""
        if self.start is None and self.end is None:
            return unmatched
        t = np.asarray([int(faults[fi].chain[s]["t_ns"]) for fi, s, _ in unmatched],
                       dtype=np.int64)
        return [u for u, k in zip(unmatched, self._time(t).tolist()) if k]
