"""GPU counter fields stored in COUNTERS chunks: ids, units, meaning, and how to read them.

A COUNTERS chunk holds one row per value taken (columns in COUNTER_COLUMNS).  ``field``
is an id from FIELDS; ids are part of the file format: a retired id is never reused,
and a new field takes the next free number.  Units are the stored units, after the
recorder converted NVML/DCGM's own (mW -> W, MiB -> bytes); NVML's PCIe throughput is
kept in NVML's KB/s because NVML does not say whether its KB is 1000 or 1024 bytes.

``kind`` says how a value relates to time:

- ``gauge``: the value at ``t_real_ns`` (``window_ns`` = 0).
- ``average``: the mean over [t_real_ns - window_ns, t_real_ns].
- ``counter``: a running total; only differences between rows mean something.
- ``bitmask``: flags valid at ``t_real_ns`` (clock event reasons: decode_clock_reasons).

    cols = run.columns(Chunk.COUNTERS)
    sm = cols["field"] == FIELD_BY_NAME["sm_clock"]
    reasons = cols["value"][cols["field"] == FIELD_BY_NAME["clock_event_reasons"]]
"""
import numpy as np

# id: (name, unit, description, kind)
FIELDS = {
    1: ("sm_clock", "MHz", "SM clock", "gauge"),
    2: ("mem_clock", "MHz", "memory clock", "gauge"),
    3: ("gpu_util", "%", "time one or more kernels ran, over the driver's sample period", "average"),
    4: ("mem_util", "%", "time device memory was read or written, over the driver's sample period",
        "average"),
    5: ("mem_used", "bytes", "device memory in use", "gauge"),
    6: ("mem_free", "bytes", "device memory free", "gauge"),
    7: ("power", "W", "board power draw, instantaneous", "gauge"),
    8: ("power_avg", "W", "board power draw averaged by the driver over 1 s", "average"),
    9: ("gpu_temp", "C", "GPU die temperature", "gauge"),
    10: ("mem_temp", "C", "HBM temperature", "gauge"),
    11: ("pcie_tx_kbps", "KB/s", "PCIe transmit throughput (NVML, 20 ms window)", "average"),
    12: ("pcie_rx_kbps", "KB/s", "PCIe receive throughput (NVML, 20 ms window)", "average"),
    13: ("pcie_tx_bytes", "bytes", "PCIe bytes transmitted (running count, wraps at 2^32)",
         "counter"),
    14: ("pcie_rx_bytes", "bytes", "PCIe bytes received (running count, wraps at 2^32)",
         "counter"),
    15: ("clock_event_reasons", "bitmask", "why clocks are below maximum (CLOCK_REASONS bits)",
         "bitmask"),
    16: ("ecc_sbe_volatile", "count", "corrected ECC errors since driver load", "counter"),
    17: ("ecc_dbe_volatile", "count", "uncorrected ECC errors since driver load", "counter"),
    18: ("ecc_sbe_aggregate", "count", "corrected ECC errors, lifetime", "counter"),
    19: ("ecc_dbe_aggregate", "count", "uncorrected ECC errors, lifetime", "counter"),
    20: ("retired_pages_sbe", "count", "pages retired for repeated corrected errors", "counter"),
    21: ("retired_pages_dbe", "count", "pages retired for uncorrected errors", "counter"),
    22: ("retired_pages_pending", "bool", "a page retirement waits for a reset", "gauge"),
    23: ("remapped_rows_correctable", "count", "rows remapped for corrected errors", "counter"),
    24: ("remapped_rows_uncorrectable", "count", "rows remapped for uncorrected errors", "counter"),
    25: ("remapped_rows_pending", "bool", "a row remap waits for a reset", "gauge"),
    26: ("remapped_rows_failure", "bool", "a row remap failed", "gauge"),
    27: ("energy", "mJ", "energy used since the driver loaded", "counter"),
    28: ("pcie_replays", "count", "PCIe replay count", "counter"),
    29: ("power_limit", "W", "power limit in force", "gauge"),
    30: ("sm_active", "ratio", "fraction of time at least one warp was resident per SM (DCGM)",
         "average"),
    31: ("sm_occupancy", "ratio", "resident warps over the SM maximum (DCGM)", "average"),
    32: ("tensor_active", "ratio", "fraction of cycles the tensor pipes were busy (DCGM)", "average"),
    33: ("dram_active", "ratio", "fraction of cycles device memory was busy (DCGM)", "average"),
    34: ("gr_engine_active", "ratio", "fraction of time the graphics/compute engine was busy (DCGM)",
         "average"),
    35: ("pcie_tx_rate", "B/s", "PCIe transmit rate incl. protocol headers (DCGM)", "average"),
    36: ("pcie_rx_rate", "B/s", "PCIe receive rate incl. protocol headers (DCGM)", "average"),
    37: ("nvlink_tx_rate", "B/s", "NVLink transmit rate (DCGM)", "average"),
    38: ("nvlink_rx_rate", "B/s", "NVLink receive rate (DCGM)", "average"),
    39: ("power_violation", "ns", "time clocks were held down by the power limit (running total)",
         "counter"),
    40: ("thermal_violation", "ns", "time clocks were held down by temperature (running total)",
         "counter"),
}

