"""The report's GPU activity section (record --gpu-activity): what the GPU ran, per stream,
and the joint view of one timeline: GPU idle gaps while the thread that launched the next
work was off-CPU (preempted or blocked).

- busy/idle per stream: the union of its executions against its span (first start to
  last end);
- launch-to-start: an execution's start minus its launching call's entry (BPF), i.e. the
  launch overhead plus the time queued behind earlier work;
- kernel durations: percentiles, and the kernels with the most GPU time;
- CUDA graphs: the kernels of each graph (CUPTI's graph id) grouped into its replays (one
  per launching call's correlation id): replays, nodes, kernels, GPU time, replay span;
- idle gaps: between one stream's busy intervals; each is charged with the off-CPU time of
  the thread that launched the work after it, inside [gap start, min(gap end, that launch
  call's entry)]: the GPU waited while that thread was not running.

    sec = gpu_section(tl.gpu_activity(fields=FIELDS), data.sched)   # None without it
    sec["numbers"], sec["text"], sec["markdown"]
"""
import numpy as np

from ..store.schema import GpuKind
from ..timeline.gpu_table import Concat, blocks as _blocks, group_ids, take as _take
from .analysis import pct
from .render import Table, fmt_count, fmt_ns, fmt_pct

# The fields of the executions this section reads (Timeline.gpu_activity(fields=...): narrow
# columns, a fraction of the whole rows' 139 bytes an execution).
FIELDS = ("kind", "raw", "launch_src", "t_ns", "end_ns", "unc_ns", "pid", "gpu", "stream",
          "name", "corr", "aux", "launch_tid", "launch_t_ns", "graph_node")


def off_cpu_within(t0, t1, s, d):
    """Per window [t0[i], t1[i]]: time covered by the intervals [s, s + d) of one thread
    (non-overlapping, sorted by s)."""
    if not len(s):
        return np.zeros(len(t0), dtype=np.int64)
    e = s + d
    cum = np.r_[0, np.cumsum(d)]

    def before(t):          # off-CPU time before t
        j = np.searchsorted(s, t, side="right") - 1
        jj = np.maximum(j, 0)
        part = np.where(j >= 0, np.minimum(t, e[jj]) - s[jj], 0)
        return np.where(j >= 0, cum[jj] + np.maximum(part, 0), 0)
    return np.maximum(before(t1) - before(t0), 0)


def stream_order(rows):
    """The rows by stream: (the distinct (gpu, pid, stream) in order, each row's index in
    them).  A stream's rows, flatnonzero(lane == j), are in start order (the rows are
    sorted by t_ns, stable)."""
    return group_ids(rows, ("gpu", "pid", "stream"))


def _each_stream(rows, streams):
    uniq, lane = streams if streams is not None else stream_order(rows)
    for j, key in enumerate(uniq):
        yield j, key, np.flatnonzero(lane == j)


def within(t0, t1, windows) -> int:
    """ns of [t0, t1) inside the windows ([n, 2], sorted); windows None: all of it."""
    if windows is None:
        return int(t1 - t0)
    return int(np.maximum(np.minimum(windows[:, 1], t1) - np.maximum(windows[:, 0], t0),
                          0).sum())


def stream_table(rows, streams=None, windows=None) -> list:
    """Per stream: executions by kind, span (first start to last end; with sampled
    activity, the part of it inside the windows), busy time (the union of its executions:
    the first-to-last span less its idle gaps) and idle time (span less busy), a block of
    rows at a time."""
    out = []
    for _, (g, p, s), idx in _each_stream(rows, streams):
        kind = rows["kind"][idx]
        last = max(int(_take(rows, "end_ns", idx[b]).max()) for b in _blocks(len(idx)))
        first = int(_take(rows, "t_ns", idx[:1])[0])
        busy = last - first - sum(int((g1 - g0).sum())
                                  for g0, g1, _, _ in _stream_gaps(rows, idx))
        span = within(first, last, windows)
        out.append({"gpu": g, "pid": p, "stream": s, "executions": int(len(idx)),
                    "kernels": int((kind == GpuKind.KERNEL).sum()),
                    "copies": int((kind == GpuKind.MEMCPY).sum()),
                    "memsets": int((kind == GpuKind.MEMSET).sum()),
                    "span_ns": span, "busy_ns": busy, "idle_ns": span - busy,
                    "busy_share": busy / span if span > 0 else None})
    return out


