#!/usr/bin/env python3
"""Export throughput, size and memory: synthetic runs of N events exported as Perfetto and
Chrome JSON, in two shapes:

  cuda  tests/synthetic.make_run: CUDA calls (86 % of them stream work, drawn twice), off-CPU
        intervals, connect(), thread events, an Xid and an OOM chain, GPU counters at 10 Hz;
  gpu   tests/unit/gpu_runs.make_bulk_gpu_run: a --gpu-activity run, N/2 launch calls and
        their N/2 GPU executions, each execution with its flow from its launch.

Writes results/export-bench.md and results/export-bench.json (machine, command, date; per
shape, run size and format: events/s, bytes an event, MB/s, peak RSS and peak anonymous RSS
of the export, each measured in a fresh process).  Give several sizes to see how memory
grows with the run:

    .venv/bin/python scripts/bench/export.py                       # 2,000,000 events a shape
    .venv/bin/python scripts/bench/export.py -n 2000000 10000000   # the committed figures
    .venv/bin/python scripts/bench/export.py -n 10000000 --workdir /tmp/ca --keep-runs
    .venv/bin/python scripts/bench/export.py --shape gpu --format perfetto
"""
import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)                    # tests.synthetic: the run-file generator

GOAL = 1_000_000                # events/s (issue 26)
SIZE_GOAL = 40                  # Perfetto bytes an event (issue 26)
FORMATS = (("perfetto", "pftrace"), ("chrome-json", "json"))
SHAPES = ("cuda", "gpu")

# The export, alone in a fresh process.  Peak RSS is VmHWM, not ru_maxrss: Linux carries the
# parent's high-water mark into a child it forks or vforks (exec folds the old mm's peak into
# ru_maxrss), so ru_maxrss would report this script's own peak after it made a big run.
# VmHWM counts the run file's pages too: the reader maps the file, and those clean file
# pages stay resident while memory is free.  RssAnon, sampled every 10 ms, is the process's
# own memory (what the export allocates).
# The measuring child's sampler (scripts/bench/gpu_activity_memory.py's child starts with it too):
# status() is /proc/self/status in MiB; a thread keeps each of peak's values' maximum every
# 10 ms until done is set.
CHILD_SAMPLER = r"""
import threading

def status():
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("RssAnon", "RssFile", "VmHWM"):
                out[k] = int(v.split()[0]) / 1024
    return out

peak = {"RssAnon": 0.0, "RssFile": 0.0}
done = threading.Event()
def sample():
    while not done.is_set():
        st = status()
        for k in peak:
            peak[k] = max(peak[k], st.get(k, 0.0))
        done.wait(0.01)
threading.Thread(target=sample, daemon=True).start()
"""

_CHILD = CHILD_SAMPLER + r"""
import json, resource, sys, time
from clockalign.timeline import Timeline
from clockalign.export import export_run

run, out, fmt = sys.argv[1:4]
t = time.perf_counter()
stats = export_run(Timeline.open(run), out, fmt)
wall = time.perf_counter() - t
done.set()
st = status()
ru = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"wall_s": wall, "peak_rss_mb": st["VmHWM"],
                  "peak_anon_mb": max(peak["RssAnon"], st.get("RssAnon", 0.0)),
                  "peak_file_mb": max(peak["RssFile"], st.get("RssFile", 0.0)),
                  "cpu_user_s": ru.ru_utime, "cpu_sys_s": ru.ru_stime,
                  "events": sum(stats["events"].values()) + stats["gpu_activity"],
                  "gpu_activity": stats["gpu_activity"], "bytes": stats["bytes"]}))
"""


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def mem_total_gb():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 1024 ** 2, 1)
    except OSError:
        pass
    return None


