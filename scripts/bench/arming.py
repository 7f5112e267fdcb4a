"""What arming the probes of `clockalign record --pid` spends (issue 24): the time a running
target goes unrecorded after `record` starts, split into the BPF compile (clang, and the
maps libbcc creates with it), the programs' load (the verifier), the tracepoints' attach,
the libcuda symbol lookup and the CUDA uprobe_multi links, the event buffers, the run file
and the helpers (clock probe, counters); and, end to end, from `record`'s start (Python's
imports, the preflight) to its run file existing.

    sudo .venv/bin/python scripts/bench/arming.py --out results/arming [--rounds 5]

Root and BCC.  The target is the stand-in libcuda's known-count target (built here with
gcc), held at --wait, so nothing it does competes.  In-process rounds time BCC's steps by
wrapping them (bcc.lib.bpf_module_create_c_from_string, BPF.load_func, attach_tracepoint,
attach_raw_tracepoint, BPF._check_path_symbol); CLI rounds run `clockalign record` as a user
would.  Writes OUT/arming.json (every round) and OUT/arming.md.
"""
import argparse
import collections
import datetime
import functools
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

from clockalign.capture.probes.cflags import import_bcc
from clockalign.capture.recorder import Recorder, RecordOptions
from clockalign.store.reader import RunReader
from clockalign.workloads.standin import build

SPENT = collections.Counter()


def timed(key, fn):
    @functools.wraps(fn)
    def wrapper(*a, **kw):
        t0 = time.monotonic()
        try:
            return fn(*a, **kw)
        finally:
            SPENT[key] += time.monotonic() - t0
    return wrapper


def instrument():
    """Time BCC's steps; the preflight's own trivial compile (before arming) apart."""
    from clockalign.capture import preflight
    real = preflight.require

    def require(*a, **kw):
        before, t0 = dict(SPENT), time.monotonic()
        try:
            return real(*a, **kw)
        finally:
            for k in list(SPENT):
                SPENT[k] = before.get(k, 0.0)
            SPENT["preflight_s"] += time.monotonic() - t0
    preflight.require = require
    bcc = import_bcc()
    B = bcc.BPF
    bcc.lib.bpf_module_create_c_from_string = timed(
        "clang_compile_and_maps_s", bcc.lib.bpf_module_create_c_from_string)
    B.load_func = timed("program_load_verifier_s", B.load_func)
    B.attach_tracepoint = timed("tracepoint_attach_s", B.attach_tracepoint)
    B.attach_raw_tracepoint = timed("tracepoint_attach_s", B.attach_raw_tracepoint)
    B._check_path_symbol = staticmethod(timed("libcuda_symbol_lookup_s", B._check_path_symbol))


