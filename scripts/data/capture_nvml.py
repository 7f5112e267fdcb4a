#!/usr/bin/env python3
"""Record raw NVML answers on a GPU host as test data for clockalign's counter code.

Writes, under --out (default tests/data/nvml):

  nvml_capture.json  host/driver facts, GPU inventory, a survey of every NVML item the
                     recorder uses (return codes, per-value timestamps and latencies,
                     nvmlDeviceGetSamples streams, event types), the cost of each call,
                     and the stats of a short real CounterSampler run at 10 ms
  burst_idle.json    raw records of NvmlReader.read() at --interval-s, GPU idle
  burst_load.json    the same while a torch process loads the GPU (matmul, then
                     host<->device copies), when torch is importable

Raw records are exactly what NvmlReader gives the decoder (see
agent/clockalign/capture/gpu/counters/nvml_decode.py), so tests replay them through the
recorder's own decoding.  Run from the repository root on the GPU host:

    python3 scripts/data/capture_nvml.py --out tests/data/nvml
    python3 scripts/data/capture_nvml.py --out /tmp/nvml --gpus 0 --load-s 0
"""
import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from clockalign.capture.gpu.counters import nvml_decode
from clockalign.capture.gpu.counters.nvml import NvmlReader, gpu_inventory, load_pynvml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

FORMAT = "clockalign-nvml-capture"
VERSION = 1
# Every NVML field id worth knowing about on this GPU, including ones the recorder does
# not read yet (clock event reason durations 269-271, power sync balancing, MMA stall).
SURVEY_FIELDS = sorted(set(nvml_decode.FIELD_VALUES) | {1, 2, 91, 92, 93, 187, 188, 189, 191,
                                                          192, 193, 194, 195, 196, 269, 270, 271,
                                                          297, 301, 302})

LOAD_SCRIPT = r"""
import sys, time, torch
dur = float(sys.argv[1]); d = torch.device("cuda:0")
a = torch.randn(8192, 8192, device=d, dtype=torch.bfloat16); b = torch.randn_like(a)
host = torch.empty(256 << 20, dtype=torch.uint8).pin_memory()
dev = torch.empty_like(host, device=d)
torch.cuda.synchronize(); print("ready", time.clock_gettime_ns(time.CLOCK_REALTIME), flush=True)
t_mid = time.monotonic() + dur / 2; t_end = time.monotonic() + dur
while time.monotonic() < t_mid:
    (a @ b); torch.cuda.synchronize()
print("copies", time.clock_gettime_ns(time.CLOCK_REALTIME), flush=True)
while time.monotonic() < t_end:
    dev.copy_(host, non_blocking=True); host.copy_(dev, non_blocking=True); torch.cuda.synchronize()
print("done", time.clock_gettime_ns(time.CLOCK_REALTIME), flush=True)
"""


def now_real():
    return time.clock_gettime_ns(time.CLOCK_REALTIME)


def now_mono():
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def try_call(nv, fn, *args):
    t0 = now_real()
    try:
        value, ret = fn(*args), 0
    except nv.NVMLError as e:
        value, ret = None, e.value
    except Exception as e:             # a binding without this function, a ctypes error
        value, ret = f"{type(e).__name__}: {e}", -1
    return {"t0": t0, "t1": now_real(), "ret": ret, "value": jsonable(value)}


def jsonable(v):
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if isinstance(v, bytes):
        return v.hex()
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if hasattr(v, "_fields_"):
        return {name: jsonable(getattr(v, name)) for name, *_ in v._fields_}
    return repr(v)


def host_facts(nv):
    facts = {"hostname": socket.gethostname(), "platform": platform.platform(),
             "python": sys.version.split()[0], "argv": sys.argv,
             "captured_real_ns": now_real(), "captured_mono_ns": now_mono()}
    for key, fn in (("driver", nv.nvmlSystemGetDriverVersion),
                    ("nvml_version", nv.nvmlSystemGetNVMLVersion),
                    ("cuda_driver_version", nv.nvmlSystemGetCudaDriverVersion)):
        facts[key] = try_call(nv, fn)["value"]
    try:
        from importlib.metadata import version
        facts["nvidia_ml_py"] = version("nvidia-ml-py")
    except Exception as e:
        facts["nvidia_ml_py"] = repr(e)
    return facts


