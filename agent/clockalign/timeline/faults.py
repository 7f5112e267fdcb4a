"""Faults from every source as one record type, merged across sources, with their chains.

Sources: CUDA driver calls that returned an error (uprobes), connect() failures,
exit_group() with a non-zero status, a fatal signal that ended the target (tracepoints),
Xids (the nvidia_dev_xid tracepoint and NVML/DCGM events stamped on receipt), and clock
event reasons (power / thermal capping) switching on in the counters.

Grouping rules, so that one problem reads as one line and its consequences:

- The first CUDA error with a sticky code (ILLEGAL_ADDRESS, LAUNCH_FAILED, ...; see
  codes.STICKY_CURESULTS) in a process is a ``cuda_error``; every later call of that
  process that fails with the same (or another sticky) code is a ``cuda_sticky_error``
  whose ``parent`` is the first.
- A failed call of the same function with the same code while an earlier error of that
  function is not yet recovered is a retry: an entry of the first error's chain, not a
  fault of its own.
- An Xid seen by the tracepoint and by NVML/DCGM (same code, same GPU, receipt no more than
  the two uncertainties before and XID_RECEIPT_TOLERANCE_NS after the in-kernel stamp) is
  one fault with two sightings, and ``delays`` gives the time between the sources.

A chain lists what followed from a fault in the same process, in time order: ``retry``
(the same call again, failed), ``error`` (another call of the same family failed, before
the process had a successful call again: one CUDA role such as alloc; a connect() chain
holds only its own peer), ``sticky_error`` (the context is broken: any call), then
``success`` (the next successful call of the same function or peer: the recovery) or
``exit``.  ``recovery_ns`` runs from the failing call's entry to the return of that
successful call; ``healthy_ns`` from the fault to the return of the first successful call
after the last error of the chain (CUDA: of any function; connect: to that peer).

Known probes are not faults: the CUDA runtime's connect() to its MPS server socket, which
fails with ENOENT where no MPS runs (codes.BENIGN_CONNECTS), becomes a note.

Memory follows the number of failing calls, not the run: one pass over the events keeps the
failing calls, Xids, exits and fatal signals; a second pass finds, for each failing call,
the successful calls its chain can end on, and keeps only those.

    for f in find_faults(tl): print(f.id, f.kind, f.name, f.recovery_ns)
"""
import dataclasses
import errno
import os
import re
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ..store.counter_fields import CAPPING, CLOCK_REASONS, FIELD_BY_NAME
from ..store.reader import RunReader
from ..store import cuda_api
from ..store.schema import Chunk, Kind
from .codes import (FATAL_SIGNALS, STICKY_CURESULTS, benign_connect, cuda_result_name,
                    errno_name, signal_name, xid_name)
from .events import decode_comm, decode_sockaddr, to_timeline
from .stamps import probe_type

KINDS = ("xid", "throttle", "cuda_error", "cuda_sticky_error", "connect_error", "signal", "exit")
CHAIN_LIMIT = 200                       # chain entries kept; the rest are counted
XID_RECEIPT_TOLERANCE_NS = 2_000_000_000  # NVML/DCGM hand an Xid over up to ~2 s late
XID_LINK_NS = 10_000_000_000            # an Xid's process error must follow within 10 s
KERNEL_SOURCES = ("tracepoint",)        # sightings stamped where the event happened
SIGNAL_DELIVERED = (0, 2, 4)            # signal_generate result: delivered/pending/lose-info

_PID_IN_XID = re.compile(r"pid=(\d+)")
_FN_NAMES = {fid: f.symbol for fid, f in cuda_api.FUNCTIONS.items()}


