"""Faults: each with where, how well its time is known, its sources, recovery and chain."""
from ...timeline.benign import note_text
from ..fault_list import benign_line
from ..render import Table, fmt_ns, fmt_t
from . import Section

_TEXT_ROWS = 12      # root faults the terminal lists
_TEXT_THEN = 60      # characters of the chain the terminal shows
_MD_ROWS = 25        # root faults report.md lists (report.json: all)


def _then(f) -> str:
    then = "; ".join(f"{e.get('what')}" + (f" {e.get('name')}" if e.get("name") and
                                             e.get("what") not in ("success",) else "")
                     + f" +{fmt_ns(e.get('dt_ns'))}" for e in (f.chain or [])[:3])
    if len(f.chain or []) > 3:
        then += f"; ... {len(f.chain) - 3} more"
    return then


def table(faults, t0, label) -> Table:
    """One row a fault: time, kind, name, where, ±, sources, recovery, what followed."""
    t = Table(["time", "kind", "fault", "where", "±", "sources", "recovery", "then"])
    for f in faults:
        where = (label(f.gpu) if f.gpu is not None else "") + (
            f" {f.pid}/{f.tid}" if f.pid else "")
        src = ", ".join(sorted({str(s.get("source")) for s in (f.sightings or [])}))
        t.add([fmt_t(f.t_ns, t0), f.kind, f.name, where.strip() or "-", fmt_ns(f.unc_ns), src,
               fmt_ns(f.recovery_ns), _then(f)])
    return t


def build(ctx) -> Section:
    faults, t0 = ctx.faults, ctx.t0
    t = table(faults, t0, ctx.tl.devices.label)
    nums = {"faults": [{"t_ns": f.t_ns, "kind": f.kind, "name": f.name, "unc_ns": f.unc_ns,
                        "recovery_ns": f.recovery_ns, "chain": len(f.chain or []),
                        "message": f.message} for f in faults]}
    nums["benign"] = ctx.tl.benign
    notes = ("\n" + benign_line(ctx.tl.benign) + ":\n\n"
             + "".join(f"- {note_text(d)}\n" for d in ctx.tl.benign)) if ctx.tl.benign else ""
    if not faults:
        return Section("Faults", "  none" + ("\n  " + benign_line(ctx.tl.benign)
                                            if ctx.tl.benign else ""),
                       "No faults.\n" + notes, nums)
    xid_text = "".join(f"- {fmt_t(f.t_ns, t0)} {f.name}: `{f.message}`\n"
                       for f in faults if f.kind == "xid" and f.message)
    tt = Table(t.header, t.align)
    roots = [r for f, r in zip(faults, t.rows) if f.kind != "cuda_sticky_error"]
    for r in roots[:_TEXT_ROWS]:
        tt.add(r[:-1] + [r[-1] if len(r[-1]) <= _TEXT_THEN else r[-1][:_TEXT_THEN - 3] + "..."])
    sticky = sum(f.kind == "cuda_sticky_error" for f in faults)
    more = (f"\n  ... {len(roots) - _TEXT_ROWS} more" if len(roots) > _TEXT_ROWS else "")
    md = Table(t.header, t.align)
    for r in roots:
        md.add(r)
    return Section("Faults",
                   f"  {len(faults)} fault(s), {sticky} of them repeats of a sticky error\n"
                   + tt.text() + more
                   + ("\n  " + benign_line(ctx.tl.benign) if ctx.tl.benign else ""),
                   f"{len(faults)} fault(s), {sticky} of them repeats of a sticky error (their "
                   "chains: `clockalign faults`).\n\n" + md.markdown(_MD_ROWS, "faults")
                   + ("\nXid messages, whole:\n\n" + xid_text if xid_text else "") + notes,
                   nums)
