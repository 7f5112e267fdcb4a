"""GPU counters: per GPU and field the samples' range, with faults marked on the figures."""
import numpy as np

from ...store.counter_fields import FIELDS
from .. import analysis, figures
from ..render import Table, fmt_count
from . import Section


def build(ctx) -> Section:
    tl = ctx.tl
    cnt = tl.counters()
    cfigs = figures.counters(cnt, ctx.t0, ctx.faults, ctx.out_dir, label=tl.devices.label)
    if cnt is None or not len(cnt):
        return Section("GPU counters", "  none recorded", "No GPU counter samples in this run.\n",
                       files=cfigs)
    t = Table(["gpu", "field", "unit", "samples", "min", "p50", "max"])
    for g in np.unique(cnt["gpu"]).tolist():
        for f in np.unique(cnt["field"]).tolist():
            mm = (cnt["gpu"] == g) & (cnt["field"] == f)
            if not mm.any():
                continue
            v = cnt["value"][mm]
            name, unit = FIELDS.get(f, (f"field {f}", ""))[:2]
            t.add([tl.devices.label(g), name, unit, fmt_count(mm.sum()), f"{v.min():.6g}",
                   f"{analysis.pct(v, 50):.6g}", f"{v.max():.6g}"])
    notes = "".join(f"\n{n}\n" for n in getattr(tl, "notes", []) if "counter" in n)
    return Section("GPU counters", t.text(), t.markdown() + notes +
                   "".join(f"\n![{f}]({f})\n" for f in cfigs), files=cfigs)
