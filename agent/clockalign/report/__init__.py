"""clockalign.report: what happened in a run, as tables and figures.

    from clockalign.timeline import Timeline
    from clockalign.report import build_report
    rep = build_report(Timeline.open("run.ca"), "run-report/")
    print(rep.text)                  # the terminal summary
    rep.files                        # report.md, report.json, *.png

Sections: alignment (per clock domain: band, residuals, skew, steps, uncertainty budget),
CUDA calls, GPU activity (busy/idle per stream, launch-to-start, idle gaps while the launching
thread was off-CPU), context-switch jitter (off-CPU time inside CUDA calls, preemptions, wakeup
latency, a heatmap), connect() per peer, GPU counters with faults marked, faults with their
chains, and the signals that left their normal band before each fault.
"""
import dataclasses
import json
import os

import numpy as np

from ..errors import ClockalignError
from . import analysis, anomaly, figures
from ..store.meta import target_label
from ..store.writer import open_private
from .collect import collect
from .gpu_activity import gpu_section
from .render import Table, fmt_count, fmt_ns, fmt_pct, fmt_t, fmt_z

SECTIONS = ["Run", "Alignment", "CUDA calls", "CUDA work", "GPU activity", "Context-switch jitter",
            "connect()", "GPU counters", "Faults", "Anomalies before faults"]


@dataclasses.dataclass
class Options:
    window: int = 50                  # trailing points the robust z is measured against
    threshold: float = 4.0            # |z| that counts as leaving the band
    bin_ns: int = None                # signal bin width (default: run / 500, >= 100 ms)
    lookback_ns: int = 30_000_000_000  # how long before a fault an excursion is listed


@dataclasses.dataclass
class Report:
    text: str
    markdown: str
    files: list
    numbers: dict


def _kind_counts_line(counts):
    return ", ".join(f"{k} {fmt_count(v)}" for k, v in sorted(counts.items(), key=lambda x: -x[1]))


