#!/usr/bin/env python3
"""Regenerate the synthetic run files of tests/data/synthetic/ (used by tests/unit/test_timeline*
and test_faults*).  Deterministic: the same bytes every time.

    .venv/bin/python scripts/data/make_test_runs.py            # writes tests/data/synthetic/*.ca
    .venv/bin/python scripts/data/make_test_runs.py --out DIR  # somewhere else (to compare)

faults.ca     one target (pid 4242, threads 4242 "python" and 4250 "pt_worker") and a second
              one (pid 5000) over 1.2 s from T0 = 5000 s MONOTONIC, no clock samples:
                23 CUDA calls: 9 warm-up launches, 1 cuMemAlloc_v2 ok, 1 cuStreamSynchronize ok,
                  OOM at +100 ms (cuMemAlloc_v2 -> 2, 50 us), failed retry at +101 ms,
                  launch ok at +102 ms, retry ok at +150 ms (100 us), 2 launches ok,
                  ILLEGAL_ADDRESS at +500 ms (cuCtxSynchronize, 2 ms), then 5 sticky 700s
                  (+503..+507 ms, one of them on thread 4250);
                connect(): EINPROGRESS to 10.0.0.7:443 at +250 ms (not a fault),
                  ECONNREFUSED to 127.0.0.1:8000 at +300 ms and +350 ms, success at +400 ms;
                Xid 31 by tracepoint at +499.5 ms (GPU 0000:18:00.0, pid=4242), the same Xid
                  from NVML at +799.5 ms (unc 50 us); Xid 43 from NVML only at +1000 ms;
                clock_event_reasons of GPU 0 every 100 ms: gpu_idle until +600 ms,
                  sw_power_cap from +700 ms to +900 ms, clear from +1000 ms; sm_clock too;
                  t_real_ns = t_mono + REAL_OFFSET, latency 20 us, received 30 us later;
                pid 5000 killed by SIGKILL from pid 1 at +800 ms (group dead at +800.2 ms);
                pid 4242 exit_group(1) at +1100 ms, group dead at +1100.5 ms.
faults_truncated.ca   faults.ca cut in the middle of its last chunk (no trailer).
aligned.ca    faults.ca's counters plus CPU_CLOCK REALTIME sandwiches (±400 ns around
              REAL_OFFSET), for the real clockalign.align.fit_run.
"""
import argparse
import os
import struct

import numpy as np

from clockalign.store.counter_fields import FIELD_BY_NAME
from clockalign.store.schema import (CUDA_FN_BY_NAME, EVENT_DTYPE, Chunk,
                                     ClockDomain, Kind)
from clockalign.store.writer import RunWriter

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "data", "synthetic")
# run-file format 1, as committed: the one real-data input of the reader's format-1 path
# (tests/unit/test_fuzz_runfile.py rewrites it in format 2 itself)
FORMAT = 1
T0 = 5_000_000_000_000
MS = 1_000_000
US = 1_000
REAL_OFFSET = 1_700_000_000_000_000_000 - T0
PID, WORKER, OTHER = 4242, 4250, 5000
META = {
    "host": "synthetic", "kernel": "6.1.0-test", "driver": "570.00",
    "gpus": [{"index": 0, "name": "NVIDIA H200", "pci_bus_id": "00000000:18:00.0"}],
    "targets": [{"pid": PID, "cmdline": ["python", "serve.py"], "libcuda": None},
                {"pid": OTHER, "cmdline": ["server"], "libcuda": None}],
    "clocks": {"MONOTONIC": T0, "REALTIME": T0 + REAL_OFFSET}, "synthetic": True,
}


def fn(name):
    return CUDA_FN_BY_NAME[name]


