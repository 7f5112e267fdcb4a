"""watch/aggregate.py and watch/metrics.py against batches with known contents.

Each batch is built as the recorder would hand it over (EVENT_DTYPE columns, COUNTERS
columns, GPU_CLOCK sandwiches, STATUS rows); the totals and the /metrics text are checked
number by number.
"""
import socket
import struct
import threading
import urllib.request

import numpy as np
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from clockalign.errors import ClockalignError
from clockalign.store import cuda_api
from clockalign.store.counter_fields import COUNTER_COLUMNS, FIELD_BY_NAME
from clockalign.store.schema import EVENT_DTYPE, Chunk, Kind, TcpCode
from clockalign.watch import aggregate
from clockalign.watch.aggregate import Aggregator
from clockalign.watch.histogram import CUDA_CALL_BOUNDS_NS, Histogram
from clockalign.watch.metrics import build_registry, parse_listen, serve

FN = {f.symbol: f.id for f in cuda_api.FUNCTIONS.values()}
GIB = 1 << 30
ONE_GPU = {"gpus": [{"index": 0, "name": "NVIDIA H200", "uuid": "GPU-abc",
                     "pci_bus_id": "00000000:19:00.0"}], "cflags": ["-DCA_XID"]}


def events(*rows):
    a = np.zeros(len(rows), dtype=EVENT_DTYPE)
    for i, r in enumerate(rows):
        for k, v in r.items():
            a[i][k] = v
    return {name: a[name] for name in EVENT_DTYPE.names}


def cuda(fn, pid=100, ret=0, dur=1000, ts=10**12, **args):
    f = cuda_api.BY_SYMBOL[fn]
    row = {"kind": Kind.CUDA, "pid": pid, "tid": pid, "code": f.id, "ret": ret, "dur": dur,
           "ts": ts}
    for name, v in args.items():
        row[f"a{f.slot(name)}"] = v
    return row


def sockaddr(ip, port):
    return struct.pack("<H", socket.AF_INET) + struct.pack(">H", port) + socket.inet_aton(ip)


def counters(rows):
    cols = {k: np.array([r.get(k, 0) for r in rows], dtype=np.dtype(dt))
            for k, dt in COUNTER_COLUMNS.items()}
    return cols


def free_sample(t_ns, free_bytes, gpu=0, latency=1000):
    return {"gpu": gpu, "field": FIELD_BY_NAME["mem_free"], "recv_mono_ns": t_ns,
            "latency_ns": latency, "value": float(free_bytes)}


def scrape(agg):
    reg, _ = build_registry(agg)
    text = generate_latest(reg).decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out, text


def test_cuda_counts_results_and_duration_buckets():
    agg = Aggregator()
    agg.open({"gpus": [], "cflags": []})
    agg.write_columns(Chunk.EVENTS, events(
        *[cuda("cuLaunchKernel", dur=3000) for _ in range(12)],
        *[cuda("cuLaunchKernel", dur=2_000_000) for _ in range(11)],
        cuda("cuMemAlloc_v2", ret=2, bytes=2 * GIB), cuda("cuMemAlloc_v2", ret=0, bytes=4096),
        cuda("cuModuleLoadData", dur=150_000_000), cuda("cuModuleLoadData", ret=218, dur=10**6),
        cuda("cuLaunchKernel", pid=200, ret=700)))
    m, _ = scrape(agg)
    calls = lambda fn, pid, res: m[("clockalign_cuda_calls_total",   # noqa: E731
                                    (("function", fn), ("pid", pid), ("result", res)))]
    assert calls("cuLaunchKernel", "100", "CUDA_SUCCESS") == 23
    assert calls("cuLaunchKernel", "200", "CUDA_ERROR_ILLEGAL_ADDRESS") == 1
    assert calls("cuMemAlloc_v2", "100", "CUDA_ERROR_OUT_OF_MEMORY") == 1
    assert calls("cuModuleLoadData", "100", "CUDA_ERROR_INVALID_PTX") == 1
    b = lambda le: m[("clockalign_cuda_call_duration_seconds_bucket",   # noqa: E731
                      (("function", "cuLaunchKernel"), ("le", le)))]
    # (the pid 200 call took 1 µs)
    assert b("1e-06") == 1 and b("5e-06") == 13 and b("0.001") == 13 and b("0.0025") == 24
    assert b("+Inf") == 24
    assert m[("clockalign_cuda_call_duration_seconds_count",
              (("function", "cuLaunchKernel"),))] == 24
    assert m[("clockalign_cuda_call_duration_seconds_sum", (("function", "cuLaunchKernel"),))] \
        == pytest.approx((12 * 3000 + 11 * 2_000_000 + 1000) / 1e9)
    assert m[("clockalign_alloc_failures_total",
              (("function", "cuMemAlloc_v2"), ("pid", "100")))] == 1
    assert m[("clockalign_module_load_duration_seconds_count", ())] == 2
    assert m[("clockalign_module_load_duration_seconds_bucket", (("le", "0.25"),))] == 2
    assert m[("clockalign_module_load_duration_seconds_bucket", (("le", "0.1"),))] == 1
    assert m[("clockalign_events_total", (("kind", "cuda"),))] == 28
    # no GPU: a refused allocation cannot be judged, and says so
    assert m[("clockalign_fragmentation_unjudged_total", (("pid", "100"), ("reason", "no GPU")))] \
        == 1
    assert not any(k[0] == "clockalign_fragmentation_failures_total" for k in m)


