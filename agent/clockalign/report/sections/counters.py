"""GPU counters: per GPU the fields that moved (range in human units, a figure panel each,
faults marked); the flat ones as one line with their value."""
import numpy as np

from ...store.counter_fields import FIELDS
from .. import analysis, figures
from ..render import Table, fmt_count, fmt_value
from . import Section


def field_stats(cnt) -> list:
    """Per GPU and field: samples, min, p50, max, and whether it moved."""
    out = []
    for g in np.unique(cnt["gpu"]).tolist():
        for f in np.unique(cnt["field"][cnt["gpu"] == g]).tolist():
            v = cnt["value"][(cnt["gpu"] == g) & (cnt["field"] == f)]
            v = v[np.isfinite(v)]
            if not len(v):
                continue
            name, unit = FIELDS.get(f, (f"field {f}", ""))[:2]
            out.append({"gpu": g, "field": f, "name": name, "unit": unit, "samples": len(v),
                        "min": float(v.min()), "p50": float(analysis.pct(v, 50)),
                        "max": float(v.max()), "moved": bool(v.max() > v.min())})
    return out


def build(ctx) -> Section:
    tl = ctx.tl
    cnt = tl.counters()
    if cnt is None or not len(cnt):
        return Section("GPU counters", "  none recorded", "No GPU counter samples in this run.\n")
    stats = field_stats(cnt)
    moved = {(r["gpu"], r["field"]) for r in stats if r["moved"]}
    cfigs = figures.counters(cnt, ctx.t0, ctx.faults, ctx.out_dir, label=tl.devices.label,
                             fields=moved)
    t = Table(["gpu", "field", "samples", "min", "p50", "max"])
    flat = {}
    for r in stats:
        if r["moved"]:
            t.add([tl.devices.label(r["gpu"]), r["name"], fmt_count(r["samples"]),
                   fmt_value(r["min"], r["unit"]), fmt_value(r["p50"], r["unit"]),
                   fmt_value(r["max"], r["unit"])])
        else:
            flat.setdefault(r["gpu"], []).append(f"{r['name']} {fmt_value(r['min'], r['unit'])}")
    flat_txt = "".join(f"{tl.devices.label(g)} flat all run: {', '.join(v)}\n"
                       for g, v in flat.items())
    notes = "".join(f"\n{n}\n" for n in getattr(tl, "notes", []) if "counter" in n)
    nums = {"counters": [{**r, "gpu": int(r["gpu"]), "field": int(r["field"])} for r in stats]}
    return Section("GPU counters",
                   (t.text() if len(t) else "  no counter moved")
                   + ("\n  " + flat_txt.rstrip().replace("\n", "\n  ") if flat_txt else ""),
                   (t.markdown() if len(t) else "No counter moved.\n")
                   + ("\n" + flat_txt.replace("\n", "\n\n") if flat_txt else "") + notes
                   + "".join(f"\n![{f}]({f})\n" for f in cfigs), nums, cfigs)
