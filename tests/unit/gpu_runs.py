"""Test support: a run file with GPU activity whose true times are known.

One thread (TID) launches rounds of kernels (BPF cuLaunchKernel events), a memset and a
copy, then cuStreamSynchronize; CUPTI's records (raw GPU times of a clock with a known
offset and drift) and its launch callbacks carry correlation ids; every 5th round the
thread is blocked 2 ms (sleep) and every 7th preempted 1 ms before it launches, so the GPU
idles while its launching thread is off-CPU.  A second process (PID2) has converted
timestamps and CUPTI clock sandwiches.  GPU clock sandwiches are exact to +-900 ns.

    truth = make_gpu_run(path)   # dict: kernels' true MONOTONIC start/end, gaps, ...
"""
import numpy as np

from clockalign.capture.gpu.gpuwire import WireParser, name_packets, records_packets
from clockalign.store.schema import (CUDA_FN_BY_NAME, EVENT_DTYPE, GPU_REC_DTYPE, Chunk,
                                     GpuKind, Kind)
from clockalign.store.writer import RunWriter

MONO0 = 1_000_000_000_000
GPU_OFF = 123_456_789_000
SKEW_PPM = 5
PID, TID, PID2, TID2 = 4242, 4243, 5151, 5152
GRAPH_ID, GRAPH_EVERY = 3, 4      # the kernels of every 4th round: nodes of CUDA graph 3
UUID = bytes(range(16))
UUID_TEXT = "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"
CUPTI_OFF = 7_000_000          # CUPTI's CPU clock of PID2, ahead of MONOTONIC
CONV_ERR = 3_000               # its conversion error: converted = true + CUPTI_OFF + 3 us
KERNEL_DUR = 20_000
LAUNCH_NS, SYNC_TAIL = 5_000, 10_000
CB_API = 307                   # a cbid, named cuLaunchKernel in GPU_NAMES


def gpu_time(mono):
    m = np.asarray(mono, dtype=np.int64)
    return m + GPU_OFF + (m - MONO0) * SKEW_PPM // 1_000_000


def _meta(host, script):
    return {"tool": "clockalign", "host": host, "clocks": {"MONOTONIC": MONO0},
            "targets": [{"pid": PID, "cmdline": ["python3", script]}], "mode": "spawn"}


