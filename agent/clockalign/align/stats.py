"""The numeric conventions align/ and report/ share, so one run's numbers agree everywhere.

    pct(half_widths, 99)          # nearest rank: a value that occurred, never interpolated
    int_grid(r.min(), r.max(), 400)   # exact int64 ns points, no float64 epoch times
"""
import math

import numpy as np


def pct(x, q):
    """Percentile by the nearest-rank method: the smallest value with at least q % of the
    values at or below it (so always a value that occurred); None when x is empty.  The
    one percentile definition of clockalign: band half-widths (align), latency tables,
    figures and anomaly bins (report)."""
    x = np.asarray(x)
    if not x.size:
        return None
    s = np.sort(x, axis=None)
    k = math.ceil(round(q * len(s) / 100.0, 9)) - 1
    return s[min(max(k, 0), len(s) - 1)].item()


def int_grid(lo: int, hi: int, n: int) -> np.ndarray:
    """n int64 points from lo to hi inclusive, each exact: lo + i * (hi - lo) // (n - 1),
    computed on offsets from lo (float64 over epoch nanoseconds steps by 256 ns)."""
    lo, hi = int(lo), int(hi)
    if n < 2 or hi == lo:
        return np.full(max(n, 1), lo, dtype=np.int64)
    i = np.arange(n, dtype=np.int64)
    return np.int64(lo) + (i * np.int64(hi - lo)) // np.int64(n - 1)