def cuda_calls():
    """(t_ms, tid, function, ret, dur_us) for the 23 CUDA calls of faults.ca."""
    calls = [(10 + i, PID, "cuLaunchKernel", 0, 5) for i in range(9)]
    calls += [
        (20, PID, "cuMemAlloc_v2", 0, 40),
        (21, PID, "cuStreamSynchronize", 0, 300),
        (100, PID, "cuMemAlloc_v2", 2, 50),          # OOM
        (101, PID, "cuMemAlloc_v2", 2, 40),          # failed retry
        (102, PID, "cuLaunchKernel", 0, 5),          # healthy again
        (150, PID, "cuMemAlloc_v2", 0, 100),         # recovery
        (200, PID, "cuLaunchKernel", 0, 5),
        (201, WORKER, "cuLaunchKernel", 0, 5),
        (500, PID, "cuCtxSynchronize", 700, 2000),   # ILLEGAL_ADDRESS
        (503, PID, "cuLaunchKernel", 700, 5),
        (504, PID, "cuMemAlloc_v2", 700, 5),
        (505, PID, "cuCtxSynchronize", 700, 5),
        (506, WORKER, "cuMemFree_v2", 700, 5),
        (507, PID, "cuStreamSynchronize", 700, 5),
    ]
    assert len(calls) == 23
    return calls


def sockaddr_in(ip, port):
    a = bytes(int(x) for x in ip.split("."))
    return struct.pack("<H", 2) + struct.pack(">H", port) + a + b"\0" * 8


def ev(kind, t_ns, pid, tid, dur=0, code=0, ret=0, a=(0, 0, 0, 0, 0), data=b""):
    e = np.zeros(1, dtype=EVENT_DTYPE)
    e["ts"], e["dur"], e["pid"], e["tid"] = t_ns, dur, pid, tid
    e["kind"], e["code"], e["ret"] = kind, code, ret
    for i, v in enumerate(a):
        e[f"a{i}"] = v
    e["data"] = np.void(data.ljust(56, b"\0")[:56])
    return e


def fault_events():
    out = [ev(Kind.THREAD_NEW, T0 + 1 * MS, PID, WORKER, a=(PID,), data=b"python"),
           ev(Kind.THREAD_NAME, T0 + 5 * MS, PID, WORKER, data=b"pt_worker")]
    for t, tid, name, ret, dur in cuda_calls():
        out.append(ev(Kind.CUDA, T0 + t * MS, PID, tid, dur=dur * US, code=fn(name), ret=ret))
    conn = [(250, "10.0.0.7", 443, -115, 8), (300, "127.0.0.1", 8000, -111, 20),
            (350, "127.0.0.1", 8000, -111, 20), (400, "127.0.0.1", 8000, 0, 30)]
    for t, ip, port, ret, dur in conn:
        out.append(ev(Kind.CONNECT, T0 + t * MS, PID, WORKER, dur=dur * US, ret=ret,
                      a=(7, 16), data=sockaddr_in(ip, port)))
    xid = b"0000:18:00.0".ljust(16, b"\0") + b"pid=4242, name=python, Ch 00000008, intr"[:39]
    out.append(ev(Kind.XID, T0 + 499_500_000, 0, 0, ret=31, data=xid))
    out.append(ev(Kind.SIGNAL, T0 + 800 * MS, OTHER, OTHER, ret=9, code=0, a=(1, 0),
                  data=b"systemd"))
    out.append(ev(Kind.THREAD_EXIT, T0 + 800_200_000, OTHER, OTHER, code=1, data=b"server"))
    out.append(ev(Kind.SIGNAL, T0 + 801 * MS, PID, PID, ret=17, code=0, a=(OTHER, 0),
                  data=b"server"))
    out.append(ev(Kind.PROC_EXIT, T0 + 1100 * MS, PID, PID, ret=1))
    out.append(ev(Kind.THREAD_EXIT, T0 + 1100_400_000, PID, WORKER, code=0, data=b"pt_worker"))
    out.append(ev(Kind.THREAD_EXIT, T0 + 1100_500_000, PID, PID, code=1, data=b"python"))
    return np.concatenate(out)