def test_histogram_bounds_are_inclusive():
    h = Histogram(CUDA_CALL_BOUNDS_NS)
    h.observe([1000, 1001, 10**10, 10**10 + 1])
    cum = dict(h.cumulative())
    assert cum[1e-6] == 1 and cum[2.5e-6] == 2 and cum[10.0] == 3 and cum[float("inf")] == 4


def test_offcpu_inside_cuda_calls_and_wakeup_latency():
    agg = Aggregator()
    agg.open({})
    sched = lambda dur, preempted, in_cuda, wake=0: {   # noqa: E731
        "kind": Kind.SCHED, "pid": 100, "tid": 101, "dur": dur, "code": preempted,
        "a0": wake, "a3": in_cuda}
    agg.write_columns(Chunk.EVENTS, events(
        sched(3_000_000, 1, FN["cuLaunchKernel"]), sched(2_000_000, 1, FN["cuMemcpyAsync"]),
        sched(7_000_000, 0, FN["cuStreamSynchronize"], wake=4000),
        sched(50_000_000, 0, 0, wake=2_000_000), sched(9_000_000, 1, 0)))
    m, _ = scrape(agg)
    assert m[("clockalign_offcpu_in_cuda_seconds_total",
              (("pid", "100"), ("state", "preempted")))] == pytest.approx(0.005)
    assert m[("clockalign_offcpu_in_cuda_seconds_total",
              (("pid", "100"), ("state", "blocked")))] == pytest.approx(0.007)
    assert m[("clockalign_wakeup_latency_seconds_count", ())] == 2
    assert m[("clockalign_wakeup_latency_seconds_bucket", (("le", "0.005"),))] == 2
    assert m[("clockalign_wakeup_latency_seconds_bucket", (("le", "0.001"),))] == 1


def test_connect_peers_results_and_tcp():
    agg = Aggregator()
    agg.open({})
    conn = lambda ret, port, dur=50_000: {   # noqa: E731
        "kind": Kind.CONNECT, "pid": 100, "ret": ret, "dur": dur, "a1": 16,
        "data": sockaddr("10.0.0.7", port).ljust(56, b"\0")}
    tcp = lambda code: {"kind": Kind.TCP, "pid": 100, "code": code}   # noqa: E731
    agg.write_columns(Chunk.EVENTS, events(
        conn(0, 8001), conn(-111, 8001), conn(-111, 8001), conn(-115, 9000),
        tcp(TcpCode.RESET_RECEIVED), tcp(TcpCode.RESET_RECEIVED), tcp(TcpCode.RESET_SENT),
        *[tcp(TcpCode.RETRANSMIT)] * 5))
    m, _ = scrape(agg)
    c = lambda peer, res: m[("clockalign_connect_total",   # noqa: E731
                             (("peer", peer), ("pid", "100"), ("result", res)))]
    assert c("10.0.0.7:8001", "ok") == 1 and c("10.0.0.7:8001", "ECONNREFUSED") == 2
    assert c("10.0.0.7:9000", "EINPROGRESS") == 1
    assert m[("clockalign_connect_duration_seconds_count", (("peer", "10.0.0.7:8001"),))] == 3
    assert m[("clockalign_tcp_resets_total", (("direction", "received"), ("pid", "100")))] == 2
    assert m[("clockalign_tcp_resets_total", (("direction", "sent"), ("pid", "100")))] == 1
    assert m[("clockalign_tcp_retransmits_total", (("pid", "100"),))] == 5


