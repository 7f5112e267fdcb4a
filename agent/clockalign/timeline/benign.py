"""Failures every healthy process shows: one table (RULES) of known benign patterns, each
with why it is benign.  A failing call a rule matches becomes part of a note with a count,
not a fault; anything no rule matches stays a fault, in the same process too.

Decided from real recordings (results/benign/README.md says which): the CUDA runtime's MPS
probe and glibc's nscd probe in every PyTorch process on the H200; CUDA_ERROR_DEINITIALIZED
from calls made while the interpreter unloads the CUDA runtime at exit; kernel lookups a
library makes to learn whether a name exists.

    rule = match_connect("unix:/var/run/nscd/socket", errno.ENOENT)   # -> the nscd Rule
    keep, notes = classify_cuda(c, deaths, by_pid, by_tid)            # fault_events' arrays
"""
import errno
from dataclasses import dataclass

import numpy as np

from ..store import cuda_api
from .codes import cuda_result_name, errno_name

CUDA_ERROR_DEINITIALIZED = 4
CUDA_ERROR_NOT_FOUND = 500


@dataclass(frozen=True)
class Rule:
    """One benign pattern.  ``source``: "connect" (``peer`` prefix and ``errno``) or "cuda"
    (``code`` returned by a function of ``role``, or any function where role is None, and
    ``when``: "exit" = the process began to exit before the call, or made no successful CUDA
    call after it; "then_ok" = the next CUDA call of the same thread that is not another
    such failure succeeded)."""

    name: str
    source: str
    reason: str
    peer: str = None
    errno: int = None
    code: int = None
    role: str = None
    when: str = None


RULES = (
    Rule("nscd probe", "connect",
         "glibc's user/host lookups (getpwuid, getaddrinfo) ask the nscd cache daemon's "
         "socket first; none runs, so glibc reads /etc itself",
         peer="unix:/var/run/nscd/", errno=errno.ENOENT),
    Rule("MPS probe", "connect",
         "the CUDA runtime looks for an MPS server at start (CUDA_MPS_PIPE_DIRECTORY, "
         "default /tmp/nvidia-mps); none runs, so none is used",
         peer="unix:/tmp/nvidia-mp", errno=errno.ENOENT),
    Rule("driver shut down at exit", "cuda",
         "the CUDA driver is already torn down while the process exits (the runtime unloads "
         "its modules from exit handlers); no CUDA work followed",
         code=CUDA_ERROR_DEINITIALIZED, when="exit"),
    Rule("lookup not found", "cuda",
         "a library asking whether a kernel exists (optional or versioned names); the "
         "thread's next CUDA work succeeded",
         code=CUDA_ERROR_NOT_FOUND, role="function", when="then_ok"),
)


def match_connect(peer: str, err: int):
    """The Rule a failed connect(peer) -> errno err matches, or None."""
    for r in RULES:
        if r.source == "connect" and int(err) == r.errno and peer.startswith(r.peer):
            return r
    return None


def _matches(r, c) -> np.ndarray:
    """Failing CUDA calls (collect()'s arrays) with rule r's code from a function of its role."""
    m = c["ret"].astype(np.int64) == r.code
    if r.role:
        m &= np.isin(c["code"].astype(np.int64), cuda_api.ids(r.role))
    return m


def thread_rule_calls(c) -> np.ndarray:
    """The failing calls a "then_ok" rule may match: their thread's next successful call is
    needed (fault_events.next_successes looks it up only for these)."""
    m = np.zeros(len(c["ret"]), dtype=bool)
    for r in RULES:
        if r.source == "cuda" and r.when == "then_ok":
            m |= _matches(r, c)
    return m


def classify_cuda(c, deaths: dict, after_any, after_tid):
    """(keep, matched): keep[i] False where failing CUDA call i of collect()'s arrays is
    benign; matched = [(Rule, i)].  ``deaths``: pid -> its exit (fault_sources);
    ``after_any(pid, x)`` / ``after_tid(pid, tid, x)``: the first successful CUDA call of
    the process / of the thread starting at or after x, as (t, end, tid), or None."""
    keep = np.ones(len(c["ret"]), dtype=bool)
    matched = []
    t = c["t_ns"].astype(np.int64)
    end = t + np.maximum(c["dur_ns"].astype(np.int64), 0)
    pid, tid = c["pid"].astype(np.int64), c["tid"].astype(np.int64)
    # per thread, the start times of its failures no "then_ok" rule could excuse
    fails = {}
    excusable = thread_rule_calls(c)
    if excusable.any():
        other = np.flatnonzero(~excusable)
        key = (pid << 32 | tid)[other]
        o = np.lexsort((t[other], key))
        key, ts = key[o], t[other][o]
        cuts = np.flatnonzero(np.diff(key)) + 1
        fails = {int(k[0]): v for k, v in zip(np.split(key, cuts), np.split(ts, cuts))
                 if len(k)}
    for r in (r for r in RULES if r.source == "cuda"):
        for i in np.flatnonzero(_matches(r, c) & keep).tolist():
            p, e = int(pid[i]), int(end[i])
            if r.when == "exit":
                death = deaths.get(p)
                ok = (death is not None and t[i] >= death["t_ns"]) or after_any(p, e) is None
            else:
                s = after_tid(p, int(tid[i]), e)
                f = fails.get(p << 32 | int(tid[i]))
                j = np.searchsorted(f, e) if f is not None else 0
                ok = s is not None and (f is None or j >= len(f) or s[0] <= f[j])
            if ok:
                keep[i] = False
                matched.append((r, i))
    return keep, matched


def notes(matched_cuda, c, matched_connect) -> list:
    """One note per rule that matched: {rule, reason, count, pids, example, first_t_ns}.
    matched_connect = [(Rule, peer, errno, pid, t_ns)]."""
    out = {}
    for r, i in matched_cuda:
        fn = cuda_api.FUNCTIONS.get(int(c["code"][i]))
        ex = f"{fn.symbol if fn else int(c['code'][i])} -> {cuda_result_name(int(c['ret'][i]))}"
        _add(out, r, ex, int(c["pid"][i]), int(c["t_ns"][i]))
    for r, peer, err, pid, t_ns in matched_connect:
        _add(out, r, f"connect({peer}) -> {errno_name(err)}", pid, t_ns)
    for d in out.values():
        d["pids"] = sorted(d["pids"])
        d["examples"] = sorted(d["examples"])
    return sorted(out.values(), key=lambda d: d["first_t_ns"])


def _add(out, r, example, pid, t_ns):
    d = out.setdefault(r.name, {"rule": r.name, "reason": r.reason, "count": 0, "pids": set(),
                                "examples": set(), "first_t_ns": t_ns})
    d["count"] += 1
    d["pids"].add(pid)
    d["examples"].add(example)
    d["first_t_ns"] = min(d["first_t_ns"], t_ns)


def note_text(d) -> str:
    """One line for a note of notes(): what, how many, where, why."""
    n = len(d["pids"])
    ex = ", ".join(d["examples"][:3]) + (", ..." if len(d["examples"]) > 3 else "")
    return (f"{d['count']} x {d['rule']} ({ex}) in {n} process{'es' if n > 1 else ''} "
            f"({', '.join(map(str, d['pids'][:5]))}{', ...' if n > 5 else ''}): "
            f"{d['reason']}; information, not a fault")