def _stream_gaps(rows, idx, windows=None):
    """The idle gaps of one stream (``idx``: its rows in start order), a block of rows at a
    time, as columns: start (the reach of the work before), end (the next work's start),
    the next work's launching tid and launch entry (-1: none).  With sampled activity
    (``windows``), a gap that leaves its window is none: nothing was recorded after it
    closed."""
    reach_before = None
    for b in _blocks(len(idx)):
        i = idx[b] if b.start == 0 else idx[b.start - 1:b.stop]   # with the row before
        t = _take(rows, "t_ns", i)
        reach = np.maximum.accumulate(_take(rows, "end_ns", i))
        if reach_before is not None:
            reach = np.maximum(reach, reach_before)
        reach_before = reach[-1]
        gap = np.flatnonzero(t[1:] > reach[:-1])
        if windows is not None and len(gap):
            w = np.searchsorted(windows[:, 0], reach[gap], side="right") - 1
            gap = gap[(w >= 0) & (t[gap + 1] <= windows[np.maximum(w, 0), 1])]
        nxt = i[gap + 1]
        yield (reach[gap], t[gap + 1], rows["launch_tid"][nxt].astype(np.int64),
               np.where(rows["launch_src"][nxt] != 0, _take(rows, "launch_t_ns", nxt),
                        -1).astype(np.int64))


class _OffCpu:
    """A thread's off-CPU intervals (preempted: flag 1, blocked: 0), sorted, from the
    report's sched columns; each thread's found once."""

    def __init__(self, sched):
        self.st, self.sd, self.stid, self.spre = (
            np.asarray(sched.get(k, []), dtype=np.int64) for k in ("t", "dur", "tid", "pre"))
        self.cache = {}

    def of(self, tid: int, flag: int):
        got = self.cache.get((tid, flag))
        if got is None:
            sel = (self.stid == tid) & (self.spre == flag)
            o = np.argsort(self.st[sel], kind="stable")
            got = self.cache[(tid, flag)] = (self.st[sel][o], self.sd[sel][o])
        return got


def _charge(j, at, g0, g1, tid, launch, off_cpu, tot, cand, uniq):
    """Charge gaps of stream j (its gaps ``at``.. in order) with the off-CPU time of the
    thread that launched the work after each; add them to the totals ``tot`` and their
    10 largest to ``cand``."""
    if not len(g0):
        return
    w1 = np.where(launch >= 0, np.minimum(g1, launch), g1)
    pre = np.zeros(len(g0), dtype=np.int64)
    blk = np.zeros(len(g0), dtype=np.int64)
    for t in np.unique(tid[launch >= 0]).tolist():
        m = (tid == t) & (launch >= 0)
        for flag, out in ((1, pre), (0, blk)):
            out[m] = off_cpu_within(g0[m], w1[m], *off_cpu.of(t, flag))
    off = pre + blk
    idle = g1 - g0
    tot["gaps"] += int(len(g0))
    tot["idle_ns"] += int(idle.sum())
    tot["with_offcpu"] += int((off > 0).sum())
    tot["offcpu_ns"] += int(off.sum())
    tot["preempted_ns"] += int(pre.sum())
    tot["blocked_ns"] += int(blk.sum())
    tot["idle_in_gaps_with_offcpu_ns"] += int(idle[off > 0].sum())
    for i in np.argsort(-off, kind="stable")[:10].tolist():
        cand.append((-int(off[i]), j, at + i, {
            "gpu": uniq[j][0], "pid": uniq[j][1], "stream": uniq[j][2],
            "start_ns": int(g0[i]), "idle_ns": int(idle[i]), "tid": int(tid[i]),
            "preempted_ns": int(pre[i]), "blocked_ns": int(blk[i])}))


