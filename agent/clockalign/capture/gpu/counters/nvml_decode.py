"""Turn raw NVML answers into counter rows: pure, so tests feed it captured JSON.

The live backend (nvml.py) and scripts/data/capture_nvml.py both produce the same
raw records, plain JSON-able dicts, one per NVML call:

    {"op": "fields", "gpu": 0, "t0": real_ns, "t1": real_ns, "recv": mono_ns, "ret": 0,
     "values": [[fieldId, scopeId, timestamp_us, latencyUsec, valueType, nvmlReturn, "16 hex"]]}
    {"op": "call", "gpu": 0, "what": "clock_sm", "t0": ..., "t1": ..., "recv": ..., "ret": 0,
     "value": 1980}
    {"op": "samples", "gpu": 0, "what": "gpu_util", "t0": ..., "t1": ..., "recv": ..., "ret": 0,
     "value_type": 1, "samples": [[timeStamp_us, "16 hex"], ...]}

``t0``/``t1`` are CLOCK_REALTIME read just before and after the call, ``recv`` is
CLOCK_MONOTONIC right after it; values keep the raw bytes of NVML's nvmlValue_t union.

Timing rules (every row gets a REALTIME time and a latency):

- field values: NVML stamps each value (µs since 1970) and says how long its read took
  (``latencyUsec``), but not whether the stamp starts or ends the read.  Both happen:
  on an H200 (driver 580), asked alone, energy (field 83) took 8655 µs with its stamp
  8637 µs after the call began and latency 8632 µs (stamp = end), while field 270 took
  755 µs with its stamp 2.7 µs after the call began and latency 751 µs (stamp = start).
  So the value was taken within [ts - latency, ts + latency + 1 µs] (the 1 µs: the
  truncated stamp), clipped to the call bracket [t0, t1], which always holds it; the
  midpoint is stored with half the width as latency.  A timestamp of 0 (or one outside
  the bracket) falls back to the bracket.  A value NVML returns again with the same
  timestamp is not stored twice.  The latency is NVML's word: field 193 (a constant
  temperature limit) reported 0 µs for a read that kept the call busy 384 µs, so a
  value whose latency matters is best judged against the bracket too.
- other calls: midpoint of [t0, t1] with half the bracket as latency.
- nvmlDeviceGetSamples: the driver's own timestamp (1 µs resolution -> latency 1000 ns);
  utilisation averages over the time since the previous sample, which becomes window_ns.
- PCIe throughput: NVML counts bytes over 20 ms inside the call, so the window ends
  somewhere in [t0 + 20 ms, t1]; its midpoint is stored, with window_ns = 20 ms.

    dec = NvmlDecoder()
    problems = dec.decode(records, rows)      # rows: a RowBuffer
"""
import struct

from ....store.counter_fields import FIELD_BY_NAME

# nvmlReturn_t values (nvml.h); mirrored so this module imports without pynvml.
SUCCESS = 0
ERROR_INVALID_ARGUMENT = 2
ERROR_NOT_SUPPORTED = 3
ERROR_NO_PERMISSION = 4
ERROR_NOT_FOUND = 6
ERROR_TIMEOUT = 10
ERROR_FUNCTION_NOT_FOUND = 13
ERROR_GPU_IS_LOST = 15
RETURN_NAMES = {
    0: "SUCCESS", 1: "UNINITIALIZED", 2: "INVALID_ARGUMENT", 3: "NOT_SUPPORTED",
    4: "NO_PERMISSION", 5: "ALREADY_INITIALIZED", 6: "NOT_FOUND", 7: "INSUFFICIENT_SIZE",
    8: "INSUFFICIENT_POWER", 9: "DRIVER_NOT_LOADED", 10: "TIMEOUT", 11: "IRQ_ISSUE",
    12: "LIBRARY_NOT_FOUND", 13: "FUNCTION_NOT_FOUND", 14: "CORRUPTED_INFOROM",
    15: "GPU_IS_LOST", 16: "RESET_REQUIRED", 17: "OPERATING_SYSTEM",
    18: "LIB_RM_VERSION_MISMATCH", 19: "IN_USE", 20: "MEMORY", 21: "NO_DATA",
    26: "DEPRECATED", 27: "NOT_READY", 999: "UNKNOWN",
}
# Answers that will not change by asking again: the item is dropped and said once.
PERMANENT = frozenset({ERROR_INVALID_ARGUMENT, ERROR_NOT_SUPPORTED, ERROR_NO_PERMISSION,
                       ERROR_FUNCTION_NOT_FOUND})

