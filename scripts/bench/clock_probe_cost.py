#!/usr/bin/env python3
"""What the clock probe costs a co-running GPU workload, probe ON against probe OFF.

A torch bf16 matmul loop runs in a separate process (its own CUDA context, like a real
target) and logs (MONOTONIC ns, matmuls done) after every batch.  This process opens a
ClockProbeThread once (contexts, PTX, tick: a one-time start cost, not measured here),
then alternates fixed intervals OFF, ON, OFF, ON, ... on one timeline.  Each ON interval
is compared with the mean of its OFF neighbours, which cancels slow drift (clocks,
temperature); ``--settle`` seconds after each switch can be left out.

    python scripts/bench/clock_probe_cost.py --seconds 60 --out results/probe_cost
    python scripts/bench/clock_probe_cost.py --seconds 120 --interval 5 --gpu-period 0.1 --out /tmp/pc

Writes DIR/probe_cost.json, DIR/probe_cost.md, DIR/workload.log and DIR/probe_run.ca.
Goal: cost <= 1 %.  The probe itself uses cuda-bindings; torch is imported only by the
workload subprocess.
"""
import argparse
import datetime
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

# The workload (scripts/workloads/matmul_loop.py): one process, one GPU, C = A @ B in bf16,
# synchronised every batch (run by its file's path, so the child needs nothing but torch)
WORKLOADS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "workloads")
sys.path.insert(0, WORKLOADS)
import matmul_loop  # noqa: E402  (WORKLOADS)
import progress_log  # noqa: E402  (WORKLOADS)


