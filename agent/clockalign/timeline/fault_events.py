"""The events faults are made of, read in two passes with memory that follows the number of
failing calls, not the run: Collector keeps the failing CUDA calls and connect()s, Xids,
exits and fatal signals (riding on the Timeline's first pass); next_successes() then finds,
for each failing call, the successful calls its chain can end on, and keeps only those.

    data = tl.fault_events()                 # {"cuda": ..., "connect": ..., "other": ...}
    nexts = next_successes(tl, data["cuda"], data["connect"], data["spans"])
"""
import errno

import numpy as np

from ..store.schema import Kind
from .codes import FATAL_SIGNALS
from .events import to_timeline
from .fault import SIGNAL_DELIVERED

_OTHER_KINDS = np.array([Kind.XID, Kind.PROC_EXIT, Kind.THREAD_EXIT, Kind.SIGNAL],
                        dtype=np.uint16)
_FATAL = np.asarray(sorted(FATAL_SIGNALS), dtype=np.int32)
_DELIVERED = np.asarray(SIGNAL_DELIVERED, dtype=np.uint16)
_CUDA_COLS = ("pid", "tid", "code", "ret")


def _failed_connect(ret) -> np.ndarray:
    # A non-blocking connect() returns EINPROGRESS: its outcome is not seen here.
    return (ret < 0) & (ret != -errno.EINPROGRESS)


def peer_keys(data, alen) -> np.ndarray:
    """One key per connect() peer: the sockaddr bytes up to its length, the rest zeroed."""
    raw = np.frombuffer(np.ascontiguousarray(data).tobytes(), dtype=np.uint8)
    raw = raw.reshape(len(data), 56).copy()
    raw[np.arange(56)[None, :] >= np.minimum(alen.astype(np.int64), 56)[:, None]] = 0
    return raw.view("V56").ravel()


class Collector:
    """The first pass: fed every events chunk in file order (EVENT_DTYPE, its XID_MSG parts
    already taken by the reader), it keeps only what can make a fault: failing CUDA calls
    and connect()s, Xids, exits, deaths and fatal signals.  Successful calls are many (they
    are most of a run) and are not kept: ``next_successes`` finds the few the chains need
    in a second pass, so memory follows the number of errors, not the run.  It rides on
    the Timeline's first full pass over the events (timeline/core.py), so it costs no
    decoding of its own; per chunk it also notes the span of the successful calls, so the
    second pass decodes only the chunks that can hold an answer."""

    def __init__(self):
        self.cuda, self.conn, self.other = [], [], []
        self.spans = {Kind.CUDA: [], Kind.CONNECT: []}   # per chunk: (first, last) ts or None

    def feed(self, ev: np.ndarray):
        k, ret = ev["kind"], ev["ret"]
        for kind, spans in self.spans.items():
            t = ev["ts"][(k == kind) & (ret == 0)]
            spans.append((int(t.min()), int(t.max())) if len(t) else None)
        m = (k == Kind.CUDA) & (ret != 0)
        if m.any():
            self.cuda.append({"t_ns": ev["ts"][m].astype(np.int64),
                              "dur_ns": ev["dur"][m].astype(np.int64),
                              **{n: ev[n][m] for n in _CUDA_COLS}})
        m = ((k == Kind.CONNECT) & _failed_connect(ret.astype(np.int64))) | (
            np.isin(k, _OTHER_KINDS)
            & ((k != Kind.THREAD_EXIT) | (ev["code"] == 1))
            & ((k != Kind.SIGNAL) | (np.isin(ret, _FATAL) & np.isin(ev["code"], _DELIVERED))))
        if m.any():
            e = to_timeline(ev[m])
            n = e["kind"] == Kind.CONNECT
            if n.any():
                self.conn.append(e[n])
            if (~n).any():
                self.other.append(e[~n])

    def result(self) -> dict:
        """{"cuda": columns of the failing calls, "connect", "other": TIMELINE_DTYPE rows
        ("other" by time), "spans": per kind, each chunk's successful calls' span}."""
        cuda, conn, other = self.cuda, self.conn, self.other
        cat = lambda parts, n: np.concatenate([p[n] for p in parts])  # noqa: E731
        out = {"cuda": {n: cat(cuda, n) for n in ("t_ns", "dur_ns") + _CUDA_COLS}
               if cuda else None,
               "connect": np.concatenate(conn) if conn else None,
               "other": np.concatenate(other) if other else None,
               "spans": self.spans}
        if out["other"] is not None:
            out["other"] = out["other"][np.argsort(out["other"]["t_ns"], kind="stable")]
        return out


def _among(a: np.ndarray, values: np.ndarray) -> np.ndarray:
    """np.isin, faster for the few values it is asked about here."""
    if len(values) > 4:
        return np.isin(a, values)
    m = np.zeros(len(a), dtype=bool)
    for v in values.tolist():
        m |= a == v
    return m