# nvmlValueType_t -> struct format of the first bytes of the 8-byte nvmlValue_t union
# (x86-64 Linux: unsigned long is 8 bytes).
VALUE_FORMATS = {0: "<d", 1: "<I", 2: "<Q", 3: "<Q", 4: "<q", 5: "<i", 6: "<H"}

SECOND_NS = 1_000_000_000
STAMP_RESOLUTION_NS = 1000            # NVML timestamps are whole microseconds
PCIE_THROUGHPUT_WINDOW_NS = 20_000_000  # nvmlDeviceGetPcieThroughput: 20 ms byte count
# nvmlDeviceGetUtilizationRates averages over "between 1 second and 1/6 second, depending
# on the product" (the H200's driver samples every 200 ms, by nvmlDeviceGetSamples);
# used only when nvmlDeviceGetSamples is not supported, with the documented minimum.
UTIL_RATES_WINDOW_NS = SECOND_NS // 6

# NVML_FI_DEV_* id -> (field name, scale to stored unit, window_ns)
FIELD_VALUES = {
    186: ("power", 1e-3, 0),                   # POWER_INSTANT, mW
    185: ("power_avg", 1e-3, SECOND_NS),       # POWER_AVERAGE, mW over 1 s
    83: ("energy", 1.0, 0),                    # TOTAL_ENERGY_CONSUMPTION, mJ
    82: ("mem_temp", 1.0, 0),                  # MEMORY_TEMP, C
    197: ("pcie_tx_bytes", 1.0, 0),            # PCIE_COUNT_TX_BYTES
    198: ("pcie_rx_bytes", 1.0, 0),            # PCIE_COUNT_RX_BYTES
    74: ("power_violation", 1.0, 0),           # PERF_POLICY_POWER, ns
    75: ("thermal_violation", 1.0, 0),         # PERF_POLICY_THERMAL, ns
    190: ("power_limit", 1e-3, 0),             # POWER_CURRENT_LIMIT, mW
    94: ("pcie_replays", 1.0, 0),              # PCIE_REPLAY_COUNTER
    3: ("ecc_sbe_volatile", 1.0, 0),           # ECC_SBE_VOL_TOTAL
    4: ("ecc_dbe_volatile", 1.0, 0),           # ECC_DBE_VOL_TOTAL
    5: ("ecc_sbe_aggregate", 1.0, 0),          # ECC_SBE_AGG_TOTAL
    6: ("ecc_dbe_aggregate", 1.0, 0),          # ECC_DBE_AGG_TOTAL
    29: ("retired_pages_sbe", 1.0, 0),         # RETIRED_SBE
    30: ("retired_pages_dbe", 1.0, 0),         # RETIRED_DBE
    31: ("retired_pages_pending", 1.0, 0),     # RETIRED_PENDING
    142: ("remapped_rows_correctable", 1.0, 0),    # REMAPPED_COR
    143: ("remapped_rows_uncorrectable", 1.0, 0),  # REMAPPED_UNC
    144: ("remapped_rows_pending", 1.0, 0),        # REMAPPED_PENDING
    145: ("remapped_rows_failure", 1.0, 0),        # REMAPPED_FAILURE
}
# Read every tick: each costs microseconds (PCIe byte counters ~0.3-0.4 ms) on an H200.
FAST_FIELD_IDS = (186, 185, 82, 197, 198, 74)
# Read as periodic jobs, each group in its own call, so one tick pays for at most a few:
# on an H200 energy (83) took 2.8-8.6 ms, the thermal violation counter (75) 1.1 ms and
# the PCIe replay counter (94) 1.0 ms; the health counters change rarely.
HEALTH_FIELD_IDS = (190, 3, 4, 5, 6, 29, 30, 31, 142, 143, 144, 145)
SLOW_FIELD_GROUPS = (HEALTH_FIELD_IDS, (83,), (75,), (94,))
SLOW_FIELD_IDS = tuple(f for group in SLOW_FIELD_GROUPS for f in group)