def test_a_known_probe_failing_is_no_connect_error():
    """glibc's nscd probe (timeline/benign.py) counts as known_probe, which the connect
    error alert leaves out; a unix socket no rule knows keeps its errno."""
    agg = Aggregator()
    agg.open({})
    unix = lambda path: {"kind": Kind.CONNECT, "pid": 100, "ret": -2, "dur": 9000,  # noqa: E731
                         "a1": 110, "data": (struct.pack("<H", socket.AF_UNIX)
                                             + path.encode()).ljust(56, b"\0")}
    agg.write_columns(Chunk.EVENTS, events(unix("/var/run/nscd/socket"),
                                           unix("/var/run/nscd/socket"),
                                           unix("/run/infer.sock")))
    m, _ = scrape(agg)
    c = lambda peer, res: m.get(("clockalign_connect_total",   # noqa: E731
                                 (("peer", peer), ("pid", "100"), ("result", res))))
    assert c("unix:/var/run/nscd/socket", "known_probe") == 2
    assert c("unix:/var/run/nscd/socket", "ENOENT") is None
    assert c("unix:/run/infer.sock", "ENOENT") == 1


def test_fragmentation_judged_from_free_memory_around_the_call():
    agg = Aggregator()
    agg.open(ONE_GPU)
    t = 10**12
    agg.write_columns(Chunk.COUNTERS, counters([free_sample(t - 50_000_000, 40 * GIB)]))
    # refused 1 GiB with 40 GiB free before: waits for the sample after the call
    agg.write_columns(Chunk.EVENTS, events(
        cuda("cuMemAlloc_v2", ret=2, bytes=GIB, ts=t, dur=20_000),
        cuda("cuMemAlloc_v2", ret=2, bytes=80 * GIB, ts=t + 1000, dur=20_000),    # truly OOM
        cuda("cuMemAllocAsync", ret=1, bytes=GIB, ts=t + 2000, dur=20_000)))      # not OOM
    assert agg.snapshot()["fragmentation"] == {}
    assert len(agg._pending) == 2
    # a sample whose taking began before the calls ended does not count as "after"
    agg.write_columns(Chunk.COUNTERS, counters([free_sample(t + 21_000, 40 * GIB,
                                                            latency=10_000)]))
    assert len(agg._pending) == 2
    agg.write_columns(Chunk.COUNTERS, counters([free_sample(t + 100_000_000, 39 * GIB)]))
    snap = agg.snapshot()
    assert snap["fragmentation"] == {("100", "0"): 1}
    assert len(agg._pending) == 0
    assert snap["alloc_failures"] == {("100", "cuMemAlloc_v2"): 2, ("100", "cuMemAllocAsync"): 1}
    m, text = scrape(agg)
    assert m[("clockalign_fragmentation_failures_total", (("gpu", "0"), ("pid", "100")))] == 1
    assert "stays 0 on a host with no GPU" in text
    assert m[("DCGM_FI_DEV_FB_FREE", (("UUID", "GPU-abc"), ("device", "nvidia0"), ("gpu", "0"),
                                      ("modelName", "NVIDIA H200")))] == 39 * 1024