@dataclass
class Fault:
    """One fault, whatever saw it.  Times are MONOTONIC ns; ``unc_ns`` is ± around t_ns."""

    id: int
    t_ns: int
    unc_ns: int
    kind: str
    code: int
    name: str
    message: str = ""
    pid: Optional[int] = None
    tid: Optional[int] = None
    gpu: Optional[int] = None
    sightings: list = field(default_factory=list)   # [{source, t_ns, unc_ns, domain}]
    chain: list = field(default_factory=list)       # [{t_ns, dt_ns, what, ...}]
    recovery_ns: Optional[int] = None
    # additions to the contract
    thread: Optional[str] = None       # thread name at t_ns
    function: Optional[str] = None     # CUDA function, or "connect"
    target: Optional[str] = None       # connect() peer
    dur_ns: int = 0                    # duration of the failing call
    parent: Optional[int] = None       # cuda_sticky_error: id of the first sticky error
    related: list = field(default_factory=list)     # ids of the same problem seen elsewhere
    recovery_unc_ns: Optional[int] = None
    healthy_ns: Optional[int] = None
    delays: list = field(default_factory=list)      # [{from, to, delay_ns, unc_ns}]

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _entry(f: Fault, t, unc, what, **kw) -> dict:
    e = {"t_ns": int(t), "unc_ns": int(unc), "dt_ns": int(t) - f.t_ns, "what": what,
         "fault": None}
    e.update(kw)
    return e


# ---------------------------------------------------------------------- collection
_OTHER_KINDS = np.array([Kind.XID, Kind.PROC_EXIT, Kind.THREAD_EXIT, Kind.SIGNAL],
                        dtype=np.uint16)
_FATAL = np.asarray(sorted(FATAL_SIGNALS), dtype=np.int32)
_DELIVERED = np.asarray(SIGNAL_DELIVERED, dtype=np.uint16)
_CUDA_COLS = ("pid", "tid", "code", "ret")


def _failed_connect(ret) -> np.ndarray:
    # A non-blocking connect() returns EINPROGRESS: its outcome is not seen here.
    return (ret < 0) & (ret != -errno.EINPROGRESS)


def _peer_keys(data, alen) -> np.ndarray:
    """One key per connect() peer: the sockaddr bytes up to its length, the rest zeroed."""
    raw = np.frombuffer(np.ascontiguousarray(data).tobytes(), dtype=np.uint8)
    raw = raw.reshape(len(data), 56).copy()
    raw[np.arange(56)[None, :] >= np.minimum(alen.astype(np.int64), 56)[:, None]] = 0
    return raw.view("V56").ravel()


def _collect(tl) -> dict:
    """The events faults are made of, in one pass, keeping only what can make a fault: failing
    CUDA calls and connect()s, Xids, exits, deaths and fatal signals.  Successful calls are
    many (they are most of a run) and are not kept: ``_next_successes`` finds the few the
    chains need in a second pass, so memory follows the number of errors, not the run."""
    cuda, conn, other = [], [], []
    for cols in tl.reader.iter_columns(Chunk.EVENTS):
        k, ret = cols["kind"], cols["ret"]
        m = (k == Kind.CUDA) & (ret != 0)
        if m.any():
            cuda.append({"t_ns": cols["ts"][m].astype(np.int64),
                         "dur_ns": cols["dur"][m].astype(np.int64),
                         **{n: cols[n][m] for n in _CUDA_COLS}})
        m = ((k == Kind.CONNECT) & _failed_connect(ret.astype(np.int64))) | (
            np.isin(k, _OTHER_KINDS)
            & ((k != Kind.THREAD_EXIT) | (cols["code"] == 1))
            & ((k != Kind.SIGNAL) | (np.isin(ret, _FATAL) & np.isin(cols["code"], _DELIVERED))))
        m |= k == Kind.XID_MSG          # an Xid's message, kept by the reader
        if m.any():
            ev = tl.reader.xid_messages.take(RunReader.as_events({n: v[m] for n, v in cols.items()}))
            ev = to_timeline(ev)
            n = ev["kind"] == Kind.CONNECT
            if n.any():
                conn.append(ev[n])
            if (~n).any():
                other.append(ev[~n])
    cat = lambda parts, n: np.concatenate([p[n] for p in parts])  # noqa: E731
    out = {"cuda": {n: cat(cuda, n) for n in ("t_ns", "dur_ns") + _CUDA_COLS} if cuda else None,
           "connect": np.concatenate(conn) if conn else None,
           "other": np.concatenate(other) if other else None}
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

    def get(self, key: int, x: int):
        x_, found, best = self.q[key]
        i = int(np.searchsorted(x_, x))
        return (int(best[0, i]), int(best[1, i]), int(best[2, i])) if found[i] else None


