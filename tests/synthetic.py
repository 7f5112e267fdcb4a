"""A synthetic run file shaped like a recording on an inference host, for benchmarks and tests.

Threads issue back-to-back CUDA driver calls (launches, copies, syncs, allocations) with
realistic durations; off-CPU intervals fall inside syncs (blocked) and at random
(preempted); a client thread connect()s to a few peers; GPU counters are sampled at 10 Hz;
CPU and GPU clock sandwiches are taken every second.  Two injected problems: an OOM chain
(cuMemAlloc_v2 fails three times, then succeeds), and, ``anomaly_s`` before an Xid, launch
latency, preemption and wakeup latency grow while the SM clock drops; after the Xid the
first thread's calls fail with CUDA_ERROR_ILLEGAL_ADDRESS.  Events reach the file in
emission order (a call when it returns), as the recorder writes them.

    info = make_run("run.ca", n_events=200_000, duration_s=20)
    info["counts"]["cuda"], info["t_xid"]
"""
import struct

import numpy as np

from clockalign.store.schema import CUDA_FN_BY_NAME, EVENT_DTYPE, Chunk, ClockDomain, Kind, KIND_NAMES
from clockalign.store.writer import RunWriter

MONO0 = 1_000_000_000_000          # 1000 s after boot
REAL_OFFSET = 1_760_000_000_000_000_000
BOOT_OFFSET = 3_000_000_000        # 3 s of suspend before the run
PID = 4242

# (function, share of calls, median duration ns, lognormal sigma)
CALL_MIX = [
    ("cuLaunchKernel", 0.78, 6_000, 0.5),
    ("cuMemcpyAsync", 0.08, 9_000, 0.6),
    ("cuStreamSynchronize", 0.10, 250_000, 1.0),
    ("cuMemAlloc_v2", 0.02, 40_000, 0.8),
    ("cuMemFree_v2", 0.02, 20_000, 0.6),
]


def _dims(x, y, z):
    return np.uint64(x) | (np.uint64(y) << np.uint64(32)) | (np.uint64(z) << np.uint64(48))


def _sockaddr_in(ip: str, port: int) -> bytes:
    return struct.pack("<H", 2) + struct.pack(">H", port) + bytes(int(p) for p in ip.split("."))


def _sockaddr_in6_loopback(port: int) -> bytes:
    return struct.pack("<H", 10) + struct.pack(">H", port) + b"\0" * 4 + b"\0" * 15 + b"\1"


def _sockaddr_un(path: str) -> bytes:
    return struct.pack("<H", 1) + path.encode() + b"\0"


PEERS = [_sockaddr_in("10.0.0.7", 8000), _sockaddr_in6_loopback(443),
         _sockaddr_un("/run/triton.sock")]


