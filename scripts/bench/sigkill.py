"""What a SIGKILL of `clockalign record` loses, and what flushing the run file more often
costs (issue 24).

A paced storm (scripts/workloads/storm.c: cuLaunchKernel of the stand-in libcuda at each of
--rates calls a second) runs under `clockalign record --pid`; after a random 1.5-3 s the recorder is
killed with SIGKILL.  The run file, truncated, is read back: the loss is the time from the
kill to the end of the last CUDA call the file kept (the storm calls every 1/rate s, so
nothing but the loss separates them), and the calls lost are counted against the storm's
own pace.  Each round is made with the recorder's flush interval (capture/recorder.py
FLUSH_S, set in the recorder's process before it starts) at each value of --flush; the
cost is the recorder's CPU seconds per second of recording (/proc/PID/stat, from the run
file's creation to the kill), its write() calls per second (/proc/PID/io syscw) and the
bytes written per second.

    sudo .venv/bin/python scripts/bench/sigkill.py --out results/sigkill [--rounds 8]

Root, BCC, gcc.  Writes OUT/sigkill.json (every round) and OUT/sigkill.md.
"""
import argparse
import datetime
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from clockalign.store.reader import RunReader
from clockalign.store.schema import Kind
from probe_cost import Storm, build_tools, child_env, machine        # scripts/bench/

WRAPPER = ("import sys, clockalign.capture.recorder as r; r.FLUSH_S = float(sys.argv[1]); "
           "from clockalign.cli.main import main; main(sys.argv[2:])")
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def io(pid):
    with open(f"/proc/{pid}/io") as f:
        d = dict(ln.split(": ") for ln in f.read().splitlines())
    return int(d["syscw"]), int(d["wchar"])


def one_round(flush, storm_bin, lib, rate, out, env):
    """One recording of a paced storm, killed: what its truncated file kept."""
    storm = Storm(storm_bin, lib, threads=1, seconds=30, rate=rate)
    if os.path.exists(out):
        os.unlink(out)
    rec = subprocess.Popen([sys.executable, "-c", WRAPPER, str(flush), "record", "--pid",
                            str(storm.pid), "-o", out, "--counters", "none", "--no-gpu-clock",
                            "--quiet"], stderr=subprocess.PIPE, text=True, env=env)
    try:
        while not os.path.exists(out):
            if rec.poll() is not None:
                raise SystemExit(f"record failed: {rec.stderr.read()}")
            time.sleep(0.01)
        storm.p.stdin.write("go\n")
        storm.p.stdin.flush()
        t_go = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        cpu0, (w0, b0), t0 = cpu_s(rec.pid), io(rec.pid), time.monotonic()
        time.sleep(random.uniform(1.5, 3.0))
        cpu1, (w1, b1), t1 = cpu_s(rec.pid), io(rec.pid), time.monotonic()
        t_kill = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        os.kill(rec.pid, signal.SIGKILL)
        rec.wait()
    finally:
        if rec.poll() is None:
            rec.kill()
            rec.wait()
        storm.p.kill()
        storm.p.wait()
    r = RunReader(out)
    ev = r.events()
    cuda = ev[(ev["kind"] == Kind.CUDA) & (ev["pid"] == storm.pid)]
    kept = cuda[cuda["ts"] >= t_go] if len(cuda) else cuda
    last = int((kept["ts"] + kept["dur"]).max()) if len(kept) else t_go
    wall = t1 - t0
    return {"flush_s": flush, "lost_ms": round((t_kill - last) / 1e6, 2),
            "calls_kept": int(len(kept)),
            "calls_lost_est": int(round((t_kill - last) / 1e9 * rate)),
            "clean": r.clean, "chunks_kept": r.chunk_count,
            "recorder_cpu_per_s": round((cpu1 - cpu0) / wall, 4),
            "writes_per_s": round((w1 - w0) / wall, 1),
            "bytes_per_s": round((b1 - b0) / wall)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--rates", default="200,20000", help="storm calls a second, each tried")
    ap.add_argument("--flush", default="0.25,0.05,0",
                    help="flush intervals to compare, seconds (0: after every batch)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="sigkill-"))
    _, lib, storm_bin = build_tools(work)
    env = child_env()
    flushes = [float(x) for x in a.flush.split(",")]
    rates = [int(x) for x in a.rates.split(",")]
    res = {"command": " ".join([os.path.basename(sys.executable)] + sys.argv),
           "machine": machine(), "loadavg_start": os.getloadavg(),
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "rates": rates, "rounds": []}
    order = [(f, rate) for _ in range(a.rounds) for rate in rates for f in flushes]
    for i, (f, rate) in enumerate(order):          # interleaved: the same load for all
        r = one_round(f, storm_bin, lib, rate, str(work / "kill.ca"), env)
        r["rate"] = rate
        print(f"{i + 1}/{len(order)}: {r}", file=sys.stderr, flush=True)
        res["rounds"].append(r)
    res["loadavg_end"] = os.getloadavg()
    with open(os.path.join(a.out, "sigkill.json"), "w") as fh:
        json.dump(res, fh, indent=1)

    def stats(f, rate, k):
        v = sorted(r[k] for r in res["rounds"] if r["flush_s"] == f and r["rate"] == rate)
        return v[len(v) // 2], v[0], v[-1]
    m = res["machine"]
    lines = ["# What a SIGKILL of the recorder loses", "",
             f"Command: `{res['command']}` on {m.get('hostname')} ({m.get('cpu', '?')}, "
             f"{m.get('cpus')} CPUs, kernel {m.get('kernel')}), {res['date']}; load average "
             f"{res['loadavg_start'][0]:.2f} at the start, {res['loadavg_end'][0]:.2f} at the "
             "end. Raw rounds: sigkill.json.", "",
             f"Storm: 1 thread, {' or '.join(map(str, rates))} cuLaunchKernel/s of the stand-in "
             "libcuda, recorded "
             "with `record --pid --counters none --no-gpu-clock`; SIGKILL after 1.5-3 s; "
             f"{a.rounds} rounds per flush interval, interleaved. Loss = kill time minus the "
             "end of the last call the truncated file kept.", "",
             "| calls/s | flush interval | lost ms, median (min–max) | calls lost (est.), max | "
             "recorder CPU s/s, median (min–max) | write() calls/s, median | bytes/s, median |",
             "|---|---|---|---|---|---|---|"]
    for rate in rates:
        for f in flushes:
            lo, cpu = stats(f, rate, "lost_ms"), stats(f, rate, "recorder_cpu_per_s")
            name = "every batch (0)" if f == 0 else f"{f * 1000:g} ms"
            lines.append(f"| {rate} | {name} | {lo[0]} ({lo[1]}–{lo[2]}) | "
                         f"{stats(f, rate, 'calls_lost_est')[2]} | {cpu[0]} ({cpu[1]}–{cpu[2]}) "
                         f"| {stats(f, rate, 'writes_per_s')[0]} | "
                         f"{stats(f, rate, 'bytes_per_s')[0]} |")
    with open(os.path.join(a.out, "sigkill.md"), "w") as fh:
        fh.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