def run_export(run, out, fmt):
    # A new file each time: ext4 flushes a file that is renamed over an existing one, which
    # would charge the export a disk write it does not otherwise wait for.
    if os.path.exists(out):
        os.unlink(out)
    p = subprocess.run([sys.executable, "-c", _CHILD, run, out, fmt],
                       capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"export of {run} as {fmt} failed:\n{p.stderr}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def make(shape, run, n, duration):
    """Write the synthetic run of ``shape`` with about n events."""
    if shape == "cuda":
        from tests.synthetic import make_run
        make_run(run, n_events=n, duration_s=duration)
    else:
        from tests.unit.gpu_runs import make_bulk_gpu_run
        make_bulk_gpu_run(run, n // 2)


def bench_size(shape, n, duration, repeat, workdir, keep_runs, formats):
    run = os.path.join(workdir, f"bench-{shape}-{n}.ca")
    if not os.path.exists(run):
        t = time.perf_counter()
        make(shape, run, n, duration)
        print(f"generated a {shape} run of about {n:,} events in {time.perf_counter() - t:.1f} s "
              f"({os.path.getsize(run) / 1e6:.0f} MB)", file=sys.stderr)
    size = {"shape": shape, "events_asked": n, "duration_s": duration,
            "run_file_mb": os.path.getsize(run) / 1e6, "results": {}}
    for fmt, ext in formats:
        out = os.path.join(workdir, f"bench-{shape}-{n}.{ext}")
        best = None
        for _ in range(repeat):
            r = run_export(run, out, fmt)
            if best is None or r["wall_s"] < best["wall_s"]:
                best = r
            best["peak_rss_mb"] = max(best["peak_rss_mb"], r["peak_rss_mb"])
            best["peak_anon_mb"] = max(best["peak_anon_mb"], r["peak_anon_mb"])
            best["peak_file_mb"] = max(best["peak_file_mb"], r["peak_file_mb"])
        os.unlink(out)
        best["events_per_s"] = best["events"] / best["wall_s"]
        best["bytes_per_event"] = best["bytes"] / best["events"]
        best["mb_per_s"] = best["bytes"] / 1e6 / best["wall_s"]
        best["output_mb"] = best["bytes"] / 1e6
        size["results"][fmt] = best
        size["events"] = best["events"]
        print(f"{shape:4s} {best['events']:>12,} {fmt:12s} {best['wall_s']:6.2f} s = "
              f"{best['events_per_s']:,.0f} events/s, {best['output_mb']:.0f} MB out "
              f"({best['bytes_per_event']:.1f} B/event), "
              f"peak RSS {best['peak_rss_mb']:.0f} MB (anonymous {best['peak_anon_mb']:.0f} MB)",
              file=sys.stderr)
    if not keep_runs:
        os.unlink(run)
    return size


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", "--events", type=int, nargs="+", default=[2_000_000],
                    help="run sizes in events (several: one run each)")
    ap.add_argument("--shape", nargs="+", choices=SHAPES, default=list(SHAPES),
                    help="run shapes (module doc)")
    ap.add_argument("--format", nargs="+", choices=[f for f, _ in FORMATS],
                    default=[f for f, _ in FORMATS], help="export formats")
    ap.add_argument("--duration", type=float,
                    help="synthetic run length, s (default: 30 s per million events, so every "
                         "size has the same event rate)")
    ap.add_argument("--repeat", type=int, default=3,
                    help="exports per size and format: the fastest is kept, memory is the "
                         "most any of them used")
    ap.add_argument("--workdir", help="where runs and traces are written (default: a new "
                                      "temporary directory, removed afterwards)")
    ap.add_argument("--keep-runs", action="store_true",
                    help="keep the synthetic runs in --workdir (reused by the next invocation)")
    ap.add_argument("--results", default=os.path.join(ROOT, "results"))
    ap.add_argument("--no-write", action="store_true", help="print only")
    a = ap.parse_args()

    t0 = time.perf_counter()
    load_before = os.getloadavg()
    workdir = a.workdir or tempfile.mkdtemp(prefix="ca-bench-")
    os.makedirs(workdir, exist_ok=True)
    try:
        formats = [(f, e) for f, e in FORMATS if f in a.format]
        sizes = [bench_size(shape, n, a.duration or max(1.0, n / 1e6 * 30), a.repeat, workdir,
                            a.keep_runs, formats) for shape in a.shape for n in a.events]
    finally:
        if not a.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    machine = {"nproc": os.cpu_count(), "cpu": cpu_model(), "mem_gb": mem_total_gb(),
               "python": platform.python_version(),
               "numpy": __import__("numpy").__version__,
               "protobuf": __import__("google.protobuf").protobuf.__version__,
               "perfetto": _version("perfetto"), "platform": platform.platform(),
               "loadavg_before": [round(x, 2) for x in load_before],
               "loadavg_after": [round(x, 2) for x in os.getloadavg()]}
    big = max(sizes, key=lambda s: s["events"])
    growth = {}
    for shape in a.shape:
        mine = [s for s in sizes if s["shape"] == shape]
        b_, s_ = max(mine, key=lambda s: s["events"]), min(mine, key=lambda s: s["events"])
        if b_ is s_:
            continue
        for fmt, _ in formats:
            b, s = b_["results"][fmt], s_["results"][fmt]
            growth[f"{shape} {fmt}"] = {
                "from_events": s_["events"], "to_events": b_["events"],
                "peak_rss": b["peak_rss_mb"] / s["peak_rss_mb"],
                "peak_anon": b["peak_anon_mb"] / s["peak_anon_mb"],
                "peak_file": b["peak_file_mb"] / s["peak_file_mb"],
                # anonymous bytes the export holds per event more (the slope between sizes)
                "anon_bytes_per_added_event": (b["peak_anon_mb"] - s["peak_anon_mb"]) * 2 ** 20
                / (b_["events"] - s_["events"])}
    doc = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "command": "python scripts/bench/export.py " + " ".join(sys.argv[1:]),
           "total_s": time.perf_counter() - t0,
           "machine": machine, "goal_events_per_s": GOAL, "goal_bytes_per_event": SIZE_GOAL,
           "repeat": a.repeat,
           "events": big["events"], "run_file_mb": big["run_file_mb"],
           "results": big["results"], "sizes": sizes, "rss_growth": growth}
    if a.no_write:
        print(json.dumps(doc, indent=2))
        return
    os.makedirs(a.results, exist_ok=True)
    with open(os.path.join(a.results, "export-bench.json"), "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    with open(os.path.join(a.results, "export-bench.md"), "w") as f:
        f.write(render_md(doc))


def _version(pkg):
    try:
        from importlib.metadata import version
        return version(pkg)
    except Exception:
        return "unknown"


def render_md(doc) -> str:
    m = doc["machine"]
    lines = [
        "# Export throughput, size and memory",
        "",
        f"Command: `{doc['command']}` on {doc['date']} ({doc['total_s'] / 60:.1f} min in all). "
        "How it was made: synthetic runs of two shapes, *cuda* (tests/synthetic.make_run: CUDA "
        "calls, 86 % of them stream work that is drawn on its stream's track too, off-CPU "
        "intervals, connect(), thread events, an Xid and an OOM chain, GPU counters at 10 Hz; "
        "30 s of run per million events) and *gpu* (tests/unit/gpu_runs.make_bulk_gpu_run: a "
        "--gpu-activity run, half launch calls, half the GPU executions they led to, each "
        "with a flow from its launch), each exported end to end (open, clock fit, faults, "
        "read, convert, write) in a fresh process; events are the run's events plus its GPU "
        f"executions; events/s is the fastest of {doc['repeat']}, memory the most any of them "
        "used.  Regenerate with the command above.",
        "",
        f"Machine: {m['nproc']} CPUs ({m['cpu']}), {m.get('mem_gb')} GB RAM, Python "
        f"{m['python']}, numpy {m['numpy']}, protobuf {m['protobuf']}, perfetto "
        f"{m['perfetto']}, {m['platform']}; load average (1, 5, 15 min) "
        f"{m.get('loadavg_before')} before, {m.get('loadavg_after')} after (other work "
        "that shared the CPUs).",
        "",
        "| shape | events | run file MB | format | events/s | wall s | output MB | bytes/event "
        "| MB/s | peak RSS MB | peak anonymous MB | peak file-backed MB |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in doc["sizes"]:
        for fmt, r in s["results"].items():
            lines.append(f"| {s.get('shape', 'cuda')} | {s['events']:,} | "
                         f"{s['run_file_mb']:,.1f} | {fmt} | "
                         f"{r['events_per_s']:,.0f} | {r['wall_s']:.2f} | {r['output_mb']:,.1f} | "
                         f"{r['bytes'] / r['events']:.1f} | "
                         f"{r['mb_per_s']:.0f} | {r['peak_rss_mb']:,.0f} | "
                         f"{r['peak_anon_mb']:,.0f} | {r['peak_file_mb']:,.0f} |")
    goal = doc["goal_events_per_s"]
    size_goal = doc.get("goal_bytes_per_event", SIZE_GOAL)
    verdict = []
    for s in doc["sizes"]:
        for fmt, r in s["results"].items():
            ok = r["events_per_s"] >= goal
            what = (f"{fmt}, {s.get('shape', 'cuda')} run of {s['events']:,} events: "
                    f"{'meets' if ok else 'is BELOW'} the {goal:,} events/s goal")
            if fmt == "perfetto":
                small = r["bytes"] / r["events"] <= size_goal
                what += f", {'meets' if small else 'is ABOVE'} the {size_goal} bytes/event goal"
            verdict.append(what)
    lines += ["", "; ".join(verdict) + "."]
    for fmt, g in doc.get("rss_growth", {}).items():
        lines.append("")
        lines.append(f"{fmt} (shape, format), {g['from_events']:,} -> {g['to_events']:,} events "
                     f"(x{g['to_events'] / g['from_events']:.1f}): peak RSS x{g['peak_rss']:.2f}, "
                     f"peak anonymous RSS x{g['peak_anon']:.2f}, peak file-backed RSS "
                     f"x{g['peak_file']:.2f}; "
                     f"{g.get('anon_bytes_per_added_event', 0):.0f} anonymous bytes per "
                     "added event.")
    lines += ["",
              "Perfetto traces are made small with what the format offers "
              "(export/perfetto_packets.py): interned names, categories and annotation names, "
              "a default track per sequence (TrackEventDefaults), timestamps as deltas on an "
              "incremental sequence clock, varints in their fewest bytes, and the event packets "
              "deflated in 256 KB compressed_packets bundles (zlib level 1).  "
              "tests/unit/test_perfetto_content.py checks that the decoded content equals the "
              "previous writer's.",
              "",
              "Notes: peak RSS is VmHWM of the export process (not ru_maxrss, which Linux "
              "seeds with the parent's peak).  It is about anonymous + file-backed: the "
              "file-backed part is the shared libraries plus the run file, which the reader "
              "maps and gives back chunk by chunk once decoded (madvise DONTNEED), so it grows "
              "far slower than the file.  The export's own memory is the anonymous RSS: a few "
              "batches in flight, the fault list (failing calls only; successful calls are "
              "streamed twice, not kept), tracks and interned strings, and up to 64 MB of freed "
              "heap that glibc keeps for the next batches (timeline/heap.py reuse_heap: without it the "
              "kernel maps and zeroes every batch's arrays afresh, as much system time as the "
              "export's own work).  A --gpu-activity run's GPU executions are not streamed: "
              "Timeline.gpu_activity sorts them by time and joins them to their launch calls "
              "before the export lays them out on tracks, so the gpu shape's memory still grows "
              "with its executions; the export reads them as narrow columns "
              "(Timeline.gpu_activity(fields=gpu_tracks.EXPORT_FIELDS), each field in the "
              "fewest bytes its values need, widened a batch at a time), so what grows is the "
              "per-added-event figure above, the peak being in reading and sorting them "
              "(timeline/gpu_load.py).  The exporter encodes on worker threads (numpy "
              "releases the GIL), the GPU executions too, while the main thread reads and builds "
              "the next batch, so both cores work; the VM is shared with other work (load "
              "average above), so events/s varies by tens of percent from run to run.  Each "
              "trace is written to a new file (a file renamed over an existing one makes ext4 "
              "flush it, which is not the exporter's cost).", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