def _next_successes(tl, cuda, connect) -> dict:
    """Second pass: the successful calls that end the chains.  For each failing call, the
    first success of the same op (function or peer) of its process at or after its return,
    and the first success of any op there (``_Calls`` asks for exactly these).
    -> {sort: (by (pid << 32 | op), by pid, op of each failing call)}"""
    out, peers = {}, {}
    if cuda is not None:
        out[Kind.CUDA] = (cuda["pid"].astype(np.int64), cuda["code"].astype(np.int64),
                          cuda["t_ns"] + np.maximum(cuda["dur_ns"], 0))
    if connect is not None:
        op = [peers.setdefault(bytes(k), len(peers))
              for k in _peer_keys(connect["data"], connect["a1"])]
        out[Kind.CONNECT] = (connect["pid"].astype(np.int64), np.asarray(op, dtype=np.int64),
                             connect["t_ns"] + np.maximum(connect["dur_ns"], 0))
    for kind, (pid, op, end) in list(out.items()):
        out[kind] = (_FirstAfter(pid << 32 | op, end), _FirstAfter(pid, end), op)
    if not out:
        return out
    for cols in tl.reader.iter_columns(Chunk.EVENTS):
        ok = cols["ret"] == 0
        for kind, (by_op, by_pid, _) in out.items():
            rows = np.flatnonzero(ok & (cols["kind"] == kind))
            t = cols["ts"][rows].astype(np.int64)
            his = [f.hi for f in (by_op, by_pid)]
            keep = t >= min(by_op.lo, by_pid.lo)
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
                keys, inv = np.unique(_peer_keys(cols["data"][rows], cols["a1"][rows]),
                                      return_inverse=True)
                op = np.asarray([peers.get(bytes(k), -1) for k in keys],
                                dtype=np.int64)[inv.reshape(-1)]
            by_pid.feed(pid, t, end, tid)
            known = op >= 0
            by_op.feed(pid[known] << 32 | op[known], t[known], end[known], tid[known])
    return out