def survey_gpu(nv, reader, gpu):
    """Every item once, with codes and values, and each field value asked alone too."""
    h = reader.handles[gpu]
    out = {"gpu": gpu}
    out["fields_together"] = reader.read_fields(gpu, h, SURVEY_FIELDS)
    out["fields_alone"] = [reader.read_fields(gpu, h, [f]) for f in SURVEY_FIELDS]
    out["calls"] = {what: reader.read_call(gpu, h, what) for what in nvml_decode.CALL_FUNCTIONS}
    streams = {}
    for stype in range(10):
        t0 = now_real()
        try:
            vtype, samples = nv.nvmlDeviceGetSamples(h, stype, 0)
            ret = 0
        except nv.NVMLError as e:
            vtype, samples, ret = 0, [], e.value
        streams[str(stype)] = {"t0": t0, "t1": now_real(), "ret": ret, "value_type": int(vtype),
                               "n": len(samples),
                               "samples": [[int(s.timeStamp), bytes(s.sampleValue)[:8].hex()]
                                           for s in samples[-50:]]}
    out["sample_streams"] = streams
    extra = {}
    for name, fn, args in (
        ("clocks_event_reasons", getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None), ()),
        ("clocks_throttle_reasons", nv.nvmlDeviceGetCurrentClocksThrottleReasons, ()),
        ("supported_clocks_event_reasons",
         getattr(nv, "nvmlDeviceGetSupportedClocksEventReasons", None), ()),
        ("supported_event_types", nv.nvmlDeviceGetSupportedEventTypes, ()),
        ("violation_power", nv.nvmlDeviceGetViolationStatus, (0,)),     # NVML_PERF_POLICY_POWER
        ("violation_thermal", nv.nvmlDeviceGetViolationStatus, (1,)),   # ..._THERMAL
        ("performance_state", nv.nvmlDeviceGetPerformanceState, ()),
        ("power_usage_mw", nv.nvmlDeviceGetPowerUsage, ()),
        ("energy_mj", nv.nvmlDeviceGetTotalEnergyConsumption, ()),
        ("enforced_power_limit_mw", nv.nvmlDeviceGetEnforcedPowerLimit, ()),
        ("ecc_mode", nv.nvmlDeviceGetEccMode, ()),
        ("remapped_rows", nv.nvmlDeviceGetRemappedRows, ()),
        ("retired_pages_pending", nv.nvmlDeviceGetRetiredPagesPendingStatus, ()),
        ("max_clock_sm", nv.nvmlDeviceGetMaxClockInfo, (nv.NVML_CLOCK_SM,)),
        ("max_clock_mem", nv.nvmlDeviceGetMaxClockInfo, (nv.NVML_CLOCK_MEM,)),
        ("architecture", getattr(nv, "nvmlDeviceGetArchitecture", None), ()),
    ):
        extra[name] = try_call(nv, fn, h, *args) if fn else {"ret": -1, "value": "no binding"}
    out["extra"] = extra
    return out


def call_costs(nv, reader, gpu, reps):
    """Wall time of each read in ns (min, median, max over reps), MONOTONIC."""
    h = reader.handles[gpu]
    jobs = {"fields_fast": lambda: reader.read_fields(gpu, h, list(nvml_decode.FAST_FIELD_IDS))}
    for group in nvml_decode.SLOW_FIELD_GROUPS:
        jobs["fields_" + "_".join(map(str, group))] = (
            lambda g=group: reader.read_fields(gpu, h, list(g)))
    for what in nvml_decode.CALL_FUNCTIONS:
        jobs[what] = (lambda w=what: reader.read_call(gpu, h, w))
    for what in nvml_decode.SAMPLE_STREAMS:
        jobs["samples_" + what] = (lambda w=what: reader.read_samples(gpu, h, w))
    out = {}
    for name, job in jobs.items():
        n = 3 if name.startswith("pcie_") else reps          # 20 ms each
        times = []
        for _ in range(n):
            t = time.perf_counter_ns()
            job()
            times.append(time.perf_counter_ns() - t)
        out[name] = {"n": n, "min": min(times), "median": int(statistics.median(times)),
                     "max": max(times)}
    return out


def burst(reader, seconds, interval_s):
    """Raw records of reader.read() at fixed slots, as NvmlBackend would ask them."""
    records, ticks = [], []
    interval = int(interval_s * 1e9)
    base = now_mono()
    k = 0
    while True:
        slot = base + k * interval
        if slot - base > seconds * 1e9:
            break
        now = now_mono()
        if now < slot:
            time.sleep((slot - now) / 1e9)
        start = now_mono()
        recs = reader.read(int(0.3 * interval))
        ticks.append([slot, start, now_mono(), len(recs)])
        records.extend(recs)
        k += 1
    return {"interval_s": interval_s, "ticks": ticks, "records": records}


