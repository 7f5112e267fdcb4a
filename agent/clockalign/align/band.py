"""The feasible band: every line consistent with a set of sandwiches.

Within one segment a sandwich says lo_i <= c + m*u_i <= hi_i, where u is the remote time
scaled to [-1, 1] over the segment and c + m*u is host minus remote (ns, relative to the
segment's int64 bases).  The lines (c, m) meeting all of them form a convex polygon
(Moon, Skelly & Towsley 1999; Zhang, Liu & Xia 2002).  At a remote time u the polygon's
extreme lines give the lowest and highest host time any consistent line allows; half that
spread is the honest uncertainty at u.  Outside the data it grows by itself, because the
slope is only known to the polygon's extent.

With F(m) = max_i(lo_i - m*u_i) and G(m) = min_i(hi_i - m*u_i) the polygon is
{(c, m): F(m) <= c <= G(m)}.  Only hull vertices enter F and G, and their breakpoints are
the hull edge slopes, so everything below is exact piecewise-linear algebra on a few dozen
numbers.  The widest-margin line (Huygens, NSDI 2018) maximises G - F.

    band = fit_band(u, lo, hi, m_max)
    if band.feasible:
        low, high = band.bounds(u_new)
"""
import numpy as np

from .hull import upper_hull

TOL = 1e-6  # ns: float slack when judging constraints built from integer nanoseconds


class Band:
    """The polygon of feasible lines, as its vertices, plus the widest-margin line.

    ``margin`` is the smallest distance (ns) from that line to any sandwich bound; it is
    negative when no line fits (``feasible`` False), and then the line is the one that
    violates the worst sandwich least.
    """

    def __init__(self, feasible, margin, c0, m0, vc, vm):
        self.feasible = feasible
        self.margin = margin
        self.c0, self.m0 = c0, m0
        self.vc, self.vm = vc, vm

    def bounds(self, u):
        """(lowest, highest) value of c + m*u over the feasible lines, as float arrays."""
        u = np.asarray(u, dtype=np.float64)
        low = np.full(u.shape, np.inf)
        high = np.full(u.shape, -np.inf)
        for c, m in zip(self.vc, self.vm):
            v = c + m * u
            np.minimum(low, v, out=low)
            np.maximum(high, v, out=high)
        return low, high

    def center(self, u):
        return self.c0 + self.m0 * np.asarray(u, dtype=np.float64)

    @property
    def m_range(self):
        return float(np.min(self.vm)), float(np.max(self.vm))


def binding(u, v) -> np.ndarray:
    """Indices of the points on the upper hull of (u, v), keeping the highest v per u
    (ties at the tick): the only lower bounds that can constrain a line.  Pass -hi for the
    upper bounds."""
    order = np.lexsort((-v, u))
    first = order[np.r_[True, np.diff(u[order]) > 0]]
    return first[upper_hull(u[first], v[first])]


def fit_band(u, lo, hi, m_max) -> Band:
    """The feasible band of lines c + m*u with lo <= c + m*u <= hi and |m| <= m_max."""
    a, b = binding(u, lo), binding(u, -hi)
    lu, lv, hu, hv = u[a], lo[a], u[b], hi[b]
    with np.errstate(divide="ignore", invalid="ignore"):
        slopes = np.concatenate([np.diff(lv) / np.diff(lu), np.diff(hv) / np.diff(hu)])
    s = np.unique(np.clip(np.r_[slopes[np.isfinite(slopes)], -m_max, m_max], -m_max, m_max))

    def F(m):
        return np.max(lv[:, None] - np.outer(lu, m), axis=0)

    def G(m):
        return np.min(hv[:, None] - np.outer(hu, m), axis=0)

    h = G(s) - F(s)   # concave, linear between consecutive s
    best = h.max()
    top = np.flatnonzero(h >= best - TOL)
    m0 = 0.5 * (s[top[0]] + s[top[-1]])
    f0, g0 = F(np.array([m0]))[0], G(np.array([m0]))[0]
    c0 = 0.5 * (f0 + g0)
    margin = 0.5 * (g0 - f0)
    if margin < -TOL:
        return Band(False, margin, c0, m0, np.array([c0]), np.array([m0]))
    ok = np.flatnonzero(h >= 0)
    if not ok.size:   # feasible only within float slack: a single line
        return Band(True, 0.0, c0, m0, np.array([c0]), np.array([m0]))
    i, j = ok[0], ok[-1]
    m_lo = s[i] if i == 0 else s[i - 1] + (s[i] - s[i - 1]) * (-h[i - 1]) / (h[i] - h[i - 1])
    m_hi = s[j] if j == len(s) - 1 else s[j] + (s[j + 1] - s[j]) * h[j] / (h[j] - h[j + 1])
    ms = np.r_[m_lo, s[(s > m_lo) & (s < m_hi)], m_hi]
    return Band(True, margin, c0, m0, np.r_[F(ms), G(ms)], np.r_[ms, ms])


def l1_violators(u, lo, hi, m_max) -> np.ndarray:
    """Indices of binding sandwiches that the least-total-violation line misses by > 0.5 ns.

    The L1 line ignores a minority of bad sandwiches (unlike the widest-margin line, which
    balances the worst ones), so its violators are the outlier candidates.  Only hull
    points are posed (a bad sandwich binds, or it would not matter), which keeps the LP
    tiny; dropping them may expose more, so callers peel in rounds.
    """
    from scipy import sparse                 # here: ~50 MB resident once imported, and
    from scipy.optimize import linprog       # only a run with outlier sandwiches needs it
    cand = np.union1d(binding(u, lo), binding(u, -hi))
    u, lo, hi = u[cand], lo[cand], hi[cand]
    n = len(u)
    ones = np.ones(n)
    eye = sparse.identity(n, format="csr")
    lhs = sparse.csr_matrix(np.c_[ones, u])
    a_ub = sparse.vstack([sparse.hstack([-lhs, -eye]), sparse.hstack([lhs, -eye])])
    res = linprog(np.r_[0.0, 0.0, ones], A_ub=a_ub, b_ub=np.r_[-lo, hi],
                  bounds=[(None, None), (-m_max, m_max)] + [(0, None)] * n, method="highs")
    if res.status != 0:
        return np.arange(0)
    return cand[res.x[2:] > 0.5]
