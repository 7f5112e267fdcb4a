"""The faults of a run as text lines or one JSON document (``clockalign faults``), each
judged against a recovery deadline.

    for line in render(tl, tl.faults(), deadline_ns=2_800_000_000): print(line)
    doc = document(tl, tl.faults(), deadline_ns=None)
"""
from .render import fmt_ns


def who(pid, tid, thread) -> str:
    if pid is None:
        return "-"
    s = f"{pid}/{tid}" if tid is not None else str(pid)
    return s + (f" ({thread})" if thread else "")


def headline(f) -> str:
    """What a fault is, in one phrase: 'cuMemAlloc_v2 -> CUDA_ERROR_OUT_OF_MEMORY (2)'."""
    if f.kind in ("cuda_error", "cuda_sticky_error"):
        return f"{f.function} -> {f.name} ({f.code})"
    if f.kind == "connect_error":
        return f"connect {f.target} -> {f.name}"
    if f.kind == "xid":
        return f.name + (f" on GPU{f.gpu}" if f.gpu is not None else "")
    if f.kind == "throttle":
        return f"GPU{f.gpu} {f.name}"
    return f.name


def _chain_line(e) -> str:
    what = e["what"]
    if what == "more":
        return f"... {e['count']} more errors until {fmt_ns(e['dt_ns'])}"
    dt = e["dt_ns"]
    parts = [f"{('+' if dt >= 0 else '') + fmt_ns(dt):>12}", f"{what:<12}"]
    if e.get("function"):
        call = e["function"] + (f" {e['target']}" if e.get("target") else "")
        parts.append(call if what == "success" else f"{call} -> {e.get('name')}")
    else:
        parts.append(str(e.get("name") or ""))
    if e.get("dur_ns", 0) >= 1_000_000:
        parts.append(f"(call took {fmt_ns(e['dur_ns'])})")
    if e.get("unc_ns"):
        parts.append(f"±{fmt_ns(e['unc_ns'])}")
    if e.get("tid") is not None:
        parts.append(f"tid {e['tid']}" + (f" ({e['thread']})" if e.get("thread") else ""))
    if e.get("fault"):
        parts.append(f"[#{e['fault']}]")
    return "  ".join(parts)


def deadline_verdict(f, deadline_ns):
    """'met' / 'MISSED' / 'not recovered by the end of the run' for the time to healthy."""
    if f.kind not in ("cuda_error", "connect_error", "xid"):
        return None
    if f.healthy_ns is None:
        return "not healthy again before the run ended"
    return "met" if f.healthy_ns <= deadline_ns else "MISSED"


def benign_line(notes) -> str:
    """The benign patterns (timeline/benign.py) as one line: how many, by rule."""
    n = sum(d["count"] for d in notes)
    return (f"{n} known benign failure{'s' if n != 1 else ''} left out (notes, not faults): "
            + ", ".join(f"{d['count']} {d['rule']}" for d in notes))


def render(tl, faults, deadline_ns=None) -> list:
    """Text lines: one block per fault (sticky repeats appear under their first error)."""
    start = tl.start_ns
    shown = [f for f in faults if f.kind != "cuda_sticky_error"]
    sticky = len(faults) - len(shown)
    lines = [f"{tl.path}: {len(faults)} fault{'s' if len(faults) != 1 else ''}"
             + (f" ({sticky} sticky repeats listed under their first error)" if sticky else "")
             + f"; times in MONOTONIC ns, t+ from the run's start {start}"]
    if tl.benign:
        lines.append(benign_line(tl.benign))
    if not faults:
        return lines
    lines.append(f"{'#':>3}  {'t+ s':>12}  {'MONOTONIC ns':>19}  {'± unc':>11}  {'kind':<17} "
                 f"{'what':<44} {'pid/tid (thread)':<24} seen by")
    for f in shown:
        seen = ", ".join(s["source"] for s in f.sightings)
        lines.append(f"{f.id:>3}  {(f.t_ns - start) / 1e9:>12.6f}  {f.t_ns:>19}  "
                     f"{'±' + fmt_ns(f.unc_ns):>11}  {f.kind:<17} {headline(f):<44} "
                     f"{who(f.pid, f.tid, f.thread):<24} {seen}")
        if f.message and f.kind != "cuda_error":
            lines.append(f"{'':7}{f.message}")
        elif f.dur_ns >= 1_000_000:
            lines.append(f"{'':7}the failing call took {fmt_ns(f.dur_ns)}")
        for d in f.delays:
            lines.append(f"{'':7}{d['to']} saw it {fmt_ns(d['delay_ns'])} ± {fmt_ns(d['unc_ns'])}"
                         f" after {d['from']}")
        for e in f.chain:
            lines.append(f"{'':7}{_chain_line(e)}")
        tail = []
        if f.recovery_ns is not None:
            tail.append(f"recovery {fmt_ns(f.recovery_ns)}"
                        + (f" ± {fmt_ns(f.recovery_unc_ns)}" if f.recovery_unc_ns else ""))
        if f.healthy_ns is not None:
            tail.append(f"healthy after {fmt_ns(f.healthy_ns)}")
        if f.related:
            tail.append("same problem as " + ", ".join(f"#{r}" for r in f.related))
        verdict = deadline_verdict(f, deadline_ns) if deadline_ns else None
        if verdict:
            tail.append(f"recovery deadline {fmt_ns(deadline_ns)}: {verdict}")
        if tail:
            lines.append(f"{'':7}" + "; ".join(tail))
    return lines


def document(tl, faults, deadline_ns=None) -> dict:
    """The faults with the run's span and notes, JSON-ready (``clockalign faults --json``)."""
    rows = []
    for f in faults:
        d = f.to_dict()
        d["deadline"] = deadline_verdict(f, deadline_ns) if deadline_ns else None
        rows.append(d)
    return {"file": tl.path, "truncated": tl.truncated, "start_ns": tl.start_ns,
            "end_ns": tl.end_ns, "deadline_ns": deadline_ns, "notes": tl.notes, "benign": tl.benign,
            "faults": rows}
