"""What `clockalign inject` writes: lifecycle.json (rows in the issue's schema),
lifecycle.md (engine x fault against the deadline, with the segment breakdown) and
lifecycle.png (stacked bars of the segments' medians).  Figures are matplotlib Figure
objects (no pyplot state).

    row = make_row("onnxruntime", "timeout", reps, deadline_ms=2800)
    write_all(out_dir, rows, notes)
"""
import json
import os

from ..align.stats import pct as nearest_rank
from ..store.writer import open_private
from .segments import segments

DEADLINE_MS = 2800


def pct(values, q):
    """clockalign's nearest-rank percentile (align/stats.py; p99 of 20 values is the
    largest) as a float; None for no values."""
    v = nearest_rank(values, q)
    return None if v is None else float(v)


def _ms(values, q):
    v = pct(values, q)
    return None if v is None else round(v / 1e6, 3)


def make_row(engine, fault, reps, deadline_ms=DEADLINE_MS, standby=0) -> dict:
    """The row of one engine x fault; with standbys also their count and replenish_ms: from
    the request to the standbys replenished."""
    done = [r for r in reps if r["total_ns"] is not None]
    row = {"engine": engine, "fault": fault, "n": len(done)}
    for key in ("detect", "recover", "total"):
        vals = [r[f"{key}_ns"] for r in done]
        row[f"{key}_ms"] = {"p50": _ms(vals, 50), "p99": _ms(vals, 99)}
    row["deadline_ms"] = int(deadline_ms) if float(deadline_ms).is_integer() else deadline_ms
    p99 = row["total_ms"]["p99"]
    row["pass"] = bool(done) and len(done) == len(reps) and p99 is not None and p99 <= deadline_ms
    if standby:
        vals = [r["replenish_ns"] for r in done if r.get("replenish_ns") is not None]
        row["standby"] = standby
        row["replenish_ms"] = {"p50": _ms(vals, 50), "p99": _ms(vals, 99)}
    row["segments"] = [{"name": name, "p50_ms": _ms(d, 50), "p99_ms": _ms(d, 99)}
                       for name, d, _ in segments(reps)]
    return row


def detail(reps) -> dict:
    """Per segment: repetitions seen, p50 of the boundaries' summed uncertainty, sources."""
    out = {}
    for name, d, u in segments(reps):
        out[name] = {"n": len(d), "unc_p50_ns": pct(u, 50)}
    srcs, calls = {}, {}
    for r in reps:
        for b in r["boundaries"]:
            srcs.setdefault(b["name"], set()).add(b["source"])
        for role, n in (r.get("reload_cuda_calls") or {}).items():
            calls.setdefault(role, []).append(n)
    return {"segments": out, "sources": {k: sorted(v) for k, v in srcs.items()},
            "reload_cuda_calls_p50": {k: pct(v, 50) for k, v in sorted(calls.items())}}


def merge_rows(path, new_rows) -> list:
    """Rows already in ``path`` for other engine x fault pairs, then the new ones."""
    old = []
    try:
        with open(path) as f:
            old = json.load(f).get("rows", [])
    except (OSError, ValueError, AttributeError):
        old = []
    keys = {(r["engine"], r["fault"]) for r in new_rows}
    return [r for r in old if (r.get("engine"), r.get("fault")) not in keys] + list(new_rows)


def _f(v):
    return "-" if v is None else f"{v:.1f}"


