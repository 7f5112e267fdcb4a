"""Counter field registry, clock-reason decoding, NVML/DCGM value conversions, backend choice."""
import struct

import numpy as np
import pytest

from clockalign.capture.gpu.counters import RowBuffer, available, gpu_inventory, open_backend
from clockalign.capture.gpu.counters import dcgm, nvml_decode
from clockalign.capture.gpu.counters.nvml_decode import NvmlDecoder, ProblemPolicy, unpack_value
from clockalign.errors import ClockalignError
from clockalign.store import counter_fields as cf
from clockalign.store.counter_fields import (CLOCK_REASONS, COUNTER_COLUMNS, COUNTER_MODULUS,
                                             FIELD_BY_NAME, FIELDS, clock_reason_transitions,
                                             decode_clock_reasons, unwrap_counter)

# --- registry -------------------------------------------------------------------------------


def test_field_ids_and_names_unique():
    assert len(FIELD_BY_NAME) == len(FIELDS)
    assert all(isinstance(i, int) and 0 < i < 65536 for i in FIELDS)     # fits the u2 column
    for fid, entry in FIELDS.items():
        assert len(entry) == 4
        name, unit, desc, kind = entry
        assert name.isidentifier() and unit and desc
        assert kind in cf.KINDS, (fid, kind)


def test_first_ids_are_file_format():
    # Ids are file format: these must never change meaning.
    assert FIELDS[1][0] == "sm_clock" and FIELDS[2][0] == "mem_clock"
    assert FIELD_BY_NAME["clock_event_reasons"] == 15
    assert FIELDS[15][3] == "bitmask"


def test_every_backend_mapping_lands_on_a_registered_field():
    for fid, (name, scale, window) in nvml_decode.FIELD_VALUES.items():
        assert name in FIELD_BY_NAME, fid
    for name, _ in nvml_decode.SCALAR_CALLS.values():
        assert name in FIELD_BY_NAME
    for _, name in nvml_decode.SAMPLE_STREAMS.values():
        assert name in FIELD_BY_NAME
    for fid, (name, scale, window) in dcgm.DCGM_FIELDS.items():
        assert name in FIELD_BY_NAME, fid
    # no backend field is read twice in one pass
    assert len(set(nvml_decode.FAST_FIELD_IDS) | set(nvml_decode.SLOW_FIELD_IDS)) == \
        len(nvml_decode.FAST_FIELD_IDS) + len(nvml_decode.SLOW_FIELD_IDS)
    assert set(nvml_decode.FAST_FIELD_IDS) | set(nvml_decode.SLOW_FIELD_IDS) == \
        set(nvml_decode.FIELD_VALUES)


def test_counter_columns_match_the_brief():
    assert list(COUNTER_COLUMNS) == ["gpu", "field", "t_real_ns", "latency_ns", "recv_mono_ns",
                                     "value", "window_ns"]
    assert np.dtype(COUNTER_COLUMNS["gpu"]) == np.uint8
    assert np.dtype(COUNTER_COLUMNS["field"]) == np.uint16
    for c in ("t_real_ns", "latency_ns", "recv_mono_ns", "window_ns"):
        assert np.dtype(COUNTER_COLUMNS[c]) == np.int64
    assert np.dtype(COUNTER_COLUMNS["value"]) == np.float64


