"""The report's head: host, kernel, driver, run length, event counts, targets."""
import os

from ...store.meta import target_label
from ..render import fmt_count
from . import Section


def kind_counts_line(counts) -> str:
    return ", ".join(f"{k} {fmt_count(v)}" for k, v in sorted(counts.items(), key=lambda x: -x[1]))


def build(ctx) -> Section:
    tl, data, t0, t1 = ctx.tl, ctx.data, ctx.t0, ctx.t1
    m = tl.meta or {}
    dur = (t1 - t0) / 1e9
    state = "clean" if not tl.truncated else tl.truncated
    head = (f"host {m.get('host', '?')}, kernel {m.get('kernel', '?')}, driver "
            f"{m.get('driver', '?')}; {dur:.3f} s on MONOTONIC; {state}")
    ev_line = f"events: {fmt_count(data.events)} ({kind_counts_line(data.counts)})"
    tgt = [f"target pid {t.get('pid')}" + (f" ({target_label(t)})" if target_label(t) else "")
           for t in m.get("targets") or [] if isinstance(t, dict)]
    text = f"clockalign report: {tl.path}\n  {head}\n  {ev_line}" + "".join(f"\n  {x}" for x in tgt)
    md = (f"# clockalign report: `{os.path.basename(str(tl.path))}`\n\n{head}.\n\n{ev_line}.\n"
          + "".join(f"\n{x}.\n" for x in tgt) +
          "\nTimes are seconds since the start of the run on CLOCK_MONOTONIC.\n")
    nums = {"run": {"start_ns": t0, "end_ns": t1, "events": data.events, "counts": data.counts,
                    "truncated": tl.truncated}}
    return Section("Run", text, md, nums)