# ---------------------------------------------------------------------- exits, signals
def _death_faults(tl, other) -> tuple:
    """Exit and signal faults, and {pid: death record} for closing chains."""
    faults, deaths = [], {}
    if other is None:
        return faults, deaths
    for pid in np.unique(other["pid"]):
        ev = other[other["pid"] == pid]
        pid = int(pid)
        exits = ev[ev["kind"] == Kind.PROC_EXIT]
        groupdead = ev[(ev["kind"] == Kind.THREAD_EXIT) & (ev["code"] == 1)]
        sigs = ev[(ev["kind"] == Kind.SIGNAL)
                  & np.isin(ev["ret"], np.asarray(sorted(FATAL_SIGNALS), dtype=np.int32))
                  & np.isin(ev["code"], np.asarray(SIGNAL_DELIVERED, dtype=np.uint16))]
        death_t = int(groupdead["t_ns"][0]) if len(groupdead) else None
        exit_fault = None
        rec = None
        if len(exits):
            x = exits[0]
            status = int(x["ret"]) & 0xFF
            if status:
                exit_fault = Fault(0, int(x["t_ns"]), int(x["unc_ns"]), "exit", status,
                                   f"exit status {status}", f"exit_group({int(x['ret'])})",
                                   pid=pid, tid=int(x["tid"]))
                exit_fault.sightings.append(_sighting(x))
                faults.append(exit_fault)
            rec = {"t_ns": int(x["t_ns"]), "unc_ns": int(x["unc_ns"]), "code": status,
                   "name": f"exit status {status}", "fault": exit_fault, "tid": int(x["tid"])}
        # killed: a fatal signal, then the group died without calling exit_group (a
        # handled signal followed by exit() is the exit's story, not a kill)
        cand = sigs if death_t is None else sigs[sigs["t_ns"] <= death_t]
        if len(cand) and not len(exits) and (death_t is not None or int(cand[-1]["ret"]) == 9):
            s = cand[-1]
            sig, sender = int(s["ret"]), int(s["a0"])
            who = ("raised by the process itself" if sender == pid
                   else f"sent by pid {sender} ({decode_comm(s['data'])})")
            msg = f"killed by {signal_name(sig)}, {who}"
            if death_t is None:
                msg += "; its exit was not recorded"
            sf = Fault(0, int(s["t_ns"]), int(s["unc_ns"]), "signal", sig, signal_name(sig), msg,
                       pid=pid, tid=int(s["tid"]))
            sf.sightings.append(_sighting(s))
            if death_t is not None:
                sf.chain.append(_entry(sf, death_t, 0, "exit", name="process ended"))
            faults.append(sf)
            rec = {"t_ns": death_t if death_t is not None else sf.t_ns, "unc_ns": 0,
                   "code": None, "name": f"killed by {signal_name(sig)}", "fault": sf,
                   "tid": None}
        if rec is None and death_t is not None:
            rec = {"t_ns": death_t, "unc_ns": 0, "code": None, "name": "process ended",
                   "fault": None, "tid": None}
        if rec is not None:
            deaths[pid] = rec
    return faults, deaths


def _sighting(ev) -> dict:
    return {"source": probe_type(ev["kind"]), "t_ns": int(ev["t_ns"]),
            "unc_ns": int(ev["unc_ns"]), "domain": "MONOTONIC"}