class Workload:
    """The matmul loop in a subprocess; ``wait_ready()`` returns once it is warm."""

    def __init__(self, gpu: int, seconds: float, log_path, n: int = 4096, batch: int = 20):
        self.log_path = Path(log_path)
        self.proc = subprocess.Popen(
            [sys.executable, matmul_loop.__file__, str(gpu), str(seconds), str(self.log_path),
             str(n), str(batch)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def wait_ready(self, timeout_s: float = 180.0):
        line = _readline(self.proc, timeout_s)
        if line.strip() != "ready":
            err = self.finish(1.0).get("stderr", "")
            raise SystemExit(f"the workload did not start: {line.strip() or err[-2000:]}")

    def finish(self, timeout_s: float = 30.0) -> dict:
        """Ask it to stop (SIGTERM), wait, return its summary line as a dict."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            out, err = self.proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
        for line in reversed(out.splitlines()):
            if line.startswith("{"):
                d = json.loads(line)
                d["returncode"] = self.proc.returncode
                return d
        return {"returncode": self.proc.returncode, "stderr": err[-4000:]}

    def samples(self):
        """[(t_ns, cumulative matmuls)] from its log."""
        return progress_log.read(self.log_path)


def _readline(proc, timeout_s):
    import selectors
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    if not sel.select(timeout_s):
        return ""
    return proc.stdout.readline()


def machine_info(run_path) -> dict:
    info = {"hostname": socket.gethostname(), "platform": platform.platform(),
            "python": platform.python_version()}
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
        info["cpus"] = os.cpu_count()
    except OSError:
        pass
    try:
        from clockalign.store.reader import RunReader
        from clockalign.store.schema import Chunk
        gpus = [r for r in RunReader(run_path).rows(Chunk.CLOCK_INFO)
                if str(r.get("domain", "")).startswith("GPU")]
        info["gpus"] = [{k: r.get(k) for k in ("domain", "device", "uuid", "pci_bus_id",
                                                "cuda_driver_version", "tick_ns", "cuda_bindings")}
                        for r in gpus]
    except Exception as e:
        info["gpus_error"] = str(e)
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.split()
        info["nvidia_driver"] = out[0] if out else None
    except (OSError, subprocess.SubprocessError):
        info["nvidia_driver"] = None
    return info


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60, help="measured time (default 60)")
    ap.add_argument("--interval", type=float, default=5, help="length of one ON or OFF interval")
    ap.add_argument("--settle", type=float, default=0.0,
                    help="seconds left out after each switch (default 0: it switches at once)")
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--pings", type=int, default=64)
    ap.add_argument("--gpu-period", type=float, default=1.0)
    ap.add_argument("--cpu-period", type=float, default=0.1)
    ap.add_argument("--size", type=int, default=4096, help="matmul size n (n x n x n)")
    ap.add_argument("--batch", type=int, default=20, help="matmuls between synchronisations")
    args = ap.parse_args(argv)

    from clockalign.capture.clocks.clockprobe import ClockProbeThread
    from clockalign.store.writer import RunWriter

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    n_int = max(2, int(round(args.seconds / args.interval)))
    n_int += n_int % 2            # OFF, ON pairs
    started = datetime.datetime.now(datetime.timezone.utc)
    print(f"probe_cost: {n_int} intervals of {args.interval} s, GPU{args.gpu}, "
          f"{args.pings} pings every {args.gpu_period} s", flush=True)

    wl = Workload(args.gpu, n_int * args.interval + 600, out / "workload.log",
                  args.size, args.batch)
    wl.wait_ready()
    run_path = out / "probe_run.ca"
    writer = RunWriter(run_path, {"tool": "scripts/bench/clock_probe_cost.py", "argv": sys.argv,
                                  "host": socket.gethostname()})
    probe = ClockProbeThread(writer, gpus=[args.gpu], cpu_period_s=args.cpu_period,
                             gpu_period_s=args.gpu_period, pings=args.pings)
    probe.start()
    probe.pause(timeout=120)      # returns once the GPU is open (context, module, tick)
    if not probe.stats()["gpu"]:
        print("warning: the probe has no GPU: " + " / ".join(probe.stats()["notices"]),
              flush=True)

    intervals = []
    try:
        for i in range(n_int):
            on = i % 2 == 1
            (probe.resume if on else probe.pause)()
            t_start = time.monotonic_ns()
            time.sleep(args.interval)
            intervals.append({"on": on, "start_ns": t_start, "end_ns": time.monotonic_ns()})
    finally:
        probe.pause()
        probe.stop()
        stats = probe.stats()
        writer.close({"reason": "probe_cost done"})
        wl_info = wl.finish()

    samples = wl.samples()
    settle = int(args.settle * 1e9)
    for iv in intervals:
        iv["rate"] = progress_log.rate(samples, iv["start_ns"] + settle, iv["end_ns"])
    pairs = []
    for i, iv in enumerate(intervals):
        if not iv["on"] or iv["rate"] is None:
            continue
        offs = [intervals[j]["rate"] for j in (i - 1, i + 1)
                if 0 <= j < len(intervals) and intervals[j]["rate"]]
        if offs:
            pairs.append(iv["rate"] / (sum(offs) / len(offs)))
    on_rates = [iv["rate"] for iv in intervals if iv["on"] and iv["rate"]]
    off_rates = [iv["rate"] for iv in intervals if not iv["on"] and iv["rate"]]
    if not pairs:
        raise SystemExit("no usable interval pairs: the workload log is empty or too short")
    costs = [1 - r for r in pairs]
    mean = statistics.fmean(costs)
    sd = statistics.stdev(costs) if len(costs) > 1 else float("nan")
    se = sd / len(costs) ** 0.5 if len(costs) > 1 else float("nan")
    try:
        from scipy.stats import t as student_t
        half = float(student_t.ppf(0.975, len(costs) - 1)) * se
    except Exception:
        half = 2.0 * se
    on_s = sum((iv["end_ns"] - iv["start_ns"]) for iv in intervals if iv["on"]) / 1e9
    bursts = sum(stats["bursts"].values())
    burst_us = _mean(stats["burst_mean_us"])
    result = {
        "date": started.isoformat(timespec="seconds"),
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
        "machine": machine_info(run_path),
        "workload": dict(wl_info, size=args.size, batch=args.batch),
        "probe": {"pings": args.pings, "gpu_period_s": args.gpu_period,
                  "cpu_period_s": args.cpu_period, "gpu": args.gpu,
                  "stats": stats,
                  "bursts_per_s_on": bursts / on_s if on_s else None,
                  "burst_mean_us": burst_us,
                  "host_duty_pct": 100 * bursts * burst_us / 1e6 / on_s if on_s else None},
        "intervals": intervals, "settle_s": args.settle, "interval_s": args.interval,
        "matmuls_per_s_on": on_rates, "matmuls_per_s_off": off_rates,
        "on_over_off_per_pair": pairs,
        "cost_pct": {"mean": 100 * mean, "sd": 100 * sd, "ci95_half": 100 * half,
                     "min": 100 * min(costs), "max": 100 * max(costs), "n_pairs": len(costs)},
        "ratio_on_off_means": statistics.fmean(on_rates) / statistics.fmean(off_rates),
        "goal_pct": 1.0,
        "meets_goal": mean + half <= 0.01 if half == half else mean <= 0.01,
    }
    (out / "probe_cost.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "probe_cost.md").write_text(render_md(result))
    print(render_md(result), flush=True)
    return 0


def _mean(d: dict) -> float:
    return statistics.fmean(d.values()) if d else 0.0


def render_md(r: dict) -> str:
    c = r["cost_pct"]
    m = r["machine"]
    gpus = ", ".join(f"{g.get('domain')} {g.get('device')}" for g in m.get("gpus", [])) \
        or "none opened"
    gpus += f" (NVIDIA driver {m.get('nvidia_driver')})"
    p = r["probe"]
    lines = [
        "# Clock-probe cost to a co-running GPU workload",
        "",
        f"- date: {r['date']}",
        f"- command: `{r['command']}`",
        f"- machine: {m.get('hostname')}, {m.get('cpu', '?')} x{m.get('cpus', '?')}, "
        f"{m.get('platform')}, Python {m.get('python')}",
        f"- GPU: {gpus}",
        f"- workload: separate process, torch {r['workload'].get('torch', '?')}, "
        f"bf16 {r['workload']['size']}^3 matmul, sync every {r['workload']['batch']}",
        f"- probe: {p['pings']} ping-pong pings every {p['gpu_period_s']} s on GPU{p['gpu']}, "
        f"CPU clocks every {p['cpu_period_s']} s; method {p['stats']['method']}; "
        f"mean burst {p['burst_mean_us']:.0f} us on the host, of which "
        f"{_mean(p['stats']['start_wait_mean_us']):.0f} us waiting for the kernel to start; "
        f"probe thread CPU {p['stats']['cpu_time_s']:.2f} s; failures {p['stats']['failures']}",
        f"- schedule: {len(r['intervals'])} intervals of {r['interval_s']} s alternating "
        f"OFF/ON, first {r['settle_s']} s of each left out; each ON compared with the mean "
        "of its OFF neighbours",
        "",
        "| | value |",
        "|---|---|",
        f"| matmuls/s OFF (mean of {len(r['matmuls_per_s_off'])}) | "
        f"{statistics.fmean(r['matmuls_per_s_off']):.1f} |",
        f"| matmuls/s ON (mean of {len(r['matmuls_per_s_on'])}) | "
        f"{statistics.fmean(r['matmuls_per_s_on']):.1f} |",
        f"| ON/OFF ratio of means | {r['ratio_on_off_means']:.5f} |",
        f"| cost per pair, mean ± 95% CI | {c['mean']:+.3f} % ± {c['ci95_half']:.3f} % "
        f"(n = {c['n_pairs']}) |",
        f"| cost per pair, sd / min / max | {c['sd']:.3f} % / {c['min']:+.3f} % / "
        f"{c['max']:+.3f} % |",
        f"| goal | <= {r['goal_pct']} %: {'met' if r['meets_goal'] else 'NOT met'} |",
        "",
        "A negative cost means ON ran faster than its OFF neighbours: noise.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