def idle_gaps(rows, sched, streams=None, windows=None) -> dict:
    """Every idle gap of every stream, charged with its next work's launcher's off-CPU
    time; one stream at a time (the gaps of a run can be as many as its executions)."""
    if streams is None:
        streams = stream_order(rows)
    uniq = streams[0]
    off_cpu = _OffCpu(sched)
    tot = dict.fromkeys(("gaps", "idle_ns", "with_offcpu", "offcpu_ns", "preempted_ns",
                         "blocked_ns", "idle_in_gaps_with_offcpu_ns"), 0)
    cand = []        # (-off, stream, gap): the 10 largest of each stream
    for j, _, idx in _each_stream(rows, streams):
        at = 0          # gaps of the stream before this block
        for g0, g1, tid, launch in _stream_gaps(rows, idx, windows):
            _charge(j, at, g0, g1, tid, launch, off_cpu, tot, cand, uniq)
            at += len(g0)
    if not tot["gaps"]:
        return {"gaps": 0, "idle_ns": 0, "with_offcpu": 0, "offcpu_ns": 0, "preempted_ns": 0,
                "blocked_ns": 0, "top": []}
    cand.sort(key=lambda c: c[:3])
    return {**tot, "top": [c[3] for c in cand[:10] if c[0] < 0]}


def durations(rows, idx) -> np.ndarray:
    """end_ns - t_ns of rows ``idx``, a block at a time, in the narrowest integer type."""
    parts = Concat()
    for b in _blocks(len(idx)):
        parts.add(_take(rows, "end_ns", idx[b]) - _take(rows, "t_ns", idx[b]))
    return parts.array()


def launch_to_start(rows) -> np.ndarray:
    """t_ns - launch_t_ns of the raw rows joined to their BPF call, a block at a time."""
    parts = Concat()
    for b in _blocks(len(rows)):
        q = np.flatnonzero((rows["launch_src"][b] == 1) & rows["raw"][b]) + b.start
        parts.add(_take(rows, "t_ns", q) - _take(rows, "launch_t_ns", q))
    return parts.array()


def kernel_table(acts, rows, k=15, ki=None, dur=None) -> list:
    """The k kernels (by pid and name) with the most GPU time; ``ki``/``dur``: the kernel
    rows and their durations, where the caller has them."""
    if ki is None:
        ki = np.flatnonzero(rows["kind"] == GpuKind.KERNEL)
        dur = durations(rows, ki)
    if not len(ki):
        return []
    uniq, inv = group_ids(rows, ("pid", "name"), ki)
    tot = np.zeros(len(uniq), dtype=np.float64)
    for b in _blocks(len(ki)):
        tot += np.bincount(inv[b], weights=dur[b].astype(np.float64), minlength=len(uniq))
    out = []
    for j in np.argsort(-tot)[:k].tolist():
        m = inv == j
        d = dur[m]
        out.append({"kernel": acts.name(rows[int(ki[np.flatnonzero(m)[0]])]),
                    "count": int(m.sum()), "total_ns": int(d.sum()), "p50_ns": pct(d, 50),
                    "p99_ns": pct(d, 99), "max_ns": int(d.max())})
    return out