# "what" of a call record -> the NVML function, for notices
CALL_FUNCTIONS = {
    "clock_sm": "nvmlDeviceGetClockInfo(SM)",
    "clock_mem": "nvmlDeviceGetClockInfo(MEM)",
    "temp_gpu": "nvmlDeviceGetTemperature(GPU)",
    "memory": "nvmlDeviceGetMemoryInfo",
    "clock_reasons": "nvmlDeviceGetCurrentClocksEventReasons",
    "util_rates": "nvmlDeviceGetUtilizationRates",
    "pcie_tx": "nvmlDeviceGetPcieThroughput(TX)",
    "pcie_rx": "nvmlDeviceGetPcieThroughput(RX)",
    "power_usage": "nvmlDeviceGetPowerUsage",
}
# single-value calls: what -> (field name, scale)
SCALAR_CALLS = {
    "clock_sm": ("sm_clock", 1.0),
    "clock_mem": ("mem_clock", 1.0),
    "temp_gpu": ("gpu_temp", 1.0),
    "clock_reasons": ("clock_event_reasons", 1.0),
}
# nvmlDeviceGetSamples streams: what -> (nvmlSamplingType_t, field name)
SAMPLE_STREAMS = {
    "gpu_util": (1, "gpu_util"),   # NVML_GPU_UTILIZATION_SAMPLES
    "mem_util": (2, "mem_util"),   # NVML_MEMORY_UTILIZATION_SAMPLES
}


def unpack_value(value_type: int, raw_hex: str):
    """Read an nvmlValue_t union (its 8 raw bytes as hex) as the type NVML said it holds."""
    raw = bytes.fromhex(raw_hex)
    fmt = VALUE_FORMATS.get(int(value_type))
    if fmt is None:
        raise ValueError(f"unknown nvmlValueType_t {value_type}")
    return struct.unpack_from(fmt, raw)[0]


def source_name(source: str) -> str:
    """Readable name of a decode source ('field:186' -> 'power (NVML field 186)')."""
    kind, _, key = source.partition(":")
    if kind == "field":
        name = FIELD_VALUES.get(int(key), (f"field {key}",))[0]
        return f"{name} (NVML field {key})"
    if kind == "call":
        return f"{key} ({CALL_FUNCTIONS.get(key, key)})"
    if kind == "samples":
        return f"{key} (nvmlDeviceGetSamples)"
    return source


def field_stamp(ts_us: int, latency_us: int, t0: int, t1: int):
    """(t_real_ns, latency_ns) of a field value: NVML's stamp +- its latency, inside [t0, t1]."""
    ts, lat = ts_us * 1000, max(int(latency_us), 0) * 1000
    lo, hi = max(ts - lat, t0), min(ts + lat + STAMP_RESOLUTION_NS, t1)
    if ts_us <= 0 or lo > hi:
        lo, hi = t0, t1
    return (lo + hi) // 2, (hi - lo + 1) // 2


def bracket(t0: int, t1: int):
    """Midpoint and half-width of a [t0, t1] REALTIME bracket, in ns."""
    return (t0 + t1) // 2, (t1 - t0 + 1) // 2


