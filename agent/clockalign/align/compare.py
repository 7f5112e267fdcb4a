"""Two GPU clocks against each other, through their fits to host MONOTONIC.

Each GPU's %globaltimer is its own domain; comparing a kernel on GPU0 with one on GPU1
needs both on one clock.  At every sandwich of GPU b, its remote time maps to a host
instant h (model b); GPU a's remote time at h comes from a's own sandwiches (host midpoint
against remote, linear between a's bursts, which the fit's wander bounds).  The offset
b - a at h carries both bands' half-widths: comparing a time of one GPU with a time of the
other is known to their sum, no better.

    rel = compare(models["GPU0"], remote0, models["GPU1"], remote1)
    rel["skew_ppm"]            # GPU1 against GPU0: + means GPU1's timer runs faster
    rel["unc_p99_ns"]          # p99 of the summed half-widths
"""
import numpy as np

from .stats import pct


def compare(model_a, remote_a, model_b, remote_b) -> dict:
    """GPU b's timer against GPU a's over the host time both were probed; None where their
    probed spans do not overlap.  Offsets are b - a in ns (int64 on offsets from a base);
    the skew is the median of the slopes between successive points, so one clock step
    moves one slope, not the estimate (the step shows in ``offset_jump_max_ns``)."""
    ra = np.unique(np.asarray(remote_a, dtype=np.int64))
    rb = np.unique(np.asarray(remote_b, dtype=np.int64))
    if len(ra) < 2 or len(rb) < 2:
        return None
    ha = model_a.center_map(ra)
    hb, ub = model_b.map(rb)
    keep = (hb >= ha.min()) & (hb <= ha.max())
    if keep.sum() < 2:
        return None
    hb, ub, rb = hb[keep], ub[keep], rb[keep]
    base_h, base_a = int(ha[0]), int(ra[0])
    # float64 only on offsets from the bases: a span of hours is exact to well under 1 ns
    ra_at = np.rint(np.interp((hb - base_h).astype(np.float64), (ha - base_h).astype(np.float64),
                              (ra - base_a).astype(np.float64))).astype(np.int64) + base_a
    _, ua = model_a.map(ra_at)
    off = rb - ra_at
    unc = ua + ub
    dh = np.diff(hb)
    slopes = np.diff(off)[dh > 0] / dh[dh > 0]
    jumps = np.abs(np.diff(off))
    return {"points": int(len(off)), "skew_ppm": float(np.median(slopes) * 1e6) if len(slopes)
            else 0.0, "offset_first_ns": int(off[0]), "offset_last_ns": int(off[-1]),
            "offset_jump_max_ns": int(jumps.max()) if len(jumps) else 0,
            "unc_p50_ns": pct(unc, 50), "unc_p99_ns": pct(unc, 99),
            "host_span_ns": [int(hb[0]), int(hb[-1])]}