def graph_table(rows, k=10) -> list:
    """Per (pid, graph id), the graphs with the most GPU time first: replays (distinct
    correlation ids: one cuGraphLaunch each), distinct nodes, kernels, GPU time and the
    replays' span (first kernel start to last kernel end) p50 / max."""
    gi = np.flatnonzero((rows["kind"] == GpuKind.KERNEL) & (rows["aux"] != 0))
    if not len(gi):
        return []
    g = rows[gi]
    gkey = (g["pid"].astype(np.int64) << 32) | g["aux"].astype(np.int64)
    uniq, inv = np.unique(gkey, return_inverse=True)
    dur = (g["end_ns"] - g["t_ns"]).astype(np.float64)
    tot = np.bincount(inv, weights=dur)
    out = []
    for j in np.argsort(-tot)[:k].tolist():
        m = np.flatnonzero(inv == j)
        corr = g["corr"][m]
        ruq, rinv = np.unique(corr, return_inverse=True)
        t0 = np.full(len(ruq), np.iinfo(np.int64).max)
        t1 = np.full(len(ruq), np.iinfo(np.int64).min)
        np.minimum.at(t0, rinv, g["t_ns"][m])
        np.maximum.at(t1, rinv, g["end_ns"][m])
        span = t1 - t0
        out.append({"pid": int(uniq[j] >> 32), "graph": int(uniq[j] & 0xFFFFFFFF),
                    "replays": int(len(ruq)), "nodes": int(len(np.unique(g["graph_node"][m]))),
                    "kernels": int(len(m)), "total_ns": int(tot[j]),
                    "span_p50_ns": pct(span, 50), "span_max_ns": int(span.max())})
    return out


