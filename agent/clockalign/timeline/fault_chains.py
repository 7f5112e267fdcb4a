"""Failing calls (CUDA driver calls, connect()) into faults and their chains.

    conn, benign_matched = split_benign_connects(data["connect"])
    faults = connect_calls(conn, nexts).run(deaths)
"""
import os
from dataclasses import dataclass
from typing import Optional

import numpy as np

from ..store import cuda_api
from ..store.schema import Kind
from . import benign
from .codes import STICKY_CURESULTS, cuda_result_name, errno_name
from .events import decode_sockaddr
from .fault import CHAIN_LIMIT, Fault, entry

_FN_NAMES = {fid: f.symbol for fid, f in cuda_api.FUNCTIONS.items()}


@dataclass
class _Root:
    """A fault that starts a chain, with what building the chain needs: its index among
    its process's failing calls, its code, the next success of its op (t, end, tid)."""

    fault: Fault
    k: int
    ret: int
    recover: Optional[tuple]
    sticky: bool


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

    def run(self, deaths: dict, parents: dict) -> list:
        """The faults of these calls; parents[id(sticky repeat)] gets its first error."""
        faults = []
        order = np.lexsort((self.t, self.pid))
        pids = self.pid[order]
        bounds = np.flatnonzero(np.diff(pids)) + 1
        for idx in np.split(order, bounds):
            if len(idx):
                faults.extend(self._one_pid(idx, deaths.get(int(self.pid[idx[0]])), parents))
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

    def _one_pid(self, idx, death, parents) -> list:
        t, end, op, ret = self.t[idx], self.end[idx], self.op[idx], self.ret[idx]
        pid = int(self.pid[idx[0]])
        death_t = death["t_ns"] if death else None

        def success_any(x, o):
            """The process healthy again after x: any successful call (CUDA), or one of
            op o (connect: that peer answering) where there is no after_any."""
            s = (self.after_any(pid, x) if self.after_any is not None
                 else self.after_op(pid, o, x))
            return None if s is None else s[:2]

        roots, role = [], {}          # role: k -> (what, its _Root, own Fault or _Root or None)
        open_by_op, sticky_root = {}, None
        ek = np.arange(len(idx))
        for k in ek:
            o, code, tk = int(op[k]), int(ret[k]), int(t[k])
            gi = int(idx[k])
            if sticky_root is not None and (code == sticky_root.ret or code in self.sticky) \
                    and (sticky_root.recover is None or tk < sticky_root.recover[0]):
                f = self._fault(gi, self.sticky_kind)
                parents[id(f)] = sticky_root.fault
                role[k] = ("sticky_error", sticky_root, f)
                continue
            retry_of = None
            for r in open_by_op.get(o, ()):
                if r.ret == code and (r.recover is None or tk < r.recover[0]):
                    retry_of = r
                    break
            if retry_of is not None:
                role[k] = ("retry", retry_of, None)
                continue
            r = _Root(self._fault(gi), k, code, self.after_op(pid, o, int(end[k])),
                      code in self.sticky)
            if r.sticky:
                sticky_root = r
            open_by_op.setdefault(o, []).append(r)
            roots.append(r)
            role[k] = ("root", r, r)
        for r in roots:
            self._chain(r, ek, role, t, end, op, idx, success_any, death, death_t)
        out = [r.fault for r in roots]
        out.extend(v[2] for v in role.values() if v[0] == "sticky_error")
        return out

    def _chain(self, root, ek, role, t, end, op, idx, success_any, death, death_t):
        r = root.fault
        stop = root.recover[0] if root.recover else None
        if death_t is not None and death_t >= r.t_ns and (stop is None or death_t < stop):
            stop = death_t
        last_end = r.t_ns + r.dur_ns
        r_op = int(self.op[idx[root.k]])
        healthy = success_any(last_end, r_op)
        start = int(np.searchsorted(ek, root.k, side="right"))
        n_more, more_t = 0, None
        for k in ek[start:]:
            tk = int(t[k])
            if stop is not None and tk >= stop:
                break
            what, of, own = role[k]
            if what == "sticky_error" and of is not root:
                continue       # belongs to the chain of the sticky error it repeats
            if what == "sticky_error":
                kind = "sticky_error"
            elif int(op[k]) == r_op:
                kind = "retry"
            elif self.family[idx[k]] != self.family[idx[root.k]]:
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
            f = own.fault if isinstance(own, _Root) else own
            r.chain.append(entry(r, tk, 0, kind, function=d.get("function"),
                                 target=d.get("target"), code=d["code"], name=d["name"],
                                 tid=int(self.tid[idx[k]]), dur_ns=int(end[k] - tk), fault=f))
            last_end = max(last_end, int(end[k]))
            healthy = success_any(last_end, r_op)
            if isinstance(own, _Root) and kind != "sticky_error" and own.sticky \
                    and not root.sticky:
                stop = tk      # a sticky error starts its own chain; this one ends here
                break
        if n_more:
            r.chain.append(entry(r, more_t, 0, "more", count=n_more))
        if root.recover is not None and (stop is None or root.recover[0] <= stop):
            rt, rend, rtid = root.recover
            r.chain.append(entry(r, rt, 0, "success", function=r.function, target=r.target,
                                 code=0, name="success", tid=rtid, dur_ns=rend - rt))
            r.recovery_ns = rend - r.t_ns
            r.recovery_unc_ns = 2 * r.unc_ns
        elif death is not None and death_t >= r.t_ns and (stop is None or death_t <= stop):
            r.chain.append(entry(r, death_t, death["unc_ns"], "exit", code=death["code"],
                                 name=death["name"], fault=death["fault"]))
        if healthy is not None and (stop is None or healthy[0] <= stop
                                    or (root.recover and healthy[0] <= root.recover[0])):
            r.healthy_ns = healthy[1] - r.t_ns


def cuda_calls(c, nexts) -> "_Calls":
    """The failing CUDA driver calls of collect()'s data, with what ends their chains."""
    ret = c["ret"].astype(np.int64)
    by_op, by_pid, op = nexts[Kind.CUDA][:3]

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


def connect_calls(ev, nexts) -> "_Calls":
    """The failing connect() calls, each peer its own op and family."""
    ret = ev["ret"].astype(np.int64)
    by_op, by_pid, op = nexts[Kind.CONNECT][:3]
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


def split_benign_connects(conn):
    """(conn without the failures a benign rule matches, [(Rule, peer, errno, pid, t_ns)]
    of those it matched): timeline/benign.py's table decides."""
    if conn is None:
        return None, []
    matched = []
    keep = np.ones(len(conn), dtype=bool)
    for i in range(len(conn)):
        peer = decode_sockaddr(conn["data"][i], conn["a1"][i])
        err = -int(conn["ret"][i])
        rule = benign.match_connect(peer, err)
        if rule is not None:
            keep[i] = False
            matched.append((rule, peer, err, int(conn["pid"][i]), int(conn["t_ns"][i])))
    return (conn[keep] if keep.any() else None), matched
