#!/usr/bin/env python3
"""RSS of `clockalign watch` on a busy target over time: is its memory flat?

A storm process (scripts/workloads/storm.c) calls the stand-in libcuda's cuLaunchKernel at a
paced rate from N threads for the whole soak; `clockalign watch --pid` (no run file,
everything on) watches it, and every --every seconds this script reads watch's VmRSS from
/proc and scrapes its /metrics (as Prometheus would), keeping every sample.  At the end it
compares the storm's own call count with the CUDA events watch counted plus its drops.

    sudo .venv/bin/python scripts/bench/watch_soak.py --minutes 15 --out results/watch
    sudo python3 scripts/bench/watch_soak.py --minutes 60 --threads 4 --rate 50000 \
        --out results/watch/h200

Writes OUT/soak.json (every sample) and OUT/soak.md.
"""
import argparse
import datetime
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from probe_cost import Storm, build_tools, child_env, clockalign_cmd, machine   # scripts/bench/


def vm_rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return None


def cpu_s(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def scrape(port):
    from prometheus_client.parser import text_string_to_metric_families
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    out = {"cuda_events": 0, "dropped": 0, "series": 0, "bytes": len(text)}
    for fam in text_string_to_metric_families(text.decode()):
        for s in fam.samples:
            out["series"] += 1
            if s.name == "clockalign_events_total" and s.labels.get("kind") == "cuda":
                out["cuda_events"] = int(s.value)
            elif s.name == "clockalign_events_dropped_total":
                out["dropped"] += int(s.value)
            elif s.name == "clockalign_probes_armed":
                out["armed"] = int(s.value)
    return out


def slope_kb_per_h(samples):
    """Least-squares slope of RSS against time, kB per hour."""
    t = [s["t_s"] for s in samples]
    r = [s["rss_kb"] for s in samples]
    mt, mr = statistics.fmean(t), statistics.fmean(r)
    den = sum((x - mt) ** 2 for x in t)
    return sum((x - mt) * (y - mr) for x, y in zip(t, r)) / den * 3600 if den else 0.0


def render(res) -> str:
    s = res["samples"]
    warm = [x for x in s if x["t_s"] >= res["warmup_s"]]
    m = res["machine"]
    first, last = warm[0], warm[-1]
    out = [f"# clockalign watch: RSS over {res['minutes']:g} min of a busy target "
           f"({m.get('gpu') or 'no GPU'}; {m['hostname']})", "",
           f"- date: {res['date']}", f"- command: `{res['command']}`",
           f"- machine: {m.get('cpu')} x{m['cpus']}, kernel {m['kernel']}",
           f"- target: storm, {res['threads']} thread(s) x {res['rate']} cuLaunchKernel/s "
           f"(stand-in libcuda), watched by `clockalign watch --pid` (no run file, counters "
           f"and GPU clock on where there is a GPU), /metrics scraped every "
           f"{res['every_s']:g} s", "",
           "| | value |", "|---|---|",
           f"| RSS after warm-up ({res['warmup_s']:g} s) | {first['rss_kb'] / 1024:.1f} MiB |",
           f"| RSS at the end | {last['rss_kb'] / 1024:.1f} MiB |",
           f"| RSS min / max after warm-up | {min(x['rss_kb'] for x in warm) / 1024:.1f} / "
           f"{max(x['rss_kb'] for x in warm) / 1024:.1f} MiB |",
           f"| RSS slope after warm-up (least squares) | {res['slope_kb_per_h']:+.0f} kB/h |",
           f"| series on /metrics, first / last scrape | {warm[0]['series']} / "
           f"{warm[-1]['series']} |",
           f"| CUDA calls made by the storm | {res['storm_calls']} |",
           f"| CUDA events counted by watch + dropped | {res['watch_cuda_events']} + "
           f"{res['watch_dropped']} |",
           f"| watch CPU, whole soak | {res['watch_cpu_s']:.0f} s "
           f"({res['watch_cpu_s'] / (res['minutes'] * 60):.0%} of a core) |",
           f"| watch exit code (SIGINT) | {res['watch_returncode']} |", "",
           "Every sample (t, RSS, CUDA events counted so far) is in soak.json.", ""]
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--minutes", type=float, default=60)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rate", type=int, default=20000, help="calls/s per storm thread")
    ap.add_argument("--every", type=float, default=10.0, help="seconds between samples")
    ap.add_argument("--warmup", type=float, default=60.0, help="seconds before RSS is judged")
    a = ap.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("watch_soak: needs root (BPF)")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="soak-"))
    _, lib, storm_bin = build_tools(work)
    seconds = a.minutes * 60
    storm = Storm(storm_bin, lib, threads=a.threads, seconds=seconds, rate=a.rate)
    # a second target that outlives the storm, so watch still serves its final counts
    keeper = subprocess.Popen(["sleep", "infinity"])
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    watch = subprocess.Popen(clockalign_cmd("watch", "--pid", str(storm.pid), "--pid",
                                            str(keeper.pid), "--libcuda", lib,
                                            "--listen", f"127.0.0.1:{port}", "--quiet"),
                             env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    t_end = time.monotonic() + 120
    while True:
        try:
            if scrape(port).get("armed") == 1:
                break
        except OSError:
            pass
        if watch.poll() is not None or time.monotonic() > t_end:
            raise SystemExit("watch did not start: " + watch.stderr.read()[-2000:])
        time.sleep(0.2)
    import threading
    result = {}
    runner = threading.Thread(target=lambda: result.update(storm.go()), daemon=True)
    runner.start()
    t0 = time.monotonic()
    samples = []
    while time.monotonic() - t0 < seconds:
        m = scrape(port)
        samples.append({"t_s": round(time.monotonic() - t0, 2), "rss_kb": vm_rss_kb(watch.pid),
                        "cpu_s": cpu_s(watch.pid), **m})
        print(f"{samples[-1]['t_s']:8.1f} s  RSS {samples[-1]['rss_kb'] / 1024:7.1f} MiB  "
              f"cuda {m['cuda_events']}  dropped {m['dropped']}", flush=True)
        time.sleep(max(0.0, a.every - (time.monotonic() - t0) % a.every))
    runner.join()                          # the storm ends with the soak
    time.sleep(1.0)
    final = scrape(port) if watch.poll() is None else {}
    watch_cpu = cpu_s(watch.pid) if watch.poll() is None else None
    if watch.poll() is None:
        os.kill(watch.pid, signal.SIGINT)
    watch.wait(timeout=60)
    keeper.kill()
    keeper.wait()
    warm = [x for x in samples if x["t_s"] >= a.warmup]
    res = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
           "machine": machine(), "minutes": a.minutes, "threads": a.threads, "rate": a.rate,
           "every_s": a.every, "warmup_s": a.warmup, "samples": samples,
           "slope_kb_per_h": slope_kb_per_h(warm) if len(warm) > 2 else None,
           "storm_calls": result.get("total"),
           "watch_cuda_events": final.get("cuda_events"),
           "watch_dropped": final.get("dropped"), "watch_cpu_s": watch_cpu,
           "watch_returncode": watch.returncode,
           "watch_stderr_tail": watch.stderr.read()[-2000:]}
    (out / "soak.json").write_text(json.dumps(res, indent=1) + "\n")
    md = render(res)
    (out / "soak.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
