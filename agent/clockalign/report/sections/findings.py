"""Findings: what an engineer reads first, a few lines ranked by impact, each pointing to
the section with the detail.  Built last from the other sections' numbers and put first.

Ranked: events lost and faults never recovered first (what the rest of the report can be
trusted for, and what did not come back); then by time: a recovered fault by its recovery,
GPU idle while the launching thread was off-CPU by that idle time, context-switch jitter by
the off-CPU time inside CUDA calls, where the time went by the CUDA call time.

    sec = findings.build(ctx, assemble.numbers(sections))
"""
from ..brief import fault_line
from ..fault_list import benign_line
from ..render import fmt_count, fmt_ns, fmt_pct, fmt_t
from ..run_info import drop_counts
from . import Section

_PINNED = -1           # impact of a finding that goes first whatever its time


def _anchor(title) -> str:
    """The markdown anchor of a section title (GitHub's rule: lower case, spaces to '-',
    punctuation dropped)."""
    return "#" + "".join(c for c in title.lower().replace(" ", "-") if c.isalnum() or c == "-")


def _faults(ctx):
    faults = ctx.faults
    roots = [f for f in faults if f.kind != "cuda_sticky_error"]
    benign = (" " + benign_line(ctx.tl.benign) + ".") if ctx.tl.benign else ""
    if not roots:
        return [(0, "No faults." + benign, "Faults")]
    repeats = {}
    for f in faults:
        if f.parent is not None:
            repeats[f.parent] = repeats.get(f.parent, 0) + 1
    open_ = [f for f in roots if f.recovery_ns is None and f.healthy_ns is None
             and f.kind in ("cuda_error", "connect_error", "xid")]
    worst = sorted(roots, key=lambda f: (f not in open_, -(f.recovery_ns or 0), f.t_ns))[:3]
    head = (f"{len(roots)} fault{'s' if len(roots) != 1 else ''}"
            + (f" ({len(open_)} not healthy again before the run ended)" if open_ else "")
            + ("; the worst: " if len(roots) > 1 else ": ")
            + fault_line(worst[0], ctx.t0, repeats.get(worst[0].id, 0))
            + (f" (and {len(roots) - 1} more)" if len(roots) > 1 else "") + "." + benign)
    impact = _PINNED if open_ else max((f.recovery_ns or 0) for f in roots)
    return [(impact, head, "Faults")]


def _time(ctx, nums):
    roles = sorted(nums.get("cuda_roles") or [], key=lambda r: -r["total_ns"])
    if not roles:
        return []
    top = ", ".join(f"{r['role']} {fmt_ns(r['total_ns'])} ({_n(r['calls'], 'call')}, p99 "
                    f"{fmt_ns(r['p99_ns'])})" for r in roles[:3])
    return [(roles[0]["total_ns"],
             f"Where the time went, in CUDA driver calls (a {fmt_ns(ctx.t1 - ctx.t0)} run): "
             f"{top}.", "CUDA work")]


def _n(n, what) -> str:
    return f"{fmt_count(n)} {what}{'s' if n != 1 else ''}"


def _gpu_idle(nums):
    g = (nums.get("gpu_activity") or {}).get("idle_gaps")
    if not g or not g.get("gaps"):
        return []
    if not g.get("with_offcpu"):
        return [(0, f"GPU idle gaps: {fmt_count(g['gaps'])}, none while the thread that "
                    "launched the next work was off-CPU.", "GPU activity")]
    top = (g.get("top") or [{}])[0]
    worst = (f"; largest {fmt_ns(top.get('idle_ns'))} on GPU {top.get('gpu')} stream "
             f"{top.get('stream')} (thread {top.get('tid')})" if top else "")
    idle = g.get("idle_in_gaps_with_offcpu_ns", 0)
    return [(idle, f"GPU idle while the launching thread was off-CPU: {fmt_ns(idle)} of idle "
                   f"GPU in {fmt_count(g['with_offcpu'])} of {fmt_count(g['gaps'])} gaps, the "
                   f"thread off-CPU {fmt_ns(g['offcpu_ns'])} of it ({fmt_ns(g['preempted_ns'])} "
                   f"preempted){worst}.", "GPU activity")]


def _jitter(ctx, nums):
    j = nums.get("jitter") or {}
    if not j.get("calls"):
        return []
    share = j["total_ns"] / j["call_time_ns"] if j.get("call_time_ns") else 0.0
    w = (j.get("worst_calls") or [None])[0]
    worst = (f"; worst: {w['function']} at {fmt_t(w['t_ns'], ctx.t0)} on {w['tid']} "
             f"{w['thread']}, {fmt_ns(w['offcpu_ns'])} off-CPU in a {fmt_ns(w['dur_ns'])} call"
             f" ({_n(w['preempted'], 'preemption')})" if w else "")
    return [(j["total_ns"], f"Jitter: {fmt_ns(j['total_ns'])} off-CPU inside CUDA calls "
                            f"({fmt_pct(share)} of CUDA call time, "
                            f"{_n(j['preemptions_in_calls'], 'preemption')}){worst}; "
                            f"wakeup-to-run p99 {fmt_ns(j.get('wake_p99_ns'))}.",
             "Context-switch jitter")]


def _drops(ctx):
    d = drop_counts(ctx.tl.reader)
    if not d:
        return [(0, "No events lost.", None)]
    return [(_PINNED, f"{fmt_count(sum(d.values()))} events LOST ("
                      + ", ".join(f"{k} {fmt_count(v)}" for k, v in d.items())
                      + "): counts and chains below miss them (`clockalign info` says where).",
             None)]


def build(ctx, nums) -> Section:
    items = (_drops(ctx) + _faults(ctx) + _gpu_idle(nums) + _jitter(ctx, nums)
             + _time(ctx, nums))
    items.sort(key=lambda x: (x[0] != _PINNED, -x[0]))
    text, md = [], []
    for i, (_, line, where) in enumerate(items, 1):
        text.append(f"  {i}. {line}" + (f" [{where}]" if where else ""))
        md.append(f"{i}. {line}" + (f" See [{where}]({_anchor(where)})." if where else ""))
    return Section("Findings", "\n".join(text), "\n".join(md) + "\n",
                   {"findings": [{"rank": i, "text": line, "section": where, "impact_ns": imp}
                                 for i, (imp, line, where) in enumerate(items, 1)]})
