#!/usr/bin/env python3
"""Export of a window vs the whole run: trace size and time, Perfetto and Chrome JSON.

Makes one synthetic run of N events (tests/synthetic.make_run), exports it whole and a
window of FRACTION of its span in its middle (export --from/--to, export/window.py), each
in this process, the fastest of --repeat, and writes results/export-window.md and .json
(machine, command, date, raw numbers).

    .venv/bin/python scripts/bench/export_window.py                  # 1,000,000 events, 10 %
    .venv/bin/python scripts/bench/export_window.py -n 2000000 --fraction 0.05
"""
import argparse
import datetime
import json
import os
import platform
import sys
import tempfile
import time

from export import _version, cpu_model, mem_total_gb   # scripts/bench/

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)                    # tests.synthetic: the run-file generator

FORMATS = (("perfetto", "pftrace"), ("chrome-json", "json"))


def one(run, out, fmt, window, repeat):
    from clockalign.export import export_run
    from clockalign.export.window import Selection
    from clockalign.timeline import Timeline
    best = None
    for i in range(repeat):
        path = f"{out}.{i}"
        t = time.perf_counter()
        tl = Timeline.open(run)
        sel = None if window is None else Selection.parse(tl, f"{window[0]}ns", f"{window[1]}ns")
        stats = export_run(tl, path, fmt, select=sel)
        wall = time.perf_counter() - t
        size = os.path.getsize(path)
        os.unlink(path)
        if best is None or wall < best["wall_s"]:
            best = {"wall_s": round(wall, 3), "bytes": size,
                    "events": sum(stats["events"].values()),
                    "gpu_activity": stats["gpu_activity"], "counters": stats["counters"],
                    "faults": stats["faults"]}
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-n", type=int, default=1_000_000, help="events in the synthetic run")
    ap.add_argument("--fraction", type=float, default=0.10, help="the window's share of the run")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--out", default=os.path.join(ROOT, "results", "export-window"),
                    help="results path without extension (.md and .json are written)")
    a = ap.parse_args()
    from clockalign.timeline import Timeline
    from tests.synthetic import make_run
    t_start = time.time()
    with tempfile.TemporaryDirectory(prefix="ca-window-") as tmp:
        run = os.path.join(tmp, "run.ca")
        make_run(run, n_events=a.n, duration_s=30 * a.n / 1e6)
        tl = Timeline.open(run)
        span = tl.end_ns - tl.start_ns
        mid = tl.start_ns + span // 2
        w = (mid - int(span * a.fraction / 2), mid + int(span * a.fraction / 2))
        rows = []
        for fmt, ext in FORMATS:
            for label, window in (("whole run", None), (f"{a.fraction:.0%} window", w)):
                r = one(run, os.path.join(tmp, f"out.{ext}"), fmt, window, a.repeat)
                rows.append({"format": fmt, "part": label, **r})
                print(fmt, label, r, flush=True)
        run_mb = os.path.getsize(run) / 1e6
    doc = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "command": "python scripts/bench/export_window.py " + " ".join(sys.argv[1:]),
           "elapsed_s": round(time.time() - t_start, 1), "n": a.n, "fraction": a.fraction,
           "run_mb": round(run_mb, 1), "window_ns": list(w), "span_ns": span,
           "machine": {"nproc": os.cpu_count(), "cpu": cpu_model(), "mem_gb": mem_total_gb(),
                       "python": platform.python_version(), "numpy": _version("numpy"),
                       "perfetto": _version("perfetto"), "platform": platform.platform()},
           "rows": rows}
    with open(a.out + ".json", "w") as f:
        json.dump(doc, f, indent=1)
    with open(a.out + ".md", "w") as f:
        f.write(render_md(doc))
    print(f"wrote {a.out}.md and .json")


def render_md(doc) -> str:
    m = doc["machine"]
    out = ["# Export of a window vs the whole run", "",
           f"Command: `{doc['command']}` on {doc['date']} ({doc['elapsed_s']} s in all): "
           f"one synthetic run of {doc['n']:,} events ({doc['run_mb']} MB run file, "
           f"{doc['span_ns'] / 1e9:.1f} s; "
           "tests/synthetic.make_run: CUDA calls, off-CPU intervals, connect(), thread events, an "
           "Xid and an OOM chain, GPU counters) exported whole and as a window of "
           f"{doc['fraction']:.0%} of its span in its middle (`export --from T0ns --to T1ns`); "
           "time is open + export end to end in one process, the fastest of the repeats.  "
           "Regenerate with the command above.", "",
           f"Machine: {m['nproc']} CPUs ({m['cpu']}), {m['mem_gb']} GB RAM, Python {m['python']}, "
           f"numpy {m['numpy']}, perfetto {m['perfetto']}, {m['platform']}.", "",
           "| format | part | events | counters | faults | output MB | bytes/event "
           "| share of whole | wall s |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    whole = {r["format"]: r for r in doc["rows"] if r["part"] == "whole run"}
    for r in doc["rows"]:
        share = r["bytes"] / whole[r["format"]]["bytes"]
        out.append(f"| {r['format']} | {r['part']} | {r['events']:,} | {r['counters']:,} | "
                   f"{r['faults']} | {r['bytes'] / 1e6:.2f} | {r['bytes'] / r['events']:.1f} | "
                   f"{share:.1%} | {r['wall_s']:.2f} |")
    out += ["", "Notes: the window's trace holds the events overlapping it (slices kept whole), "
            "its counter samples and faults, the clock snapshot and the descriptors of the tracks "
            "it uses.  Every chunk of the run is still read and decoded (and the faults are found "
            "over the whole run) before the window's rows are picked; what a window saves is "
            "building, encoding and writing the rows outside it.", ""]
    return "\n".join(out)


if __name__ == "__main__":
    main()
