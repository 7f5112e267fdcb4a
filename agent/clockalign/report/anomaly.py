"""Hidden signals before a crash: when a signal left its normal band, and by how much.

Each signal is a time series on fixed bins (launch latency: median cuLaunchKernel time per
bin; off-CPU time inside CUDA calls that are not meant to block, i.e. all but the
synchronize calls, which sleep by design; wakeup-to-run latency: p90 per bin; involuntary
preemptions per bin; each GPU counter as sampled).  Its robust z-score at point i compares
it with the ``window`` points BEFORE it (a trailing window, so a slow drift into a fault is
measured against what preceded it, not against itself):

    z = (x - median(prev)) / (1.4826 * MAD(prev))

A MAD of 0 (a sparse signal, mostly one value) falls back to 1.2533 times the mean
absolute deviation; the scale is floored at 1 % of the median (and, for counts per bin, at
the square root of the median count, at least 1), so a signal that never moves, or a
sparse count, does not turn a rounding step or a single event into an alarm.  An
*excursion* is a run of points with |z| >= threshold; excursions a few points apart make
one *episode*; the report lists, for every fault, the episode of each signal nearest
before it within ``lookback``, with its lead time.

    z = robust_z(x, window=50)
    for ex in excursions(t, z, x, threshold=4): ...
"""
import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..align.stats import pct
from ..store import cuda_api
from .analysis import LAUNCH_FNS

SYNC_FNS = list(cuda_api.ids("sync"))    # calls that block by design

MAD_K = 1.4826
MEAN_AD_K = 1.253314


def robust_z(x, window: int = 50, min_periods: int = 10, rel_floor: float = 0.01,
             abs_floor: float = 1e-9, counts: bool = False) -> np.ndarray:
    """Robust z of each x[i] against x[i-window:i] (NaN where too little history)."""
    x = np.asarray(x, dtype=np.float64)
    n = len(x)
    z = np.full(n, np.nan)
    if n <= min_periods:
        return z
    pad = np.concatenate([np.full(window, np.nan), x])
    win = sliding_window_view(pad[:-1], window)[:n]          # win[i] = x[i-window:i]
    valid = np.sum(~np.isnan(win), axis=1)
    with np.errstate(all="ignore"):
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            med = np.nanmedian(win, axis=1)
            dev = np.abs(win - med[:, None])
            mad = np.nanmedian(dev, axis=1)
            # MAD is 0 when over half the window equals its median (a sparse signal):
            # then the mean absolute deviation, scaled to a normal's sigma, as IBM's
            # modified z-score does
            mad_scaled = np.where(mad > 0, MAD_K * mad, MEAN_AD_K * np.nanmean(dev, axis=1))
        scale = np.maximum(mad_scaled, np.maximum(rel_floor * np.abs(med), abs_floor))
        if counts:     # a count per bin varies by about its square root (Poisson)
            scale = np.maximum(scale, np.sqrt(np.maximum(med, 1.0)))
        zz = (x - med) / scale
    ok = (valid >= min_periods) & ~np.isnan(x)
    z[ok] = zz[ok]
    return z


def excursions(t, z, x, threshold: float = 4.0) -> list:
    """Runs of |z| >= threshold: [{start_ns, end_ns, peak_z, peak_value, bins}]."""
    out = []
    hot = np.nan_to_num(np.abs(z), nan=0.0) >= threshold
    if not hot.any():
        return out
    d = np.diff(np.concatenate([[0], hot.astype(np.int8), [0]]))
    starts, ends = np.flatnonzero(d == 1), np.flatnonzero(d == -1)
    for a, b in zip(starts.tolist(), ends.tolist()):
        k = a + int(np.nanargmax(np.abs(z[a:b])))
        out.append({"start_ns": int(t[a]), "end_ns": int(t[b - 1]), "bins": b - a,
                    "peak_z": float(z[k]), "peak_value": float(x[k]), "peak_ns": int(t[k])})
    return out


def _binned(t, v, edges, stat):
    idx = np.searchsorted(edges, t, side="right") - 1
    nb = len(edges) - 1
    ok = (idx >= 0) & (idx < nb)
    idx, v = idx[ok], v[ok]
    out = np.full(nb, np.nan)
    if not len(idx):
        return out
    order = np.argsort(idx, kind="stable")
    idx, v = idx[order], v[order]
    bounds = np.flatnonzero(np.diff(np.concatenate([[-1], idx, [nb]])))
    for a, b in zip(bounds[:-1], bounds[1:]):
        out[idx[a]] = stat(v[a:b])
    return out