def counter_columns():
    t_mono = T0 + np.arange(0, 1201, 100, dtype=np.int64) * MS
    reasons = np.where(t_mono < T0 + 700 * MS, 0x1,
                       np.where(t_mono < T0 + 1000 * MS, 0x4, 0x0)).astype(np.float64)
    sm = np.where(t_mono < T0 + 700 * MS, 1980.0, 1500.0)
    n = len(t_mono)
    rows = {
        "gpu": np.zeros(2 * n, dtype=np.uint8),
        "field": np.concatenate([np.full(n, FIELD_BY_NAME["clock_event_reasons"]),
                                 np.full(n, FIELD_BY_NAME["sm_clock"])]).astype("<u2"),
        "t_real_ns": np.concatenate([t_mono, t_mono]) + REAL_OFFSET,
        "latency_ns": np.full(2 * n, 20 * US, dtype=np.int64),
        "recv_mono_ns": np.concatenate([t_mono, t_mono]) + 30 * US,
        "value": np.concatenate([reasons, sm]),
        "window_ns": np.zeros(2 * n, dtype=np.int64),
    }
    return rows


def gpu_event_rows():
    rows = []
    for t_ns, code in ((T0 + 799_500_000, 31), (T0 + 1000 * MS, 43)):
        rows.append({"source": "nvml", "gpu": 0, "type": "xid", "code": code,
                     "t_mono_ns": t_ns, "t_real_ns": t_ns + REAL_OFFSET, "unc_ns": 50 * US})
    return rows


def write_events(w, evs, order):
    for part in np.array_split(evs[order], 3):
        w.write_columns(Chunk.EVENTS, {n: part[n] for n in EVENT_DTYPE.names})


def make_faults(path):
    evs = fault_events()
    rng = np.random.default_rng(23)
    order = rng.permutation(len(evs))    # the recorder's chunks are not globally sorted
    with RunWriter(path, META, format_version=FORMAT) as w:
        w.write_rows(Chunk.THREADS, [{"pid": PID, "tid": PID, "comm": "python", "t_ns": T0},
                                     {"pid": OTHER, "tid": OTHER, "comm": "server", "t_ns": T0}])
        write_events(w, evs, order)
        w.write_columns(Chunk.COUNTERS, counter_columns())
        w.write_rows(Chunk.GPU_EVENTS, gpu_event_rows())
        w.write_rows(Chunk.NOTICES, [{"t_ns": T0, "level": "info", "text": "synthetic run"}])
        w.close({"reason": "target exited", "t_ns": T0 + 1200 * MS})


def make_truncated(src, path):
    with open(src, "rb") as f:
        data = f.read()
    end_chunk = struct.unpack_from("<Q", data, len(data) - 8)[0]   # the trailer chunk
    # cut inside the chunk before the trailer (NOTICES): every fault source survives
    with open(path, "wb") as f:
        f.write(data[:end_chunk - 20])


def make_aligned(path):
    t = T0 - 100 * MS + np.arange(0, 1500, dtype=np.int64) * MS
    jitter = (np.arange(len(t)) * 7919) % 300
    with RunWriter(path, dict(META, targets=[]), format_version=FORMAT) as w:
        w.write_columns(Chunk.CPU_CLOCK, {
            "domain": np.full(len(t), int(ClockDomain.REALTIME), dtype=np.uint8),
            "t0": t - 400 - jitter, "remote": t + REAL_OFFSET, "t1": t + 400 + jitter})
        w.write_columns(Chunk.COUNTERS, counter_columns())
        w.close({"reason": "closed", "t_ns": T0 + 1400 * MS})


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=OUT, help=f"directory for the run files (default {OUT})")
    out = ap.parse_args().out
    os.makedirs(out, exist_ok=True)
    faults = os.path.join(out, "faults.ca")
    make_faults(faults)
    make_truncated(faults, os.path.join(out, "faults_truncated.ca"))
    make_aligned(os.path.join(out, "aligned.ca"))
    for name in ("faults.ca", "faults_truncated.ca", "aligned.ca"):
        print(os.path.join(out, name), os.path.getsize(os.path.join(out, name)))


if __name__ == "__main__":
    main()
