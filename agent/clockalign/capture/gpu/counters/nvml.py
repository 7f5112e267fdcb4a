"""NVML counter backend: reads every GPU each tick and decodes with nvml_decode.

NVML is reached through nvidia-ml-py (module ``pynvml``, NVIDIA's binding over ctypes);
ctypes drops the GIL during each call, so a slow NVML call in the sampler thread does
not hold up the rest of the recorder.  GPU numbers are NVML indices, which ignore
CUDA_VISIBLE_DEVICES.

    backend = NvmlBackend(gpus=[0])
    rows = RowBuffer(); backend.sample(rows); backend.close()
"""
import time

from ....errors import ClockalignError
from .nvml_decode import (ERROR_FUNCTION_NOT_FOUND, FAST_FIELD_IDS, RETURN_NAMES, SAMPLE_STREAMS,
                          SLOW_FIELD_GROUPS, NvmlDecoder, ProblemPolicy)

REALTIME = time.CLOCK_REALTIME
MONOTONIC = time.CLOCK_MONOTONIC
_now_real = time.clock_gettime_ns


def load_pynvml(what="NVML"):
    """Import pynvml and initialise NVML, or raise ClockalignError with one sentence."""
    try:
        import pynvml
    except ImportError:
        raise ClockalignError(f"{what} is not usable: the nvidia-ml-py package (module pynvml) "
                              "is not installed") from None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        raise ClockalignError(f"{what} is not usable: {describe_nvml_error(e)}") from None
    return pynvml


def describe_nvml_error(e) -> str:
    """Words for an NVMLError that say what is wrong on this host."""
    code = getattr(e, "value", None)
    return {
        12: "libnvidia-ml.so.1 not found",
        9: "the NVIDIA kernel driver is not loaded",
        4: "no permission to open the NVIDIA device files",
        18: "libnvidia-ml.so.1 does not match the loaded NVIDIA kernel driver version",
        13: "libnvidia-ml.so.1 is too old for this call",
        15: "the GPU has fallen off the bus",
    }.get(code, f"NVML error {RETURN_NAMES.get(code, code)} ({e})")


def nvml_status():
    """(usable, reason) for `clockalign doctor`, without keeping NVML open."""
    try:
        nv = load_pynvml()
    except ClockalignError as e:
        return False, str(e)
    try:
        count = nv.nvmlDeviceGetCount()
        driver = nv.nvmlSystemGetDriverVersion()
        if count == 0:
            return False, f"NVML is not usable: it found no GPU (driver {driver})"
        return True, f"NVML works: driver {driver}, {count} GPU(s)"
    except nv.NVMLError as e:
        return False, f"NVML is not usable: {describe_nvml_error(e)}"
    finally:
        nv.nvmlShutdown()


def gpu_inventory():
    """GPU metadata for the run-file header: ``(gpus, reason)``, reason None when NVML works.

        gpus, why = gpu_inventory()     # ([{"index": 0, "name": "NVIDIA H200", ...}], None)
    """
    try:
        nv = load_pynvml()
    except ClockalignError as e:
        return [], str(e)
    gpus = []
    try:
        driver = nv.nvmlSystemGetDriverVersion()
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            info = {
                "index": i,
                "name": nv.nvmlDeviceGetName(h),
                "uuid": nv.nvmlDeviceGetUUID(h),
                "pci_bus_id": nv.nvmlDeviceGetPciInfo(h).busId,
                "driver": driver,
                "memory_total": int(nv.nvmlDeviceGetMemoryInfo(h).total),
            }
            for key, fn in (("serial", nv.nvmlDeviceGetSerial),
                            ("compute_capability", nv.nvmlDeviceGetCudaComputeCapability)):
                try:
                    info[key] = fn(h)
                except nv.NVMLError:
                    pass
            if "compute_capability" in info:
                info["compute_capability"] = "%d.%d" % tuple(info["compute_capability"])
            gpus.append(info)
    except nv.NVMLError as e:
        return gpus, f"NVML inventory stopped early: {describe_nvml_error(e)}"
    finally:
        nv.nvmlShutdown()
    return gpus, None