def signals(data, inside, tl, bin_ns: int) -> list:
    """[(name, unit, t_ns per point, values)] of the signals watched."""
    start, end = tl.start_ns, tl.end_ns
    nb = max(int((end - start) // bin_ns), 1)
    edges = start + np.arange(nb + 1, dtype=np.int64) * bin_ns
    mid = edges[:-1] + bin_ns // 2
    out = []
    c = data.cuda
    if len(c["t"]):
        lm = np.isin(c["fn"].astype(np.int64), LAUNCH_FNS)
        if lm.any():
            out.append(("launch latency (median per bin)", "ns", mid,
                        _binned(c["t"][lm], c["dur"][lm].astype(np.float64), edges,
                                 lambda a: pct(a, 50))))
        nosync = ~np.isin(c["fn"].astype(np.int64), SYNC_FNS)
        k = np.clip(np.searchsorted(edges, c["t"][nosync], side="right") - 1, 0, nb - 1)
        total = np.bincount(k, weights=inside["per_call_ns"][nosync].astype(np.float64),
                            minlength=nb)
        out.append(("off-CPU time inside non-sync CUDA calls per bin", "ns", mid, total))
    s = data.sched
    if len(s["t"]):
        w = s["wake"] > 0
        if w.any():
            out.append(("wakeup-to-run latency (p90 per bin)", "ns", mid,
                        _binned(s["t"][w], s["wake"][w].astype(np.float64), edges,
                                lambda a: pct(a, 90))))
        pre = s["pre"].astype(bool)
        k = np.clip(np.searchsorted(edges, s["t"][pre], side="right") - 1, 0, nb - 1)
        out.append(("involuntary preemptions per bin", "count/bin", mid,
                    np.bincount(k, minlength=nb).astype(np.float64)))
    cnt = tl.counters()
    if cnt is not None and len(cnt):
        from ..store.counter_fields import FIELDS
        for g in np.unique(cnt["gpu"]).tolist():
            for f in np.unique(cnt["field"]).tolist():
                name, unit, _, kind = FIELDS.get(f, (f"field {f}", "", "", "gauge"))
                if kind in ("bitmask", "counter"):
                    continue
                m = (cnt["gpu"] == g) & (cnt["field"] == f)
                out.append((f"GPU{g} {name}", unit, cnt["t_ns"][m],
                            cnt["value"][m].astype(np.float64)))
    return out


def detect(sigs, faults, window: int = 50, threshold: float = 4.0,
           lookback_ns: int = 30_000_000_000, merge_points: int = 5) -> dict:
    """z series and excursions per signal, and for each fault the excursions before it."""
    per_signal = []
    for name, unit, t, x in sigs:
        z = robust_z(x, window=window, counts=unit == "count/bin")
        ex = excursions(t, z, x, threshold)
        gap = _gap(t, merge_points)
        per_signal.append({"name": name, "unit": unit, "t": t, "x": x, "z": z,
                           "excursions": ex, "episodes": _episodes(ex, gap)})
    roots = [f for f in faults if f.kind != "cuda_sticky_error"]
    groups = {}                  # the same episodes before several faults: one entry
    for f in roots:
        hits = []
        for s in per_signal:
            eps = [e for e in s["episodes"] if f.t_ns - lookback_ns <= e["start_ns"] < f.t_ns]
            if not eps:
                continue
            e = eps[-1]          # the episode nearest before the fault
            hits.append({"signal": s["name"], "unit": s["unit"],
                         "lead_ns": int(f.t_ns - e["start_ns"]), "earlier": len(eps) - 1, **e})
        if hits:
            hits.sort(key=lambda h: -h["lead_ns"])
            key = tuple((h["signal"], h["start_ns"]) for h in hits)
            if key in groups:
                groups[key]["also"].append(f)
            else:
                groups[key] = {"fault": f, "signals": hits, "also": []}
    return {"signals": per_signal, "before_faults": list(groups.values()), "window": window,
            "threshold": threshold, "lookback_ns": lookback_ns}


def _gap(t, points):
    t = np.asarray(t)
    if len(t) < 2:
        return 0
    return int(np.median(np.diff(t))) * points


def _episodes(ex, gap) -> list:
    """Excursions less than ``gap`` apart merged: one episode of leaving the band."""
    out = []
    for e in ex:
        if out and e["start_ns"] - out[-1]["end_ns"] <= gap:
            last = out[-1]
            last["end_ns"] = e["end_ns"]
            last["bins"] += e["bins"]
            if abs(e["peak_z"]) > abs(last["peak_z"]):
                last.update(peak_z=e["peak_z"], peak_value=e["peak_value"],
                            peak_ns=e["peak_ns"])
        else:
            out.append(dict(e))
    return out