class NvmlDecoder:
    """Raw NVML records -> rows; remembers what it has seen to drop repeats.

    ``decode`` returns problems as ``[(gpu, source, nvmlReturn), ...]``, source being
    ``field:<id>``, ``call:<what>`` or ``samples:<what>``; the caller decides whether to
    stop asking (PERMANENT) and what to say.
    """

    def __init__(self):
        self._last_field = {}      # (gpu, nvml field id) -> (timestamp_us, raw hex)
        self._last_sample = {}     # (gpu, what) -> timeStamp_us of the newest sample seen
        self.repeats = 0           # cached field values seen again and skipped

    def decode(self, records, out) -> list:
        problems = []
        for rec in records:
            op = rec["op"]
            if op == "fields":
                self._fields(rec, out, problems)
            elif op == "call":
                self._call(rec, out, problems)
            elif op == "samples":
                self._samples(rec, out, problems)
        return problems

    def _fields(self, rec, out, problems):
        gpu = rec["gpu"]
        if rec["ret"] != SUCCESS:
            problems.extend((gpu, f"field:{v[0]}", rec["ret"]) for v in rec["values"])
            return
        t0, t1 = rec["t0"], rec["t1"]
        for fid, _scope, ts_us, lat_us, vtype, ret, raw in rec["values"]:
            if ret != SUCCESS:
                problems.append((gpu, f"field:{fid}", ret))
                continue
            spec = FIELD_VALUES.get(fid)
            if spec is None:
                continue
            name, scale, window = spec
            key = (gpu, fid)
            if self._last_field.get(key) == (ts_us, raw) and ts_us > 0:
                self.repeats += 1
                continue
            self._last_field[key] = (ts_us, raw)
            t, lat = field_stamp(ts_us, lat_us, t0, t1)
            out.add(gpu, FIELD_BY_NAME[name], t, lat, rec["recv"],
                    float(unpack_value(vtype, raw)) * scale, window)

    def _call(self, rec, out, problems):
        gpu, what = rec["gpu"], rec["what"]
        if rec["ret"] != SUCCESS:
            problems.append((gpu, f"call:{what}", rec["ret"]))
            return
        t0, t1, recv, value = rec["t0"], rec["t1"], rec["recv"], rec["value"]
        mid, half = bracket(t0, t1)
        if what in SCALAR_CALLS:
            name, scale = SCALAR_CALLS[what]
            out.add(gpu, FIELD_BY_NAME[name], mid, half, recv, float(value) * scale, 0)
        elif what == "memory":
            _total, free, used = value
            out.add(gpu, FIELD_BY_NAME["mem_used"], mid, half, recv, float(used), 0)
            out.add(gpu, FIELD_BY_NAME["mem_free"], mid, half, recv, float(free), 0)
        elif what == "util_rates":
            gpu_util, mem_util = value
            for name, v in (("gpu_util", gpu_util), ("mem_util", mem_util)):
                out.add(gpu, FIELD_BY_NAME[name], mid, half, recv, float(v), UTIL_RATES_WINDOW_NS)
        elif what in ("pcie_tx", "pcie_rx"):
            lo = min(t0 + PCIE_THROUGHPUT_WINDOW_NS, t1)
            end, end_half = bracket(lo, t1)
            name = "pcie_tx_kbps" if what == "pcie_tx" else "pcie_rx_kbps"
            out.add(gpu, FIELD_BY_NAME[name], end, end_half, recv, float(value),
                    PCIE_THROUGHPUT_WINDOW_NS)

    def _samples(self, rec, out, problems):
        gpu, what = rec["gpu"], rec["what"]
        if rec["ret"] == ERROR_NOT_FOUND:      # no sample newer than the last one asked for
            return
        if rec["ret"] != SUCCESS:
            problems.append((gpu, f"samples:{what}", rec["ret"]))
            return
        fid = FIELD_BY_NAME[SAMPLE_STREAMS[what][1]]
        key = (gpu, what)
        prev = self._last_sample.get(key)
        vtype = rec["value_type"]
        for ts_us, raw in sorted(rec["samples"]):
            if prev is not None and ts_us <= prev:
                continue
            if prev is not None:
                # the first sample ever seen has no start of its window, so it is not kept
                out.add(gpu, fid, ts_us * 1000, STAMP_RESOLUTION_NS, rec["recv"],
                        float(unpack_value(vtype, raw)), (ts_us - prev) * 1000)
            prev = ts_us
        if prev is not None:
            self._last_sample[key] = prev


class ProblemPolicy:
    """What to do about failed NVML answers: drop, give up on a GPU, or keep asking.

    ``handle(problems)`` returns the (gpu, source) items to stop asking for; notices
    (said once each), the unsupported list and lost GPUs accumulate on the object.

        drop = policy.handle([(0, "field:143", ERROR_NOT_SUPPORTED)])   # [(0, "field:143")]
    """

    def __init__(self):
        self.notices = []         # [(level, text)], drained by the backend
        self.unsupported = []     # ["gpu0 remapped_rows_uncorrectable (NVML field 143): ..."]
        self.lost = set()
        self.errors = 0
        self._said = set()

    def handle(self, problems) -> list:
        drop = []
        for gpu, source, code in problems:
            what = source_name(source)
            code_name = RETURN_NAMES.get(code, str(code))
            if code == ERROR_GPU_IS_LOST:
                if gpu not in self.lost:
                    self.lost.add(gpu)
                    self.notices.append(("warning", f"NVML reports GPU {gpu} lost (GPU_IS_LOST); "
                                                    "its counters stop here"))
            elif code in PERMANENT:
                drop.append((gpu, source))
                if (gpu, source) not in self._said:
                    self._said.add((gpu, source))
                    self.unsupported.append(f"gpu{gpu} {what}: {code_name}")
                    verb = "does not support" if code == ERROR_NOT_SUPPORTED else "refused"
                    self.notices.append(("info", f"NVML {verb} {what} on GPU {gpu} "
                                                 f"({code_name}); it is not asked again"))
            else:
                self.errors += 1
                if (gpu, source, code) not in self._said:
                    self._said.add((gpu, source, code))
                    self.notices.append(("warning", f"NVML failed reading {what} on GPU {gpu} "
                                                    f"({code_name}); still asking"))
        return drop
