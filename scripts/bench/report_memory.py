#!/usr/bin/env python3
"""Peak memory, time and chunk decoding of report, export and dump on a run the size of the
H200 recording of issue 26 (84 s of a GPT-2 decode loop with --gpu-activity: 0.97 M CUDA
calls, 2.94 M GPU executions).

The run is synthetic (tests/unit/gpu_runs.make_bulk_gpu_run): --calls launching calls of
one thread, --per-call GPU executions each (a graph launch, say: one CUPTI callback, that
many kernels, copies and memsets sharing its correlation id), spread over --seconds.  Each
command runs alone in a fresh process (the CLI, in-process there) importing clockalign from
--agent (default: this tree's; another tree, e.g. a `git archive` of an older commit, gives
a before/after pair on the same run): peak RSS is VmHWM, peak anonymous RSS (the mapped run
file left out) RssAnon sampled every 10 ms, time wall-clock; "EVENTS chunks decoded" is
RunReader.decodes summed over the command's readers, against the run's EVENTS chunks (dump
decodes each once).  Writes results/report-memory.json (sets by --label) and .md.

    .venv/bin/python scripts/bench/report_memory.py --label after
    .venv/bin/python scripts/bench/report_memory.py --agent /tmp/base/agent --label before \\
        --commit 8fbee30
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)                    # tests.unit.gpu_runs: the run generator
from export import CHILD_SAMPLER  # noqa: E402  (scripts/bench/)
from labelled_sets import save_set  # noqa: E402  (scripts/bench/)

_CHILD = CHILD_SAMPLER + r"""
import json, sys, time
from clockalign.cli.main import cli
from clockalign.store import reader as store_reader

readers = []
_init = store_reader.RunReader.__init__
def _counting(self, *a, **kw):
    _init(self, *a, **kw)
    readers.append(self)
store_reader.RunReader.__init__ = _counting

t = time.perf_counter()
try:
    cli(sys.argv[1:], standalone_mode=False)
finally:
    wall = time.perf_counter() - t
    done.set()
st = status()
decoded = sum(int(r.decodes.get(1, 0)) for r in readers)       # Chunk.EVENTS
print(json.dumps({"wall_s": wall, "peak_rss_mb": st["VmHWM"],
                  "peak_anon_mb": max(peak["RssAnon"], st.get("RssAnon", 0.0)),
                  "events_chunks_decoded": decoded}))