def gpu_section(acts, sched):
    """{"numbers", "text", "markdown"} of the GPU activity section, or None."""
    rows = acts.rows
    if not len(rows):
        return None
    raw = rows["raw"]
    streams = stream_order(rows)
    nums = {"stats": acts.stats, "streams": stream_table(rows, streams, acts.windows)}
    ki = np.flatnonzero(rows["kind"] == GpuKind.KERNEL)
    ki = ki.astype(np.uint32) if len(ki) < 1 << 32 else ki
    kd = durations(rows, ki)
    nums["kernel_duration_ns"] = {"n": int(len(kd)), **{f"p{q}": pct(kd, q)
                                                        for q in (50, 90, 99, 99.9)},
                                  "max": int(kd.max()) if len(kd) else None}
    qd = launch_to_start(rows)
    nums["launch_to_start_ns"] = {"n": int(len(qd)), **{f"p{x}": pct(qd, x)
                                                        for x in (50, 90, 99)},
                                  "max": int(qd.max()) if len(qd) else None,
                                  "negative": int((qd < 0).sum())}
    del qd
    nums["kernels"] = kernel_table(acts, rows, ki=ki, dur=kd)
    del ki, kd
    nums["graphs"] = graph_table(rows)
    gaps = idle_gaps(rows, sched, streams, acts.windows)
    del streams
    nums["idle_gaps"] = gaps
    unc = rows["unc_ns"][raw]
    nums["unc_ns"] = {"p50": pct(unc, 50), "p99": pct(unc, 99), "max": int(unc.max())
                      if len(unc) else None, "converted": int((~raw).sum())}

    st = Table(["gpu", "pid", "stream", "kernels", "copies", "memsets", "busy", "idle",
                "busy share"])
    for r in nums["streams"]:
        st.add([r["gpu"], r["pid"], r["stream"], fmt_count(r["kernels"]), fmt_count(r["copies"]),
                fmt_count(r["memsets"]), fmt_ns(r["busy_ns"]), fmt_ns(r["idle_ns"]),
                fmt_pct(r["busy_share"]) if r["busy_share"] is not None else "-"])
    kd_, ls = nums["kernel_duration_ns"], nums["launch_to_start_ns"]
    smp = acts.stats.get("sampled")
    summary = ((f"SAMPLED (--gpu-activity-duty): CUPTI on {smp['share']:.0%} of every "
                f"{smp['period_s']:g} s, {smp['windows']} windows, {fmt_ns(smp['armed_ns'])} in "
                "all; what the GPU ran between them is not here, and idle time counts only "
                "inside them\n" if smp else "") +
               f"{fmt_count(len(rows))} GPU executions ({fmt_count(acts.stats.get('gpu_kernel', 0))}"
               f" kernels, {fmt_count(acts.stats.get('gpu_copy', 0))} copies, "
               f"{fmt_count(acts.stats.get('gpu_memset', 0))} memsets); mapped from the GPU clock "
               f"with uncertainty p50 {fmt_ns(nums['unc_ns']['p50'])}, p99 "
               f"{fmt_ns(nums['unc_ns']['p99'])}"
               + (f"; {fmt_count(nums['unc_ns']['converted'])} with CUPTI's converted times "
                  "(no bound)" if nums["unc_ns"]["converted"] else "") + "\n"
               f"kernel duration p50 {fmt_ns(kd_['p50'])}, p99 {fmt_ns(kd_['p99'])}, max "
               f"{fmt_ns(kd_['max'])}; launch entry to start p50 {fmt_ns(ls['p50'])}, p99 "
               f"{fmt_ns(ls['p99'])}, max {fmt_ns(ls['max'])} ({fmt_count(ls['n'])} launches "
               "joined to their BPF call)\n"
               f"idle gaps: {fmt_count(gaps['gaps'])}, {fmt_ns(gaps['idle_ns'])} in all; "
               f"{fmt_count(gaps['with_offcpu'])} of them while the thread that launched the next "
               f"work was off-CPU: {fmt_ns(gaps['offcpu_ns'])} off-CPU "
               f"({fmt_ns(gaps['preempted_ns'])} preempted, {fmt_ns(gaps['blocked_ns'])} "
               f"blocked) inside {fmt_ns(gaps.get('idle_in_gaps_with_offcpu_ns', 0))} of idle GPU")
    kt = Table(["kernel", "count", "GPU time", "p50", "p99", "max"])
    for r in nums["kernels"]:
        name = r["kernel"] if len(r["kernel"]) <= 60 else r["kernel"][:57] + "..."
        kt.add([name, fmt_count(r["count"]), fmt_ns(r["total_ns"]), fmt_ns(r["p50_ns"]),
                fmt_ns(r["p99_ns"]), fmt_ns(r["max_ns"])])
    grt = Table(["pid", "graph", "replays", "nodes", "kernels", "GPU time", "replay p50",
                 "replay max"])
    for r in nums["graphs"]:
        grt.add([r["pid"], r["graph"], fmt_count(r["replays"]), fmt_count(r["nodes"]),
                 fmt_count(r["kernels"]), fmt_ns(r["total_ns"]), fmt_ns(r["span_p50_ns"]),
                 fmt_ns(r["span_max_ns"])])
    gt = Table(["gpu/stream", "thread", "idle", "preempted", "blocked"])
    for r in gaps["top"]:
        gt.add([f"{r['gpu']}/{r['stream']}", r["tid"], fmt_ns(r["idle_ns"]),
                fmt_ns(r["preempted_ns"]), fmt_ns(r["blocked_ns"])])
    notes = "".join(f"\n{n}\n" for n in acts.notes)
    text = ("  " + summary.replace("\n", "\n  ") + "\n\n" + st.text(limit=10, what="streams")
            + ("\n\n  idle gaps with the launching thread off-CPU (largest first):\n" + gt.text()
               if len(gt) else ""))
    md = (summary.replace("\n", "\n\n") + "\n\nPer stream:\n\n" + st.markdown(15, "streams")
          + "\nKernels by GPU time:\n\n" + kt.markdown()
          + ("\nCUDA graphs, kernels grouped into replays (by GPU time):\n\n" + grt.markdown()
             if len(grt) else "")
          + ("\nIdle gaps while the launching thread was off-CPU (largest first):\n\n"
             + gt.markdown() if len(gt) else "") + notes)
    return {"numbers": nums, "text": text, "markdown": md}
