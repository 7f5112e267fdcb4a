"""Overflow lanes: every track's slices in time order and balanced, whatever the batch order.

The recorder writes a CUDA call when it returns, stamped with its entry time, so a batch is
not in time order and a long call (a 2 s cuStreamSynchronize) shows up after calls that
started later on other threads.  No bounded buffer can restore a global time order, but one
*track* can be kept in order: the calls of one thread do not overlap (a thread is in one
driver call at a time), nor do the off-CPU intervals of one thread.  So every track is its
own writer (its own Perfetto trusted_packet_sequence_id), its slices are emitted as complete
BEGIN/END pairs, and a slice that would overlap one already written on its track (a call
nested inside another, a reordering) goes to the first overflow *lane* (a child track,
"overlapping #1", ...) where it fits.  Within every track the timestamps are then
non-decreasing and the slices balance.

    lanes = Lanes(tracks)
    track = lanes.assign(base, start, end)  # per row: its base track idx or a lane's
"""
import numpy as np

from .tracks import Tracks

NO_END = np.iinfo(np.int64).min // 4


class Lanes:
    """Keeps each track's slices in time order and non-overlapping (module doc)."""

    def __init__(self, tracks: Tracks):
        self.tracks = tracks
        self.base_end = np.zeros(0, dtype=np.int64)   # last end on lane 0, per base track idx
        self.extra = {}                               # base idx -> [last end of lane 1, 2, ...]

    def _grow(self):
        n = len(self.tracks.all)
        if len(self.base_end) < n:
            self.base_end = np.concatenate(
                [self.base_end, np.full(n - len(self.base_end) + 64, NO_END, np.int64)])

    def assign(self, base: np.ndarray, start: np.ndarray, end: np.ndarray,
               by_start: np.ndarray = None) -> np.ndarray:
        """Track idx per row: its base track, or the first overflow lane it fits in.
        ``by_start``: np.argsort(start, kind="stable"), if the caller has it."""
        self._grow()
        n = len(base)
        out = base.copy()
        if n == 0:
            return out
        if by_start is None:
            by_start = np.argsort(start, kind="stable")
        order = by_start[_stable_order(base[by_start])]       # == np.lexsort((start, base))
        b, s, e = base[order], start[order], end[order]
        first = np.empty(n, dtype=bool)
        first[0] = True
        first[1:] = b[1:] != b[:-1]
        gid = np.cumsum(first) - 1
        lo = int(s.min())
        rel = e - lo
        span = int(rel.max()) + 1
        ngroups = int(gid[-1]) + 1
        if span * ngroups < (1 << 62):
            off = gid * span
            cm = np.maximum.accumulate(rel + off) - off
        else:                      # a span of centuries: do it group by group
            cm = np.empty(n, dtype=np.int64)
            starts = np.flatnonzero(first)
            for a, z in zip(starts, list(starts[1:]) + [n]):
                cm[a:z] = np.maximum.accumulate(rel[a:z])
        seed = np.maximum(self.base_end[b], NO_END + lo) - lo
        prev = np.empty(n, dtype=np.int64)
        prev[0] = seed[0]
        prev[1:] = np.where(first[1:], seed[1:], np.maximum(cm[:-1], seed[1:]))
        bad = (s - lo) < prev
        last = np.flatnonzero(np.r_[first[1:], True])
        bad_group = np.zeros(ngroups, dtype=bool)
        bad_group[gid[bad]] = True
        good_last = last[~bad_group]
        self.base_end[b[good_last]] = np.maximum(self.base_end[b[good_last]], cm[good_last] + lo)
        for g in np.flatnonzero(bad_group):
            a = int(np.flatnonzero(first)[g])
            z = int(last[g]) + 1
            bi = int(b[a])
            ends = [int(self.base_end[bi])] + self.extra.get(bi, [])
            for k in range(a, z):
                si, ei = int(s[k]), int(e[k])
                for lane, le in enumerate(ends):
                    if si >= le:
                        break
                else:
                    lane = len(ends)
                    ends.append(NO_END)
                ends[lane] = ei
                if lane:
                    out[order[k]] = self.tracks.lane(self.tracks.all[bi], lane).idx
            self.base_end[bi] = ends[0]
            self.extra[bi] = ends[1:]
        return out


def _stable_order(keys: np.ndarray) -> np.ndarray:
    """np.argsort(keys, kind="stable") of small non-negative ints, by radix sort when it can."""
    if len(keys) and 0 <= keys.min() and keys.max() < (1 << 16):
        keys = keys.astype(np.uint16)
    return np.argsort(keys, kind="stable")