# ---------------------------------------------------------------------- calls and chains
class _Calls:
    """The failing calls of one sort (CUDA driver calls, or connect()) with an op key;
    classifies them into roots / sticky repeats / retries and builds chains.  The successful
    calls are not here: ``after_op(pid, op, x)`` and ``after_any(pid, x)`` give the first one
    at or after x (of that op, of any op) as (t, end, tid), or None."""

    def __init__(self, t, dur, pid, tid, op, ret, describe, after_op, after_any,
                 sticky=frozenset(), sticky_kind=None, family=None):
        self.t = t.astype(np.int64)
        self.end = self.t + np.maximum(dur.astype(np.int64), 0)
        self.pid, self.tid, self.op, self.ret = pid, tid, op, ret
        self.describe = describe          # i -> dict(kind, code, name, message, function, target)
        self.after_op, self.after_any = after_op, after_any
        self.sticky, self.sticky_kind = sticky, sticky_kind
        # family[i]: calls of one family can follow from each other's faults (one CUDA
        # role; connect: one peer, so another peer's failure is never in a chain)
        self.family = op if family is None else family

    def run(self, deaths: dict) -> list:
        faults = []
        order = np.lexsort((self.t, self.pid))
        pids = self.pid[order]
        bounds = np.flatnonzero(np.diff(pids)) + 1
        for idx in np.split(order, bounds):
            if len(idx):
                faults.extend(self._one_pid(idx, deaths.get(int(self.pid[idx[0]]))))
        return faults

    def _fault(self, i, kind=None) -> Fault:
        d = self.describe(i)
        f = Fault(0, int(self.t[i]), 0, kind or d["kind"], d["code"], d["name"],
                  d.get("message", ""), pid=int(self.pid[i]), tid=int(self.tid[i]),
                  function=d.get("function"), target=d.get("target"),
                  dur_ns=int(self.end[i] - self.t[i]))
        f.sightings.append({"source": d["source"], "t_ns": f.t_ns, "unc_ns": 0,
                            "domain": "MONOTONIC"})
        return f

    def _one_pid(self, idx, death) -> list:
        t, end, op, ret = self.t[idx], self.end[idx], self.op[idx], self.ret[idx]
        pid = int(self.pid[idx[0]])
        death_t = death["t_ns"] if death else None

        def success_any(x, o):
            """The process healthy again after x: any successful call (CUDA), or one of
            op o (connect: that peer answering) where there is no after_any."""
            s = (self.after_any(pid, x) if self.after_any is not None
                 else self.after_op(pid, o, x))
            return None if s is None else s[:2]

        roots, role = [], {}          # role: k -> (what, root, fault or None)
        open_by_op, sticky_root = {}, None
        ek = np.arange(len(idx))
        for k in ek:
            o, code, tk = int(op[k]), int(ret[k]), int(t[k])
            gi = int(idx[k])
            if sticky_root is not None and (code == sticky_root._ret or code in self.sticky) \
                    and (sticky_root._recover is None or tk < sticky_root._recover[0]):
                f = self._fault(gi, self.sticky_kind)
                f._parent = sticky_root
                role[k] = ("sticky_error", sticky_root, f)
                continue
            retry_of = None
            for r in open_by_op.get(o, ()):
                if r._ret == code and (r._recover is None or tk < r._recover[0]):
                    retry_of = r
                    break
            if retry_of is not None:
                role[k] = ("retry", retry_of, None)
                continue
            f = self._fault(gi)
            f._k, f._ret = k, code
            f._recover = self.after_op(pid, o, int(end[k]))
            f._sticky = code in self.sticky
            if f._sticky:
                sticky_root = f
            open_by_op.setdefault(o, []).append(f)
            roots.append(f)
            role[k] = ("root", f, f)
        for r in roots:
            self._chain(r, ek, role, t, end, op, ret, idx, success_any, death, death_t)
        out = list(roots)
        out.extend(v[2] for v in role.values() if v[0] == "sticky_error")
        return out

    def _chain(self, r, ek, role, t, end, op, ret, idx, success_any, death, death_t):
        stop = r._recover[0] if r._recover else None
        if death_t is not None and death_t >= r.t_ns and (stop is None or death_t < stop):
            stop = death_t
        last_end = r.t_ns + r.dur_ns
        r_op = int(self.op[idx[r._k]])
        healthy = success_any(last_end, r_op)
        start = int(np.searchsorted(ek, r._k, side="right"))
        n_more, more_t = 0, None
        for k in ek[start:]:
            tk = int(t[k])
            if stop is not None and tk >= stop:
                break
            what, root, f = role[k]
            if what == "sticky_error" and root is not r:
                continue       # belongs to the chain of the sticky error it repeats
            same_op = int(op[k]) == r_op
            if what == "sticky_error" and root is r:
                kind = "sticky_error"
            elif same_op:
                kind = "retry"
            elif self.family[idx[k]] != self.family[idx[r._k]]:
                continue       # another family's failure does not follow from this one
            else:
                if healthy is not None and healthy[0] < tk:
                    continue
                kind = "error"
            if len(r.chain) >= CHAIN_LIMIT:
                n_more += 1
                more_t = tk
                continue
            d = self.describe(int(idx[k]))
            r.chain.append(_entry(r, tk, 0, kind, function=d.get("function"),
                                  target=d.get("target"), code=d["code"], name=d["name"],
                                  tid=int(self.tid[idx[k]]), dur_ns=int(end[k] - tk), fault=f))
            last_end = max(last_end, int(end[k]))
            healthy = success_any(last_end, r_op)
            if f is not None and kind != "sticky_error" and getattr(f, "_sticky", False) \
                    and not r._sticky:
                stop = tk      # a sticky error starts its own chain; this one ends here
                break
        if n_more:
            r.chain.append(_entry(r, more_t, 0, "more", count=n_more))
        if r._recover is not None and (stop is None or r._recover[0] <= stop):
            rt, rend, rtid = r._recover
            r.chain.append(_entry(r, rt, 0, "success", function=r.function, target=r.target,
                                  code=0, name="success", tid=rtid, dur_ns=rend - rt))
            r.recovery_ns = rend - r.t_ns
            r.recovery_unc_ns = 2 * r.unc_ns
        elif death is not None and death_t >= r.t_ns and (stop is None or death_t <= stop):
            r.chain.append(_entry(r, death_t, death["unc_ns"], "exit", code=death["code"],
                                  name=death["name"], fault=death["fault"]))
        if healthy is not None and (stop is None or healthy[0] <= stop
                                    or (r._recover and healthy[0] <= r._recover[0])):
            r.healthy_ns = healthy[1] - r.t_ns