def load_burst(reader, gpu, seconds, interval_s):
    env = dict(os.environ, CUDA_DEVICE_ORDER="PCI_BUS_ID", CUDA_VISIBLE_DEVICES=str(gpu))
    proc = subprocess.Popen([sys.executable, "-c", LOAD_SCRIPT, str(seconds)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    marks = []
    line = proc.stdout.readline()
    if not line.startswith("ready"):
        proc.kill()
        return {"error": (line + proc.stderr.read())[-2000:]}
    marks.append(line.split())
    reader_thread_out = {}
    t = threading.Thread(target=lambda: reader_thread_out.update(
        burst(reader, seconds + 1.0, interval_s)))
    t.start()
    for line in proc.stdout:
        marks.append(line.split())
    proc.wait()
    t.join()
    reader_thread_out["load_marks"] = [[m[0], int(m[1])] for m in marks if len(m) == 2]
    reader_thread_out["load_gpu"] = gpu
    reader_thread_out["load_stderr_tail"] = proc.stderr.read()[-2000:]
    return reader_thread_out


def sampler_run(gpus, seconds, interval_s):
    """A real CounterSampler into a temporary run file; its stats and what came back."""
    from clockalign.capture.gpu.counters import CounterSampler, open_backend
    from clockalign.store.counter_fields import FIELDS
    from clockalign.store.reader import RunReader
    from clockalign.store.schema import Chunk
    from clockalign.store.writer import RunWriter
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "run.ca")
        backend = open_backend("nvml", gpus=gpus)
        with RunWriter(path, {"capture": "sampler_run"}) as w:
            s = CounterSampler(w, backend, interval_s=interval_s)
            s.start()
            time.sleep(seconds)
            s.stop()
            backend.close()
            stats = s.stats()
        run = RunReader(path)
        cols = run.columns(Chunk.COUNTERS)
        per_field = {}
        for fid in sorted(set(cols["field"].tolist())):
            m = cols["field"] == fid
            lat = cols["latency_ns"][m]
            per_field[FIELDS[fid][0]] = {"n": int(m.sum()), "latency_ns_median": int(
                statistics.median(lat.tolist())), "latency_ns_max": int(lat.max())}
        return {"interval_s": interval_s, "seconds": seconds, "stats": stats,
                "chunks": len(run._index.get(Chunk.COUNTERS, [])),
                "notices": run.rows(Chunk.NOTICES), "gpu_events": run.rows(Chunk.GPU_EVENTS),
                "per_field": per_field}


def write(out_dir, name, obj):
    path = os.path.join(out_dir, name)
    with open(path, "w") as f:
        json.dump(obj, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.path.join(ROOT, "tests", "data", "nvml"))
    p.add_argument("--gpus", default=None, help="comma-separated NVML indices (default: all)")
    p.add_argument("--interval-s", type=float, default=0.02, help="burst sampling interval")
    p.add_argument("--idle-s", type=float, default=3.0)
    p.add_argument("--load-s", type=float, default=4.0, help="0 skips the load burst")
    p.add_argument("--reps", type=int, default=30, help="repetitions per call cost")
    p.add_argument("--sampler-s", type=float, default=2.0, help="0 skips the sampler run")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)

    nv = load_pynvml("NVML")
    gpus = None if args.gpus is None else [int(g) for g in args.gpus.split(",")]
    reader = NvmlReader(nv, gpus)
    capture = {"format": FORMAT, "version": VERSION, "host": host_facts(nv),
               "inventory": gpu_inventory()[0],
               "decoder_fields": {"fast": list(nvml_decode.FAST_FIELD_IDS),
                                  "slow_groups": [list(g) for g in
                                                  nvml_decode.SLOW_FIELD_GROUPS],
                                  "survey": SURVEY_FIELDS}}
    capture["survey"] = [survey_gpu(nv, reader, g) for g in reader.gpus]
    capture["costs"] = {str(g): call_costs(nv, reader, g, args.reps) for g in reader.gpus}
    print("survey and call costs done")

    idle = burst(NvmlReader(nv, reader.gpus), args.idle_s, args.interval_s)
    write(args.out, "burst_idle.json", {"format": FORMAT, "version": VERSION, "kind": "idle",
                                        **idle})
    try:
        import torch  # noqa: F401
        have_torch = True
    except ImportError:
        have_torch = False
    if args.load_s > 0 and have_torch:
        load = load_burst(NvmlReader(nv, reader.gpus), reader.gpus[0], args.load_s,
                          args.interval_s)
        write(args.out, "burst_load.json", {"format": FORMAT, "version": VERSION,
                                            "kind": "load", **load})
    else:
        capture["load_skipped"] = "torch not importable" if not have_torch else "--load-s 0"
    nv.nvmlShutdown()

    if args.sampler_s > 0:
        capture["sampler_run"] = sampler_run(reader.gpus, args.sampler_s, 0.01)
        st = capture["sampler_run"]["stats"]
        print(f"sampler 10 ms for {args.sampler_s} s: {st['samples']} samples, "
              f"{st['missed_deadlines']} missed, max late {st['max_late_ns'] / 1e6:.2f} ms, "
              f"unsupported {st['fields_unsupported']}")
    write(args.out, "nvml_capture.json", capture)


if __name__ == "__main__":
    main()