def test_mirrored_nvml_constants_match_pynvml():
    pynvml = pytest.importorskip("pynvml")
    assert nvml_decode.ERROR_NOT_SUPPORTED == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert nvml_decode.ERROR_NOT_FOUND == pynvml.NVML_ERROR_NOT_FOUND
    assert nvml_decode.ERROR_GPU_IS_LOST == pynvml.NVML_ERROR_GPU_IS_LOST
    assert nvml_decode.ERROR_FUNCTION_NOT_FOUND == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    names = {pynvml.NVML_FI_DEV_POWER_INSTANT: "power", pynvml.NVML_FI_DEV_POWER_AVERAGE:
             "power_avg", pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION: "energy",
             pynvml.NVML_FI_DEV_MEMORY_TEMP: "mem_temp",
             pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES: "pcie_tx_bytes",
             pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES: "pcie_rx_bytes",
             pynvml.NVML_FI_DEV_PERF_POLICY_POWER: "power_violation",
             pynvml.NVML_FI_DEV_PERF_POLICY_THERMAL: "thermal_violation",
             pynvml.NVML_FI_DEV_POWER_CURRENT_LIMIT: "power_limit",
             pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER: "pcie_replays",
             pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL: "ecc_sbe_volatile",
             pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL: "ecc_dbe_volatile",
             pynvml.NVML_FI_DEV_ECC_SBE_AGG_TOTAL: "ecc_sbe_aggregate",
             pynvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL: "ecc_dbe_aggregate",
             pynvml.NVML_FI_DEV_RETIRED_SBE: "retired_pages_sbe",
             pynvml.NVML_FI_DEV_RETIRED_DBE: "retired_pages_dbe",
             pynvml.NVML_FI_DEV_RETIRED_PENDING: "retired_pages_pending",
             pynvml.NVML_FI_DEV_REMAPPED_COR: "remapped_rows_correctable",
             pynvml.NVML_FI_DEV_REMAPPED_UNC: "remapped_rows_uncorrectable",
             pynvml.NVML_FI_DEV_REMAPPED_PENDING: "remapped_rows_pending",
             pynvml.NVML_FI_DEV_REMAPPED_FAILURE: "remapped_rows_failure"}
    assert {fid: v[0] for fid, v in nvml_decode.FIELD_VALUES.items()} == names
    assert nvml_decode.SAMPLE_STREAMS["gpu_util"][0] == pynvml.NVML_GPU_UTILIZATION_SAMPLES
    assert nvml_decode.SAMPLE_STREAMS["mem_util"][0] == pynvml.NVML_MEMORY_UTILIZATION_SAMPLES
    for code, fmt in nvml_decode.VALUE_FORMATS.items():
        assert code < pynvml.NVML_VALUE_TYPE_COUNT
    reasons = {pynvml.nvmlClocksThrottleReasonGpuIdle: "gpu_idle",
               pynvml.nvmlClocksThrottleReasonSwPowerCap: "sw_power_cap",
               pynvml.nvmlClocksThrottleReasonHwSlowdown: "hw_slowdown",
               pynvml.nvmlClocksThrottleReasonSyncBoost: "sync_boost",
               pynvml.nvmlClocksThrottleReasonSwThermalSlowdown: "sw_thermal",
               pynvml.nvmlClocksThrottleReasonHwThermalSlowdown: "hw_thermal",
               pynvml.nvmlClocksThrottleReasonHwPowerBrakeSlowdown: "hw_power_brake",
               pynvml.nvmlClocksThrottleReasonApplicationsClocksSetting: "app_clocks_setting",
               pynvml.nvmlClocksThrottleReasonDisplayClockSetting: "display_clock_setting"}
    for bit, name in reasons.items():
        assert CLOCK_REASONS[bit] == name


def test_unwrap_32bit_counter():
    m = COUNTER_MODULUS[FIELD_BY_NAME["pcie_tx_bytes"]]
    assert m == 1 << 32 and FIELDS[FIELD_BY_NAME["pcie_rx_bytes"]][3] == "counter"
    raw = np.array([m - 100, m - 10, 5, 3_000_000_000, 20], dtype=np.float64)
    total = unwrap_counter(raw, m)
    assert total.dtype == np.int64
    assert list(np.diff(total)) == [90, 15, 2_999_999_995, m - 3_000_000_000 + 20]
    assert list(unwrap_counter([7.0], m)) == [7]


# --- clock event reasons ---------------------------------------------------------------------


def test_decode_clock_reasons():
    assert decode_clock_reasons(0) == []
    assert decode_clock_reasons(0x1) == ["gpu_idle"]
    assert decode_clock_reasons(0x4 | 0x40) == ["sw_power_cap", "hw_thermal"]
    assert decode_clock_reasons(0x20 | 0x80 | 0x8) == ["hw_slowdown", "sw_thermal",
                                                       "hw_power_brake"]
    assert decode_clock_reasons(0x1000) == ["bit_0x1000"]
    assert decode_clock_reasons(np.float64(4.0)) == ["sw_power_cap"]   # as stored in a chunk