class _FirstAfter:
    """For given (key, x) pairs: the successful call of that key with the smallest start
    t >= x (on a tie, the first in file order) -> (t, end, tid), fed one chunk at a time."""

    def __init__(self, keys: np.ndarray, xs: np.ndarray):
        self.q = {}
        for key in np.unique(keys).tolist():
            x = np.unique(xs[keys == key])
            self.q[key] = (x, np.zeros(len(x), dtype=bool), np.zeros((3, len(x)), np.int64))
        self.keys = np.asarray(sorted(self.q), dtype=np.int64)
        self.lo = int(xs.min())        # a call that starts earlier answers nothing
        self.hi = None                 # nor one that starts at or after this (None: no bound)

    def feed(self, keys, t, end, tid):
        if len(self.q) > 16:
            m = np.isin(keys, self.keys)
            keys, t, end, tid = keys[m], t[m], end[m], tid[m]
            wanted = np.unique(keys).tolist()
        else:
            wanted = self.q
        for key in wanted:
            s = np.flatnonzero(keys == key)
            if not len(s):
                continue
            s = s[np.argsort(t[s], kind="stable")]
            st = t[s]
            x, found, best = self.q[key]
            j = np.searchsorted(st, x, side="left")
            i = np.flatnonzero(j < len(st))
            j = s[j[i]]
            better = ~found[i] | (t[j] < best[0, i])
            i, j = i[better], j[better]
            found[i] = True
            best[:, i] = (t[j], end[j], tid[j])
        if all(v[1].all() for v in self.q.values()):
            self.hi = max(int(v[2][0].max()) for v in self.q.values())

    def could_improve(self, a: int, b: int) -> bool:
        """Whether a call starting in [a, b] could answer some pair better than now."""
        for x, found, best in self.q.values():
            t = np.maximum(x, a)
            if ((t <= b) & (~found | (t < best[0]))).any():
                return True
        return False

    def get(self, key: int, x: int):
        x_, found, best = self.q[key]
        i = int(np.searchsorted(x_, x))
        return (int(best[0, i]), int(best[1, i]), int(best[2, i])) if found[i] else None


def next_successes(tl, cuda, connect, thread_calls=None, spans=None) -> dict:
    """Second pass: the successful calls that end the chains.  For each failing call, the
    first success of the same op (function or peer) of its process at or after its return,
    and the first success of any op there (``_Calls`` asks for exactly these); for the
    failing CUDA calls where ``thread_calls`` is True, also the first success of the same
    thread (timeline/benign.py's rules ask for it).  ``spans`` (Collector's) lets it skip,
    undecoded, each chunk whose successful calls could answer no failing call better than
    the chunks before it did.
    -> {sort: (by (pid << 32 | op), by pid, op of each failing call, by (pid << 32 | tid)
    or None)}"""
    out, peers, by_tid = {}, {}, {}
    if cuda is not None:
        out[Kind.CUDA] = (cuda["pid"].astype(np.int64), cuda["code"].astype(np.int64),
                          cuda["t_ns"] + np.maximum(cuda["dur_ns"], 0))
    if connect is not None:
        op = [peers.setdefault(bytes(k), len(peers))
              for k in peer_keys(connect["data"], connect["a1"])]
        out[Kind.CONNECT] = (connect["pid"].astype(np.int64), np.asarray(op, dtype=np.int64),
                             connect["t_ns"] + np.maximum(connect["dur_ns"], 0))
    if cuda is not None and thread_calls is not None and thread_calls.any():
        pid, _, end = out[Kind.CUDA]
        by_tid[Kind.CUDA] = _FirstAfter((pid << 32 | cuda["tid"].astype(np.int64))[thread_calls],
                                        end[thread_calls])
    for kind, (pid, op, end) in list(out.items()):
        out[kind] = (_FirstAfter(pid << 32 | op, end), _FirstAfter(pid, end), op,
                     by_tid.get(kind))
    if not out:
        return out
    def want(i):
        for kind, (by_op, by_pid, _, by_thread) in out.items():
            span = spans[kind][i]
            if span is not None and any(f is not None and f.could_improve(*span)
                                        for f in (by_op, by_pid, by_thread)):
                return True
        return False

    for cols in tl.event_chunks(None if spans is None else want):
        ok = cols["ret"] == 0
        for kind, (by_op, by_pid, _, by_thread) in out.items():
            rows = np.flatnonzero(ok & (cols["kind"] == kind))
            t = cols["ts"][rows].astype(np.int64)
            finders = [f for f in (by_op, by_pid, by_thread) if f is not None]
            his = [f.hi for f in finders]
            keep = t >= min(f.lo for f in finders)
            if None not in his:
                keep &= t < max(his)
            keep[keep] = _among(cols["pid"][rows[keep]], by_pid.keys)
            if not keep.any():
                continue
            rows, t = rows[keep], t[keep]
            pid = cols["pid"][rows].astype(np.int64)
            end = t + np.maximum(cols["dur"][rows].astype(np.int64), 0)
            tid = cols["tid"][rows].astype(np.int64)
            if kind == Kind.CUDA:
                op = cols["code"][rows].astype(np.int64)
            else:
                keys, inv = np.unique(peer_keys(cols["data"][rows], cols["a1"][rows]),
                                      return_inverse=True)
                op = np.asarray([peers.get(bytes(k), -1) for k in keys],
                                dtype=np.int64)[inv.reshape(-1)]
            by_pid.feed(pid, t, end, tid)
            if by_thread is not None:
                by_thread.feed(pid << 32 | tid, t, end, tid)
            known = op >= 0
            by_op.feed(pid[known] << 32 | op[known], t[known], end[known], tid[known])
    return out