def test_fragmentation_needs_a_sample_before_and_caps_waiting_failures(monkeypatch):
    agg = Aggregator()
    agg.open(ONE_GPU)
    t = 10**12
    agg.write_columns(Chunk.EVENTS, events(cuda("cuMemCreate", ret=2, bytes=GIB, device=0,
                                                ts=t, dur=10)))
    agg.write_columns(Chunk.COUNTERS, counters([free_sample(t + 10**6, 40 * GIB)]))
    snap = agg.snapshot()
    assert snap["fragmentation"] == {}
    assert snap["fragmentation_unjudged"] == {("100", "no sample before"): 1}
    # no sample after within 5 s of later calls (counters off): not judged, said so
    agg.write_columns(Chunk.EVENTS, events(cuda("cuMemAlloc_v2", ret=2, bytes=GIB, ts=t + 2 * 10**9)))
    agg.write_columns(Chunk.EVENTS, events(cuda("cuLaunchKernel", ts=t + 8 * 10**9)))
    assert agg.snapshot()["fragmentation_unjudged"][("100", "no sample after")] == 1
    assert not agg._pending
    monkeypatch.setattr(aggregate, "MAX_PENDING", 3)
    agg.write_columns(Chunk.EVENTS, events(*[cuda("cuMemAlloc_v2", ret=2, bytes=GIB,
                                                  ts=t + 9 * 10**9 + i, dur=10)
                                             for i in range(5)]))
    assert len(agg._pending) == 3
    assert agg.snapshot()["dropped"]["fragmentation_pending"] == 2


def test_several_gpus_device_unknown():
    agg = Aggregator()
    agg.open({"gpus": [{"index": 0}, {"index": 1}]})
    agg.write_columns(Chunk.EVENTS, events(cuda("cuMemAlloc_v2", ret=2, bytes=GIB)))
    assert agg.snapshot()["fragmentation_unjudged"] == {("100", "device unknown"): 1}


def test_xids_drops_gauges_and_reasons():
    agg = Aggregator()
    agg.open(ONE_GPU)
    xid = {"kind": Kind.XID, "ret": 79, "data": b"0000:19:00".ljust(56, b"\0")}
    agg.write_columns(Chunk.EVENTS, events(xid, xid, {**xid, "ret": 13}))
    agg.write_rows(Chunk.GPU_EVENTS, [{"type": "xid", "gpu": 0, "code": 79}])   # BPF has them
    agg.write_rows(Chunk.STATUS, [{"t_ns": 1, "drops": {"cuda": 4, "state_map_full": 1}}])
    agg.write_columns(Chunk.COUNTERS, counters([
        {"gpu": 0, "field": FIELD_BY_NAME["sm_clock"], "value": 1980.0, "recv_mono_ns": 1},
        {"gpu": 0, "field": FIELD_BY_NAME["clock_event_reasons"], "value": float(0x20 | 0x1),
         "recv_mono_ns": 1},
        {"gpu": 0, "field": FIELD_BY_NAME["power_avg"], "value": 350.0, "recv_mono_ns": 1}]))
    m, _ = scrape(agg)
    assert m[("clockalign_xid_total", (("code", "79"), ("gpu", "0")))] == 2
    assert m[("clockalign_xid_total", (("code", "13"), ("gpu", "0")))] == 1
    assert m[("clockalign_events_dropped_total", (("kind", "cuda"),))] == 4
    assert m[("clockalign_events_dropped_total", (("kind", "state_map_full"),))] == 1
    lab = (("UUID", "GPU-abc"), ("device", "nvidia0"), ("gpu", "0"), ("modelName", "NVIDIA H200"))
    assert m[("DCGM_FI_DEV_SM_CLOCK", lab)] == 1980
    assert m[("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", lab)] == 0x21
    assert m[("clockalign_gpu_power_avg", lab)] == 350
    assert m[("clockalign_gpu_clock_event_reason_active", lab + (("reason", "sw_thermal"),))] == 1
    assert m[("clockalign_gpu_clock_event_reason_active", lab + (("reason", "hw_thermal"),))] == 0
    agg.close({"drops": {"cuda": 6}})
    m, _ = scrape(agg)
    assert m[("clockalign_events_dropped_total", (("kind", "cuda"),))] == 6
    assert m[("clockalign_probes_armed", ())] == 0


def test_nvml_xids_count_where_the_tracepoint_is_absent():
    agg = Aggregator()
    agg.open({"gpus": [{"index": 0}], "cflags": []})
    agg.write_rows(Chunk.GPU_EVENTS, [{"type": "xid", "gpu": 0, "code": 48},
                                      {"type": "nvml_event_0x1", "gpu": 0, "code": 0}])
    assert agg.snapshot()["xids"] == {("0", "48"): 1}


