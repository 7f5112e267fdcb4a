"""Fit sandwiches to a piecewise model and map remote timestamps to host MONOTONIC ns.

    model = fit_sandwiches(t0, remote, t1, tick_ns=32)      # int64 ns arrays
    host_ns, unc_ns = model.map(gpu_ns)                      # int64, int64
    model.summary()["halfwidth_ns"]["p99"]

The data are cut into disjoint segments (one window each, split at kinks and steps); these
are ``model.segments`` and ``summary()["segments"]``, and they decide steps, skews and
which stretch of sandwiches forms one "run" (the segments between two steps).  A band is
narrowest in the middle of its window and widens towards its edges, so within a run the
model also fits overlapping windows (``model.windows``): each one segment long, straddling
a boundary, starting every quarter segment (piecewise.overlap_windows), so every time lies
within an eighth of a segment of some window's middle.

A mapped time is the middle of the intersection of every band that holds there: within its
run, the union of the segments whose coverage includes it (more than one only in the
gap between two segments), cut down by the band of every overlapping window whose data
span it.  Each band contains the truth when the clock runs linearly over that window, so
the intersection does too; should they contradict (empty intersection: the clock bent
beyond the curvature allowance) the time gets their union instead.  The uncertainty is the
half-width + the remote tick + the event's own stamping uncertainty.  Where no segment's
data cover a time (between segments, around a step, where a remote clock that stepped back
repeats its values) it gets the union over the runs whose bands may hold there; before
the first and after the last sandwich the edge segment's band is extrapolated, widening
with the slope it could not pin down.
"""
import numpy as np

from ..errors import ClockalignError
from .mindelay import burst_groups, min_delay_select
from .piecewise import bands_between, merge_short, overlap_windows, split_window
from .segment import Segment
from .stats import pct

ASSUMPTION = (
    "Each uncertainty assumes the remote clock was read somewhere inside its host interval "
    "[t0, t1] and runs linearly within each segment; a fixed path asymmetry (the read always "
    "nearer t0 or t1) is unobservable and can shift every mapped time by up to half the "
    "minimum round trip (floor_ns) without widening the band.")

_I64_MIN, _I64_MAX = np.iinfo(np.int64).min, np.iinfo(np.int64).max


def _int_array(name, a):
    a = np.asarray(a)
    if a.dtype.kind == "u":
        if a.size and a.max() > _I64_MAX:
            raise ClockalignError(f"{name} has values beyond int64 nanoseconds")
        a = a.astype(np.int64)
    if a.dtype.kind != "i":
        raise ClockalignError(
            f"{name} must be integer nanoseconds, not {a.dtype}: a float64 cannot hold epoch "
            "nanoseconds exactly")
    return a.astype(np.int64, copy=False)


