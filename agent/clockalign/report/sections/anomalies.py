"""Anomalies before faults: the signals that left their normal band (robust z) before each
fault, and every episode outside the band."""
from .. import anomaly, figures
from ..render import Table, fmt_ns, fmt_t, fmt_value, fmt_z
from . import Section, figure

BEFORE = 5        # faults whose preceding excursions report.md shows


def _params(opt, bin_ns) -> str:
    return (f"robust z = (x - median) / (1.4826 MAD) against the trailing {opt.window} "
            f"points; outside the band when |z| >= {opt.threshold:g}; signals binned by "
            f"{fmt_ns(bin_ns)} (counters as sampled); excursions that began up to "
            f"{fmt_ns(opt.lookback_ns)} before a fault are listed.")


def build(ctx) -> Section:
    opt, t0, t1, faults = ctx.opt, ctx.t0, ctx.t1, ctx.faults
    bin_ns = opt.bin_ns or max(100_000_000, (t1 - t0) // 500)
    det = anomaly.detect(anomaly.signals(ctx.data, ctx.inside, ctx.tl, bin_ns), faults,
                         window=opt.window, threshold=opt.threshold, lookback_ns=opt.lookback_ns)
    fig = figures.anomalies(det, t0, faults, ctx.out_dir)
    tx, mdx, nums = [], [], []
    for item in det["before_faults"]:
        f = item["fault"]
        t = Table(["signal", "left its band at", "lead", "back in band", "peak z",
                   "peak value", "earlier episodes"])
        for h in item["signals"]:
            t.add([h["signal"], fmt_t(h["start_ns"], t0), fmt_ns(h["lead_ns"]),
                   fmt_t(h["end_ns"], t0) if h["end_ns"] < f.t_ns else "after the fault",
                   fmt_z(h['peak_z']), fmt_value(h["peak_value"], h["unit"]), h["earlier"]])
        title = f"{f.kind} {f.name} at {fmt_t(f.t_ns, t0)}"
        if item["also"]:
            title += (f" (and {len(item['also'])} later fault(s) up to "
                      f"{fmt_t(item['also'][-1].t_ns, t0)})")
        tx.append(f"  before {title}:\n" + t.text("    "))
        mdx.append(f"\n### Before {title}\n\n" + t.markdown())
        nums.append({"fault": f.name, "fault_kind": f.kind, "t_ns": f.t_ns,
                     "signals": [{k: v for k, v in h.items()} for h in item["signals"]]})
    allx = Table(["signal", "from", "to", "peak z"])
    flat = [(s["name"], e) for s in det["signals"] for e in s["episodes"]]
    flat.sort(key=lambda x: -abs(x[1]["peak_z"]))
    for name, e in flat:
        allx.add([name, fmt_t(e["start_ns"], t0), fmt_t(e["end_ns"], t0), fmt_z(e['peak_z'])])
    if len(mdx) > BEFORE:
        mdx = mdx[:BEFORE] + [f"\n{len(mdx) - BEFORE} more faults with signals out of their "
                              "band before them not shown; report.json has all.\n"]
        tx = tx[:BEFORE] + [f"  ... {len(tx) - BEFORE} more (report.json)"]
    text = (("\n".join(tx) if tx else "  no signal left its band before a fault") +
            f"\n  ({len(flat)} episode(s) outside the band in all; see report.md)")
    md = (_params(opt, bin_ns) + "\n" +
          ("".join(mdx) if mdx else "\nNo signal left its band before a fault.\n") +
          ("\n### All episodes outside the band (largest first)\n\n"
           + allx.markdown(10, "episodes")
           if len(allx) else "") +
          (f"\n![anomalies]({fig})\n" if fig else ""))
    return Section("Anomalies before faults", text, md, {"anomalies": nums}, figure(fig))