class _Job:
    """A periodic read: a group of field ids, a call, or a sample stream of one GPU."""

    __slots__ = ("gpu", "kind", "arg", "period_ns", "due", "cost_ns")

    def __init__(self, gpu, kind, arg, period_ns, due):
        self.gpu, self.kind, self.arg, self.period_ns, self.due = gpu, kind, arg, period_ns, due
        self.cost_ns = 0          # how long it took last time


class NvmlReader:
    """Asks NVML for every enabled item of every GPU and returns the raw records.

    Each ``read()`` asks the cheap items of every GPU (FAST_FIELD_IDS and five calls of a
    few µs), then runs the most overdue periodic jobs (health counters, energy, the
    utilisation sample streams) while they fit in ``budget_ns`` by what they cost last
    time, at least one per read, so no single tick pays for all the slow reads.  The sample streams lose nothing by being
    read every half second: the driver keeps its own buffer (about 14 s of 200 ms samples
    on an H200) and every sample carries its driver timestamp.

    Shared by NvmlBackend and scripts/data/capture_nvml.py, so the captured test data
    is exactly what the recorder reads.  Items answered with a PERMANENT error are
    dropped with ``disable``.
    """

    def __init__(self, nv, gpus=None, slow_period_s=1.0, stream_period_s=0.5):
        self.nv = nv
        count = nv.nvmlDeviceGetCount()
        gpus = list(range(count)) if gpus is None else [int(g) for g in gpus]
        bad = [g for g in gpus if not 0 <= g < count]
        if bad:
            raise ClockalignError(f"GPU {bad[0]} does not exist (NVML sees {count} GPU(s))")
        self.gpus = gpus
        self.handles = {g: nv.nvmlDeviceGetHandleByIndex(g) for g in gpus}
        self.fast_fields = {g: list(FAST_FIELD_IDS) for g in gpus}
        self.calls = {g: ["clock_sm", "clock_mem", "temp_gpu", "memory", "clock_reasons"]
                      for g in gpus}
        self.slow_ns = int(slow_period_s * 1e9)
        now = _now_real(MONOTONIC)
        self.jobs = []
        for g in gpus:
            for what in SAMPLE_STREAMS:
                self._add_job(g, "samples", what, int(stream_period_s * 1e9), now)
            for group in SLOW_FIELD_GROUPS:
                self._add_job(g, "fields", list(group), self.slow_ns, now)
        # Start the sample streams 2 s back: the oldest sample only opens a window.
        start_us = _now_real(REALTIME) // 1000 - 2_000_000
        self.last_seen = {(g, s): start_us for g in gpus for s in SAMPLE_STREAMS}
        self.lost = set()
        self._reasons = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            nv.nvmlDeviceGetCurrentClocksThrottleReasons
        self._call_fns = {
            "clock_sm": lambda h: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
            "clock_mem": lambda h: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM),
            "temp_gpu": lambda h: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
            "memory": self._memory,
            "clock_reasons": lambda h: self._reasons(h),
            "util_rates": self._util_rates,
            "pcie_tx": lambda h: nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_TX_BYTES),
            "pcie_rx": lambda h: nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_RX_BYTES),
            "power_usage": nv.nvmlDeviceGetPowerUsage,
        }

    def _add_job(self, gpu, kind, arg, period_ns, due):
        self.jobs.append(_Job(gpu, kind, arg, period_ns, due))

    def _memory(self, h):
        m = self.nv.nvmlDeviceGetMemoryInfo(h)
        return [int(m.total), int(m.free), int(m.used)]

    def _util_rates(self, h):
        u = self.nv.nvmlDeviceGetUtilizationRates(h)
        return [int(u.gpu), int(u.memory)]

    def read(self, budget_ns=3_000_000) -> list:
        """One pass: the cheap items of every GPU, then overdue jobs within ``budget_ns``."""
        start = _now_real(MONOTONIC)
        out = []
        for g in self.gpus:
            if g in self.lost:
                continue
            h = self.handles[g]
            out.append(self.read_fields(g, h, self.fast_fields[g]))
            for what in self.calls[g]:
                out.append(self.read_call(g, h, what))
        ran = 0
        while True:
            now = _now_real(MONOTONIC)
            due = [j for j in self.jobs if j.due <= now and j.gpu not in self.lost]
            if not due:
                break
            job = min(due, key=lambda j: j.due)
            if ran and now - start + job.cost_ns > budget_ns:
                break
            job.due = now + job.period_ns
            out.append(self.run_job(job))
            job.cost_ns = _now_real(MONOTONIC) - now
            ran += 1
        return [r for r in out if r is not None]

    def run_job(self, job):
        h = self.handles[job.gpu]
        if job.kind == "fields":
            return self.read_fields(job.gpu, h, job.arg)
        if job.kind == "samples":
            return self.read_samples(job.gpu, h, job.arg)
        return self.read_call(job.gpu, h, job.arg)

    def read_fields(self, gpu, h, ids):
        if not ids:
            return None
        nv = self.nv
        t0 = _now_real(REALTIME)
        try:
            vals = nv.nvmlDeviceGetFieldValues(h, ids)
            ret = 0
        except nv.NVMLError as e:
            vals, ret = None, e.value
        t1 = _now_real(REALTIME)
        recv = _now_real(MONOTONIC)
        if vals is None:
            values = [[fid, 0, 0, 0, 0, ret, "00" * 8] for fid in ids]
        else:
            values = [[int(v.fieldId), int(v.scopeId), int(v.timestamp), int(v.latencyUsec),
                       int(v.valueType), int(v.nvmlReturn), bytes(v.value)[:8].hex()]
                      for v in vals]
        return {"op": "fields", "gpu": gpu, "t0": t0, "t1": t1, "recv": recv, "ret": ret,
                "values": values}

    def read_call(self, gpu, h, what):
        nv = self.nv
        fn = self._call_fns[what]
        t0 = _now_real(REALTIME)
        try:
            value = fn(h)
            ret = 0
        except nv.NVMLError as e:
            value, ret = None, e.value
        t1 = _now_real(REALTIME)
        recv = _now_real(MONOTONIC)
        if ret == ERROR_FUNCTION_NOT_FOUND and what == "clock_reasons" and \
                self._reasons is not nv.nvmlDeviceGetCurrentClocksThrottleReasons:
            self._reasons = nv.nvmlDeviceGetCurrentClocksThrottleReasons   # driver < 535
            return self.read_call(gpu, h, what)
        return {"op": "call", "gpu": gpu, "what": what, "t0": t0, "t1": t1, "recv": recv,
                "ret": ret, "value": value}

    def read_samples(self, gpu, h, what):
        nv = self.nv
        key = (gpu, what)
        t0 = _now_real(REALTIME)
        try:
            vtype, samples = nv.nvmlDeviceGetSamples(h, SAMPLE_STREAMS[what][0],
                                                     self.last_seen[key])
            ret = 0
        except nv.NVMLError as e:
            vtype, samples, ret = 0, [], e.value
        t1 = _now_real(REALTIME)
        recv = _now_real(MONOTONIC)
        raw = [[int(s.timeStamp), bytes(s.sampleValue)[:8].hex()] for s in samples]
        if raw:
            self.last_seen[key] = max(self.last_seen[key], max(r[0] for r in raw))
        return {"op": "samples", "gpu": gpu, "what": what, "t0": t0, "t1": t1, "recv": recv,
                "ret": ret, "value_type": int(vtype), "last_seen": self.last_seen[key],
                "samples": raw}

    def disable(self, gpu, source):
        """Stop asking for one item; falls back where another call gives the same thing."""
        kind, _, key = source.partition(":")
        if kind == "field":
            fid = int(key)
            if fid in self.fast_fields[gpu]:
                self.fast_fields[gpu].remove(fid)
            for job in self.jobs:
                if job.gpu == gpu and job.kind == "fields" and fid in job.arg:
                    job.arg.remove(fid)
            self.jobs = [j for j in self.jobs if not (j.kind == "fields" and not j.arg)]
            # PCIe byte counters missing: NVML's 20 ms throughput call instead, once a period
            if fid in (197, 198):
                what = "pcie_tx" if fid == 197 else "pcie_rx"
                if not any(j.gpu == gpu and j.arg == what for j in self.jobs):
                    self._add_job(gpu, "call", what, self.slow_ns, _now_real(MONOTONIC))
        elif kind == "call":
            if key in self.calls[gpu]:
                self.calls[gpu].remove(key)
            self.jobs = [j for j in self.jobs if not (j.gpu == gpu and j.arg == key)]
        elif kind == "samples":
            self.jobs = [j for j in self.jobs
                         if not (j.gpu == gpu and j.kind == "samples" and j.arg == key)]
            if "util_rates" not in self.calls[gpu]:
                self.calls[gpu].append("util_rates")     # costs ~10 µs, so every tick


