"""Two GPU clocks against each other, through their fits to host MONOTONIC.

Each GPU's %globaltimer is its own domain; comparing a kernel on GPU0 with one on GPU1
needs both on one clock.  At host instants h spread over the span both GPUs were probed,
each GPU's remote time at h comes from its own sandwiches (mapped by its band's centre,
linear between bursts, which the fit's wander bounds).  The offset b - a at h carries
both bands' half-widths: a time of one GPU is known against a time of the other to their
sum, no better.

    rel = compare(models["GPU0"], remote0, models["GPU1"], remote1)
    rel["skew_ppm"]            # GPU1 against GPU0: + means GPU1's timer runs faster
    rel["unc_p99_ns"]          # p99 of the summed half-widths
"""
import numpy as np

from .stats import int_grid, pct


def _remote_at(model, remote, host):
    """Remote ns at host instants, linear between the domain's own sandwiches (as mapped by
    its band's centre); computed on offsets from bases, never on epoch float64."""
    r = np.unique(np.asarray(remote, dtype=np.int64))
    h = model.center_map(r)
    keep = np.concatenate([[True], np.diff(h) > 0])
    r, h = r[keep], h[keep]
    x = np.interp((host - h[0]).astype(np.float64), (h - h[0]).astype(np.float64),
                  (r - r[0]).astype(np.float64))
    return np.rint(x).astype(np.int64) + r[0], h


def compare(model_a, remote_a, model_b, remote_b, points: int = 200) -> dict:
    """GPU b's timer against GPU a's at ``points`` host instants over the span both were
    probed; None where their probed spans do not overlap.  Offsets are b - a in ns; the
    skew (ppm, + = b runs faster) is the median (nearest rank) of the slopes between
    successive instants,
    so a clock step moves one or two slopes, not the estimate; the steps either fit found
    in the span are listed in ``steps`` (domain "a" or "b", jump and host time)."""
    if len(np.unique(remote_a)) < 2 or len(np.unique(remote_b)) < 2:
        return None
    _, ha = _remote_at(model_a, remote_a, np.zeros(0, np.int64))
    _, hb = _remote_at(model_b, remote_b, np.zeros(0, np.int64))
    lo, hi = max(int(ha[0]), int(hb[0])), min(int(ha[-1]), int(hb[-1]))
    if hi <= lo:
        return None
    host = int_grid(lo, hi, points)
    ra, _ = _remote_at(model_a, remote_a, host)
    rb, _ = _remote_at(model_b, remote_b, host)
    _, ua = model_a.map(ra)
    _, ub = model_b.map(rb)
    off = rb - ra
    unc = ua + ub
    slopes = np.diff(off) / np.diff(host)
    steps = [{"domain": which, "remote_jump_ns": int(st["remote_jump_ns"]),
              "host_ns": int(st["host_ns"])}
             for which, m in (("a", model_a), ("b", model_b)) for st in m.steps
             if lo <= int(st["host_ns"]) <= hi]
    return {"points": int(len(off)), "skew_ppm": float(pct(slopes, 50) * 1e6),
            "offset_first_ns": int(off[0]), "offset_last_ns": int(off[-1]),
            "steps": steps,
            "unc_p50_ns": pct(unc, 50), "unc_p99_ns": pct(unc, 99),
            "host_span_ns": [int(host[0]), int(host[-1])]}
