"""Least squares on sandwich midpoints: the naive fit, kept only as a comparison.

It assumes the remote read happened at (t0 + t1) / 2 on average, so any mean asymmetry of
the two legs (a slow return path, a heavy tail on one side) becomes bias, and slow
sandwiches weigh as much as fast ones.  The band's centre does not have these problems.

    a, b, xm = midpoint_lsq(t0, remote, t1, R, H)   # host ~ H + x + a + b*(x - xm), x = remote - R
"""
import numpy as np


def midpoint_lsq(t0, remote, t1, R, H):
    """Fit host - remote = a + b*(x - xm) on midpoints, relative to int64 bases R, H."""
    x = (remote - R).astype(np.float64)
    y = (t0 - H).astype(np.float64) + 0.5 * (t1 - t0).astype(np.float64) - x
    xm = float(x.mean())
    dx = x - xm
    den = float(dx @ dx)
    b = float(dx @ (y - y.mean())) / den if den > 0 else 0.0
    return float(y.mean()), b, xm