def markdown(rows, details, notes) -> str:
    lines = ["# Fault life cycle: inject -> detect -> recover", "",
             "Times in ms on CLOCK_MONOTONIC, from the client's request to its first error "
             "answer (detect), from there to its first ready answer polling every 50 ms "
             "(recover), and both (total); pass = every repetition recovered and the total's "
             "p99 is within the deadline.  Percentiles are nearest-rank (p99 of 20 is the "
             "largest).", "",
             "| engine | fault | n | detect p50 / p99 | recover p50 / p99 | total p50 / p99 | "
             "deadline | pass |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['engine']} | {r['fault']} | {r['n']} | "
                     f"{_f(r['detect_ms']['p50'])} / {_f(r['detect_ms']['p99'])} | "
                     f"{_f(r['recover_ms']['p50'])} / {_f(r['recover_ms']['p99'])} | "
                     f"{_f(r['total_ms']['p50'])} / {_f(r['total_ms']['p99'])} | "
                     f"{r['deadline_ms']} | {'pass' if r['pass'] else 'FAIL'} |")
    for r in rows:
        d = details.get((r["engine"], r["fault"]), {})
        lines += ["", f"## {r['engine']} x {r['fault']}", "",
                  "| segment | p50 ms | p99 ms | seen in | ± unc p50 |", "|---|---|---|---|---|"]
        for s in r["segments"]:
            sd = d.get("segments", {}).get(s["name"], {})
            unc = sd.get("unc_p50_ns")
            lines.append(f"| {s['name']} | {_f(s['p50_ms'])} | {_f(s['p99_ms'])} | "
                         f"{sd.get('n', '-')} | {'-' if unc is None else f'{unc / 1e3:.1f} µs'} |")
        if r.get("standby"):
            rp = r["replenish_ms"]
            lines += ["", f"{r['standby']} standby worker(s); the standbys were replenished "
                      f"{_f(rp['p50'])} / {_f(rp['p99'])} ms (p50 / p99) after the request."]
        if d.get("reload_cuda_calls_p50"):
            lines += ["", "CUDA calls of the new worker before its first successful launch "
                      "(p50): " + ", ".join(f"{k} {v:g}" for k, v in
                                              d["reload_cuda_calls_p50"].items()) + "."]
        if d.get("sources"):
            lines += ["", "Boundaries and the sources that saw them: " + "; ".join(
                f"{k}: {', '.join(v)}" for k, v in d["sources"].items()) + "."]
    if notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def figure(rows):
    """Stacked horizontal bars: one per engine x fault, the segments' p50s in order."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure
    palette = colormaps["tab20"]
    names = {s["name"] for r in rows for s in r["segments"]}
    fig = Figure(figsize=(11, max(1.2 + 0.7 * len(rows), 0.6 + 0.22 * len(names))))
    ax = fig.add_subplot(1, 1, 1)
    cmap = {}
    for y, r in enumerate(rows):
        left = 0.0
        for s in r["segments"]:
            w = max(0.0, s["p50_ms"] or 0.0)
            first = s["name"] not in cmap
            c = cmap.setdefault(s["name"], palette(len(cmap) % 20))
            ax.barh(y, w, left=left, color=c, edgecolor="white", linewidth=0.5,
                    hatch="//" if len(cmap) > 20 else None, label=s["name"] if first else None)
            left += w
    for y, r in enumerate(rows):
        p50 = r["total_ms"]["p50"]
        if p50 is not None:
            ax.plot([p50], [y], marker="|", color="black", markersize=18)
    ax.axvline(rows[0]["deadline_ms"] if rows else DEADLINE_MS, color="crimson", ls="--", lw=1,
               label="deadline")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"{r['engine']} {r['fault']}" for r in rows])
    ax.invert_yaxis()
    ax.set_xlabel("ms from the request (segment p50s stacked; | = total p50)")
    ax.set_title("Fault life cycle per engine: where the time goes")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    return fig


def _merge_details(path, details, notes) -> tuple:
    """lifecycle-detail.json: {"ENGINE/FAULT": detail, ..., "notes": [...]}, merged."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        doc = {}
    doc = doc if isinstance(doc, dict) else {}
    old_notes = doc.pop("notes", []) if isinstance(doc.get("notes", []), list) else []
    old = {tuple(k.split("/", 1)): v for k, v in doc.items() if "/" in k}
    old.update(details)
    notes = list(old_notes) + [n for n in notes if n not in old_notes]
    with open_private(path, "w") as f:
        json.dump({**{"/".join(k): v for k, v in old.items()}, "notes": notes}, f, indent=1)
    return old, notes


def write_all(out_dir, rows, details, notes) -> dict:
    """Write lifecycle.json/.md/.png (and lifecycle-detail.json: per segment how many
    repetitions saw it, its uncertainty, each boundary's sources), keeping the rows of
    other engine x fault pairs already in out_dir."""
    paths = {k: os.path.join(out_dir, f"lifecycle.{k}") for k in ("json", "md", "png")}
    rows = merge_rows(paths["json"], rows)
    details, notes = _merge_details(os.path.join(out_dir, "lifecycle-detail.json"), details,
                                    notes)
    for k, text in (("json", json.dumps({"rows": rows}, indent=1) + "\n"),
                    ("md", markdown(rows, details, notes))):
        with open_private(paths[k], "w") as f:
            f.write(text)
    fig = figure(rows)
    with open_private(paths["png"], "wb") as f:
        fig.savefig(f, format="png", dpi=110)
    return paths
