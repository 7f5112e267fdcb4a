"""Each repetition of a fault, split into segments from the recording.

A repetition is a list of boundaries, each {name, t_ns, unc_ns, source}: the client's
stamps (request sent, error answer, ready answer), what the probes saw in the recording
of the service (the CUDA error return, the Xid, the watchdog thread's wakeup, the kill
signal, the worker's exit, the new worker's fork, its first CUDA call and first
successful launch), and, where no probe can see inside the process, the service's own
event log (validation rejected it, the engine raised, the model was loaded, ready).  A
kernel-stamped source wins over the log where both saw a boundary.  All stamps are
CLOCK_MONOTONIC; unc_ns is the clock uncertainty of the stamp (0 for bpf_ktime_get_ns and
time.monotonic_ns reads; for the send, half the time the request took to write).

    reps = split(Timeline.open("run.ca"), client, read_events("events.jsonl"))
    for r in reps: print(r["detect_ns"], [b["name"] for b in r["boundaries"]])

Where a new worker reloaded the model on a GPU, ``reload_cuda_calls`` counts its CUDA calls
by role from its first call to its first successful launch.

With standby workers (``inject --standby``) a repetition runs on to the moment the client
saw the standbys replenished (``t_full_ns``), and the two recoveries tell apart by their
boundaries: a cold restart has "worker restart ... ready (service)" before the ready
answer; a standby switch has "switched to standby" (the service's log), the standby's
first request (the sched_wakeup of its main thread, blocked until a request came) and the
ready answer, then the replacement's "worker restart ... standby replenished" after it.
"""
import numpy as np

from ..store import cuda_api
from ..store.schema import CUDA_FUNCTIONS, Kind
from .faults import request_id

LAUNCH_IDS = np.asarray(cuda_api.ids("launch", "graph_launch"), dtype=np.uint16)
CONTEXT_IDS = np.asarray([i for i in cuda_api.ids("context")
                          if cuda_api.FUNCTIONS[i].symbol != "cuInit"], dtype=np.uint16)

# boundary name -> service-log events that stand for it (first one in the window wins)
LOGGED = {
    "rejected by validation": ("rejected",),
    "request accepted": ("accepted",),
    "engine raised": ("engine_oom", "engine_sticky_error", "engine_error"),
    "split retry failed": ("oom_retry_failed",),
    "watchdog wakeup": ("watchdog_fired",),
    "kill sent": ("kill_sent",),
    "worker exit": ("worker_exit",),
    "worker restart": ("worker_spawn",),
    "worker started": ("worker_start",),
    "model loaded": ("model_loaded",),
    "first successful inference": ("first_success", "canary_ok"),
    "ready (service)": ("ready",),
}


def _b(name, t, unc, source):
    return {"name": name, "t_ns": int(t), "unc_ns": int(unc), "source": source}


def _fn(code) -> str:
    return CUDA_FUNCTIONS.get(int(code), (f"cuda function {int(code)}",))[0]


class _Run:
    """What the repetitions are cut from, read from the timeline once."""

    def __init__(self, tl, events):
        self.tl = tl
        self.events = events
        self.faults = tl.faults(kinds=["cuda_error", "xid"])
        life = tl.events(kinds=["thread_new", "thread_exit", "signal"])
        self.forks = life[life["kind"] == Kind.THREAD_NEW]
        self.exits = life[(life["kind"] == Kind.THREAD_EXIT) & (life["code"] == 1)]
        self.kills = life[(life["kind"] == Kind.SIGNAL) & (life["ret"] == 9)]
        self._sched = {}
        self.spawns = [(r["t_ns"], r["worker"]) for r in events if r["ev"] == "worker_spawn"]
        self.serving = [(r["t_ns"], r["worker"]) for r in events if r["ev"] in ("ready", "switch")]

    def log(self, evs, lo, hi, pid=None, rid=None):
        for r in self.events:
            if lo <= r["t_ns"] <= hi and r["ev"] in evs and (pid is None or r["pid"] == pid
                                                             or r.get("worker") == pid) \
                    and (rid is None or r.get("id") == rid):
                return r
        return None

    def worker_at(self, t):
        """(pid of the worker serving at t, pid of the next one started after t): the last
        one the service turned ready with or switched to (else the last one started)."""
        before = [p for ts, p in self.serving if ts <= t] or \
            [p for ts, p in self.spawns if ts <= t]
        after = [p for ts, p in self.spawns if ts > t]
        return (before[-1] if before else None), (after[0] if after else None)

    def wakeup(self, tid, lo, hi, last=False):
        """The first (last) wakeup of thread ``tid`` that it ran after within [lo, hi] ->
        (t_ns, unc_ns) or None: a SCHED record's switch-in minus its wakeup-to-run time."""
        if tid not in self._sched:
            self._sched[tid] = self.tl.events(kinds=["sched"], tids=[tid])
        sch = self._sched[tid]
        run_at = sch["t_ns"] + sch["dur_ns"]
        m = np.flatnonzero((run_at >= lo) & (run_at <= hi))
        if not len(m):
            return None
        e = sch[m[np.argmax(run_at[m]) if last else np.argmin(run_at[m])]]
        return int(e["t_ns"] + e["dur_ns"] - e["a0"]), int(e["unc_ns"])


