"""Alignment: per clock domain its band, skew, steps and uncertainty budget, and the GPU
clocks against each other."""
from .. import analysis, figures
from ..render import Table, fmt_ns, fmt_t
from . import Section, figure

_NOT_IN_JSON = ("summary", "residual_t", "residual_ns", "residual_half_rtt", "band_t", "band_ns")


def _domain_tables(rows):
    """The per-domain table and the uncertainty budget table."""
    t = Table(["domain", "segments", "skew ppm", "samples used/total", "min RTT",
               "half-width p50", "p99", "max", "floor", "tick", "steps", "device"])
    b = Table(["domain", "band p99", "tick", "stamping p99", "total p99"])
    for r in rows:
        t.add([r["domain"], r["segments"], f"{r['skew_ppm']:+.3f}",
               f"{r['samples_used']}/{r['samples_total']}", fmt_ns(r["min_rtt_ns"]),
               fmt_ns(r["hw_p50"]), fmt_ns(r["hw_p99"]), fmt_ns(r["hw_max"]),
               fmt_ns(r["floor_ns"]), fmt_ns(r["tick_ns"]), len(r["steps"]),
               r["device"] or "-"])
        stamp = r["stamp_p99"]
        total = (r["hw_p99"] or 0) + (r["tick_ns"] or 0) + (stamp or 0)
        b.add([r["domain"], fmt_ns(r["hw_p99"]), fmt_ns(r["tick_ns"]),
               fmt_ns(stamp) if stamp is not None else "-", fmt_ns(total)])
    return t, b


def _pairs_table(pairs):
    pt = Table(["GPU", "against", "skew ppm", "offset first", "offset last", "steps",
                "±p50", "±p99", "points"])
    for p in pairs:
        pt.add([p["b_label"], p["a_label"], f"{p['skew_ppm']:+.3f}", fmt_ns(p["offset_first_ns"]),
                fmt_ns(p["offset_last_ns"]), len(p["steps"]),
                fmt_ns(p["unc_p50_ns"]), fmt_ns(p["unc_p99_ns"]), p["points"]])
    return pt


def build(ctx) -> Section:
    tl, t0 = ctx.tl, ctx.t0
    rows = analysis.alignment(tl)
    t, b = _domain_tables(rows)
    steps_md = ""
    for r in rows:
        for s in r["steps"]:
            steps_md += (f"- {r['domain']} stepped by {fmt_ns(s.get('remote_jump_ns'))} at "
                         f"{fmt_t(s.get('host_ns', t0), t0)}\n")
    pairs = analysis.gpu_clock_pairs(tl)
    pt = _pairs_table(pairs)
    pairs_md = ("\n### GPU clocks against each other\n\nOffset = the GPU's timer minus the "
                "other's at the same host instant; ± = the sum of both bands' half-widths, "
                "how well a time on one GPU is known against a time on the other.\n\n"
                + pt.markdown()) if pairs else ""
    nums = {"gpu_clock_pairs": pairs,
            "alignment": [{k: v for k, v in r.items() if k not in _NOT_IN_JSON} for r in rows],
            "alignment_failed": dict(tl.fit_failures)}
    fig = figures.alignment(rows, t0, ctx.out_dir)
    failed = "".join(f"- {d}: the fit failed ({why}); {d} times are not mapped\n"
                     for d, why in tl.fit_failures.items())
    failed = "\nDomains that could not be fitted:\n\n" + failed if failed else ""
    if rows:
        assumption = rows[0]["assumption"]
        body_md = (t.markdown() + ("\nSteps:\n\n" + steps_md if steps_md else "") +
                   "\n### Uncertainty budget\n\nA mapped time's uncertainty = the band's "
                   "half-width + the remote clock's tick + the sample's own stamping "
                   "uncertainty (counter samples: their NVML/DCGM latency). BPF events are "
                   "stamped on MONOTONIC itself (no mapping).\n\n" + b.markdown() +
                   f"\n{assumption}\n" + pairs_md + (f"\n![alignment]({fig})\n" if fig else "")
                   + failed)
        body_text = (t.text() + "\n\n" + b.text() + ("\n\n" + pt.text() if pairs else "") +
                     ("\n  " + steps_md.replace("\n", "\n  ").rstrip() if steps_md else "") +
                     failed.replace("\n", "\n  "))
    elif failed:
        body_text = ("  no domain could be fitted: only MONOTONIC stamps are usable"
                     + failed.replace("\n", "\n  "))
        body_md = "No clock domain could be fitted: only MONOTONIC stamps are usable.\n" + failed
    else:
        body_text = "  no clock samples: only MONOTONIC stamps are usable"
        body_md = "No clock samples in this run: only MONOTONIC stamps are usable.\n"
    return Section("Alignment", body_text, body_md, nums, figure(fig))
