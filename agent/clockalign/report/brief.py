"""Short lines people read first: a fault in one line, known counts in one line where they
all match, the benign notes in one line.  `clockalign demo` prints them; the report's
findings use fault_line.

    for line in fault_lines(tl.faults(), tl.start_ns, limit=8): print(line)
    print(counts_line(rows))          # rows: [(what, expected, seen, ok)] from workloads.check
"""
from .fault_list import benign_line, headline, who
from .render import fmt_ns, fmt_t

_JUDGED = ("cuda_error", "connect_error", "xid")


def outcome(f) -> str:
    """How a fault ended: recovered, healthy again, still open at the end."""
    if f.recovery_ns is not None:
        return f"recovered in {fmt_ns(f.recovery_ns)}"
    if f.healthy_ns is not None:
        return f"healthy again after {fmt_ns(f.healthy_ns)}"
    if f.kind in _JUDGED:
        return "not healthy again before the run ended"
    return ""


def fault_line(f, t0, repeats=0) -> str:
    """'#3 +1.234567 s cuCtxSynchronize -> CUDA_ERROR_ILLEGAL_ADDRESS (700) in 623/623
    (python3); 6 sticky repeats; not healthy again before the run ended'."""
    where = who(f.pid, f.tid, f.thread)
    parts = [f"#{f.id} {fmt_t(f.t_ns, t0)} {headline(f)}" + (f" in {where}" if where != "-"
                                                            else "")]
    if repeats:
        parts.append(f"{repeats} sticky repeat{'s' if repeats > 1 else ''}")
    end = outcome(f)
    if end:
        parts.append(end)
    return "; ".join(parts)


def fault_lines(faults, t0, limit=8, indent="  ") -> list:
    """One line a fault (sticky repeats counted on their first error), at most ``limit``
    lines, then how many more."""
    repeats = {}
    for f in faults:
        if f.kind == "cuda_sticky_error" and f.parent is not None:
            repeats[f.parent] = repeats.get(f.parent, 0) + 1
    roots = [f for f in faults if f.kind != "cuda_sticky_error"]
    lines = [indent + fault_line(f, t0, repeats.get(f.id, 0)) for f in roots[:limit]]
    if len(roots) > limit:
        lines.append(f"{indent}... {len(roots) - limit} more")
    return lines


def counts_line(rows) -> list:
    """Known counts against the recording: one line when all match, else each mismatch."""
    bad = [r for r in rows if not r[3]]
    if not bad:
        return [f"all {len(rows)} known counts match the recording"]
    return ([f"{len(bad)} of {len(rows)} known counts DIFFER from the recording:"]
            + [f"  DIFF {what}: expected {exp}, recorded {seen}" for what, exp, seen, _ in bad])


__all__ = ["benign_line", "counts_line", "fault_line", "fault_lines", "outcome"]