def build_report(tl, out_dir, options: Options = None, progress=None) -> Report:
    opt = options or Options()
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:
        raise ClockalignError(f"cannot create report directory {out_dir}: "
                              f"{e.strerror or e}") from None
    data = collect(tl, progress)
    t0, t1 = tl.start_ns, tl.end_ns
    faults = tl.faults()
    names = tl.threads
    text, md, nums, files = [], [], {}, []

    def section(title, body_text, body_md):
        text.append(f"\n== {title} ==\n{body_text}")
        md.append(f"\n## {title}\n\n{body_md}\n")

    # ---- run
    m = tl.meta or {}
    dur = (t1 - t0) / 1e9
    state = "clean" if not tl.truncated else tl.truncated
    head = (f"host {m.get('host', '?')}, kernel {m.get('kernel', '?')}, driver "
            f"{m.get('driver', '?')}; {dur:.3f} s on MONOTONIC; {state}")
    ev_line = f"events: {fmt_count(data.events)} ({_kind_counts_line(data.counts)})"
    tgt = [f"target pid {t.get('pid')}" + (f" ({target_label(t)})" if target_label(t) else "")
           for t in m.get("targets") or [] if isinstance(t, dict)]
    text.append(f"clockalign report: {tl.path}\n  {head}\n  {ev_line}" +
                "".join(f"\n  {x}" for x in tgt))
    md.append(f"# clockalign report: `{os.path.basename(str(tl.path))}`\n\n{head}.\n\n{ev_line}.\n"
              + "".join(f"\n{x}.\n" for x in tgt) +
              "\nTimes are seconds since the start of the run on CLOCK_MONOTONIC.\n")
    nums["run"] = {"start_ns": t0, "end_ns": t1, "events": data.events, "counts": data.counts,
                   "truncated": tl.truncated}

    # ---- alignment
    rows = analysis.alignment(tl)
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
    steps_md = ""
    for r in rows:
        for s in r["steps"]:
            steps_md += (f"- {r['domain']} stepped by {fmt_ns(s.get('remote_jump_ns'))} at "
                         f"{fmt_t(s.get('host_ns', t0), t0)}\n")
    pairs = analysis.gpu_clock_pairs(tl)
    nums["gpu_clock_pairs"] = pairs
    pt = Table(["GPU", "against", "skew ppm", "offset first", "offset last", "steps",
                "±p50", "±p99", "points"])
    for p in pairs:
        pt.add([p["b_label"], p["a_label"], f"{p['skew_ppm']:+.3f}", fmt_ns(p["offset_first_ns"]),
                fmt_ns(p["offset_last_ns"]), len(p["steps"]),
                fmt_ns(p["unc_p50_ns"]), fmt_ns(p["unc_p99_ns"]), p["points"]])
    pairs_md = ("\n### GPU clocks against each other\n\nOffset = the GPU's timer minus the "
                "other's at the same host instant; ± = the sum of both bands' half-widths, "
                "how well a time on one GPU is known against a time on the other.\n\n"
                + pt.markdown()) if pairs else ""
    nums["alignment"] = [{k: v for k, v in r.items() if k not in (
        "summary", "residual_t", "residual_ns", "residual_half_rtt", "band_t", "band_ns")}
        for r in rows]
    fig = figures.alignment(rows, t0, out_dir)
    files += [fig] if fig else []
    nums["alignment_failed"] = dict(tl.fit_failures)
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
        section("Alignment", t.text() + "\n\n" + b.text() + (
            "\n\n" + pt.text() if pairs else "") + ("\n  " + steps_md.replace(
            "\n", "\n  ").rstrip() if steps_md else "") + failed.replace("\n", "\n  "),
            body_md)
    elif failed:
        section("Alignment", "  no domain could be fitted: only MONOTONIC stamps are usable"
                + failed.replace("\n", "\n  "),
                "No clock domain could be fitted: only MONOTONIC stamps are usable.\n" + failed)
    else:
        section("Alignment", "  no clock samples: only MONOTONIC stamps are usable",
                "No clock samples in this run: only MONOTONIC stamps are usable.\n")

    # ---- CUDA calls
    ct = analysis.cuda_table(data.cuda, data.unfinished)
    t = Table(["function", "calls", "errors", "p50", "p99", "p99.9", "max"])
    for r in ct:
        t.add([r["function"], fmt_count(r["count"]), fmt_count(r["errors"]), fmt_ns(r["p50_ns"]),
               fmt_ns(r["p99_ns"]), fmt_ns(r["p999_ns"]), fmt_ns(r["max_ns"])])
    errs = [f"- {r['function']}: " + ", ".join(f"{k} x{v}" for k, v in r["error_names"].items())
            for r in ct if r["errors"]]
    unf = len(data.unfinished["t"])
    nums["cuda"] = ct
    fig = figures.cuda_latency(data.cuda, ct, out_dir)
    files += [fig] if fig else []
    if ct:
        extra = ("\nErrors:\n\n" + "\n".join(errs) + "\n" if errs else "") + (
            f"\n{unf} call(s) were still running when the recording stopped.\n" if unf else "")
        section("CUDA calls", t.text() + ("\n  errors: " + "; ".join(e[2:] for e in errs)
                                          if errs else ""),
                t.markdown() + extra + (f"\n![CUDA latency]({fig})\n" if fig else ""))
    else:
        section("CUDA calls", "  none recorded", "No CUDA calls were recorded.\n")

    # ---- CUDA work: by role, kernels by name, module loads
    roles = analysis.role_table(data.cuda)
    kernels = analysis.kernel_table(data.cuda, data.kernels)
    loads = analysis.module_loads(data.cuda)
    nums["cuda_roles"], nums["kernels"], nums["module_loads"] = roles, kernels, loads
    if roles:
        t = Table(["role", "calls", "errors", "time", "p50", "p99", "bytes"])
        for r in roles:
            t.add([r["role"], fmt_count(r["calls"]), fmt_count(r["errors"]), fmt_ns(r["total_ns"]),
                   fmt_ns(r["p50_ns"]), fmt_ns(r["p99_ns"]),
                   "-" if r["bytes"] is None else fmt_count(r["bytes"])])
        txt, mdx = [t.text()], [t.markdown()]
        if kernels:
            k = Table(["kernel", "func", "launches", "errors", "p50", "p99"])
            for r in kernels:
                k.add([r["kernel"] or "(not looked up while recording)", f"{r['func']:#x}",
                       fmt_count(r["launches"]), fmt_count(r["errors"]), fmt_ns(r["p50_ns"]),
                       fmt_ns(r["p99_ns"])])
            txt.append(k.text())
            mdx.append("Launches per kernel (names from cuModuleGetFunction / "
                       "cuLibraryGetKernel):\n\n" + k.markdown())
        if loads:
            m = Table(["t", "function", "duration", "result"])
            for r in loads[:20]:
                m.add([fmt_t(r["t_ns"], t0), r["function"], fmt_ns(r["dur_ns"]), r["result"]])
            more = f"\n  ... {len(loads) - 20} more" if len(loads) > 20 else ""
            txt.append(m.text() + more)
            mdx.append("Module and library loads:\n\n" + m.markdown() + more)
        section("CUDA work", "\n\n".join(txt), "\n\n".join(mdx) + "\n")
    else:
        section("CUDA work", "  none recorded", "No CUDA calls were recorded.\n")

    # ---- GPU activity (record --gpu-activity): report/gpu_activity.py
    gsec = gpu_section(tl.gpu_activity(), data.sched)
    if gsec:
        nums["gpu_activity"] = gsec["numbers"]
        section("GPU activity", gsec["text"], gsec["markdown"])

    # ---- jitter
    inside = analysis.offcpu_in_calls(data.cuda, data.sched)
    ss = analysis.sched_summary(data.sched, tl)
    by_fn = analysis.offcpu_by_function(data.cuda, inside)
    worst = analysis.worst_calls(data.cuda, inside, tl)
    share = inside["total_ns"] / inside["call_time_ns"] if inside["call_time_ns"] else 0.0
    summary = (f"off-CPU inside CUDA calls: {fmt_ns(inside['total_ns'])} over "
               f"{fmt_count(inside['calls_with_offcpu'])} of {fmt_count(inside['calls'])} calls "
               f"({fmt_pct(share)} of CUDA call time); involuntary preemptions inside calls: "
               f"{fmt_count(inside['preemptions_in_calls'])}\n"
               f"all off-CPU intervals: {fmt_count(ss['intervals'])} ({fmt_count(ss['preempted'])} "
               f"preempted, {fmt_count(ss['blocked'])} blocked), {fmt_ns(ss['offcpu_ns'])} in all; "
               f"wakeup-to-run latency p50 {fmt_ns(ss['wake_p50_ns'])}, p99 "
               f"{fmt_ns(ss['wake_p99_ns'])}, max {fmt_ns(ss['wake_max_ns'])} "
               f"({fmt_count(ss['wake_n'])} wakeups)")
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
    tt = Table(["thread", "off-CPU", "intervals", "preempted", "wakeup p50", "wakeup p99"])
    for r in ss["per_thread"]:
        tt.add([f"{r['tid']} {r['thread']}", fmt_ns(r["offcpu_ns"]), fmt_count(r["intervals"]),
                fmt_count(r["preempted"]), fmt_ns(r["wake_p50_ns"]), fmt_ns(r["wake_p99_ns"])])
    nums["jitter"] = {k: v for k, v in inside.items()
                      if k not in ("per_call_ns", "preempted_per_call")}
    nums["jitter"].update({k: v for k, v in ss.items() if k != "per_thread"})
    nums["jitter"]["by_function"] = by_fn
    tids, edges, mat = analysis.offcpu_heatmap(data.sched, t0, max(t1, t0 + 1))
    figs = [figures.offcpu_heatmap(tids, edges, mat, names, t0, faults, out_dir),
            figures.wakeup_latency(data.sched, out_dir)]
    files += [f for f in figs if f]
    section("Context-switch jitter",
            "  " + summary.replace("\n", "\n  ") + "\n\n" + tf.text() +
            ("\n\n  calls with the most off-CPU time:\n" + tw.text() if len(tw) else ""),
            summary.replace("\n", "\n\n") + "\n\n" + tf.markdown() +
            ("\nCalls with the most off-CPU time:\n\n" + tw.markdown() if len(tw) else "") +
            "\nPer thread:\n\n" + tt.markdown() +
            "".join(f"\n![{f}]({f})\n" for f in figs if f))

    # ---- connect
    cn = analysis.connect_table(data.connect, data.peers)
    t = Table(["peer", "calls", "errors", "p50", "p99", "max"])
    for r in cn:
        t.add([r["peer"], fmt_count(r["count"]),
               f"{r['errors']}" + (" (" + ", ".join(f"{k} x{v}" for k, v in
                                                     r["error_names"].items()) + ")"
                                   if r["errors"] else ""),
               fmt_ns(r["p50_ns"]), fmt_ns(r["p99_ns"]), fmt_ns(r["max_ns"])])
    nums["connect"] = [{k: v for k, v in r.items() if k != "_peer_id"} for r in cn]
    fig = figures.connect_latency(data.connect, cn, out_dir)
    files += [fig] if fig else []
    if cn:
        section("connect()", t.text(), t.markdown() + (f"\n![connect]({fig})\n" if fig else ""))
    else:
        section("connect()", "  none recorded", "No connect() calls were recorded.\n")

    # ---- counters
    cnt = tl.counters()
    cfigs = figures.counters(cnt, t0, faults, out_dir, label=tl.devices.label)
    files += cfigs
    if cnt is not None and len(cnt):
        from ..store.counter_fields import FIELDS
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
        section("GPU counters", t.text(), t.markdown() + notes +
                "".join(f"\n![{f}]({f})\n" for f in cfigs))
    else:
        section("GPU counters", "  none recorded", "No GPU counter samples in this run.\n")

    # ---- faults
    t = Table(["time", "kind", "fault", "where", "±", "sources", "recovery", "then"])
    for f in faults:
        where = (tl.devices.label(f.gpu) if f.gpu is not None else "") + (
            f" {f.pid}/{f.tid}" if f.pid else "")
        src = ", ".join(sorted({str(s.get("source")) for s in (f.sightings or [])}))
        then = "; ".join(f"{e.get('what')}" + (f" {e.get('name')}" if e.get("name") and
                                                 e.get("what") not in ("success",) else "")
                         + f" +{fmt_ns(e.get('dt_ns'))}" for e in (f.chain or [])[:3])
        if len(f.chain or []) > 3:
            then += f"; ... {len(f.chain) - 3} more"
        t.add([fmt_t(f.t_ns, t0), f.kind, f.name, where.strip() or "-", fmt_ns(f.unc_ns), src,
               fmt_ns(f.recovery_ns), then])
    nums["faults"] = [{"t_ns": f.t_ns, "kind": f.kind, "name": f.name, "unc_ns": f.unc_ns,
                       "recovery_ns": f.recovery_ns, "chain": len(f.chain or []),
                       "message": f.message} for f in faults]
    xid_text = "".join(f"- {fmt_t(f.t_ns, t0)} {f.name}: `{f.message}`\n"
                       for f in faults if f.kind == "xid" and f.message)
    if faults:
        tt = Table(t.header, t.align)
        roots = [r for f, r in zip(faults, t.rows) if f.kind != "cuda_sticky_error"]
        for r in roots[:12]:
            tt.add(r[:-1] + [r[-1] if len(r[-1]) <= 60 else r[-1][:57] + "..."])
        sticky = sum(f.kind == "cuda_sticky_error" for f in faults)
        more = (f"\n  ... {len(roots) - 12} more" if len(roots) > 12 else "")
        section("Faults", f"  {len(faults)} fault(s), {sticky} of them repeats of a sticky "
                f"error\n" + tt.text() + more,
                t.markdown() + ("\nXid messages, whole:\n\n" + xid_text if xid_text else ""))
    else:
        section("Faults", "  none", "No faults.\n")

    # ---- anomalies
    bin_ns = opt.bin_ns or max(100_000_000, (t1 - t0) // 500)
    det = anomaly.detect(anomaly.signals(data, inside, tl, bin_ns), faults, window=opt.window,
                         threshold=opt.threshold, lookback_ns=opt.lookback_ns)
    fig = figures.anomalies(det, t0, faults, out_dir)
    files += [fig] if fig else []
    params = (f"robust z = (x - median) / (1.4826 MAD) against the trailing {opt.window} "
              f"points; outside the band when |z| >= {opt.threshold:g}; signals binned by "
              f"{fmt_ns(bin_ns)} (counters as sampled); excursions that began up to "
              f"{fmt_ns(opt.lookback_ns)} before a fault are listed.")
    tx, mdx = [], []
    nums["anomalies"] = []
    for item in det["before_faults"]:
        f = item["fault"]
        t = Table(["signal", "left its band at", "lead", "back in band", "peak z",
                   "peak value", "earlier episodes"])
        for h in item["signals"]:
            t.add([h["signal"], fmt_t(h["start_ns"], t0), fmt_ns(h["lead_ns"]),
                   fmt_t(h["end_ns"], t0) if h["end_ns"] < f.t_ns else "after the fault",
                   fmt_z(h['peak_z']), f"{h['peak_value']:.6g} {h['unit']}", h["earlier"]])
        title = f"{f.kind} {f.name} at {fmt_t(f.t_ns, t0)}"
        if item["also"]:
            title += (f" (and {len(item['also'])} later fault(s) up to "
                      f"{fmt_t(item['also'][-1].t_ns, t0)})")
        tx.append(f"  before {title}:\n" + t.text("    "))
        mdx.append(f"\n### Before {title}\n\n" + t.markdown())
        nums["anomalies"].append({"fault": f.name, "fault_kind": f.kind, "t_ns": f.t_ns,
                                  "signals": [{k: v for k, v in h.items()}
                                              for h in item["signals"]]})
    allx = Table(["signal", "from", "to", "peak z"])
    flat = [(s["name"], e) for s in det["signals"] for e in s["episodes"]]
    flat.sort(key=lambda x: -abs(x[1]["peak_z"]))
    for name, e in flat[:20]:
        allx.add([name, fmt_t(e["start_ns"], t0), fmt_t(e["end_ns"], t0), fmt_z(e['peak_z'])])
    section("Anomalies before faults",
            ("\n".join(tx) if tx else "  no signal left its band before a fault") +
            f"\n  ({len(flat)} episode(s) outside the band in all; see report.md)",
            params + "\n" + ("".join(mdx) if mdx else
                             "\nNo signal left its band before a fault.\n") +
            ("\n### All episodes outside the band (largest first)\n\n" + allx.markdown()
             if len(allx) else "") +
            (f"\n![anomalies]({fig})\n" if fig else ""))

    markdown = "".join(md)
    with open_private(os.path.join(out_dir, "report.md"), "w") as fh:
        fh.write(markdown)
    with open_private(os.path.join(out_dir, "report.json"), "w") as fh:
        json.dump(nums, fh, indent=1, default=_json_default)
        fh.write("\n")
    files = ["report.md", "report.json"] + files
    return Report(text="\n".join(text) + "\n", markdown=markdown, files=files, numbers=nums)


def _json_default(o):
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)