def make_run(path, n_events: int = 200_000, duration_s: float = 20.0, threads: int = 6,
             gpus: int = 2, seed: int = 7, chunk_rows: int = 8192, anomaly_s: float = 2.0,
             truncate: bool = False) -> dict:
    """Write a synthetic run to ``path``; returns what was put in (counts, fault times)."""
    rng = np.random.default_rng(seed)
    dur_ns = int(duration_s * 1e9)
    t_end = MONO0 + dur_ns
    t_xid = MONO0 + int(dur_ns * 0.75)
    t_anom = t_xid - int(anomaly_s * 1e9)
    tids = PID + np.arange(threads)
    parts = []
    n_calls = max(int(n_events * 0.78) // threads, 8)
    n_sched_total = 0

    for ti, tid in enumerate(tids.tolist()):
        share = np.array([m[1] for m in CALL_MIX])
        fn_i = rng.choice(len(CALL_MIX), size=n_calls, p=share / share.sum())
        med = np.array([m[2] for m in CALL_MIX], dtype=float)[fn_i]
        sig = np.array([m[3] for m in CALL_MIX])[fn_i]
        d = (med * np.exp(sig * rng.standard_normal(n_calls))).astype(np.int64) + 500
        gap = rng.exponential(1.0, n_calls)
        # spread the calls over the run: scale the gaps to the time left
        spare = max(dur_ns * 0.98 - d.sum(), dur_ns * 0.1)
        gap = (gap / gap.sum() * spare).astype(np.int64) + 200
        start = MONO0 + 1_000_000 + np.cumsum(np.r_[0, (d + gap)[:-1]])
        # the anomaly: launches get slower before the Xid
        slow = (start >= t_anom) & (start < t_xid)
        d = np.where(slow & (fn_i == 0), d * 4, d)
        start = MONO0 + 1_000_000 + np.cumsum(np.r_[0, (d + gap)[:-1]])
        end = start + d
        gap_after = np.r_[start[1:] - end[:-1], 1_000_000]
        ok = end + 1000 < t_end
        fn_i, start, d, gap_after, slow = fn_i[ok], start[ok], d[ok], gap_after[ok], slow[ok]
        nc = len(start)
        ev = np.zeros(nc, dtype=EVENT_DTYPE)
        ev["ts"] = start
        ev["dur"] = d
        ev["pid"] = PID
        ev["tid"] = tid
        ev["kind"] = Kind.CUDA
        fids = np.array([CUDA_FN_BY_NAME[m[0]] for m in CALL_MIX])[fn_i]
        ev["code"] = fids
        launch = fn_i == 0
        ev["a0"][launch] = 0x7F00_0000_1000 + rng.integers(0, 16, launch.sum()) * 0x40
        ev["a1"][launch] = _dims(108, 1, 1)
        ev["a2"][launch] = _dims(256, 1, 1)
        ev["a3"][launch] = 0
        ev["a4"][launch] = 0x5500_0000 + ti
        cp = fn_i == 1
        ev["a0"][cp] = 0x7E00_0000_0000
        ev["a1"][cp] = 0x5600_0000_0000
        ev["a2"][cp] = rng.integers(1, 1 << 20, cp.sum())
        ev["a3"][cp] = 0x5500_0000 + ti
        ev["a0"][fn_i == 2] = 0x5500_0000 + ti
        al = fn_i == 3
        ev["a0"][al] = 0x7D00_0000_0000 + np.arange(al.sum()) * 0x100000
        ev["a1"][al] = rng.integers(1, 64, al.sum()) << 20
        ev["a0"][fn_i == 4] = 0x7D00_0000_0000
        if ti == 1:                       # sticky error after the Xid
            after = np.flatnonzero(start > t_xid)[:40]
            ev["ret"][after] = 700
        if ti == 2:                       # OOM chain at 40 % of the run
            allocs = np.flatnonzero((fn_i == 3) & (start > MONO0 + int(dur_ns * 0.4)))[:4]
            ev["ret"][allocs[:3]] = 2
        emit = start + d
        parts.append((emit, ev))

        # off-CPU: blocked inside syncs, preempted inside some launches, idle in gaps
        sync = np.flatnonzero(fn_i == 2)
        pre_p = np.where(slow, 0.06, 0.02)
        pre = np.flatnonzero((rng.random(nc) < pre_p) & (fn_i != 2) & (d > 2000))
        idle = np.flatnonzero((rng.random(nc) < 0.15) & (gap_after > 20_000))
        s_ts = np.concatenate([start[sync] + d[sync] // 10, start[pre] + d[pre] // 3,
                               start[idle] + d[idle] + 2_000])
        s_dur = np.concatenate([d[sync] * 8 // 10, d[pre] // 3,
                                (gap_after[idle] - 10_000).clip(1_000)])
        s_code = np.concatenate([np.zeros(len(sync)), np.ones(len(pre)), np.zeros(len(idle))])
        s_state = np.where(s_code == 1, 0, 1)
        wake_slow = np.concatenate([slow[sync], slow[pre], slow[idle]])
        wake = (rng.exponential(4_000, len(s_ts)) * np.where(wake_slow, 5, 1)).astype(np.int64)
        wake = np.minimum(wake, s_dur)
        se = np.zeros(len(s_ts), dtype=EVENT_DTYPE)
        se["ts"] = s_ts
        se["dur"] = s_dur
        se["pid"] = PID
        se["tid"] = tid
        se["kind"] = Kind.SCHED
        se["code"] = s_code
        se["ret"] = s_state
        se["a0"] = wake
        se["a1"] = rng.integers(0, 32, len(s_ts))
        se["a2"] = rng.integers(0, 32, len(s_ts))
        n_sched_total += len(se)
        parts.append((s_ts + s_dur, se))

    # a client thread connect()ing to three peers; two refusals before the first success
    ctid = PID + threads
    n_conn = max(int(n_events * 0.02), 6)
    c_ts = np.sort(rng.integers(MONO0 + 2_000_000, t_end - 50_000_000, n_conn))
    c_ts = c_ts + np.arange(n_conn) * 0         # sequential: one connect at a time
    c_dur = (rng.lognormal(np.log(80_000), 0.7, n_conn)).astype(np.int64)
    c_ts = np.maximum(c_ts, np.r_[0, (c_ts + c_dur)[:-1] + 1000])
    ce = np.zeros(n_conn, dtype=EVENT_DTYPE)
    ce["ts"] = c_ts
    ce["dur"] = c_dur
    ce["pid"] = PID
    ce["tid"] = ctid
    ce["kind"] = Kind.CONNECT
    peer_i = rng.integers(0, len(PEERS), n_conn)
    peer_i[:3] = 0
    ce["ret"][:2] = -111
    ce["a0"] = 7 + peer_i
    data = np.zeros((n_conn, 56), dtype=np.uint8)
    for i, p in enumerate(PEERS):
        data[peer_i == i, :len(p)] = np.frombuffer(p, np.uint8)
        ce["a1"][peer_i == i] = 16 if i == 0 else 28 if i == 1 else len(p)
    ce["data"] = data.view("V56").ravel()
    parts.append((c_ts + c_dur, ce))

    # thread lifecycle, a signal, an Xid
    def instant(ts, kind, tid, ret=0, code=0, a0=0, data=b""):
        e = np.zeros(1, dtype=EVENT_DTYPE)
        e["ts"], e["pid"], e["tid"], e["kind"] = ts, PID, tid, kind
        e["ret"], e["code"], e["a0"] = ret, code, a0
        e["data"] = np.frombuffer(data.ljust(56, b"\0"), dtype="V56")
        parts.append((np.array([ts]), e))

    for tid in list(tids[1:]) + [ctid]:
        instant(MONO0 + 100_000 + int(tid - PID) * 1000, Kind.THREAD_NEW, int(tid), a0=PID,
                data=b"python")
        instant(MONO0 + 200_000 + int(tid - PID) * 1000, Kind.THREAD_NAME, int(tid),
                data=f"worker-{int(tid - PID)}".encode() if tid != ctid else b"http-client")
    instant(t_xid, Kind.XID, 0, ret=13,
            data=b"0000:17:00.0".ljust(16, b"\0") + b"Graphics Exception: ESR 0x404490")
    instant(t_xid + 30_000_000, Kind.SIGNAL, PID, ret=6, a0=PID, data=b"python")
    instant(t_end - 500_000, Kind.THREAD_EXIT, int(ctid), code=0, data=b"http-client")

    emit = np.concatenate([p[0] for p in parts])
    events = np.concatenate([p[1] for p in parts])
    order = np.argsort(emit, kind="stable")
    events = events[order]
    emit = emit[order]

    counts = {KIND_NAMES[int(k)]: int(c) for k, c in zip(*np.unique(events["kind"],
                                                                      return_counts=True))}
    meta = {"tool": "clockalign", "version": "synthetic", "host": "synthetic-host",
            "kernel": "6.1.0-synthetic", "driver": "570.00", "mode": "pid",
            "gpus": [{"index": g, "name": "NVIDIA H200", "pci_bus_id": f"0000:{0x17 + g:02x}:00.0",
                      "uuid": f"GPU-synthetic-{g}"} for g in range(gpus)],
            "targets": [{"pid": PID, "cmdline": ["python", "serve.py"],
                         "libcuda": "/usr/lib/libcuda.so.1"}],
            "synthetic": {"seed": seed, "n_events": n_events, "duration_s": duration_s}}
    w = RunWriter(path, meta, flush_interval=3600)
    w.write_rows(Chunk.THREADS, [{"pid": PID, "tid": int(t), "comm": "python" if t == PID else
                                  f"worker-{int(t - PID)}", "t_ns": MONO0} for t in tids] +
                 [{"pid": PID, "tid": int(ctid), "comm": "http-client", "t_ns": MONO0}])
    w.write_rows(Chunk.CLOCK_INFO, [{"domain": "MONOTONIC", "tick_ns": 1, "method": "reference"},
                                    {"domain": "REALTIME", "tick_ns": 1, "method": "sandwich"},
                                    {"domain": "BOOTTIME", "tick_ns": 1, "method": "sandwich"}] +
                 [{"domain": f"GPU{g}", "tick_ns": 32, "method": "ping-pong", "pings": 16}
                  for g in range(gpus)])

    # clock sandwiches every second: CPU (REALTIME with a 40 µs NTP step at 60 %), GPU
    sec = MONO0 + np.arange(0, dur_ns + 1, 1_000_000_000, dtype=np.int64)
    step = np.where(sec > MONO0 + int(dur_ns * 0.6), 40_000, 0)
    cpu_rows = []
    for dom, off in ((ClockDomain.REALTIME, REAL_OFFSET + step), (ClockDomain.BOOTTIME,
                                                                 BOOT_OFFSET + 0 * step)):
        width = rng.integers(40, 400, len(sec))
        cpu_rows.append({"domain": np.full(len(sec), int(dom), np.uint8), "t0": sec,
                         "remote": sec + width // 2 + off, "t1": sec + width})
    gpu_rows = []
    for g in range(gpus):
        pings = 16
        t0 = np.repeat(sec, pings) + np.tile(np.arange(pings) * 5_000, len(sec))
        rtt = (1_800 + rng.exponential(600, len(t0))).astype(np.int64)
        host_mid = t0 + rtt // 2
        drift = (-2.2e-6 * (host_mid - MONO0)).astype(np.int64)
        remote = host_mid + REAL_OFFSET + 100_000 + g * 7_000 + drift
        remote = remote // 32 * 32
        gpu_rows.append({"gpu": np.full(len(t0), g, np.uint8), "method": np.ones(len(t0), np.uint8),
                         "t0": t0, "remote": remote, "t1": t0 + rtt})

    # GPU counters at 10 Hz, REALTIME-stamped; SM clock drops and power caps in the anomaly
    ts = MONO0 + np.arange(50_000_000, dur_ns, 100_000_000, dtype=np.int64)
    anom = (ts >= t_anom) & (ts < t_xid)
    series = {
        1: np.where(anom, 1410.0, 1980.0) + rng.normal(0, 5, len(ts)).round(),      # sm_clock
        7: np.where(anom, 690.0, 540.0) + rng.normal(0, 15, len(ts)),               # power
        3: np.clip(rng.normal(85, 5, len(ts)), 0, 100).round(),                     # gpu_util
        5: 60e9 + np.cumsum(rng.normal(0, 1e6, len(ts))),                           # mem_used
        9: np.where(anom, 81.0, 62.0) + rng.normal(0, 0.5, len(ts)),                # gpu_temp
        15: np.where(anom, 0x004, 0x000).astype(float),                             # reasons
    }
    cnt = []
    for g in range(gpus):
        for field, val in series.items():
            n = len(ts)
            lat = rng.integers(200_000, 800_000, n)
            cnt.append({"gpu": np.full(n, g, np.uint8), "field": np.full(n, field, np.uint16),
                        "t_real_ns": ts + REAL_OFFSET + np.where(ts > MONO0 + int(dur_ns * 0.6),
                                                                  40_000, 0),
                        "latency_ns": lat, "recv_mono_ns": ts + lat,
                        "value": (val if g == 0 or field == 15 else val * 0.99).astype(np.float64),
                        "window_ns": np.full(n, 100_000_000 if field == 3 else 0, np.int64)})

    # interleave by time: one pass writes events, and each second's side chunks
    t_side = sec
    side_i = 0
    for a in range(0, len(events), chunk_rows):
        chunk = events[a:a + chunk_rows]
        t_chunk = int(emit[min(a + chunk_rows, len(emit)) - 1])
        while side_i < len(t_side) and t_side[side_i] <= t_chunk:
            _write_side(w, cpu_rows, gpu_rows, cnt, sec, ts, side_i)
            side_i += 1
        w.write_columns(Chunk.EVENTS, {name: chunk[name] for name in EVENT_DTYPE.names})
    while side_i < len(t_side):
        _write_side(w, cpu_rows, gpu_rows, cnt, sec, ts, side_i)
        side_i += 1
    if truncate:
        w._f.flush()
        size = w._f.tell()
        w._f.close()
        w.closed = True
        with open(path, "r+b") as f:
            f.truncate(size - 100)
    else:
        w.close({"reason": "synthetic", "counts": counts, "drops": {}, "t_ns": t_end})
    return {"counts": counts, "n_events": int(len(events)), "t_xid": t_xid,
            "t_anomaly": t_anom, "start_ns": MONO0, "end_ns": t_end, "pid": PID,
            "tids": [int(t) for t in tids] + [int(ctid)], "events": events}


def _write_side(w, cpu_rows, gpu_rows, cnt, sec, ts, i):
    lo, hi = sec[i], sec[i] + 1_000_000_000
    for rows, ctype in ((cpu_rows, Chunk.CPU_CLOCK), (gpu_rows, Chunk.GPU_CLOCK)):
        for r in rows:
            sel = (r["t0"] >= lo) & (r["t0"] < hi)
            if sel.any():
                w.write_columns(ctype, {k: v[sel] for k, v in r.items()})
    for r in cnt:
        sel = (r["recv_mono_ns"] >= lo) & (r["recv_mono_ns"] < hi)
        if sel.any():
            w.write_columns(Chunk.COUNTERS, {k: v[sel] for k, v in r.items()})