def test_gpu_clock_uncertainty_from_the_live_fit():
    agg = Aggregator()
    agg.open(ONE_GPU)
    agg.write_rows(Chunk.CLOCK_INFO, [{"domain": "GPU0", "tick_ns": 32}])
    rng = np.random.default_rng(1)
    for burst in range(4):
        host = 10**12 + burst * 10**9 + np.arange(64) * 20_000
        t0 = host - rng.integers(800, 1500, 64)
        t1 = host + rng.integers(800, 1500, 64)
        remote = host - 5_000_000 + (host - 10**12) // 500_000        # 2 ppm, 5 ms off
        agg.write_columns(Chunk.GPU_CLOCK, {"gpu": np.zeros(64, np.uint8),
                                            "method": np.ones(64, np.uint8),
                                            "t0": t0, "remote": remote, "t1": t1})
    unc = agg.snapshot()["clock_unc_ns"]["0"]
    assert 32 < unc < 1500
    m, _ = scrape(agg)
    assert m[("clockalign_gpu_clock_uncertainty_seconds", (("gpu", "0"),))] == unc / 1e9


def test_labels_are_capped_and_memory_stays_bounded():
    agg = Aggregator()
    agg.open({})
    agg.write_columns(Chunk.EVENTS, events(*[cuda("cuLaunchKernel", pid=1000 + i)
                                             for i in range(aggregate.MAX_PIDS + 10)]))
    snap = agg.snapshot()
    assert len({k[0] for k in snap["cuda_calls"]}) == aggregate.MAX_PIDS + 1
    assert snap["cuda_calls"][("other", "cuLaunchKernel", "CUDA_SUCCESS")] == 10
    assert snap["folded"]["pid"] == 10
    # a busy target for a long time: the state does not grow with the events
    rng = np.random.default_rng(0)
    n = 20000
    batch = np.zeros(n, dtype=EVENT_DTYPE)
    batch["kind"] = Kind.CUDA
    batch["pid"] = 1000
    batch["code"] = rng.choice([FN["cuLaunchKernel"], FN["cuMemcpyAsync"]], n)
    batch["dur"] = rng.integers(1000, 10**7, n)
    cols = {k: batch[k] for k in EVENT_DTYPE.names}
    for _ in range(3):
        agg.write_columns(Chunk.EVENTS, cols)
    sizes = (len(agg.cuda_calls), len(agg.cuda_duration))
    for _ in range(50):
        agg.write_columns(Chunk.EVENTS, cols)
    assert (len(agg.cuda_calls), len(agg.cuda_duration)) == sizes
    assert agg.cuda_calls[("1000", "cuLaunchKernel", "CUDA_SUCCESS")] + \
        agg.cuda_calls[("1000", "cuMemcpyAsync", "CUDA_SUCCESS")] == 53 * n + 1