def _cuda_calls(c, nexts) -> _Calls:
    ret = c["ret"].astype(np.int64)
    by_op, by_pid, op = nexts[Kind.CUDA]

    def describe(i):
        fn = _FN_NAMES.get(int(c["code"][i]), f"cuda function {int(c['code'][i])}")
        code = int(ret[i])
        return {"kind": "cuda_error", "code": code, "name": cuda_result_name(code),
                "message": f"{fn} returned {cuda_result_name(code)} ({code})",
                "function": fn, "source": "uprobe"}

    roles = {r: i for i, r in enumerate(cuda_api.ROLES)}
    family = np.asarray([roles.get(cuda_api.role_of(f), -1) for f in c["code"].tolist()],
                        dtype=np.int64)
    return _Calls(c["t_ns"], c["dur_ns"], c["pid"], c["tid"], op, ret, describe,
                  lambda pid, o, x: by_op.get(pid << 32 | o, x),
                  lambda pid, x: by_pid.get(pid, x), STICKY_CURESULTS, "cuda_sticky_error",
                  family=family)


def _connect_calls(ev, nexts) -> _Calls:
    ret = ev["ret"].astype(np.int64)
    by_op, by_pid, op = nexts[Kind.CONNECT]
    peers = {}

    def peer(i):
        o = int(op[i])
        if o not in peers:
            peers[o] = decode_sockaddr(ev["data"][i], ev["a1"][i])
        return peers[o]

    def describe(i):
        code = -int(ret[i])
        p = peer(i)
        return {"kind": "connect_error", "code": code, "name": errno_name(code),
                "message": f"connect({p}) failed: {os.strerror(code)}",
                "function": "connect", "target": p, "source": "tracepoint"}

    # healthy again = that peer answered: another peer answering says nothing of this one
    return _Calls(ev["t_ns"], ev["dur_ns"], ev["pid"], ev["tid"], op, ret, describe,
                  lambda pid, o, x: by_op.get(pid << 32 | o, x), None)


# ---------------------------------------------------------------------- Xid
def _xid_sightings(tl, other) -> list:
    out = []
    if other is not None:
        for ev in other[other["kind"] == Kind.XID]:
            dev, msg, _ = tl.xid_text(ev)
            m = _PID_IN_XID.search(msg)
            out.append({"source": "tracepoint", "t_ns": int(ev["t_ns"]),
                        "unc_ns": int(ev["unc_ns"]), "domain": "MONOTONIC",
                        "code": int(ev["ret"]), "gpu": tl.gpu_of_pci(dev), "dev": dev,
                        "msg": msg, "pid": int(m.group(1)) if m else None})
    for row in tl.gpu_events():
        if str(row.get("type", "")).lower() != "xid":
            continue
        msg = str(row.get("message") or row.get("msg") or "")
        m = _PID_IN_XID.search(msg)
        gpu = row.get("gpu")
        out.append({"source": str(row.get("source") or "nvml"), "t_ns": int(row["t_ns"]),
                    "unc_ns": int(row["unc_ns"]), "domain": row["domain"],
                    "code": int(row["code"]), "gpu": None if gpu is None else int(gpu),
                    "dev": None, "msg": msg, "pid": int(m.group(1)) if m else None})
    out.sort(key=lambda s: (s["t_ns"], s["source"] not in KERNEL_SOURCES))
    return out