def _repetition(run, rep, fault_name):
    t0, t_ans, t_ready = rep["t_send_ns"], rep["t_answer_ns"], rep["t_ready_ns"]
    hi = max(t_ready, rep.get("t_full_ns") or t_ready)     # with standbys: replenished
    old, new = run.worker_at(t0)
    out = [_b("request sent", (t0 + rep["t_sent_ns"]) // 2, (rep["t_sent_ns"] - t0 + 1) // 2,
              "client")]
    if new is not None and run.log(("worker_spawn",), t0, hi, new) is None:
        new = None                          # the next worker started after this repetition
    procs = {p for p in (old, new) if p is not None}
    reload_calls = {}

    def kernel_or_log(name, arr, pid_field, pid, source, log_pid=None, lo=t0, rid=None):
        if arr is not None and pid is not None and len(arr):
            m = (arr[pid_field] == pid) & (arr["t_ns"] >= lo) & (arr["t_ns"] <= hi)
            if m.any():
                e = arr[np.flatnonzero(m)[0]]
                out.append(_b(name, e["t_ns"], e["unc_ns"], source))
                return int(e["t_ns"])
        r = run.log(LOGGED[name], lo, hi, log_pid, rid)
        if r is not None:
            out.append(_b(name, r["t_ns"], 0, "service log"))
            return r["t_ns"]
        return None

    rid = request_id(rep["i"])
    kernel_or_log("rejected by validation", None, None, None, None, rid=rid)
    kernel_or_log("request accepted", None, None, None, None, rid=rid)
    for f in run.faults:
        end = f.t_ns + f.dur_ns
        if f.kind == "cuda_error" and f.pid in procs and t0 <= end <= hi:
            out.append(_b("CUDA error returned", end, f.unc_ns,
                          f"uprobe: {f.function} -> {f.name}"))
            break
    for f in run.faults:
        if f.kind == "xid" and t0 - f.unc_ns <= f.t_ns <= hi + f.unc_ns:
            out.append(_b(f"Xid {f.code}", f.t_ns, f.unc_ns, f.sightings[0]["source"]))
            break
    kernel_or_log("engine raised", None, None, None, None, old)
    kernel_or_log("split retry failed", None, None, None, None, old)
    fired = run.log(("watchdog_fired",), t0, hi)
    if fired is not None:
        woke = run.wakeup(fired["tid"], t0, fired["t_ns"], last=True)
        out.append(_b("watchdog wakeup", *woke, "sched_wakeup tracepoint") if woke else
                   _b("watchdog wakeup", fired["t_ns"], 0, "service log"))
    switch = next((r for r in run.events if r["ev"] == "switch" and r.get("old") == old
                   and t0 <= r["t_ns"] <= hi), None)
    if switch is not None:
        out.append(_b("switched to standby", switch["t_ns"], 0, "service log"))
        # the standby's main thread sleeps in recv() until a request comes
        woke = run.wakeup(switch["worker"], switch["t_ns"], hi)
        if woke is not None:
            out.append(_b("standby's first request", woke[0], woke[1],
                          "sched_wakeup tracepoint"))
    kernel_or_log("kill sent", run.kills, "pid", old, "signal_generate tracepoint")
    exited = kernel_or_log("worker exit", run.exits, "pid", old if new else None,
                           "sched_process_exit tracepoint", old) if new else None
    out.append(_b("error answer", t_ans, 0, "client"))
    if new is not None:
        kernel_or_log("worker restart", run.forks, "tid", new, "sched_process_fork tracepoint",
                      new, lo=exited or t0)
        kernel_or_log("worker started", None, None, None, None, new)
        cuda = run.tl.events(kinds=["cuda"], window=(t0, hi))
        mine = cuda[cuda["pid"] == new]
        if len(mine):
            out.append(_b("CUDA init", mine["t_ns"][0], mine["unc_ns"][0],
                          f"uprobe: {_fn(mine['code'][0])}"))
            # the driver start ends when the first context call returns (cuInit's own
            # duration and the context's creation, apart from the import before them)
            ctx = mine[np.isin(mine["code"], CONTEXT_IDS) & (mine["ret"] == 0)]
            if len(ctx) and ctx["t_ns"][0] > mine["t_ns"][0]:
                out.append(_b("CUDA context", ctx["t_ns"][0] + ctx["dur_ns"][0],
                              ctx["unc_ns"][0], f"uprobe: {_fn(ctx['code'][0])} returned"))
        kernel_or_log("model loaded", None, None, None, None, new)
        ok = mine[(mine["ret"] == 0) & np.isin(mine["code"], LAUNCH_IDS)] if len(mine) else mine
        loaded = run.log(("model_loaded",), t0, hi, new)
        if loaded is not None and len(ok):
            ok = ok[ok["t_ns"] >= loaded["t_ns"]]
        if len(ok):
            first = ok["t_ns"][0] + ok["dur_ns"][0]
            out.append(_b("first successful launch", first, ok["unc_ns"][0],
                          f"uprobe: {_fn(ok['code'][0])}"))
            reload_calls.update(_roles(mine[mine["t_ns"] < ok["t_ns"][0]]))
        else:
            kernel_or_log("first successful inference", None, None, None, None, new)
    elif fault_name == "oom" and old is not None:
        kernel_or_log("first successful inference", None, None, None, None, old)
    kernel_or_log("ready (service)", None, None, None, None, new or old)
    back = run.log(("standby_ready",), t0, hi, new or old)
    if back is not None:
        # the supervisor thread sleeps in recv() until the worker says it is ready, which
        # it does right after its first successful inference
        done = [b["t_ns"] for b in out if b["name"] in ("first successful inference",
                                                         "first successful launch")]
        woke = run.wakeup(back["tid"], done[-1], back["t_ns"]) if done else None
        out.append(_b("standby replenished", *woke, "sched_wakeup tracepoint") if woke else
                   _b("standby replenished", back["t_ns"], 0, "service log"))
    out.append(_b("ready answer", t_ready, 0, "client"))
    out.sort(key=lambda b: b["t_ns"])
    return out, reload_calls