def test_concurrent_writers_and_scrapes():
    agg = Aggregator()
    agg.open(ONE_GPU)
    cols = events(*[cuda("cuLaunchKernel")] * 100)
    errors = []

    def write():
        try:
            for _ in range(200):
                agg.write_columns(Chunk.EVENTS, cols)
        except Exception as e:       # pragma: no cover - a failure shows in the assert
            errors.append(e)
    threads = [threading.Thread(target=write) for _ in range(4)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        scrape(agg)
    for t in threads:
        t.join()
    assert not errors
    assert agg.cuda_calls[("100", "cuLaunchKernel", "CUDA_SUCCESS")] == 4 * 200 * 100


def test_served_over_http_with_every_contract_name():
    agg = Aggregator()
    agg.open(ONE_GPU)
    agg.write_columns(Chunk.EVENTS, events(cuda("cuLaunchKernel")))
    reg, collector = build_registry(agg)
    server = serve(reg, "127.0.0.1", 0)
    try:
        port = server.server_address[1]
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
    finally:
        server.shutdown()
        server.server_close()
    names = {f.name for f in text_string_to_metric_families(text.decode())}
    for n in ["clockalign_cuda_calls", "clockalign_cuda_call_duration_seconds",
              "clockalign_offcpu_in_cuda_seconds", "clockalign_wakeup_latency_seconds",
              "clockalign_connect", "clockalign_connect_duration_seconds",
              "clockalign_tcp_resets", "clockalign_tcp_retransmits",
              "clockalign_alloc_failures", "clockalign_fragmentation_failures",
              "clockalign_module_load_duration_seconds", "clockalign_xid",
              "clockalign_gpu_clock_uncertainty_seconds", "clockalign_events_dropped",
              "process_resident_memory_bytes"]:
        assert n in names, n
    assert collector.scrapes == 1


def test_listen_addresses():
    assert parse_listen("127.0.0.1:9464") == ("127.0.0.1", 9464)
    assert parse_listen("[::1]:9000") == ("::1", 9000)
    for bad in ("9464", "host:", ":9464", "127.0.0.1:70000", "127.0.0.1:http"):
        with pytest.raises(ClockalignError):
            parse_listen(bad)
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    try:
        reg, _ = build_registry(Aggregator())
        with pytest.raises(ClockalignError, match="cannot listen on 127.0.0.1"):
            serve(reg, "127.0.0.1", s.getsockname()[1])
    finally:
        s.close()


def test_call_counts_pack_or_fall_back_row_wise():
    """pid x function x result counts: packed into one int64 key where the results fit 16
    bits, row-wise otherwise; both give the same counts."""
    rng = np.random.default_rng(1)
    n = 5000
    pid = rng.choice([7, 70000, 4_000_000_000], n).astype(np.uint32)
    code = rng.choice([FN["cuLaunchKernel"], FN["cuMemAlloc_v2"]], n).astype(np.uint16)
    ret = rng.choice([0, 2, 700, 999], n).astype(np.int32)
    def counted():
        want = {}
        for p, c, r in zip(pid.tolist(), code.tolist(), ret.tolist()):
            want[(p, c, r)] = want.get((p, c, r), 0) + 1
        return want
    assert dict(aggregate._call_counts(pid, code, ret)) == counted()
    ret[0] = -5                                      # not a CUresult: the row-wise way
    assert dict(aggregate._call_counts(pid, code, ret)) == counted()


def test_a_batch_of_only_cuda_calls_and_a_mixed_one_count_the_same():
    rows = [cuda("cuLaunchKernel", pid=5, dur=2000 + i) for i in range(300)]
    a, b = Aggregator(), Aggregator()
    a.open({}), b.open({})
    a.write_columns(Chunk.EVENTS, events(*rows))
    b.write_columns(Chunk.EVENTS, events(*rows, {"kind": Kind.SCHED, "pid": 5, "tid": 5,
                                                 "dur": 10, "a3": 0}))
    sa, sb = a.snapshot(), b.snapshot()
    assert sa["cuda_calls"] == sb["cuda_calls"] == {("5", "cuLaunchKernel", "CUDA_SUCCESS"): 300}
    assert sa["cuda_duration"]["cuLaunchKernel"].count == 300
    assert sb["events"] == {"cuda": 300, "sched": 1}


def test_cuda_probe_share_is_stated():
    """--cuda-duty: /metrics says which share of the time the CUDA counts cover."""
    agg = Aggregator()
    agg.open({"gpus": [], "cflags": []})
    m, text = scrape(agg)
    assert m[("clockalign_cuda_probe_share", ())] == 1
    agg = Aggregator()
    agg.open({"gpus": [], "cflags": [], "cuda_duty": {"share": 0.25, "period_s": 1.0}})
    m, text = scrape(agg)
    assert m[("clockalign_cuda_probe_share", ())] == 0.25
    assert "divide by it" in text


def test_entry_only_calls_are_counted_without_a_duration():
    """--cuda-returns blocking: launches arrive as CUDA_ENTRY records; they count as calls
    (result entry_only) and add nothing to the duration histograms."""
    agg = Aggregator()
    agg.open({"gpus": [], "cflags": []})
    entry = [{**cuda("cuLaunchKernel"), "kind": Kind.CUDA_ENTRY, "dur": 0, "ret": 0}
             for _ in range(5)]
    agg.write_columns(Chunk.EVENTS, events(*entry, cuda("cuStreamSynchronize", dur=5000)))
    m, text = scrape(agg)
    assert m[("clockalign_cuda_calls_total", (("function", "cuLaunchKernel"), ("pid", "100"),
                                              ("result", "entry_only")))] == 5
    assert 'function="cuLaunchKernel"' not in "".join(
        ln for ln in text.splitlines() if ln.startswith("clockalign_cuda_call_duration"))
    assert agg.cuda_calls_seen == 6