class AlignmentModel:
    """Piecewise-linear host = f(remote) with a feasible band per segment, tightened by
    overlapping windows.

    ``segments``: the disjoint segments (Segment), in time order; ``steps``: the steps
    between them (dicts, ``segment`` = index of the first segment after the step);
    ``windows``: extra Segments over overlapping windows, each with ``run`` = the number
    of steps before it (windows never straddle a step).
    """

    def __init__(self, segments, steps, stats, tick_ns=0, name=None, windows=()):
        self.segments = segments
        self.steps = steps
        self.stats = stats
        self.tick_ns = int(tick_ns)
        self.name = name
        self.windows = list(windows)
        first = sorted({int(st["segment"]) for st in steps})
        self._run_of = np.searchsorted(first, np.arange(len(segments)), side="right")
        self.n_runs = int(self._run_of[-1]) + 1 if len(segments) else 0

    def _run_bounds(self, run, rs):
        """(low, high, covered) on sorted remote ns ``rs`` from run ``run`` alone."""
        n = rs.size
        ulo = np.full(n, _I64_MAX, dtype=np.int64)
        uhi = np.full(n, _I64_MIN, dtype=np.int64)
        for k in np.flatnonzero(self._run_of == run):
            seg = self.segments[k]
            i, j = np.searchsorted(rs, seg.cov[0], "left"), np.searchsorted(rs, seg.cov[1], "right")
            if i < j:
                lo, hi = seg.bounds(rs[i:j])
                np.minimum(ulo[i:j], lo, out=ulo[i:j])
                np.maximum(uhi[i:j], hi, out=uhi[i:j])
        covered = ulo <= uhi
        ilo, ihi = ulo.copy(), uhi.copy()      # intersection with the windows
        hlo, hhi = ulo.copy(), uhi.copy()      # union with them, should that be empty
        for w in self.windows:
            if w.run != run:
                continue
            i, j = np.searchsorted(rs, w.span[0], "left"), np.searchsorted(rs, w.span[1], "right")
            if i < j:
                lo, hi = w.bounds(rs[i:j])
                c = covered[i:j]
                ilo[i:j] = np.where(c, np.maximum(ilo[i:j], lo), ilo[i:j])
                ihi[i:j] = np.where(c, np.minimum(ihi[i:j], hi), ihi[i:j])
                hlo[i:j] = np.where(c, np.minimum(hlo[i:j], lo), hlo[i:j])
                hhi[i:j] = np.where(c, np.maximum(hhi[i:j], hi), hhi[i:j])
        clash = covered & (ilo > ihi)
        ilo[clash], ihi[clash] = hlo[clash], hhi[clash]
        return ilo, ihi, covered

    def _bounds(self, r, runs=None):
        order = np.argsort(r, kind="stable")
        rs = r[order]
        low = np.full(r.shape, _I64_MAX, dtype=np.int64)
        high = np.full(r.shape, _I64_MIN, dtype=np.int64)
        for run in (range(self.n_runs) if runs is None else runs):
            lo, hi, c = self._run_bounds(run, rs)
            low[c] = np.minimum(low[c], lo[c])
            high[c] = np.maximum(high[c], hi[c])
        out_lo = np.empty_like(low)
        out_hi = np.empty_like(high)
        out_lo[order], out_hi[order] = low, high
        return out_lo, out_hi

    def map(self, remote_ns, stamp_unc_ns=None):
        """Host MONOTONIC ns and uncertainty ns (both int64) for remote-clock ns."""
        r = _int_array("remote_ns", remote_ns)
        shape = r.shape
        r = r.ravel()
        low, high = self._bounds(r)
        host = low + (high - low) // 2
        unc = (high - low + 1) // 2 + self.tick_ns
        if stamp_unc_ns is not None:
            unc = unc + np.broadcast_to(_int_array("stamp_unc_ns", stamp_unc_ns),
                                        shape).ravel()
        return host.reshape(shape), unc.reshape(shape)

    def _nearest(self, r):
        best = np.zeros(r.shape, dtype=np.int64)
        dist = np.full(r.shape, _I64_MAX, dtype=np.int64)
        for k, seg in enumerate(self.segments):
            d = np.maximum(seg.span[0] - r, 0) + np.maximum(r - seg.span[1], 0)
            better = d < dist
            best[better], dist[better] = k, d[better]
        return best

    def _per_segment(self, remote_ns, fn):
        r = _int_array("remote_ns", remote_ns)
        flat = r.ravel()
        out = np.empty(flat.shape, dtype=np.int64)
        k = self._nearest(flat)
        for i, seg in enumerate(self.segments):
            m = k == i
            if m.any():
                out[m] = fn(seg, flat[m])
        return out.reshape(r.shape)

    def center_map(self, remote_ns):
        """Host ns on the widest-margin line of the segment or overlapping window whose
        middle is nearest (among those whose data span the time; else the nearest
        segment's).  No union, no uncertainty."""
        r = _int_array("remote_ns", remote_ns)
        flat = r.ravel()
        fits = list(self.segments) + self.windows
        best = self._nearest(flat)
        dist = np.full(flat.shape, np.inf)
        for k, f in enumerate(fits):
            mid = 0.5 * (f.span[0] + f.span[1])
            inside = (flat >= f.span[0]) & (flat <= f.span[1])
            d = np.where(inside, np.abs(flat - mid), np.inf)
            better = d < dist
            best[better], dist[better] = k, d[better]
        out = np.empty(flat.shape, dtype=np.int64)
        for k in np.unique(best):
            m = best == k
            out[m] = fits[k].center(flat[m])
        return out.reshape(r.shape)

    def least_squares_map(self, remote_ns):
        """Host ns from least squares on midpoints over the same segments (comparison only)."""
        return self._per_segment(remote_ns, lambda s, r: s.lsq_map(r))

    def summary(self) -> dict:
        segs = []
        for s in self.segments:
            lo, hi = s.skew_range_ppm
            segs.append({"start_remote_ns": s.span[0], "end_remote_ns": s.span[1],
                         "start_host_ns": s.host_span[0], "end_host_ns": s.host_span[1],
                         "offset_ns": s.offset_at(s.span[0]), "skew_ppm": s.skew_ppm,
                         "skew_range_ppm": [lo, hi], "wander_ns": s.wander_ns,
                         "samples_used": s.n_used, "samples_total": s.n_total})
        out = {"segments": segs, **self.stats, "steps": list(self.steps),
               "tick_ns": self.tick_ns, "assumption": ASSUMPTION}
        if self.name is not None:
            out = {"domain": self.name, **out}
        return out


