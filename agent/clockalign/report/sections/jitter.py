"""Context-switch jitter: off-CPU time inside CUDA calls, preemptions, wakeup latency, per
function and per thread, with a heatmap."""
import numpy as np

from .. import analysis, figures
from ..render import Table, fmt_count, fmt_ns, fmt_pct, fmt_t
from . import Section


ROWS = 10          # rows of each table in report.md and the terminal; report.json has all


def _summary(inside, ss) -> str:
    share = inside["total_ns"] / inside["call_time_ns"] if inside["call_time_ns"] else 0.0
    return (f"off-CPU inside CUDA calls: {fmt_ns(inside['total_ns'])} over "
            f"{fmt_count(inside['calls_with_offcpu'])} of {fmt_count(inside['calls'])} calls "
            f"({fmt_pct(share)} of CUDA call time); involuntary preemptions inside calls: "
            f"{fmt_count(inside['preemptions_in_calls'])}\n"
            f"off-CPU intervals: {fmt_count(ss['intervals'])} ({fmt_count(ss['preempted'])} "
            f"preempted, {fmt_count(ss['blocked'])} blocked); "
            f"wakeup-to-run latency p50 {fmt_ns(ss['wake_p50_ns'])}, p99 "
            f"{fmt_ns(ss['wake_p99_ns'])}, max {fmt_ns(ss['wake_max_ns'])} "
            f"({fmt_count(ss['wake_n'])} wakeups)")


def cuda_threads_first(per_thread, cuda_tids) -> list:
    """Threads that made CUDA calls first (most off-CPU first), then the rest: idle workers
    waiting on a queue are off-CPU all run long and say nothing about the CUDA path."""
    return sorted(per_thread, key=lambda r: (r["tid"] not in cuda_tids, -r["offcpu_ns"]))


def build(ctx) -> Section:
    tl, data, t0, t1, inside = ctx.tl, ctx.data, ctx.t0, ctx.t1, ctx.inside
    ss = analysis.sched_summary(data.sched, tl)
    by_fn = analysis.offcpu_by_function(data.cuda, inside)
    worst = analysis.worst_calls(data.cuda, inside, tl)
    summary = _summary(inside, ss)
    tf = Table(["function", "calls off-CPU", "off-CPU total", "share of call time", "preempted",
                "p99 off-CPU/call"])
    for r in by_fn:
        tf.add([r["function"], f"{fmt_count(r['calls_with_offcpu'])}/{fmt_count(r['calls'])}",
                fmt_ns(r["offcpu_ns"]), fmt_pct(r["share"]), fmt_count(r["preempted"]),
                fmt_ns(r["p99_offcpu_ns"])])
    tw = Table(["time", "thread", "function", "call", "off-CPU", "preempted"])
    for r in worst:
        tw.add([fmt_t(r["t_ns"], t0), f"{r['tid']} {r['thread']}", r["function"],
                fmt_ns(r["dur_ns"]), fmt_ns(r["offcpu_ns"]), r["preempted"]])
    tids_cuda, ncalls = np.unique(data.cuda["tid"].astype(np.int64), return_counts=True)
    calls = dict(zip(tids_cuda.tolist(), ncalls.tolist()))
    threads = cuda_threads_first(ss["per_thread"], calls)
    tt = Table(["thread", "CUDA calls", "off-CPU", "intervals", "preempted", "wakeup p50",
                "wakeup p99"])
    for r in threads:
        tt.add([f"{r['tid']} {r['thread']}", fmt_count(calls.get(r["tid"], 0)),
                fmt_ns(r["offcpu_ns"]), fmt_count(r["intervals"]), fmt_count(r["preempted"]),
                fmt_ns(r["wake_p50_ns"]), fmt_ns(r["wake_p99_ns"])])
    jit = {k: v for k, v in inside.items() if k not in ("per_call_ns", "preempted_per_call")}
    jit.update({k: v for k, v in ss.items() if k not in ("per_thread", "offcpu_ns")})
    jit["by_function"] = by_fn
    jit["per_thread"] = [dict(r, cuda_calls=calls.get(r["tid"], 0)) for r in threads]
    jit["worst_calls"] = worst
    shown = [r["tid"] for r in threads if r["tid"] in calls] or [r["tid"] for r in threads]
    sched = data.sched
    keep = np.isin(sched["tid"].astype(np.int64), shown[:3 * ROWS])
    tids, edges, mat = analysis.offcpu_heatmap({k: v[keep] for k, v in sched.items()}, t0,
                                               max(t1, t0 + 1))
    figs = [figures.offcpu_heatmap(tids, edges, mat, tl.threads, t0, ctx.faults, ctx.out_dir),
            figures.wakeup_latency(data.sched, ctx.out_dir)]
    text = ("  " + summary.replace("\n", "\n  ") + "\n\n" + tf.text(limit=ROWS, what="functions")
            + ("\n\n  calls with the most off-CPU time:\n" + tw.text(limit=5) if len(tw) else ""))
    md = (summary.replace("\n", "\n\n") + "\n\n" + tf.markdown(ROWS, "functions") +
          ("\nCalls with the most off-CPU time:\n\n" + tw.markdown() if len(tw) else "") +
          "\nPer thread (threads that made CUDA calls first):\n\n" + tt.markdown(ROWS, "threads")
          + "".join(f"\n![{f}]({f})\n" for f in figs if f))
    return Section("Context-switch jitter", text, md, {"jitter": jit}, [f for f in figs if f])