def waiting_target(d):
    env = dict(os.environ, LD_LIBRARY_PATH=d)
    t = subprocess.Popen([os.path.join(d, "target"), "--wait"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, env=env)
    assert t.stdout.readline().startswith("ready")
    return t


def stop(t):
    t.kill()
    t.wait()


def in_process_round(d, out, cuda):
    t = waiting_target(d)
    SPENT.clear()
    try:
        s = Recorder(RecordOptions(pids=[t.pid], output=out, force=True, duration=0.5,
                                   cuda=cuda, libcuda=os.path.join(d, "libcuda.so.1"),
                                   status=False)).run()
    finally:
        stop(t)
    return {**s["arming"], **{k: round(v, 4) for k, v in SPENT.items()}}


def cli_round(d, out, python):
    """`clockalign record --pid` from its start: seconds to its run file (the probes are
    attached then), and the arming it states."""
    t = waiting_target(d)
    if os.path.exists(out):
        os.unlink(out)
    t0 = time.monotonic()
    rec = subprocess.Popen([python, "-m", "clockalign.cli.main", "record", "--pid", str(t.pid),
                            "-o", out, "--duration", "2", "--quiet"],
                           stderr=subprocess.PIPE, text=True)
    try:
        while not os.path.exists(out) and rec.poll() is None:
            time.sleep(0.005)
        to_file = time.monotonic() - t0
        _, err = rec.communicate(timeout=120)
    finally:
        stop(t)
    assert rec.returncode == 0, err
    said = next(ln for ln in err.splitlines() if "probes armed in" in ln)
    return {"start_to_run_file_s": round(to_file, 3), "stated": said.split(": ", 1)[1],
            **RunReader(out).trailer["arming"]}


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="arming-")
    build(tmp)
    run = os.path.join(tmp, "run.ca")
    res = {"command": " ".join([os.path.basename(sys.executable)] + sys.argv),
           "machine": f"{platform.node()} ({platform.machine()}, kernel {platform.release()}, "
                      f"{os.cpu_count()} CPUs)",
           "loadavg_start": os.getloadavg(),
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "cli": [], "cuda": [], "no_cuda": []}
    instrument()                       # in this process only; the CLI rounds are not touched
    for _ in range(a.rounds):          # interleaved, so that all see the same load
        res["cli"].append(cli_round(tmp, run, sys.executable))
        res["cuda"].append(in_process_round(tmp, run, True))
        res["no_cuda"].append(in_process_round(tmp, run, False))
    res["loadavg_end"] = os.getloadavg()
    with open(os.path.join(a.out, "arming.json"), "w") as f:
        json.dump(res, f, indent=1)

    def col(rows, k):
        v = [r[k] for r in rows if k in r]
        return f"{median(v):.3f} ({min(v):.3f}–{max(v):.3f})" if v else "-"
    steps = [("preflight_s", "(before arming) preflight, with its trivial BPF compile"),
             ("clang_compile_and_maps_s", "clang compile + map creation (libbcc)"),
             ("program_load_verifier_s", "program loads (verifier), all programs"),
             ("tracepoint_attach_s", "tracepoint attach"),
             ("bpf_compile_load_s", "= Probes: BPF compile and load, in all"),
             ("libcuda_symbol_lookup_s", "libcuda symbol lookup (84 symbols)"),
             ("cuda_links_s", "Probes: CUDA links, in all (lookup + 2 loads + links)"),
             ("event_buffers_s", "event buffers (slot rings mapped)"),
             ("targets_s", "targets map"),
             ("libcuda_lookup_s", "libcuda located"),
             ("probes_armed_s", "**probes armed** (the target unrecorded until here)"),
             ("run_file_and_threads_s", "run file opened, thread snapshot"),
             ("helpers_s", "helpers started (clock probe, counters)"),
             ("total_s", "arming, all steps")]
    lines = ["# What arming the probes spends", "",
             f"`{res['command']}` on {res['machine']}, {res['date']}; load average "
             f"{res['loadavg_start'][0]:.2f} at the start, {res['loadavg_end'][0]:.2f} at the "
             "end. Raw rounds: arming.json.", "",
             f"End to end, `clockalign record --pid` of a waiting target, from the command's "
             f"start to its run file existing (the probes are attached before the file is "
             f"created): median (min–max) of {a.rounds} rounds "
             f"**{col(res['cli'], 'start_to_run_file_s')} s**, of which the recorder's arming "
             f"{col(res['cli'], 'probes_armed_s')} s (the rest: Python's imports, the "
             "preflight). The three kinds of round were interleaved. Stated on stderr, e.g. `" + res["cli"][-1]["stated"] + "`.", "",
             f"By step, in-process `Recorder` rounds ({a.rounds} each), seconds, median "
             "(min–max):", "",
             "| step | CUDA probes on the stand-in libcuda | `--no-cuda` |", "|---|---|---|"]
    for k, name in steps:
        lines.append(f"| {name} | {col(res['cuda'], k)} | {col(res['no_cuda'], k)} |")
    share = median([r["clang_compile_and_maps_s"] / r["probes_armed_s"] for r in res["cuda"]])
    verifier = median([r["program_load_verifier_s"] / r["probes_armed_s"] for r in res["cuda"]])
    lines += ["", f"Of the probes' arming with CUDA probes (median of the rounds' shares): "
              f"clang compile and map creation {share:.0%}, the verifier's program loads "
              f"{verifier:.0%}. A `--pid` target's events before `probes armed` are not "
              "recorded; a target that ends before then is named, and `record` exits 1 when "
              "nothing of it was recorded."]
    with open(os.path.join(a.out, "arming.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