def _xid_match(a: dict, b: dict) -> bool:
    """Could sightings a and b be the same Xid?"""
    if a["code"] != b["code"] or a["source"] == b["source"]:
        return False
    if a["gpu"] is not None and b["gpu"] is not None and a["gpu"] != b["gpu"]:
        return False
    u = a["unc_ns"] + b["unc_ns"]
    ak, bk = a["source"] in KERNEL_SOURCES, b["source"] in KERNEL_SOURCES
    if ak != bk:
        k, r = (a, b) if ak else (b, a)
        return -u <= r["t_ns"] - k["t_ns"] <= u + XID_RECEIPT_TOLERANCE_NS
    return abs(a["t_ns"] - b["t_ns"]) <= u + XID_RECEIPT_TOLERANCE_NS


def _xid_faults(tl, other) -> list:
    groups = []
    for s in _xid_sightings(tl, other):
        for g in groups:
            if all(x["source"] != s["source"] for x in g) and _xid_match(g[0], s):
                g.append(s)
                break
        else:
            groups.append([s])
    faults = []
    for g in groups:
        best = min(g, key=lambda s: (s["unc_ns"], s["source"] not in KERNEL_SOURCES, s["t_ns"]))
        code = best["code"]
        gpu = next((s["gpu"] for s in g if s["gpu"] is not None), None)
        pid = next((s["pid"] for s in g if s["pid"] is not None), None)
        msg = next((s["msg"] for s in g if s["msg"]), "")
        dev = next((s["dev"] for s in g if s["dev"]), None)
        text = (f"PCI {dev}: " if dev else "") + msg
        f = Fault(0, best["t_ns"], best["unc_ns"], "xid", code, xid_name(code), text,
                  pid=pid, gpu=gpu)
        f.sightings = [{k: s[k] for k in ("source", "t_ns", "unc_ns", "domain")}
                       for s in sorted(g, key=lambda s: s["t_ns"])]
        f.delays = [{"from": best["source"], "to": s["source"],
                     "delay_ns": s["t_ns"] - best["t_ns"],
                     "unc_ns": s["unc_ns"] + best["unc_ns"]} for s in g if s is not best]
        faults.append(f)
    return faults


def _link_xids(xids, cuda_roots, deaths):
    """Chain an Xid to the first CUDA error of its process that returned after it."""
    for x in xids:
        if x.pid is None:
            continue
        cands = [r for r in cuda_roots if r.pid == x.pid
                 and r.t_ns + r.dur_ns >= x.t_ns - x.unc_ns
                 and r.t_ns <= x.t_ns + XID_LINK_NS]
        if cands:
            r = min(cands, key=lambda r: r.t_ns)
            x.chain.append(_entry(x, r.t_ns, r.unc_ns, "error", function=r.function,
                                  code=r.code, name=r.name, tid=r.tid, dur_ns=r.dur_ns,
                                  fault=r))
            x.related.append(r)
            r.related.append(x)
            if r.healthy_ns is not None:
                x.healthy_ns = r.t_ns + r.healthy_ns - x.t_ns
        death = deaths.get(x.pid)
        if death is not None and death["t_ns"] >= x.t_ns:
            x.chain.append(_entry(x, death["t_ns"], death["unc_ns"], "exit", code=death["code"],
                                  name=death["name"], fault=death["fault"]))


