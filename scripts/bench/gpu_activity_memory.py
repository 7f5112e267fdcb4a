#!/usr/bin/env python3
"""Peak memory and time of the GPU-activity paths (dump, export, report) on a synthetic
--gpu-activity run of N executions (tests/unit/gpu_runs.make_bulk_gpu_run: each with its
BPF launch event and CUPTI callback, so the run holds 2N GPU records and N CUDA events).

Each command runs alone in a fresh process (the CLI, in-process there): peak RSS is its
VmHWM, peak anonymous RSS (what it allocates, the mapped run file left out) is RssAnon
sampled every 10 ms; time is wall-clock.  Writes results/gpu-activity-memory.md (machine,
command, date), or with --label merges a labelled set of figures into
results/gpu-activity-memory.json first, so a before/after pair can be kept side by side:

    .venv/bin/python scripts/bench/gpu_activity_memory.py -n 2000000 --label before
    .venv/bin/python scripts/bench/gpu_activity_memory.py -n 2000000 --label after
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from export import CHILD_SAMPLER   # scripts/bench/
from labelled_sets import save_set   # scripts/bench/

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)                    # tests.unit.gpu_runs: the run-file generator

_CHILD = CHILD_SAMPLER + r"""
import json, sys, time
from clockalign.cli.main import cli

t = time.perf_counter()
try:
    cli(sys.argv[1:], standalone_mode=False)
finally:
    wall = time.perf_counter() - t
    done.set()
st = status()
print(json.dumps({"wall_s": wall, "peak_rss_mb": st["VmHWM"],
                  "peak_anon_mb": max(peak["RssAnon"], st.get("RssAnon", 0.0))}))
"""


def commands(run, work):
    return {
        "dump": ["dump", run, "-o", os.path.join(work, "dump.jsonl")],
        "export perfetto": ["export", run, "-o", os.path.join(work, "t.pftrace")],
        "export chrome-json": ["export", run, "-o", os.path.join(work, "t.json"),
                               "--format", "chrome-json"],
        "report": ["report", run, "-o", os.path.join(work, "rep")],
    }


def measure(args):
    p = subprocess.run([sys.executable, "-c", _CHILD] + args, capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"clockalign {' '.join(args)} failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=2_000_000, help="GPU executions in the run")
    ap.add_argument("--only", nargs="+", help="commands to measure (default: all)")
    ap.add_argument("--label", default="now", help="name of this set of figures")
    ap.add_argument("--results", default=os.path.join(ROOT, "results"))
    ap.add_argument("--note", help="a line on this set of figures, shown under its heading")
    ap.add_argument("--commit", help="the commit of the tree measured, where it is not a git "
                                     "checkout (a `git archive` copy)")
    a = ap.parse_args()
    from tests.unit.gpu_runs import make_bulk_gpu_run
    with tempfile.TemporaryDirectory(prefix="ca-gpu-bench-") as work:
        run = os.path.join(work, "run.ca")
        make_bulk_gpu_run(run, a.n)
        figures = {}
        for name, args in commands(run, work).items():
            if a.only and name not in a.only:
                continue
            figures[name] = measure(args)
            print(f"{name:20s} {figures[name]['wall_s']:7.2f} s  peak RSS "
                  f"{figures[name]['peak_rss_mb']:6.0f} MB  anonymous "
                  f"{figures[name]['peak_anon_mb']:6.0f} MB", file=sys.stderr)
    save_set(a.results, "gpu-activity-memory", a.label,
             {"n": a.n, "figures": figures, **({"note": a.note} if a.note else {})}, markdown,
             "scripts/bench/gpu_activity_memory.py", a.commit, merge="figures")


def markdown(doc) -> str:
    m = doc["machine"]
    out = ["# GPU activity: peak memory and time of dump, export and report", "",
           f"Made by `scripts/bench/gpu_activity_memory.py` on {m['cpu']} ({m['nproc']} CPUs, "
           f"{m['mem_gb']} GB), Python {m['python']}, {m['platform']}.  A synthetic "
           "--gpu-activity run (tests/unit/gpu_runs.make_bulk_gpu_run): N executions, each "
           "with its BPF launch event and CUPTI callback.  Each command alone in a fresh "
           "process; peak RSS = VmHWM (the mapped run file included), anonymous = RssAnon "
           "sampled every 10 ms.  The machine is shared: times are as measured, not best-of.",
           ""]
    for label, s in doc["sets"].items():
        out += [f"## {label}: N = {s['n']:,} (commit {s['commit']}, {s['date']})", "",
                f"`{s['command']}`", ""] + ([s["note"], ""] if s.get("note") else []) + [
                "| command | wall s | peak RSS MB | peak anonymous MB |", "|---|---:|---:|---:|"]
        for name, r in s["figures"].items():
            out.append(f"| {name} | {r['wall_s']:.2f} | {r['peak_rss_mb']:.0f} | "
                       f"{r['peak_anon_mb']:.0f} |")
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    t0 = time.perf_counter()
    main()
    print(f"done in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
