"""One segment: the feasible band of one line over a stretch of sandwiches, in int64 ns.

Absolute times never enter a float: the segment keeps int64 bases (R, H) = (remote, t0)
of its first sandwich, works on x = remote - R and on host - H - x (a few us to ms),
and adds the bases back in int64.  Sandwiches are widened by one tick on each side, since
a remote reading r only says the remote clock was within a tick of r, and by ``wander_ns``
where the clock is known to curve (model._curvature, model._allowance): then the best line
may miss a sandwich by that much, and the truth may leave that line's band by as much again
(bounds() widens by it).

    seg = Segment(t0, remote, t1, tick_ns=32, max_skew=1e-3)
    low, high = seg.bounds(remote_ns)      # int64 host ns, rounded outward
"""
import numpy as np

from .band import fit_band
from .lsq import midpoint_lsq


class Segment:
    def __init__(self, t0, remote, t1, tick_ns=0, max_skew=1e-3, wander_ns=0):
        self.R, self.H = int(remote[0]), int(t0[0])
        R, H = np.int64(self.R), np.int64(self.H)
        dx = remote - R
        x = dx.astype(np.float64)
        self.wander_ns = int(wander_ns)
        widen = tick_ns + self.wander_ns
        lo = ((t0 - H) - dx - widen).astype(np.float64)
        hi = ((t1 - H) - dx + widen).astype(np.float64)
        self.xmid = 0.5 * (x.min() + x.max())
        self.hs = max(0.5 * (x.max() - x.min()), 1.0)
        self.constraints = ((x - self.xmid) / self.hs, lo, hi, max_skew * self.hs)
        self.band = fit_band(*self.constraints)
        self.feasible = self.band.feasible
        self.span = (int(remote.min()), int(remote.max()))
        self.host_span = (int(t0[0]), int(t1[-1]))
        self.cov = self.span
        self.n_used = len(t0)
        self.n_total = len(t0)
        self.lsq = None

    def _u(self, remote):
        dx = np.asarray(remote, dtype=np.int64) - np.int64(self.R)
        return dx, (dx.astype(np.float64) - self.xmid) / self.hs

    def bounds(self, remote):
        """Lowest and highest host ns any feasible line gives at these remote ns."""
        dx, u = self._u(remote)
        low, high = self.band.bounds(u)
        base = np.int64(self.H) + dx
        w = self.wander_ns
        return (base + np.floor(low).astype(np.int64) - w,
                base + np.ceil(high).astype(np.int64) + w)

    def center(self, remote):
        """Host ns on the widest-margin line."""
        dx, u = self._u(remote)
        return np.int64(self.H) + dx + np.rint(self.band.center(u)).astype(np.int64)

    def fit_lsq(self, t0, remote, t1):
        self.lsq = midpoint_lsq(t0, remote, t1, np.int64(self.R), np.int64(self.H))

    def lsq_map(self, remote):
        a, b, xm = self.lsq
        dx = np.asarray(remote, dtype=np.int64) - np.int64(self.R)
        return np.int64(self.H) + dx + np.rint(a + b * (dx.astype(np.float64) - xm)).astype(
            np.int64)

    def _remote_rate_ppm(self, m):
        # the band's slope is d(host)/d(remote) - 1; report the remote clock's rate
        # against MONOTONIC, d(remote)/d(host) - 1 (-2.2 ppm: the remote runs slow)
        return (1.0 / (1.0 + m / self.hs) - 1.0) * 1e6

    @property
    def skew_ppm(self) -> float:
        return self._remote_rate_ppm(self.band.m0)

    @property
    def skew_range_ppm(self):
        lo, hi = self.band.m_range
        return self._remote_rate_ppm(hi), self._remote_rate_ppm(lo)

    def offset_at(self, remote: int) -> int:
        """Host minus remote (ns) on the centre line at one remote time."""
        return int(self.center(np.array([remote]))[0]) - int(remote)