def _roles(cuda) -> dict:
    """{role: calls} of CUDA events (the new worker's init and model load), by the table's
    roles ('alloc', 'copy', 'module', ...)."""
    roles = {}
    for fid, n in zip(*np.unique(cuda["code"], return_counts=True)):
        r = cuda_api.role_of(int(fid)) or "other"
        roles[r] = roles.get(r, 0) + int(n)
    return roles


def split(tl, client: dict, events: list) -> list:
    """One dict per repetition: status, error, detect/recover/total ns (None where the
    fault was not triggered or the service did not get ready again) and its boundaries."""
    run = _Run(tl, events)
    out = []
    for rep in client["repetitions"]:
        r = {"i": rep["i"], "status": rep["status"], "error": rep["error"],
             "detect_ns": None, "recover_ns": None, "total_ns": None, "boundaries": [],
             "reload_cuda_calls": {}, "replenish_ns": None}
        if rep.get("t_send_ns") is not None and rep.get("t_ready_ns") is not None:
            r["boundaries"], r["reload_cuda_calls"] = _repetition(run, rep, client["fault"])
            if rep["status"] is not None and rep["status"] >= 400:
                r["detect_ns"] = rep["t_answer_ns"] - rep["t_send_ns"]
                r["recover_ns"] = rep["t_ready_ns"] - rep["t_answer_ns"]
                r["total_ns"] = rep["t_ready_ns"] - rep["t_send_ns"]
                back = [b["t_ns"] for b in r["boundaries"] if b["name"] == "standby replenished"]
                if back:
                    r["replenish_ns"] = back[0] - rep["t_send_ns"]
        out.append(r)
    return out


def canonical_order(reps) -> list:
    """Boundary names in the order of their median time after the request was sent; the
    request comes first whatever its stamp (the middle of the client's send window, which a
    slow send can put after the service's "request accepted")."""
    offs = {}
    for r in reps:
        if r["total_ns"] is None:
            continue
        sent = [b["t_ns"] for b in r["boundaries"] if b["name"] == "request sent"]
        t0 = sent[0] if sent else r["boundaries"][0]["t_ns"]
        for b in r["boundaries"]:
            offs.setdefault(b["name"], []).append(b["t_ns"] - t0)
    return sorted(offs, key=lambda n: (n != "request sent", float(np.median(offs[n]))))


def segments(reps) -> list:
    """[(name 'A -> B', [ns per repetition], [unc ns per repetition])] between consecutive
    boundaries of the canonical order, for the repetitions that have both ends."""
    order = canonical_order(reps)
    out = []
    for a, b in zip(order, order[1:]):
        d, u = [], []
        for r in reps:
            if r["total_ns"] is None:
                continue
            by = {x["name"]: x for x in r["boundaries"]}
            if a in by and b in by:
                d.append(by[b]["t_ns"] - by[a]["t_ns"])
                u.append(by[a]["unc_ns"] + by[b]["unc_ns"])
        out.append((f"{a} -> {b}", d, u))
    return out