class NvmlBackend:
    """The default counter backend: NVML on every chosen GPU, Xid events in a thread.

    ``slow_period_s``: how often the health counters (ECC, retired pages, row remaps,
    power limit, PCIe replays), energy and the thermal violation counter are read; they
    change rarely or cost milliseconds per call.  ``interval_s`` sets the time budget
    for those slow reads within one tick.
    """

    name = "nvml"

    def __init__(self, gpus=None, interval_s=0.1, slow_period_s=1.0, event_timeout_ms=100):
        self.nv = load_pynvml()
        try:
            self.reader = NvmlReader(self.nv, gpus, slow_period_s=slow_period_s)
        except BaseException:
            self.nv.nvmlShutdown()
            raise
        self.gpus = self.reader.gpus
        self.decoder = NvmlDecoder()
        # slow jobs may use up to 30% of a tick beyond the cheap items (at least one job)
        self.budget_ns = int(0.3 * interval_s * 1e9)
        self.policy = ProblemPolicy()
        self.event_timeout_ms = event_timeout_ms
        self._events = None
        self._closed = False

    def sample(self, out) -> None:
        """Read every GPU once and append the decoded rows to ``out`` (a RowBuffer)."""
        records = self.reader.read(self.budget_ns)
        self.handle_problems(self.decoder.decode(records, out))

    def handle_problems(self, problems):
        for gpu, source in self.policy.handle(problems):
            self.reader.disable(gpu, source)
        self.reader.lost |= self.policy.lost

    @property
    def unsupported(self):
        return self.policy.unsupported

    @property
    def errors(self):
        return self.policy.errors

    def drain_notices(self) -> list:
        """[(level, text)] said since the last call."""
        out, self.policy.notices = self.policy.notices, []
        if self._events is not None:
            out.extend(self._events.drain_notices())
        return out

    def start_events(self, writer):
        """Watch NVML Xid events in their own thread, writing GPU_EVENTS rows."""
        from .nvml_events import NvmlEventWatcher
        self._events = NvmlEventWatcher(self.nv, self.reader.handles, writer,
                                        timeout_ms=self.event_timeout_ms)
        self._events.start()

    def stop_events(self):
        if self._events is not None:
            self._events.stop()

    @property
    def event_count(self):
        return self._events.count if self._events is not None else 0

    def close(self):
        if self._closed:
            return
        self._closed = True
        self.stop_events()
        try:
            self.nv.nvmlShutdown()
        except self.nv.NVMLError:
            pass