# ---------------------------------------------------------------------- throttle
def _throttle_faults(tl) -> list:
    fid = FIELD_BY_NAME.get("clock_event_reasons")
    if fid is None:
        return []
    c = tl.counters(fields=[fid])
    faults = []
    for gpu in np.unique(c["gpu"]):
        g = c[(c["gpu"] == gpu) & np.isfinite(c["value"])]
        masks = g["value"].astype(np.int64)
        prev = np.concatenate(([0], masks[:-1]))
        for bit, name in CLOCK_REASONS.items():
            if not CAPPING & bit:
                continue
            now, was = (masks & bit) != 0, (prev & bit) != 0
            on = np.flatnonzero(now & ~was)
            off = np.flatnonzero(~now & was)
            for i in on:
                t, u = _between(g, i)
                first = i == 0
                f = Fault(0, t, u, "throttle", bit, name,
                          f"GPU {int(gpu)} clocks held down: {name} "
                          + ("set in the first sample (it may have been on before)" if first
                             else "switched on between two samples"), gpu=int(gpu))
                f.sightings.append({"source": "counters", "t_ns": int(g["t_ns"][i]),
                                    "unc_ns": int(g["unc_ns"][i]),
                                    "domain": "REALTIME" if "REALTIME" in tl.models
                                    else "receipt"})
                j = off[off > i]
                if len(j):
                    tc, uc = _between(g, int(j[0]))
                    f.chain.append(_entry(f, tc, uc, "cleared", name=name))
                    f.recovery_ns = tc - t
                    f.recovery_unc_ns = uc + u
                faults.append(f)
    return faults


def _between(g, i):
    """A reason bit changed between sample i-1 and sample i: the midpoint, ± half the gap
    plus the samples' own uncertainty."""
    t, u = int(g["t_ns"][i]), int(g["unc_ns"][i])
    if i == 0:
        return t, u
    tp, up = int(g["t_ns"][i - 1]), int(g["unc_ns"][i - 1])
    half = (t - tp) // 2
    return tp + half, (t - tp - half) + max(u, up)


# ---------------------------------------------------------------------- all together
_RANK = {k: i for i, k in enumerate(KINDS)}


def _benign_connects(tl, conn):
    """conn without the failures that are known probes (codes.BENIGN_CONNECTS); each kind
    of probe becomes one note in tl.notes: information, not a fault."""
    if conn is None:
        return None
    seen = {}
    keep = np.ones(len(conn), dtype=bool)
    for i in range(len(conn)):
        peer = decode_sockaddr(conn["data"][i], conn["a1"][i])
        err = -int(conn["ret"][i])
        what = benign_connect(peer, err)
        if what is not None:
            keep[i] = False
            seen.setdefault((peer, err, what), set()).add(int(conn["pid"][i]))
    for (peer, err, what), pids in seen.items():
        n = len(pids)
        tl.notes.append(f"connect({peer}) -> {errno_name(err)} in {n} process"
                        f"{'es' if n > 1 else ''} ({', '.join(map(str, sorted(pids)))}): "
                        f"{what}; information, not a fault")
    return conn[keep] if keep.any() else None


def find_faults(tl) -> list:
    data = _collect(tl)
    data["connect"] = _benign_connects(tl, data["connect"])
    nexts = _next_successes(tl, data["cuda"], data["connect"])
    deathf, deaths = _death_faults(tl, data["other"])
    cuda = _cuda_calls(data["cuda"], nexts).run(deaths) if data["cuda"] is not None else []
    conn = (_connect_calls(data["connect"], nexts).run(deaths)
            if data["connect"] is not None else [])
    xids = _xid_faults(tl, data["other"])
    _link_xids(xids, [f for f in cuda if f.kind == "cuda_error"], deaths)
    faults = cuda + conn + xids + deathf + _throttle_faults(tl)
    faults.sort(key=lambda f: (f.t_ns, _RANK.get(f.kind, 99), f.pid or 0, f.tid or 0))
    for i, f in enumerate(faults, 1):
        f.id = i
    for f in faults:
        if f.tid is not None:
            f.thread = tl.thread_name(f.tid, f.t_ns)
        parent = getattr(f, "_parent", None)
        f.parent = parent.id if parent is not None else None
        f.related = [r.id for r in f.related]
        for e in f.chain:
            if e["fault"] is not None:
                e["fault"] = e["fault"].id
            if e.get("tid") is not None:
                e["thread"] = tl.thread_name(e["tid"], e["t_ns"])
        for attr in ("_parent", "_k", "_ret", "_recover", "_sticky"):
            f.__dict__.pop(attr, None)
    return faults