FIELD_BY_NAME = {name: fid for fid, (name, _, _, _) in FIELDS.items()}
KINDS = ("gauge", "average", "counter", "bitmask")

# Running counts that NVML hands over in 32 bits: they wrap (seen on an H200 with driver
# 580 during host<->device copies, several times a second).  unwrap_counter restores the
# total as long as less than one modulus passed between two rows: at PCIe Gen5 x16
# (~64 GB/s) that needs a sample at least every ~65 ms.
COUNTER_MODULUS = {13: 1 << 32, 14: 1 << 32}

# Columns of a COUNTERS chunk (little-endian numpy dtype strings).
COUNTER_COLUMNS = {
    "gpu": "u1",             # NVML index (not CUDA_VISIBLE_DEVICES order)
    "field": "<u2",          # id in FIELDS
    "t_real_ns": "<i8",      # CLOCK_REALTIME when the value was taken (end of window if averaged)
    "latency_ns": "<i8",     # how far the true time may be from t_real_ns (capture/gpu/counters)
    "recv_mono_ns": "<i8",   # CLOCK_MONOTONIC when the recorder received the value
    "value": "<f8",
    "window_ns": "<i8",      # averaging window ending at t_real_ns; 0 = instantaneous
}

# NVML clocks event reasons (nvmlClocksEventReason*, formerly ...ThrottleReason*); DCGM's
# DCGM_CLOCKS_EVENT_REASON_* use the same bits.
CLOCK_REASONS = {
    0x001: "gpu_idle",
    0x002: "app_clocks_setting",
    0x004: "sw_power_cap",
    0x008: "hw_slowdown",
    0x010: "sync_boost",
    0x020: "sw_thermal",
    0x040: "hw_thermal",
    0x080: "hw_power_brake",
    0x100: "display_clock_setting",
    0x200: "board_limit",
    0x400: "reliability",
}
CLOCK_REASON_BY_NAME = {name: bit for bit, name in CLOCK_REASONS.items()}

# Bits that mean the GPU is being held down by power or heat (not idle, not a setting).
POWER_CAPPING = 0x004 | 0x080 | 0x200
THERMAL_CAPPING = 0x020 | 0x040
CAPPING = POWER_CAPPING | THERMAL_CAPPING | 0x008


def unwrap_counter(values, modulus):
    """A wrapped running count (time order) as a non-decreasing total from its first value.

        total = unwrap_counter(v, COUNTER_MODULUS[FIELD_BY_NAME["pcie_tx_bytes"]])
    """
    v = np.asarray(values).astype(np.int64)
    if len(v) < 2:
        return v
    steps = np.diff(v)
    steps[steps < 0] += int(modulus)
    return np.concatenate(([v[0]], v[0] + np.cumsum(steps)))


def decode_clock_reasons(mask) -> list:
    """Names of the set bits, lowest bit first; an unknown bit shows as 'bit_0x...'."""
    mask = int(mask)
    names = []
    bit = 1
    while bit <= mask:
        if mask & bit:
            names.append(CLOCK_REASONS.get(bit, f"bit_{bit:#x}"))
        bit <<= 1
    return names


def clock_reason_changes(masks, bits=CAPPING) -> list:
    """Where each reason in ``bits`` switched on or off in a series of reason masks (one
    GPU's clock_event_reasons values in time order): ``[(sample index, bit, name, on)]``
    by bit then index; a reason set in the first sample switches on at sample 0, since
    nothing earlier was seen.

        for i, bit, name, on in clock_reason_changes(m): print(i, name, on)
    """
    masks = np.asarray(masks).astype(np.int64)
    out = []
    if not len(masks):
        return out
    prev = np.concatenate(([0], masks[:-1]))
    for bit, name in CLOCK_REASONS.items():
        if not bits & bit:
            continue
        now = (masks & bit) != 0
        was = (prev & bit) != 0
        out.extend((int(i), bit, name, bool(now[i])) for i in np.flatnonzero(now != was))
    return out


def clock_reason_transitions(t_ns, masks, bits=CAPPING) -> list:
    """When each reason in ``bits`` switched on or off, from a series of reason masks.

    ``t_ns`` and ``masks`` are one GPU's clock_event_reasons rows in time order.  Returns
    ``[(t_on_or_off, name, True/False), ...]``; a reason already set in the first sample
    is reported as switching on at that sample, since nothing earlier was seen.

        for t, name, on in clock_reason_transitions(t, m): print(t, name, "on" if on else "off")
    """
    t_ns = np.asarray(t_ns, dtype=np.int64)
    out = [(int(t_ns[i]), name, on) for i, _, name, on in clock_reason_changes(masks, bits)]
    out.sort(key=lambda e: (e[0], e[1]))
    return out
