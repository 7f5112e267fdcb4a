"""Piecewise fit: one band per window, split where no single line fits.

Clocks wander (on an H200 one line over 120 s leaves up to 3 us, 1-10 s windows ~0.3 us)
and may step (NTP steps REALTIME, a GPU timer resync).  Each window of sandwiches (host
time order) gets one feasible band.  A window that no line satisfies is repaired in order:

1. one or two sandwiches that the least-violation (L1) line misses are outliers: drop them;
2. else, if the longest feasible prefix and the longest feasible suffix overlap, the break
   lies in the overlap: what precedes it is surely before the break, what follows surely
   after.  At a step (the two sure sides' bands are disjoint) the sandwiches inside go to
   neither side: a wide one from the wrong side still fits a slightly tilted line and
   would pin it; the model maps that stretch with the union of both bands.  At a kink
   they are good data: the next window resumes at the overlap to place them;
3. else up to 5% L1 violators are outliers;
4. else cut after the longest feasible prefix and repeat on the rest.

Splitting comes before dropping more than two because a curving clock is also "fixed" by
dropping its few tightest sandwiches, and that leaves a falsely narrow band.

    pieces, resume, bent = split_window(idx, make)   # make(idx) -> Segment
    pieces = merge_short(pieces, make, t0, window_ns)

A split leaves short pieces at window edges whose slope is barely pinned, and a band that
wide hides a step next to it; merge_short joins such a piece to its neighbour whenever one
line still fits both.

The pieces are disjoint, so a time near a boundary sits at the edge of its piece's window,
where the band is widest.  overlap_windows adds windows one piece long that straddle each
boundary without a step, one every quarter piece; the model intersects their bands.

    wins = overlap_windows(pieces, same_run, t0)     # [(k, positions)] across k-1 | k
"""
import numpy as np

from .band import l1_violators


def _longest_prefix(idx, feasible):
    lo, hi = 1, len(idx)          # idx[:lo] feasible, idx[:hi+1] not
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if feasible(idx[:mid]):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _shortest_suffix(idx, feasible):
    lo, hi = 1, len(idx) - 1      # idx[hi:] feasible, idx[lo-1:] not
    while lo < hi:
        mid = (lo + hi) // 2
        if feasible(idx[mid:]):
            hi = mid
        else:
            lo = mid + 1
    return hi


def bands_between(a, b):
    """Host bounds (la, ua), (lb, ub) of consecutive segments a, b midway between a's last
    and b's first remote reading."""
    x = np.array([a.span[1] + (b.span[0] - a.span[1]) // 2], dtype=np.int64)
    (la,), (ua,) = a.bounds(x)
    (lb,), (ub,) = b.bounds(x)
    return (int(la), int(ua)), (int(lb), int(ub))


def is_step(a, b) -> bool:
    """True where a's and b's bands cannot both hold between them: the remote clock jumped
    by more than the bands can absorb."""
    (la, ua), (lb, ub) = bands_between(a, b)
    return la > ub or lb > ua


def split_window(idx, make):
    """Position arrays, one per segment, covering ``idx`` (sorted); each has a feasible band.

    Returns (pieces, resume, bent): after a split at an overlap, ``resume`` is the position
    the next window should start from (the overlap at a kink, just after it at a step),
    and the last piece is provisional; ``bent`` says the clock visibly curved here (a
    split that was no step), so shorter windows would follow it better.
    ``make(idx)`` builds a Segment.
    """
    def feasible(ix):
        return make(ix).feasible

    def without_outliers(ix, limit):
        rest = ix
        for _ in range(8):
            bad = l1_violators(*make(rest).constraints)
            if not bad.size or ix.size - rest.size + bad.size > limit:
                return None
            rest = np.delete(rest, bad)
            if rest.size < 2:
                return None
            if feasible(rest):
                return rest
        return None

    pieces = []
    while idx.size >= 2:
        if feasible(idx):
            pieces.append(idx)
            break
        rest = without_outliers(idx, 2)
        if rest is not None:
            pieces.append(rest)
            break
        n_p = _longest_prefix(idx, feasible)
        if n_p < 2:
            idx = idx[1:]
            continue
        q = _shortest_suffix(idx, feasible)
        if 2 <= q <= n_p <= idx.size - 2:
            if is_step(make(idx[:q]), make(idx[n_p:])):
                return pieces + [idx[:q], idx[n_p:]], int(idx[n_p]), False
            return pieces + [idx[:q], idx[q:]], int(idx[q]), True
        rest = without_outliers(idx, idx.size // 20)
        if rest is not None:
            pieces.append(rest)
            break
        pieces.append(idx[:n_p])
        idx = idx[n_p:]
    return pieces, None, len(pieces) > 1


def merge_short(pieces, make, t0, window_ns):
    """Join each piece shorter than half a window to its predecessor where one line fits
    both (and the pair spans at most 1.5 windows); sandwiches left between them rejoin
    too when they fit."""
    out = []
    for p in pieces:
        if out:
            prev = out[-1]
            span = t0[p[-1]] - t0[prev[0]]
            short = min(t0[prev[-1]] - t0[prev[0]], t0[p[-1]] - t0[p[0]]) < window_ns / 2
            if short and span <= 1.5 * window_ns:
                whole = np.arange(prev[0], p[-1] + 1)
                both = np.concatenate([prev, p])
                joined = next((c for c in (whole, both) if make(c).feasible), None)
                if joined is not None:
                    out[-1] = joined
                    continue
        out.append(p)
    return out


HOPS = 4   # overlapping windows per segment: one starts every quarter segment


def hop_chunks(p, t0, hops=HOPS):
    """Chunk number 0 .. hops-1 of each position of piece ``p``, by equal host-time spans."""
    t = t0[p]
    span = int(t[-1] - t[0]) + 1
    return np.minimum((t - t[0]) * hops // span, hops - 1)


def overlap_windows(pieces, same_run, t0, hops=HOPS):
    """The windows that straddle segment boundaries, as (k, positions): for the boundary
    between pieces k-1 and k (where ``same_run[k]`` says no step lies between them), the
    last hops-s chunks of piece k-1 joined to the first s chunks of piece k, s = 1 ..
    hops-1.  With the pieces themselves these are windows one segment long starting every
    1/hops segment, so each time lies within 1/(2*hops) segment of some window's middle,
    where a band is narrowest.  A window can hold one line only where the two pieces'
    clocks do: callers drop the windows whose band is infeasible (a kink inside)."""
    out = []
    chunks = [hop_chunks(p, t0, hops) for p in pieces]
    for k in range(1, len(pieces)):
        if not same_run[k]:
            continue
        a, b, ca, cb = pieces[k - 1], pieces[k], chunks[k - 1], chunks[k]
        for s in range(1, hops):
            ix = np.concatenate([a[ca >= s], b[cb < s]])
            if ix.size >= 2:
                out.append((k, ix))
    return out