def _write_head(w, t_end, rng):
    """The GPU's clock info, the launcher thread, and GPU clock sandwiches up to t_end: a
    burst of 16 pings every 50 ms, read 900 +- 200 ns into a 1.8 us trip."""
    w.write_rows(Chunk.CLOCK_INFO, [{"domain": "GPU0", "ordinal": 0, "tick_ns": 32,
                                     "uuid": UUID_TEXT, "method": "ping-pong"}])
    w.write_rows(Chunk.THREADS, [{"pid": PID, "tid": TID, "comm": "launcher", "t_ns": MONO0}])
    h = np.arange(MONO0, t_end + 100_000_000, 50_000_000, dtype=np.int64)
    t0 = (h[:, None] + np.arange(16)[None, :] * 3_000).ravel()
    mid = t0 + 900 + rng.integers(-200, 200, len(t0))
    w.write_columns(Chunk.GPU_CLOCK, {
        "gpu": np.zeros(len(t0), np.uint8), "method": np.ones(len(t0), np.uint8),
        "t0": t0, "remote": (gpu_time(mid) // 32) * 32, "t1": t0 + 1_800})


def _rec(kind, **kw):
    r = np.zeros(1, dtype=GPU_REC_DTYPE)
    r["kind"] = kind
    for k, v in kw.items():
        r[k] = v
    return r


def _ev(kind, t, dur, pid, tid, code=0, ret=0, a=()):
    e = np.zeros(1, dtype=EVENT_DTYPE)
    e["kind"], e["ts"], e["dur"], e["pid"], e["tid"], e["code"], e["ret"] = \
        kind, t, dur, pid, tid, code, ret
    for j, v in enumerate(a):
        e[f"a{j}"] = v
    return e


def make_gpu_run(path, rounds=40, per_round=4, through_wire=True, entry_only=False):
    """entry_only: launches and memsets recorded at their entry only (--cuda-returns
    blocking: Kind.CUDA_ENTRY, no duration)."""
    rng = np.random.default_rng(23)
    evs, recs, truth_k, gaps = [], [], [], []
    recs.append(_rec(GpuKind.INFO, pid=PID, value=130001, aux=0, flags=1, start=MONO0))
    recs.append(_rec(GpuKind.DEVICE, pid=PID, device=0, aux=1,
                     grid=int.from_bytes(UUID[:8], "little"),
                     block=int.from_bytes(UUID[8:], "little")))
    launch = CUDA_FN_BY_NAME["cuLaunchKernel"]
    sync = CUDA_FN_BY_NAME["cuStreamSynchronize"]
    memset = CUDA_FN_BY_NAME["cuMemsetD8Async"]
    t = MONO0 + 10_000_000
    gpu_free = t
    corr = 0
    for rnd in range(rounds):
        if rnd and rnd % 5 == 0:          # blocked in a sleep before launching
            evs.append(_ev(Kind.SCHED, t, 2_000_000, PID, TID, code=0, ret=1))
            gaps.append((t, t + 2_000_000, "blocked"))
            t += 2_000_000 + 3_000
        elif rnd and rnd % 7 == 0:        # preempted
            evs.append(_ev(Kind.SCHED, t, 1_000_000, PID, TID, code=1, ret=0x100))
            gaps.append((t, t + 1_000_000, "preempted"))
            t += 1_000_000 + 3_000
        ends = []
        for j in range(per_round + 1):
            corr += 1
            is_memset = j == per_round
            evs.append(_ev(Kind.CUDA_ENTRY if entry_only else Kind.CUDA, t,
                           0 if entry_only else LAUNCH_NS, PID, TID,
                           code=memset if is_memset else launch,
                           a=(0x7000, 1 | 1 << 32 | 1 << 48, 1 | 1 << 32 | 1 << 48)))
            recs.append(_rec(GpuKind.API, pid=PID, tid=TID, corr=corr, start=t + 1_000,
                             end=t + LAUNCH_NS - 1_000, aux=CB_API + is_memset,
                             name=CB_API + is_memset))
            start = max(t + 8_000, gpu_free + 1_000)
            dur = 2_000 if is_memset else KERNEL_DUR + int(rng.integers(0, 5_000))
            gs, ge = gpu_time(start), gpu_time(start + dur)
            if is_memset:
                recs.append(_rec(GpuKind.MEMSET, pid=PID, corr=corr, start=gs, end=ge,
                                 value=65536, aux=7, stream=13, flags=1))
            else:
                recs.append(_rec(GpuKind.KERNEL, pid=PID, corr=corr, start=gs, end=ge,
                                 stream=13, flags=1, name=1 + (j % 2),
                                 grid=2 | 1 << 32 | 1 << 48, block=128 | 1 << 32 | 1 << 48,
                                 **({"aux": GRAPH_ID, "value": (1 << 32) + j}
                                    if rnd % GRAPH_EVERY == 0 else {})))
                truth_k.append((start, start + dur, corr))
            gpu_free = start + dur
            ends.append(start + dur)
            t += LAUNCH_NS + 500
        sync_end = max(t, max(ends)) + SYNC_TAIL
        evs.append(_ev(Kind.CUDA, t, sync_end - t, PID, TID, code=sync, a=(0x7000,)))
        t = sync_end + 2_000
    # PID2: converted timestamps, CUPTI clock sandwiches, no BPF events (its callback stamps)
    recs.append(_rec(GpuKind.INFO, pid=PID2, value=130001, aux=1, flags=2, start=MONO0))
    for c in range(6):
        m = MONO0 + c * 100_000_000
        recs.append(_rec(GpuKind.CLOCK, pid=PID2, start=m, value=m + 100 + CUPTI_OFF,
                         end=m + 200, flags=2))
    conv_truth = []
    for i in range(10):
        m = MONO0 + 50_000_000 + i * 40_000_000
        recs.append(_rec(GpuKind.API, pid=PID2, tid=TID2, corr=i + 1, start=m, end=m + 3_000,
                         aux=CB_API, name=CB_API))
        s0 = m + 20_000
        recs.append(_rec(GpuKind.KERNEL, pid=PID2, corr=i + 1, device=0, stream=7, flags=2,
                         start=s0 + CUPTI_OFF + CONV_ERR, end=s0 + 10_000 + CUPTI_OFF + CONV_ERR,
                         name=1))
        conv_truth.append(s0 + CONV_ERR)
    recs.append(_rec(GpuKind.DROPPED, pid=PID, value=3, start=t))
    ev = np.concatenate(evs)
    rec = np.concatenate(recs)
    names = [(PID, 1, 1, "ca_selfstamp"), (PID, 1, 2, "void gemm<128>(float*)" + "_" * 4100),
             (PID, 2, CB_API, "cuLaunchKernel"), (PID, 2, CB_API + 1, "cuMemsetD8Async"),
             (PID2, 1, 1, "conv_kernel"), (PID2, 2, CB_API, "cuLaunchKernel")]
    if through_wire:      # the bytes the C library would write, parsed as the recorder does
        blob = b"".join(records_packets(rec[rec["pid"] == p], p) for p in (PID, PID2))
        blob += b"".join(name_packets(p, s, i, n) for p, s, i, n in names)
        parser = WireParser()
        parts, got = [], []
        for a in range(0, len(blob), 1000):           # reads cut packets anywhere
            r, nm = parser.feed(blob[a:a + 1000])
            parts.append(r)
            got += nm
        rec = np.concatenate(parts)
        names = got
        assert parser.bad_bytes == 0 and parser.leftover == 0
    with RunWriter(path, _meta("test", "x.py")) as w:
        _write_head(w, t, rng)
        w.write_columns(Chunk.EVENTS, {n: ev[n] for n in EVENT_DTYPE.names})
        w.write_columns(Chunk.GPU_ACTIVITY, {n: rec[n] for n in GPU_REC_DTYPE.names})
        w.write_rows(Chunk.GPU_NAMES, [{"pid": p, "space": s, "id": i, "name": n}
                                       for p, s, i, n in names])
        w.close({"reason": "test", "counts": {"cuda": int((ev["kind"] == Kind.CUDA).sum()),
                                              "gpu_kernel": len(truth_k) + 10},
                 "drops": {"cupti_dropped": 3}, "t_ns": t})
    return {"kernels": np.array(truth_k, dtype=np.int64), "gaps": gaps, "rounds": rounds,
            "per_round": per_round, "conv_truth": np.array(conv_truth, dtype=np.int64),
            "events": ev, "end": t}


def make_bulk_gpu_run(path, n: int, chunk: int = 65536, streams: int = 4, seed: int = 5,
                      per_call: int = 1, every_ns: int = 6_000):
    """A run of ``n`` GPU executions (vectorised, for memory and speed benchmarks): one
    thread launches back to back (BPF cuLaunchKernel / cuMemcpyAsync / cuMemsetD8Async
    events 5 us long, one every ``every_ns``), each with its CUPTI callback and raw activity
    record (every 10th a copy, every 20th a memset, the rest kernels of 64 names on
    ``streams`` streams), written ``chunk`` records per GPU_ACTIVITY chunk as the recorder
    does.  With ``per_call`` > 1 each call (a graph launch, say) leads to that many
    executions, 5 us apart, sharing its correlation id.  Returns {"n", "calls", "t_end"}."""
    rng = np.random.default_rng(seed)
    i = np.arange(n, dtype=np.int64)
    ci = i // per_call                       # the call each execution came from
    m = int(ci[-1]) + 1 if n else 0
    c = np.arange(m, dtype=np.int64)
    t = MONO0 + 10_000_000 + c * every_ns
    kind = np.full(n, GpuKind.KERNEL, np.uint16)
    kind[i % 10 == 9] = GpuKind.MEMCPY
    kind[i % 20 == 19] = GpuKind.MEMSET
    fn = np.select([kind == GpuKind.MEMCPY, kind == GpuKind.MEMSET],
                   [CUDA_FN_BY_NAME["cuMemcpyAsync"], CUDA_FN_BY_NAME["cuMemsetD8Async"]],
                   CUDA_FN_BY_NAME["cuLaunchKernel"]).astype(np.uint16)
    start = t[ci] + 8_000 + (i % per_call) * 5_000
    end = start + 1_000 + rng.integers(0, 3_000, n)
    ev = np.zeros(m, dtype=EVENT_DTYPE)
    ev["kind"], ev["ts"], ev["dur"], ev["pid"], ev["tid"], ev["code"] = \
        Kind.CUDA, t, LAUNCH_NS, PID, TID, fn[c * per_call]
    api = np.zeros(m, dtype=GPU_REC_DTYPE)
    api["kind"], api["pid"], api["tid"], api["corr"] = GpuKind.API, PID, TID, c + 1
    api["start"], api["end"], api["aux"] = t + 1_000, t + LAUNCH_NS - 1_000, CB_API
    act = np.zeros(n, dtype=GPU_REC_DTYPE)
    act["kind"], act["flags"], act["pid"], act["corr"] = kind, 1, PID, ci + 1
    act["start"], act["end"] = gpu_time(start), gpu_time(end)
    act["stream"] = 13 + i % streams
    k = kind == GpuKind.KERNEL
    act["name"][k] = 1 + rng.integers(0, 64, int(k.sum()))
    act["grid"][k] = (1 + i[k] % 512) | 1 << 32 | 1 << 48
    act["block"][k] = 128 | 1 << 32 | 1 << 48
    act["shmem"][k] = 48
    act["value"][~k] = 4096 + i[~k] % 1000
    act["aux"][kind == GpuKind.MEMCPY] = 1
    act["aux"][kind == GpuKind.MEMSET] = 7
    head = np.concatenate([
        _rec(GpuKind.INFO, pid=PID, value=130001, aux=0, flags=1, start=MONO0),
        _rec(GpuKind.DEVICE, pid=PID, device=0, aux=1,
             grid=int.from_bytes(UUID[:8], "little"), block=int.from_bytes(UUID[8:], "little"))])
    t_end = int(t[-1]) + 100_000
    with RunWriter(path, _meta("bench", "bench.py")) as w:
        _write_head(w, t_end, rng)
        w.write_columns(Chunk.GPU_ACTIVITY, {f: head[f] for f in GPU_REC_DTYPE.names})
        half = max(1, chunk // (1 + per_call))
        for a in range(0, m, half):          # a chunk: callbacks and the activity they led to
            e = ev[a:a + half]
            w.write_columns(Chunk.EVENTS, {f: e[f] for f in EVENT_DTYPE.names})
            recs = np.concatenate([api[a:a + half],
                                   act[a * per_call:(a + half) * per_call]])
            w.write_columns(Chunk.GPU_ACTIVITY, {f: recs[f] for f in GPU_REC_DTYPE.names})
        w.write_rows(Chunk.GPU_NAMES, [{"pid": PID, "space": 1, "id": j, "name": f"kernel_{j}"}
                                       for j in range(1, 65)]
                     + [{"pid": PID, "space": 2, "id": CB_API, "name": "cuLaunchKernel"}])
        w.close({"reason": "bench", "counts": {"cuda": m, "gpu_kernel": int(k.sum())},
                 "t_ns": t_end})
    return {"n": n, "calls": m, "t_end": t_end}
