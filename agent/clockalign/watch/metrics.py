"""The Prometheus side of ``clockalign watch``: a collector over an Aggregator, and its server.

Metric names are a contract (README "Watch" lists them).  Everything is computed at scrape
time from the aggregator's snapshot with prometheus_client's metric families; the HTTP
server is watch/server.py (prometheus_client's could not take a burst of scrapes).  GPU counters use dcgm-exporter's names and units
(DCGM_FI_DEV_FB_FREE in MiB, ...) so dashboards built for it read them, with its labels
gpu, UUID, device and modelName.

    registry = build_registry(aggregator)
    server = serve(registry, "127.0.0.1", 9464)      # GET /metrics
"""
import math

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                    HistogramMetricFamily)

from ..errors import ClockalignError
from ..store.counter_fields import CLOCK_REASONS, FIELD_BY_NAME, FIELDS
from .aggregate import reasons_active

MIB = 1 << 20
# counter field -> (dcgm-exporter name, scale from our stored unit to DCGM's)
DCGM_NAMES = {
    "sm_clock": ("DCGM_FI_DEV_SM_CLOCK", 1), "mem_clock": ("DCGM_FI_DEV_MEM_CLOCK", 1),
    "gpu_util": ("DCGM_FI_DEV_GPU_UTIL", 1), "mem_util": ("DCGM_FI_DEV_MEM_COPY_UTIL", 1),
    "mem_used": ("DCGM_FI_DEV_FB_USED", 1 / MIB), "mem_free": ("DCGM_FI_DEV_FB_FREE", 1 / MIB),
    "power": ("DCGM_FI_DEV_POWER_USAGE", 1), "gpu_temp": ("DCGM_FI_DEV_GPU_TEMP", 1),
    "mem_temp": ("DCGM_FI_DEV_MEMORY_TEMP", 1),
    "pcie_tx_kbps": ("DCGM_FI_DEV_PCIE_TX_THROUGHPUT", 1),
    "pcie_rx_kbps": ("DCGM_FI_DEV_PCIE_RX_THROUGHPUT", 1),
    "clock_event_reasons": ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", 1),
    "ecc_sbe_volatile": ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", 1),
    "ecc_dbe_volatile": ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 1),
    "ecc_sbe_aggregate": ("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", 1),
    "ecc_dbe_aggregate": ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", 1),
    "retired_pages_sbe": ("DCGM_FI_DEV_RETIRED_SBE", 1),
    "retired_pages_dbe": ("DCGM_FI_DEV_RETIRED_DBE", 1),
    "retired_pages_pending": ("DCGM_FI_DEV_RETIRED_PENDING", 1),
    "remapped_rows_correctable": ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", 1),
    "remapped_rows_uncorrectable": ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", 1),
    "remapped_rows_pending": ("DCGM_FI_DEV_ROW_REMAP_PENDING", 1),
    "remapped_rows_failure": ("DCGM_FI_DEV_ROW_REMAP_FAILURE", 1),
    "energy": ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 1),
    "pcie_replays": ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", 1),
    "power_limit": ("DCGM_FI_DEV_POWER_MGMT_LIMIT", 1),
    "sm_active": ("DCGM_FI_PROF_SM_ACTIVE", 1), "sm_occupancy": ("DCGM_FI_PROF_SM_OCCUPANCY", 1),
    "tensor_active": ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 1),
    "dram_active": ("DCGM_FI_PROF_DRAM_ACTIVE", 1),
    "gr_engine_active": ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 1),
    "pcie_tx_rate": ("DCGM_FI_PROF_PCIE_TX_BYTES", 1),
    "pcie_rx_rate": ("DCGM_FI_PROF_PCIE_RX_BYTES", 1),
    "nvlink_tx_rate": ("DCGM_FI_PROF_NVLINK_TX_BYTES", 1),
    "nvlink_rx_rate": ("DCGM_FI_PROF_NVLINK_RX_BYTES", 1),
    "power_violation": ("DCGM_FI_DEV_POWER_VIOLATION", 1e-3),       # ns -> µs
    "thermal_violation": ("DCGM_FI_DEV_THERMAL_VIOLATION", 1e-3),
}
GPU_LABELS = ["gpu", "UUID", "device", "modelName"]

