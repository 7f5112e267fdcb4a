"""Upper convex hull of points, vectorised (quickhull with numpy).

The feasible band of sandwich lines depends only on the upper hull of the lower bounds and
the lower hull of the upper bounds (Moon, Skelly & Towsley 1999), so a window of thousands
of sandwiches reduces to a few dozen constraints.  Quickhull keeps the per-point work in
numpy; only the hull vertices cost a Python step each.

    idx = upper_hull(x, y)        # x strictly increasing; indices left to right
    idx = upper_hull(x, -y)       # the lower hull of (x, y)
"""
import numpy as np


def upper_hull(x, y) -> np.ndarray:
    """Indices of the vertices of the upper hull of (x, y), x strictly increasing."""
    n = len(x)
    if n <= 2:
        return np.arange(n)
    keep = [0, n - 1]
    stack = [(0, n - 1, np.arange(1, n - 1))]
    while stack:
        a, b, cand = stack.pop()
        if not cand.size:
            continue
        # twice the signed area: > 0 when the candidate lies above the chord a-b
        d = (x[b] - x[a]) * (y[cand] - y[a]) - (y[b] - y[a]) * (x[cand] - x[a])
        above = d > 0
        if not above.any():
            continue
        cand, d = cand[above], d[above]
        k = int(cand[np.argmax(d)])
        keep.append(k)
        stack.append((a, k, cand[cand < k]))
        stack.append((k, b, cand[cand > k]))
    return np.array(sorted(keep))