def fit_sandwiches(t0, remote, t1, tick_ns=0, window_ns=5_000_000_000, burst_gap_ns=None,
                   *, max_skew_ppm=1000.0, name=None) -> AlignmentModel:
    """Fit host = f(remote) from sandwiches t0 <= host(remote) <= t1 (int64 ns arrays).

    window_ns: segment length (1-10 s keeps a wandering GPU timer within ~0.3 us of a line);
    windows after one that visibly bent are halved, down to window_ns / 8.
    burst_gap_ns: gap that separates probe bursts for min-delay filtering; None detects
    bursts, 0 keeps every sandwich.  max_skew_ppm: prior bound on the rate difference,
    which only matters for a segment too short to measure its own slope.
    """
    t0, remote, t1 = (_int_array(n, a) for n, a in (("t0", t0), ("remote", remote), ("t1", t1)))
    if not (t0.ndim == remote.ndim == t1.ndim == 1) or not (len(t0) == len(remote) == len(t1)):
        raise ClockalignError(f"t0, remote and t1 must be 1-d arrays of one length, got "
                              f"{t0.shape}, {remote.shape} and {t1.shape}")
    if len(t0) < 2:
        raise ClockalignError(f"at least 2 sandwiches are needed to fit a line, got {len(t0)}")
    bad = np.flatnonzero(t1 < t0)
    if bad.size:
        raise ClockalignError(f"sandwich {bad[0]} ends before it starts (t1 {t1[bad[0]]} < "
                              f"t0 {t0[bad[0]]}); {bad.size} such")
    if window_ns <= 0 or tick_ns < 0:
        raise ClockalignError("window_ns must be positive and tick_ns not negative")
    order = np.argsort(t0, kind="stable")
    t0, remote, t1 = t0[order], remote[order], t1[order]
    keep = min_delay_select(t0, remote, t1, burst_groups(t0, burst_gap_ns))
    T0, RM, T1 = t0[keep], remote[keep], t1[keep]
    max_skew = max_skew_ppm * 1e-6

    def make(ix, wander_ns=0):
        return Segment(T0[ix], RM[ix], T1[ix], tick_ns, max_skew, wander_ns=wander_ns)

    # A window that had to be split at a kink shows the clock bending at that scale;
    # halve the windows after it (down to 1/8) and grow them back after clean ones.
    pieces, start, n, win = [], 0, len(T0), window_ns
    while start < n:
        end = int(np.searchsorted(T0, T0[start] + win))
        end = max(end, min(start + 3, n))
        if n - end < 3 or T0[-1] - T0[start] < 1.5 * win:
            end = n
        parts, resume, bent = split_window(np.arange(start, end), make)
        win = max(win // 2, window_ns // 8) if bent else min(win * 2, window_ns)
        if resume is not None and end < n:
            pieces += parts[:-1]
            start = resume
        else:
            pieces += parts
            start = end
    pieces = merge_short(pieces, make, T0, window_ns)
    if not pieces:
        raise ClockalignError(f"no line fits the {len(t0)} sandwiches: they contradict each "
                              "other everywhere (is the remote clock stuck or running backwards?)")
    segments = [make(p) for p in pieces]
    bend = _curvature(segments)
    for k, p in enumerate(pieces):
        w = _allowance(bend[k], segments[k])
        if w:
            segments[k] = make(p, w)
    steps = _link(segments, T0, T1, pieces)
    run_of = np.cumsum([k in {st["segment"] for st in steps} for k in range(len(pieces))])
    windows = []
    for k, ix in overlap_windows(pieces, np.r_[False, run_of[1:] == run_of[:-1]], T0):
        w = make(ix)
        if not w.feasible:     # a kink inside: the two segments alone map this stretch
            continue
        allow = _allowance(max(bend[k - 1], bend[k]), w)
        if allow:
            w = make(ix, allow)
        w.run = int(run_of[k])
        windows.append(w)

    # every input sandwich belongs to the segment whose first used sandwich precedes it
    starts = np.array([T0[p[0]] for p in pieces])
    seg_of = np.clip(np.searchsorted(starts, t0, side="right") - 1, 0, len(segments) - 1)
    for k, seg in enumerate(segments):
        m = seg_of == k
        seg.n_total = int(m.sum())
        if seg.n_total:
            seg.fit_lsq(t0[m], remote[m], t1[m])
        else:
            seg.fit_lsq(T0[pieces[k]], RM[pieces[k]], T1[pieces[k]])
    model = AlignmentModel(segments, steps, {}, tick_ns, name, windows)
    # the band half-width map() gives at each used sandwich, within that sandwich's own
    # run (a backward step makes remote times ambiguous; that is not the band's width)
    half = []
    for run in range(model.n_runs):
        r = RM[np.concatenate([p for k, p in enumerate(pieces) if run_of[k] == run])]
        lo, hi = model._bounds(r, runs=[run])
        half.append((hi - lo + 1) // 2)
    half = np.concatenate(half)
    rtt = t1 - t0
    dur = np.array([max(s.span[1] - s.span[0], 1) for s in segments], dtype=np.float64)
    stats = {
        "skew_ppm": float(np.average([s.skew_ppm for s in segments], weights=dur)),
        "offset_ns": segments[0].offset_at(segments[0].span[0]),
        "samples_used": int(sum(s.n_used for s in segments)),
        "samples_total": int(len(t0)),
        "min_rtt_ns": int(rtt.min()),
        "halfwidth_ns": {"p50": int(pct(half, 50)), "p99": int(pct(half, 99)),
                         "max": int(half.max())},
        "floor_ns": int(rtt.min() // 2),
    }
    model.stats = stats
    return model


def _curvature(segments):
    """Curvature (rate change per ns, 1/ns) per segment that its band cannot see.

    A line fitting every sandwich does not prove the clock is straight: it can curve by
    up to the sandwich width unseen.  A curve does show as a rate change between
    neighbouring segments once their skew ranges are disjoint: a change Df over a distance
    d between their centres.  Zero where neighbouring skews agree.
    """
    out = []
    for k, seg in enumerate(segments):
        lo_k, hi_k = seg.skew_range_ppm
        mid = 0.5 * (seg.span[0] + seg.span[1])
        c = 0.0
        for j in (k - 1, k + 1):
            if 0 <= j < len(segments):
                lo_j, hi_j = segments[j].skew_range_ppm
                gap = max(lo_j - hi_k, lo_k - hi_j, 0.0) * 1e-6
                d = abs(0.5 * (segments[j].span[0] + segments[j].span[1]) - mid)
                if gap and d:
                    c = max(c, gap / d)
        out.append(c)
    return out


def _allowance(curvature, seg):
    """Allowance (ns) for that curvature over a segment or window: a rate change Df over
    a distance d bends a stretch of length L away from its best line by about
    Df * L^2 / (8 d)."""
    length = seg.span[1] - seg.span[0]
    return int(np.ceil(curvature * length * length / 8))


def _link(segments, T0, T1, pieces):
    """Join neighbours: extend each one's coverage over the gap between their sandwiches,
    and call the boundary a step where their bands cannot both hold in the middle of it."""
    steps = []
    segments[0].cov = (_I64_MIN, segments[0].cov[1])
    segments[-1].cov = (segments[-1].cov[0], _I64_MAX)
    for k in range(1, len(segments)):
        a, b = segments[k - 1], segments[k]
        h_lo, h_hi = int(T0[pieces[k - 1][-1]]), int(T1[pieces[k][0]])
        z_lo, z_hi = sorted((a.span[1], b.span[0]))
        # Until the first surely-new sandwich, A's clock may still hold: cover the remote
        # values A reads up to then (after a backward step they lie above z_hi), and the
        # same for B back to the last surely-old one; 1000 ppm pads the skew over the gap.
        pad = (h_hi - h_lo) // 1000 + 1
        off_a, off_b = a.offset_at(a.span[1]), b.offset_at(b.span[0])
        a.cov = (a.cov[0], max(a.cov[1], z_hi, h_hi - off_a + pad))
        b.cov = (min(b.cov[0], z_lo, h_lo - off_b - pad), b.cov[1])
        (la, ua), (lb, ub) = bands_between(a, b)
        if la > ub or lb > ua:
            host = h_lo + (h_hi - h_lo) // 2
            steps.append({"host_ns": host, "host_window_ns": [h_lo, h_hi],
                          "remote_ns": host - off_a,
                          # host-ns gap at one remote reading, in remote ns
                          "remote_jump_ns": int(round(((la + ua) // 2 - (lb + ub) // 2)
                                                      * (1 + a.skew_ppm * 1e-6))),
                          "segment": k})
    return steps