HELP = {
    "cuda_calls": "CUDA driver calls, by result: CUDA_SUCCESS or the CUresult name of cuda.h "
                  "for calls that returned, ENTRY_ONLY for calls recorded at their entry only "
                  "(record --cuda-returns blocking: their return is not probed).",
    "cuda_duration": "Time from a CUDA driver call's entry to its return.",
    "offcpu": "Time target threads spent off CPU while inside a probed CUDA driver call: "
              "preempted (runnable, another task took the CPU) or blocked (slept, e.g. a "
              "synchronize waiting).",
    "wakeup": "From a target thread's wakeup to it running on a CPU (run-queue latency).",
    "connects": "connect() calls by peer and result (ok, or the errno name; EINPROGRESS is a "
                "non-blocking connect under way, not an error; known_probe a library's probe "
                "for an optional service failing as expected, e.g. glibc asking nscd).",
    "connect_duration": "Time inside connect() (a non-blocking connect returns at once).",
    "tcp_resets": "TCP resets on the targets' sockets, sent or received.",
    "tcp_retransmits": "TCP segments the targets' sockets retransmitted.",
    "alloc": "Allocating CUDA driver calls (cuMemAlloc*, cuMemCreate, ...) that failed.",
    "fragmentation": "Allocations refused with CUDA_ERROR_OUT_OF_MEMORY while the GPU's free "
                     "memory sampled just before and just after the call was at least the "
                     "size asked for. Needs the counter sampler's free-memory samples "
                     "(NVML/DCGM), so it stays 0 on a host with no GPU; the GPU is the "
                     "call's device argument or the only GPU (see "
                     "clockalign_fragmentation_unjudged_total).",
    "unjudged": "Refused allocations that could not be judged for fragmentation, by why "
                "(no GPU, device unknown on a host with several GPUs, no free-memory sample "
                "before or none within 5 s after: counters off).",
    "module_load": "Duration of module and library loads (cuModuleLoad*, cuLibraryLoad*): "
                   "model-load latency.",
    "xid": "NVIDIA Xid errors by GPU and code (nvidia_dev_xid tracepoint, else NVML).",
    "clock_unc": "Uncertainty of the GPU clock's mapping to CLOCK_MONOTONIC at its latest "
                 "reading, from the last ~10 s of clock probes.",
    "dropped": "Records lost, by kind: probe records that found the event buffer full, "
               "state maps full, CUDA calls not paired, and what watch itself gave up.",
    "events": "Events aggregated, by kind.",
    "armed": "1 while the probes are attached and the metrics live.",
    "cuda_share": "Share of time the CUDA probes are attached (--cuda-duty; 1: always).  Below "
                  "1, CUDA call counts cover only that share of the time (divide by it for "
                  "the whole), and duration quantiles are those of the calls inside it.",
    "targets": "Target processes attached now (--pid, the command, and with --follow the "
               "matching processes found so far).",
    "attached": "Target processes attached since watch started; with --follow a restarted "
                "service's successor counts once more.",
    "exits": "Target processes that exited while watched (with --follow watch stays up and "
             "attaches to the successor).",
    "forgotten": "Exited target processes whose series were dropped 5 minutes after the "
                 "exit (a crash loop under --follow would otherwise fill the pid label's cap).",
    "folded": "Label values folded into 'other' because a label reached its cap.",
    "reasons": "Clock event (throttle) reasons set at the latest sample, one series per "
               "reason: 1 while it holds the clocks down (PromQL has no bitwise and).",
}


def _hist(name, doc, labels, items):
    fam = HistogramMetricFamily(name, doc, labels=labels)
    for key, h in items:
        fam.add_metric(list(key), buckets=[(_le(le), c) for le, c in h.cumulative()],
                       sum_value=h.sum_ns / 1e9)
    return fam


def _le(v: float) -> str:
    return "+Inf" if math.isinf(v) else repr(float(v))


def _counter(name, doc, labels, items, scale=1.0):
    fam = CounterMetricFamily(name, doc, labels=labels)
    for key, v in items:
        fam.add_metric([str(k) for k in key], v * scale)
    return fam


