"""The clock snapshot a trace carries so it merges with traces Perfetto took itself.

From the run's CPU_CLOCK sandwiches (t0 = MONOTONIC, remote, t1 = MONOTONIC) the
tightest REALTIME sandwich gives one instant: MONOTONIC = its midpoint, REALTIME = remote.
BOOTTIME at that instant comes from the tightest BOOTTIME sandwich (BOOTTIME - MONOTONIC
only changes across a suspend); a run without BOOTTIME sandwiches states that it assumed
BOOTTIME = MONOTONIC.  The half-width of each sandwich is its uncertainty.

    snap = clock_snapshot(tl)
    snap.clocks            # [(BUILTIN_CLOCK_BOOTTIME, ns), (..MONOTONIC, ns), (..REALTIME, ns)]

gpu_clock_bands(tl) gives each fitted GPU clock's band over time, drawn as a counter track.
"""
import dataclasses

import numpy as np

from ..align.stats import int_grid
from ..store.schema import Chunk, ClockDomain

# Perfetto BuiltinClock ids (perfetto_trace_pb2.BuiltinClock), fixed by Perfetto.
REALTIME, MONOTONIC, BOOTTIME = 1, 3, 6


@dataclasses.dataclass
class Snapshot:
    clocks: list                    # [(builtin clock id, ns)]
    halfwidth_ns: dict              # domain name -> sandwich half-width
    notes: list

    def describe(self) -> str:
        names = {REALTIME: "REALTIME", MONOTONIC: "MONOTONIC", BOOTTIME: "BOOTTIME"}
        parts = [f"{names[c]}={t}" for c, t in self.clocks]
        hw = ", ".join(f"{k} ±{v} ns" for k, v in self.halfwidth_ns.items())
        return " ".join(parts) + (f" ({hw})" if hw else "") + "".join(
            f"; {n}" for n in self.notes)


def _tightest(cols, domain):
    sel = np.flatnonzero(cols["domain"] == int(domain)) if len(cols) else np.zeros(0, int)
    if not len(sel):
        return None
    w = cols["t1"][sel] - cols["t0"][sel]
    i = sel[int(np.argmin(w))]
    t0, r, t1 = int(cols["t0"][i]), int(cols["remote"][i]), int(cols["t1"][i])
    return t0 + (t1 - t0) // 2, r, (t1 - t0 + 1) // 2


def clock_snapshot(tl) -> Snapshot:
    cols = tl.columns(Chunk.CPU_CLOCK)
    notes = []
    rt = _tightest(cols, ClockDomain.REALTIME) if cols else None
    bt = _tightest(cols, ClockDomain.BOOTTIME) if cols else None
    if rt is not None:
        mono, real, hw_r = rt
    else:
        mono = int(tl.start_ns or 0)
        real, hw_r = None, None
        notes.append("no REALTIME sandwich in the run: REALTIME left out")
    if bt is not None:
        mid_b, boot, hw_b = bt
        boot = boot + (mono - mid_b)
    else:
        boot, hw_b = mono, None
        notes.append("no BOOTTIME sandwich in the run: BOOTTIME assumed equal to MONOTONIC")
    clocks = [(BOOTTIME, boot), (MONOTONIC, mono)]
    if real is not None:
        clocks.append((REALTIME, real))
    hw = {}
    if hw_r is not None:
        hw["REALTIME"] = hw_r
    if hw_b is not None:
        hw["BOOTTIME"] = hw_b
    return Snapshot(clocks=clocks, halfwidth_ns=hw, notes=notes)


def gpu_clock_bands(tl, points: int = 400) -> dict:
    """{"GPU<n>": (host t_ns, half-width ns)} of every fitted GPU domain, at ``points``
    remote times from its first to its last sandwich (the band between bursts included)."""
    gpu = tl.columns(Chunk.GPU_CLOCK)
    out = {}
    for g in np.unique(gpu.get("gpu", np.zeros(0))).tolist():
        name = f"GPU{g}"
        if name not in tl.models:
            continue
        r = gpu["remote"][gpu["gpu"] == g].astype(np.int64)
        t, u = tl.models[name].map(int_grid(r.min(), r.max(), points))
        order = np.argsort(t, kind="stable")
        out[name] = (t[order], u[order])
    return out