def test_clock_reason_transitions_tell_when_capping_started():
    t = np.array([10, 20, 30, 40, 50, 60])
    m = np.array([0x1, 0x0, 0x4, 0x4 | 0x40, 0x40, 0x0], dtype=np.float64)
    tr = clock_reason_transitions(t, m)
    assert tr == [(30, "sw_power_cap", True), (40, "hw_thermal", True),
                  (50, "sw_power_cap", False), (60, "hw_thermal", False)]
    # gpu_idle is not capping; asked for explicitly it shows
    assert clock_reason_transitions(t, m, bits=0x1) == [(10, "gpu_idle", True),
                                                       (20, "gpu_idle", False)]
    assert clock_reason_transitions([], []) == []


# --- NVML decoding (hand-packed nvmlValue_t bytes; real captures: test_counters_nvml_data) ---


def _hex(fmt, v):
    return struct.pack(fmt, v).ljust(8, b"\0").hex()


def test_unpack_value_by_nvml_value_type():
    assert unpack_value(0, _hex("<d", 1.5)) == 1.5
    assert unpack_value(1, _hex("<I", 123456)) == 123456
    assert unpack_value(3, _hex("<Q", 2 ** 40 + 3)) == 2 ** 40 + 3
    assert unpack_value(4, _hex("<q", -5)) == -5
    assert unpack_value(5, _hex("<i", -7)) == -7
    assert unpack_value(6, _hex("<H", 65535)) == 65535
    with pytest.raises(ValueError):
        unpack_value(9, "00" * 8)


def test_field_values_keep_nvml_timestamp_and_latency_and_convert_units():
    rows = RowBuffer()
    dec = NvmlDecoder()
    rec = {"op": "fields", "gpu": 0, "t0": 1_700_000_000_000_000_000,
           "t1": 1_700_000_000_000_050_000, "recv": 5_000, "ret": 0,
           "values": [[186, 0, 1_700_000_000_000_010, 7, 1, 0, _hex("<I", 123456)],
                      [185, 0, 1_700_000_000_000_011, 7, 1, 0, _hex("<I", 100000)],
                      [143, 0, 0, 0, 0, 3, "00" * 8],
                      [83, 0, 0, 0, 3, 0, _hex("<Q", 999)]]}
    problems = dec.decode([rec], rows)
    assert problems == [(0, "field:143", 3)]
    c = rows.columns()
    power = c["field"] == FIELD_BY_NAME["power"]
    assert c["value"][power][0] == pytest.approx(123.456)           # mW -> W
    # read within [ts - 7 µs, ts + 8 µs], clipped to the call: its midpoint, half its width
    assert c["t_real_ns"][power][0] == 1_700_000_000_000_010_000 + 500
    assert c["latency_ns"][power][0] == 7500
    assert c["window_ns"][power][0] == 0
    # a stamp near the call's start is clipped to it
    t, lat = nvml_decode.field_stamp(1_700_000_000_000_001, 5, 1_700_000_000_000_000_000,
                                     1_700_000_000_000_050_000)
    assert t - lat == 1_700_000_000_000_000_000 and t + lat >= 1_700_000_000_000_007_000
    avg = c["field"] == FIELD_BY_NAME["power_avg"]
    assert c["window_ns"][avg][0] == 1_000_000_000
    energy = c["field"] == FIELD_BY_NAME["energy"]
    # no NVML timestamp: the call bracket's midpoint, half of it as latency
    assert c["t_real_ns"][energy][0] == 1_700_000_000_000_025_000
    assert c["latency_ns"][energy][0] == 25_000
    assert set(c["recv_mono_ns"]) == {5_000}
    # the same cached value again (same timestamp) is not stored twice
    dec.decode([rec], rows)
    again = rows.columns()
    assert (again["field"] == FIELD_BY_NAME["power"]).sum() == 1
    assert dec.repeats == 2


