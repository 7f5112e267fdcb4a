"""Minimum-delay filtering: keep the sandwiches of each burst that carry its information.

A probe often fires bursts (the H200 probe: 64 ping-pongs every 100 ms) and only the
fastest readings matter: a slow one was delayed by an interrupt or a cache miss and says
less (linuxptp phc2sys keeps the fastest of N).  Within a burst the clocks barely move
relative to each other, so besides the fastest round trip we also keep the sandwich with
the smallest delay on each side (largest t0 - remote, smallest t1 - remote): each is a
valid constraint on its own, and together they bound the line tighter than the fastest
alone.  Dropping the rest never makes the band wrong, only (slightly) less tight.

    groups = burst_groups(t0, gap_ns=None)          # auto: bursts only if clearly bursty
    keep = min_delay_select(t0, remote, t1, groups)  # sorted positions
"""
import numpy as np


def burst_groups(t0, gap_ns=None) -> np.ndarray:
    """Group id per sandwich (time order): a new burst starts after a gap > gap_ns.

    With gap_ns None a gap must exceed 10x the median spacing, and the data counts as
    bursty only if the typical burst is short next to the typical gap between bursts
    (under a tenth of it); a steady stream, whose chance long gaps would cut it into
    seconds-long "bursts", stays one sandwich per group.  gap_ns=0 disables grouping.
    """
    n = len(t0)
    if n < 2:
        return np.zeros(n, dtype=np.int64)
    gaps = np.diff(t0)
    sep = gaps > (10 * max(float(np.median(gaps)), 1.0) if gap_ns is None else gap_ns)
    groups = np.r_[0, np.cumsum(sep)].astype(np.int64)
    if gap_ns is None:
        first = np.flatnonzero(np.r_[True, sep])
        last = np.r_[first[1:] - 1, n - 1]
        if not sep.any() or np.median(t0[last] - t0[first]) > 0.1 * np.median(gaps[sep]):
            return np.arange(n, dtype=np.int64)
    return groups


def _best_per_group(key, groups):
    """Position of the largest key in each group (groups contiguous and non-decreasing)."""
    order = np.lexsort((key, groups))
    last = np.r_[groups[order][1:] != groups[order][:-1], True]
    return order[last]


def fastest_per_group(t0, t1, groups) -> np.ndarray:
    """phc2sys style: the position of the smallest round trip in each group."""
    return np.sort(_best_per_group(-(t1 - t0), groups))


def min_delay_select(t0, remote, t1, groups) -> np.ndarray:
    """Sorted positions of the fastest and the two one-way extremes of each group."""
    if len(np.unique(groups)) == len(groups):
        return np.arange(len(groups))
    picks = [fastest_per_group(t0, t1, groups),
             _best_per_group(t0 - remote, groups),
             _best_per_group(remote - t1, groups)]
    return np.unique(np.concatenate(picks))