class WatchCollector:
    """Yields every clockalign_* family (and the DCGM-named GPU gauges) at each scrape."""

    def __init__(self, aggregator):
        self.agg = aggregator
        self.scrapes = 0      # collections (scrapes that arrive together share one)

    def describe(self):
        return []     # families depend on what was seen; no registration-time collect

    def collect(self):
        self.scrapes += 1
        s = self.agg.snapshot()
        yield _counter("clockalign_cuda_calls", HELP["cuda_calls"], ["pid", "function", "result"],
                       s["cuda_calls"].items())
        yield _hist("clockalign_cuda_call_duration_seconds", HELP["cuda_duration"], ["function"],
                    [((k,), h) for k, h in sorted(s["cuda_duration"].items())])
        yield _counter("clockalign_offcpu_in_cuda_seconds", HELP["offcpu"], ["pid", "state"],
                       s["offcpu_in_cuda_ns"].items(), 1e-9)
        yield _hist("clockalign_wakeup_latency_seconds", HELP["wakeup"], [], [((), s["wakeup"])])
        yield _counter("clockalign_connect", HELP["connects"], ["pid", "peer", "result"],
                       s["connects"].items())
        yield _hist("clockalign_connect_duration_seconds", HELP["connect_duration"], ["peer"],
                    [((k,), h) for k, h in sorted(s["connect_duration"].items())])
        yield _counter("clockalign_tcp_resets", HELP["tcp_resets"], ["pid", "direction"],
                       s["tcp_resets"].items())
        yield _counter("clockalign_tcp_retransmits", HELP["tcp_retransmits"], ["pid"],
                       s["tcp_retransmits"].items())
        yield _counter("clockalign_alloc_failures", HELP["alloc"], ["pid", "function"],
                       s["alloc_failures"].items())
        yield _counter("clockalign_fragmentation_failures", HELP["fragmentation"],
                       ["pid", "gpu"], s["fragmentation"].items())
        yield _counter("clockalign_fragmentation_unjudged", HELP["unjudged"], ["pid", "reason"],
                       s["fragmentation_unjudged"].items())
        yield _hist("clockalign_module_load_duration_seconds", HELP["module_load"], [],
                    [((), s["module_load"])])
        yield _counter("clockalign_xid", HELP["xid"], ["gpu", "code"], s["xids"].items())
        g = GaugeMetricFamily("clockalign_gpu_clock_uncertainty_seconds", HELP["clock_unc"],
                              labels=["gpu"])
        for gpu, ns in sorted(s["clock_unc_ns"].items()):
            g.add_metric([gpu], ns / 1e9)
        yield g
        yield _counter("clockalign_events_dropped", HELP["dropped"], ["kind"],
                       [((k,), v) for k, v in sorted(s["dropped"].items())])
        yield _counter("clockalign_events", HELP["events"], ["kind"],
                       [((k,), v) for k, v in sorted(s["events"].items())])
        yield _counter("clockalign_label_values_folded", HELP["folded"], ["label"],
                       [((k,), v) for k, v in sorted(s["folded"].items())])
        armed = GaugeMetricFamily("clockalign_probes_armed", HELP["armed"])
        armed.add_metric([], 1 if s["armed"] else 0)
        yield armed
        share = GaugeMetricFamily("clockalign_cuda_probe_share", HELP["cuda_share"])
        share.add_metric([], s["cuda_share"])
        yield share
        targets = GaugeMetricFamily("clockalign_targets", HELP["targets"])
        targets.add_metric([], s["targets"])
        yield targets
        yield _counter("clockalign_targets_attached", HELP["attached"], [],
                       [((), s["targets_attached"])])
        yield _counter("clockalign_target_exits", HELP["exits"], [], [((), s["target_exits"])])
        yield _counter("clockalign_target_series_forgotten", HELP["forgotten"], [],
                       [((), s["pids_forgotten"])])
        yield from _gpu_gauges(s["counters"], s["gpus"])


def _gpu_gauges(counters: dict, gpus: list):
    info = {g["index"]: g for g in gpus}

    def labels(gpu):
        g = info.get(gpu, {})
        return [str(gpu), g.get("uuid", ""), f"nvidia{gpu}", g.get("name", "")]
    fams = {}
    for (gpu, fid), (value, _) in sorted(counters.items()):
        name, unit, desc, _ = FIELDS.get(fid, (None, "", "", ""))
        if name is None:
            continue
        dcgm, scale = DCGM_NAMES.get(name, (f"clockalign_gpu_{name}", 1))
        fam = fams.get(dcgm)
        if fam is None:
            doc = f"{desc} ({'DCGM units' if name in DCGM_NAMES else unit}; from clockalign)"
            fam = fams[dcgm] = GaugeMetricFamily(dcgm, doc, labels=GPU_LABELS)
        fam.add_metric(labels(gpu), value * scale)
        if fid == FIELD_BY_NAME["clock_event_reasons"]:
            r = fams.get("reasons")
            if r is None:
                r = fams["reasons"] = GaugeMetricFamily(
                    "clockalign_gpu_clock_event_reason_active", HELP["reasons"],
                    labels=GPU_LABELS + ["reason"])
            for reason, on in reasons_active(value).items():
                r.add_metric(labels(gpu) + [reason], on)
    yield from fams.values()


def build_registry(aggregator):
    """A registry with the watch collector and this process's own (RSS, CPU, fds)."""
    reg = CollectorRegistry(auto_describe=False)
    collector = WatchCollector(aggregator)
    reg.register(collector)
    ProcessCollector(registry=reg)
    return reg, collector


def parse_listen(text: str):
    """'127.0.0.1:9464', '[::1]:9464', '0.0.0.0:9464' -> (host, port); bad input raises."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ClockalignError(f"--listen {text!r} is not HOST:PORT (e.g. 127.0.0.1:9464)")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not host:
        raise ClockalignError(f"--listen {text!r} names no address: give 0.0.0.0:{port} to "
                              "listen on every interface, or 127.0.0.1:" + port)
    return host, int(port)


def is_loopback(host: str) -> bool:
    import ipaddress
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def serve(registry, host: str, port: int, on_scrape=None):
    """Serve ``registry`` on (host, port) from daemon threads (watch/server.py); returns the
    server (its server_address has the port bound, for port 0)."""
    from .server import MetricsServer
    return MetricsServer(registry, host, port, on_scrape=on_scrape)


__all__ = ["WatchCollector", "build_registry", "serve", "parse_listen", "is_loopback",
           "DCGM_NAMES", "CLOCK_REASONS"]