"""


def commands(run, work):
    return {
        "report": ["report", run, "-o", os.path.join(work, "rep")],
        "export perfetto": ["export", run, "-o", os.path.join(work, "t.pftrace")],
        "export chrome-json": ["export", run, "-o", os.path.join(work, "t.json"),
                               "--format", "chrome-json"],
        "dump": ["dump", run, "-o", os.path.join(work, "dump.jsonl")],
    }


def measure(agent, args, work):
    env = dict(os.environ, PYTHONPATH=agent)
    p = subprocess.run([sys.executable, "-c", _CHILD] + args, env=env, capture_output=True,
                       text=True, cwd=work)
    if p.returncode:
        sys.exit(f"clockalign {' '.join(args)} failed:\n{p.stderr[-3000:]}")
    for name in os.listdir(work):            # outputs are large: one at a time on disk
        path = os.path.join(work, name)
        if os.path.isfile(path) and name != "run.ca":
            os.unlink(path)
    return json.loads(p.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=980_000, help="launching CUDA calls")
    ap.add_argument("--per-call", type=int, default=3, help="GPU executions per call")
    ap.add_argument("--seconds", type=float, default=84.0, help="the run's length")
    ap.add_argument("--agent", default=os.path.join(ROOT, "agent"),
                    help="the clockalign tree measured (its agent/ directory)")
    ap.add_argument("--only", nargs="+", help="commands to measure (default: all)")
    ap.add_argument("--label", default="now", help="name of this set of figures")
    ap.add_argument("--note", help="a line on this set of figures, shown under its heading")
    ap.add_argument("--commit", help="the commit of the tree measured (default: this "
                                     "checkout's HEAD)")
    ap.add_argument("--results", default=os.path.join(ROOT, "results"))
    a = ap.parse_args()
    from clockalign.store.reader import RunReader
    from clockalign.store.schema import Chunk
    from tests.unit.gpu_runs import make_bulk_gpu_run
    n = a.calls * a.per_call
    with tempfile.TemporaryDirectory(prefix="ca-report-mem-") as work:
        run = os.path.join(work, "run.ca")
        make_bulk_gpu_run(run, n, per_call=a.per_call, every_ns=int(a.seconds * 1e9 / a.calls))
        r = RunReader(run)
        shape = {"calls": a.calls, "executions": n, "seconds": a.seconds,
                 "run_mb": round(os.path.getsize(run) / 1e6, 1),
                 "events_chunks": len(list(r.chunk_sizes(Chunk.EVENTS)))}
        del r
        figures = {}
        for name, args in commands(run, work).items():
            if a.only and name not in a.only:
                continue
            figures[name] = measure(os.path.abspath(a.agent), args, work)
            f = figures[name]
            print(f"{name:20s} {f['wall_s']:7.2f} s  peak RSS {f['peak_rss_mb']:6.0f} MB  "
                  f"anonymous {f['peak_anon_mb']:6.0f} MB  EVENTS chunks decoded "
                  f"{f['events_chunks_decoded']} of {shape['events_chunks']}", file=sys.stderr)
    save_set(a.results, "report-memory", a.label,
             {"run": shape, "figures": figures, **({"note": a.note} if a.note else {})},
             markdown, "scripts/bench/report_memory.py", a.commit)


def markdown(doc) -> str:
    m = doc["machine"]
    out = ["# report and export on an H200-size GPU run: peak memory, time, decoding", "",
           f"Made by `scripts/bench/report_memory.py` on {m['cpu']} ({m['nproc']} CPUs, "
           f"{m['mem_gb']} GB), Python {m['python']}, {m['platform']}.", "",
           "How it was made: a synthetic --gpu-activity run the size of issue 26's H200 "
           "recording (tests/unit/gpu_runs.make_bulk_gpu_run: one thread's launching calls, "
           "each with its CUPTI callback and several executions sharing its correlation id). "
           "Each command runs alone in a fresh process; peak RSS = VmHWM (the mapped run "
           "file included), anonymous = RssAnon sampled every 10 ms; EVENTS chunks decoded = "
           "RunReader.decodes over the command, per EVENTS chunk of the run (on a GPU run dump "
           "decodes each twice: its own pass, and the Timeline's that gathers the CUDA calls "
           "the executions are joined to).  The machine is shared: times are as measured, "
           "not best-of.",
           "", "Regenerate: `python scripts/bench/report_memory.py --label after` (this "
           "tree); a before set on the same run from an older tree: `git archive <commit> "
           "agent | tar -x -C /tmp/base` then `python scripts/bench/report_memory.py --agent "
           "/tmp/base/agent --commit <commit> --label before`.", ""]
    for label, s in doc["sets"].items():
        r = s["run"]
        out += [f"## {label} (commit {s['commit']}, {s['date'][:10]})", "",
                f"`{s['command']}`", "",
                f"Run: {r['calls']:,} CUDA calls, {r['executions']:,} GPU executions over "
                f"{r['seconds']:g} s; run file {r['run_mb']} MB, {r['events_chunks']} EVENTS "
                "chunks.", ""] + ([s["note"], ""] if s.get("note") else []) + [
                "| command | wall s | peak RSS MB | peak anonymous MB | EVENTS chunks decoded "
                "(per chunk) |", "|---|---:|---:|---:|---:|"]
        for name, f in s["figures"].items():
            k = f["events_chunks_decoded"]
            out.append(f"| {name} | {f['wall_s']:.2f} | {f['peak_rss_mb']:.0f} | "
                       f"{f['peak_anon_mb']:.0f} | {k} ({k / max(r['events_chunks'], 1):.2f}) |")
        out.append("")
    out += ["Where export's memory goes: its events stream (a batch at a time; the second "
            "pass reads the first pass's spool), but the GPU executions are held whole "
            "(ACTIVITY_DTYPE, 139 bytes each) while their tracks and lanes are laid out "
            "(export/gpu_tracks.py, export/lanes.py): export's peak still grows with the "
            "number of executions.", ""]
    return "\n".join(out)


if __name__ == "__main__":
    t0 = time.perf_counter()
    main()
    print(f"done in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