def test_call_values_are_stamped_with_the_bracket_midpoint():
    rows = RowBuffer()
    recs = [{"op": "call", "gpu": 1, "what": "clock_sm", "t0": 1000, "t1": 3001, "recv": 9,
             "ret": 0, "value": 1980},
            {"op": "call", "gpu": 1, "what": "memory", "t0": 10, "t1": 20, "recv": 9, "ret": 0,
             "value": [100, 30, 70]},
            {"op": "call", "gpu": 1, "what": "pcie_tx", "t0": 0, "t1": 30_000_000, "recv": 9,
             "ret": 0, "value": 512},
            {"op": "call", "gpu": 1, "what": "temp_gpu", "t0": 0, "t1": 1, "recv": 9, "ret": 3,
             "value": None}]
    problems = NvmlDecoder().decode(recs, rows)
    assert problems == [(1, "call:temp_gpu", 3)]
    c = rows.columns()
    sm = c["field"] == FIELD_BY_NAME["sm_clock"]
    assert c["t_real_ns"][sm][0] == 2000 and c["latency_ns"][sm][0] == 1001
    used = c["field"] == FIELD_BY_NAME["mem_used"]
    assert c["value"][used][0] == 70
    tx = c["field"] == FIELD_BY_NAME["pcie_tx_kbps"]
    # window (20 ms) ends somewhere in [20 ms, 30 ms]
    assert c["t_real_ns"][tx][0] == 25_000_000 and c["latency_ns"][tx][0] == 5_000_000
    assert c["window_ns"][tx][0] == 20_000_000


def test_utilisation_samples_become_windows_between_driver_stamps():
    rows = RowBuffer()
    dec = NvmlDecoder()
    rec = {"op": "samples", "gpu": 0, "what": "gpu_util", "t0": 0, "t1": 0, "recv": 1, "ret": 0,
           "value_type": 1, "samples": [[1000, _hex("<I", 10)], [1166, _hex("<I", 20)],
                                        [1333, _hex("<I", 30)]]}
    dec.decode([rec], rows)
    c = rows.take()
    assert list(c["value"]) == [20, 30]             # the first only opens a window
    assert list(c["t_real_ns"]) == [1_166_000, 1_333_000]
    assert list(c["window_ns"]) == [166_000, 167_000]
    more = dict(rec, samples=[[1333, _hex("<I", 30)], [1500, _hex("<I", 40)]])
    dec.decode([more], rows)
    c = rows.take()
    assert list(c["value"]) == [40] and list(c["window_ns"]) == [167_000]
    nothing_new = dict(rec, ret=nvml_decode.ERROR_NOT_FOUND, samples=[])
    assert dec.decode([nothing_new], rows) == [] and len(rows) == 0


def test_problem_policy_drops_permanent_failures_once_and_retries_others():
    pol = ProblemPolicy()
    drop = pol.handle([(0, "field:143", 3), (0, "field:143", 3), (0, "call:clock_sm", 999),
                       (1, "samples:gpu_util", 4)])
    assert drop == [(0, "field:143"), (0, "field:143"), (1, "samples:gpu_util")]
    assert len(pol.unsupported) == 2
    assert "remapped_rows_uncorrectable (NVML field 143)" in pol.unsupported[0]
    assert pol.errors == 1
    texts = [t for _, t in pol.notices]
    assert sum("not asked again" in t for t in texts) == 2
    assert sum("still asking" in t for t in texts) == 1
    pol.handle([(0, "call:clock_sm", 999)])
    assert pol.errors == 2 and len(pol.notices) == 3      # said once
    pol.handle([(2, "field:186", nvml_decode.ERROR_GPU_IS_LOST)])
    assert pol.lost == {2}


# --- DCGM conversions (not verified against a live host engine) --------------------------


def test_dcgm_timestamps_windows_and_units():
    rows = RowBuffer()
    ts = 1_700_000_000_123_456
    vals = [(0, 1002, ts, 0.42),              # PROF_SM_ACTIVE ratio over the watch window
            (0, 100, ts + 1, 1980),           # SM clock, instant
            (0, 252, ts + 2, 1024),           # FB_USED MiB -> bytes
            (0, 155, ts + 3, 350.5),          # POWER_USAGE: 1 s average
            (0, 1009, ts + 4, 3.0e9)]         # PROF_PCIE_TX_BYTES B/s
    xids, problems = dcgm.decode_dcgm_values(vals, rows, recv_mono_ns=77,
                                             watch_ns=100_000_000)
    assert xids == [] and problems == []
    c = rows.columns()
    by = {int(f): i for i, f in enumerate(c["field"])}
    i = by[FIELD_BY_NAME["sm_active"]]
    assert c["t_real_ns"][i] == ts * 1000 and c["window_ns"][i] == 100_000_000
    assert c["value"][i] == pytest.approx(0.42) and c["latency_ns"][i] == 1000
    assert c["window_ns"][by[FIELD_BY_NAME["sm_clock"]]] == 0
    assert c["value"][by[FIELD_BY_NAME["mem_used"]]] == 1024 * 1024 * 1024
    assert c["window_ns"][by[FIELD_BY_NAME["power_avg"]]] == 1_000_000_000
    assert c["window_ns"][by[FIELD_BY_NAME["pcie_tx_rate"]]] == 100_000_000
    assert set(c["recv_mono_ns"]) == {77}


def test_dcgm_placeholders_xids_and_old_cache():
    rows = RowBuffer()
    vals = [(0, 150, 2_000_000, dcgm.INT64_BLANK),           # blank: skipped silently
            (0, 393, 2_000_000, dcgm.INT64_BLANK + 2),       # not supported: reported
            (1, 1004, 2_000_000, dcgm.FP64_BLANK + 3.0),     # no permission: reported
            (0, 230, 2_500_000, 79),                         # Xid 79
            (0, 100, 999_999, 1500)]                         # before the recording: dropped
    xids, problems = dcgm.decode_dcgm_values(vals, rows, 5, 100_000_000, since_us=1_000_000)
    assert len(rows) == 0
    assert problems == [(0, 393, "not_supported"), (1, 1004, "no_permission")]
    assert xids == [{"source": "dcgm", "gpu": 0, "type": "xid", "code": 79, "t_mono_ns": None,
                     "t_real_ns": 2_500_000_000, "unc_ns": 100_000_000, "recv_mono_ns": 5}]
    assert dcgm.classify(0.5) == "ok" and dcgm.classify(7) == "ok"
    assert dcgm.classify(None) == "blank"
    assert dcgm.classify(dcgm.INT64_BLANK + 1) == "not_found"


def test_dcgm_field_sets():
    assert dcgm.XID_FIELD in dcgm.MAIN_FIELD_IDS
    assert {1002, 1003, 1004, 1005, 1009, 1010, 1011, 1012} <= set(dcgm.PROF_FIELD_IDS)
    assert set(dcgm.PROF_CORE_IDS) <= set(dcgm.PROF_FIELD_IDS)
    assert not set(dcgm.PROF_FIELD_IDS) & set(dcgm.MAIN_FIELD_IDS)
    assert all(d.endswith("bindings/python3") for d in dcgm.BINDING_DIRS)


# --- choosing a backend ---------------------------------------------------------------------


def _nvml_works():
    return available()["nvml"][0]


@pytest.mark.skipif(_nvml_works(), reason="NVML works here; the failure path needs a host without it")
def test_open_nvml_without_a_driver_fails_with_one_sentence():
    with pytest.raises(ClockalignError) as e:
        open_backend("nvml")
    msg = str(e.value)
    assert msg.startswith("NVML is not usable: ")
    assert "\n" not in msg and msg.count(". ") == 0
    assert e.value.exit_code != 0
    gpus, why = gpu_inventory()
    assert gpus == [] and why == msg


def test_open_backend_choices():
    assert open_backend("none") is None
    with pytest.raises(ClockalignError, match="unknown counter backend 'nvlm'"):
        open_backend("nvlm")
    status = available()
    assert set(status) == {"nvml", "dcgm"}
    for ok, reason in status.values():
        assert isinstance(ok, bool) and reason and "\n" not in reason
    if not status["dcgm"][0]:
        with pytest.raises(ClockalignError, match="^DCGM is not usable: "):
            open_backend("dcgm")
    if not status["dcgm"][0] and not status["nvml"][0]:
        with pytest.raises(ClockalignError, match="^no GPU counter backend is usable: DCGM"):
            open_backend("auto")
