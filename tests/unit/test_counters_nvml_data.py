"""NVML decoding on real answers captured from a GPU host (tests/data/nvml/).

The files come from scripts/data/capture_nvml.py run on the H200 test host; they are
the raw records NvmlReader produced there, replayed here through the recorder's own
decoder, problem policy and sampler.  CLOCKALIGN_NVML_TESTDATA points at another folder.
"""
import json
import os
import time
from pathlib import Path

import numpy as np
import pytest

from clockalign.capture.gpu.counters import CounterSampler, RowBuffer
from clockalign.capture.gpu.counters import nvml_decode
from clockalign.capture.gpu.counters.nvml_decode import NvmlDecoder, ProblemPolicy
from clockalign.store.counter_fields import (COUNTER_COLUMNS, COUNTER_MODULUS, FIELD_BY_NAME,
                                             FIELDS, unwrap_counter)
from clockalign.store.reader import RunReader
from clockalign.store.schema import Chunk
from clockalign.store.writer import RunWriter

DATA = Path(os.environ.get("CLOCKALIGN_NVML_TESTDATA",
                           Path(__file__).resolve().parents[1] / "data" / "nvml"))
CAPTURE = DATA / "nvml_capture.json"

pytestmark = pytest.mark.skipif(
    not CAPTURE.is_file(),
    reason="no NVML capture committed under tests/data/nvml (run "
           "scripts/data/capture_nvml.py on a GPU host)")

# What a healthy datacenter GPU can report (stored units).
RANGES = {
    "sm_clock": (0, 5000), "mem_clock": (0, 20000), "gpu_util": (0, 100), "mem_util": (0, 100),
    "gpu_temp": (0, 120), "mem_temp": (0, 130), "power": (1, 2000), "power_avg": (1, 2000),
    "power_limit": (50, 2000), "mem_used": (0, 1 << 40), "mem_free": (0, 1 << 40),
}


def _load(name):
    path = DATA / name
    if not path.is_file():
        pytest.skip(f"{path} not captured")
    with open(path) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def capture():
    return _load("nvml_capture.json")


@pytest.fixture(scope="module")
def idle():
    return _load("burst_idle.json")


@pytest.fixture(scope="module")
def load():
    return _load("burst_load.json")


def _decode(records):
    rows, dec, pol = RowBuffer(), NvmlDecoder(), ProblemPolicy()
    problems = dec.decode(records, rows)
    pol.handle(problems)
    return rows.columns(), problems, pol, dec


def _values(cols, name, gpu=None):
    m = cols["field"] == FIELD_BY_NAME[name]
    if gpu is not None:
        m &= cols["gpu"] == gpu
    return cols["t_real_ns"][m], cols["value"][m], cols["latency_ns"][m], cols["window_ns"][m]


def test_capture_header_and_inventory(capture):
    assert capture["format"] == "clockalign-nvml-capture" and capture["version"] == 1
    inv = capture["inventory"]
    assert inv, "no GPU in the capture"
    for g in inv:
        for key in ("index", "name", "uuid", "pci_bus_id", "driver", "memory_total"):
            assert key in g
    assert len(capture["survey"]) >= 1


def test_survey_decodes_with_plausible_values(capture):
    for s in capture["survey"]:
        recs = [s["fields_together"]] + list(s["calls"].values())
        cols, problems, pol, _ = _decode(recs)
        for gpu, source, code in problems:
            assert code in nvml_decode.RETURN_NAMES, (source, code)
        for name, (lo, hi) in RANGES.items():
            _, v, _, _ = _values(cols, name)
            assert np.all((v >= lo) & (v <= hi)), (name, v)
        # every NOT_SUPPORTED answer became one line of the unsupported list
        ns = {src for _, src, code in problems if code in nvml_decode.PERMANENT}
        assert len(pol.unsupported) == len(ns)


def test_fields_alone_agree_with_fields_together(capture):
    # a field unsupported when asked alone is unsupported in the batch too
    for s in capture["survey"]:
        together = {v[0]: v[5] for v in s["fields_together"]["values"]}
        for rec in s["fields_alone"]:
            fid, ret = rec["values"][0][0], rec["values"][0][5]
            assert (ret == 0) == (together[fid] == 0), fid


def test_field_stamps_open_or_close_a_read_of_latency_inside_the_call(capture, idle):
    # NVML's per-value stamp is inside the call, and the read of latencyUsec it starts or
    # ends fits the call too; the decoder relies on exactly this (field_stamp).
    recs = [s["fields_together"] for s in capture["survey"]]
    recs += [r for s in capture["survey"] for r in s["fields_alone"]]
    recs += [r for r in idle["records"] if r["op"] == "fields"]
    n = 0
    for rec in recs:
        t0, t1 = rec["t0"], rec["t1"]
        for fid, _, ts_us, lat_us, _, ret, _ in rec["values"]:
            if ret != 0 or ts_us == 0:
                continue
            n += 1
            ts, lat = ts_us * 1000, lat_us * 1000
            assert lat >= 0
            assert t0 - 1000 <= ts <= t1 + 1000, (fid, ts - t0, t1 - t0)
            assert ts - lat >= t0 - 1000 or ts + lat <= t1 + 1000, (fid, ts - t0, lat, t1 - t0)
    assert n > 0, "no field value carried an NVML timestamp"


def test_decoded_field_rows_sit_inside_their_call(idle):
    rows = RowBuffer()
    for rec in idle["records"]:
        if rec["op"] != "fields":
            continue
        NvmlDecoder().decode([rec], rows)
        c = rows.take()
        if len(c["gpu"]):
            assert np.all(c["t_real_ns"] - c["latency_ns"] >= rec["t0"] - 1000)
            assert np.all(c["t_real_ns"] + c["latency_ns"] <= rec["t1"] + 1000)


def test_idle_burst_rows(capture, idle):
    cols, problems, pol, dec = _decode(idle["records"])
    assert len(cols["gpu"]) > 0
    assert set(np.unique(cols["field"]).tolist()) <= set(FIELDS)
    for name in ("sm_clock", "mem_clock", "gpu_temp", "mem_used", "mem_free",
                 "clock_event_reasons"):
        t, v, lat, win = _values(cols, name)
        assert len(v) >= len(idle["ticks"]) * 0.9, name
        assert np.all(np.diff(t) > 0), name
        assert np.all((lat > 0) & (lat < 50_000_000)), name
        assert np.all(win == 0)
    t, v, lat, win = _values(cols, "gpu_util")
    if len(v):          # driver utilisation samples: windows between driver stamps
        assert np.all(win > 0) and np.all(np.diff(t) > 0)
        assert np.all(lat == nvml_decode.STAMP_RESOLUTION_NS)
    assert np.all(np.diff(cols["recv_mono_ns"]) >= 0)
    total = {g["index"]: g["memory_total"] for g in capture["inventory"]}
    for gpu in np.unique(cols["gpu"]):
        _, used, _, _ = _values(cols, "mem_used", gpu)
        _, free, _, _ = _values(cols, "mem_free", gpu)
        assert np.all(used + free <= total[int(gpu)] * 1.001)
        assert np.all(used + free >= total[int(gpu)] * 0.90)


def test_running_totals_never_fall(idle):
    bursts = [idle]
    if (DATA / "burst_load.json").is_file():
        bursts.append(_load("burst_load.json"))
    for burst in bursts:
        cols, _, _, _ = _decode(burst["records"])
        for name in ("energy", "pcie_tx_bytes", "pcie_rx_bytes", "power_violation",
                     "thermal_violation", "ecc_sbe_volatile", "ecc_dbe_volatile"):
            for gpu in np.unique(cols["gpu"]):
                _, v, _, _ = _values(cols, name, gpu)
                if FIELD_BY_NAME[name] in COUNTER_MODULUS:
                    assert v.max() < COUNTER_MODULUS[FIELD_BY_NAME[name]]
                    v = unwrap_counter(v, COUNTER_MODULUS[FIELD_BY_NAME[name]])
                assert np.all(np.diff(v) >= 0), name


def test_load_is_visible(idle, load):
    if "error" in load:
        pytest.skip(f"load burst failed on the GPU host: {load['error'][:200]}")
    gpu = load["load_gpu"]
    ci, _, _, _ = _decode(idle["records"])
    cl, _, _, _ = _decode(load["records"])
    marks = dict(load["load_marks"])
    _, ui, _, _ = _values(ci, "gpu_util", gpu)
    t, ul, _, _ = _values(cl, "gpu_util", gpu)
    busy = (t > marks["ready"]) & (t < marks["copies"])
    assert busy.any()
    assert ul[busy].mean() > (ui.mean() if len(ui) else 0) + 30
    tp, pl, _, _ = _values(cl, "power", gpu)
    if len(pl):
        _, pi, _, _ = _values(ci, "power", gpu)
        assert pl[(tp > marks["ready"]) & (tp < marks["copies"])].max() > pi.mean() + 50
    # the copy phase moves 256 MiB each way per round trip: several GB a second
    for name in ("pcie_tx_bytes", "pcie_rx_bytes"):
        t, v, _, _ = _values(cl, name, gpu)
        copy = (t > marks["copies"]) & (t < marks["done"])
        if copy.sum() > 2:
            total = unwrap_counter(v[copy], COUNTER_MODULUS[FIELD_BY_NAME[name]])
            rate = (total[-1] - total[0]) / ((t[copy][-1] - t[copy][0]) / 1e9)
            assert rate > 1e9, (name, rate)


def test_cheap_items_fit_a_10ms_tick(capture):
    # what NvmlReader asks every tick, by the costs measured on the GPU host
    for gpu, costs in capture["costs"].items():
        every_tick = costs["fields_fast"]["median"] + sum(
            costs[w]["median"] for w in ("clock_sm", "clock_mem", "temp_gpu", "memory",
                                         "clock_reasons"))
        assert every_tick < 3_000_000, costs


class ReplayBackend:
    """Replays one captured burst tick by tick through the recorder's decoder."""

    name = "nvml-replay"

    def __init__(self, burst):
        self.ticks = []
        recs = iter(burst["records"])
        for _, _, _, n in burst["ticks"]:
            self.ticks.append([next(recs) for _ in range(n)])
        self.decoder, self.policy = NvmlDecoder(), ProblemPolicy()
        self.i = 0

    def sample(self, rows):
        if self.i < len(self.ticks):
            self.policy.handle(self.decoder.decode(self.ticks[self.i], rows))
            self.i += 1

    @property
    def unsupported(self):
        return self.policy.unsupported

    def drain_notices(self):
        out, self.policy.notices = self.policy.notices, []
        return out


def test_replay_through_the_sampler_writes_the_same_rows(tmp_path, idle):
    direct, _, pol, _ = _decode(idle["records"])
    backend = ReplayBackend(idle)
    path = tmp_path / "replay.ca"
    with RunWriter(path, {}) as w:
        s = CounterSampler(w, backend, interval_s=0.01)
        s.start()
        deadline = time.monotonic() + 30
        while backend.i < len(backend.ticks) and time.monotonic() < deadline:
            time.sleep(0.02)
        s.stop()
        stats = s.stats()
    run = RunReader(path)
    cols = run.columns(Chunk.COUNTERS)
    for name, dt in COUNTER_COLUMNS.items():
        assert cols[name].dtype == np.dtype(dt)
        assert np.array_equal(cols[name], direct[name]), name
    assert stats["fields_unsupported"] == pol.unsupported
    texts = [n["text"] for n in run.rows(Chunk.NOTICES)]
    assert len([t for t in texts if "not asked again" in t]) == len(pol.unsupported)


def test_sampler_run_on_the_gpu_host(capture):
    run = capture.get("sampler_run")
    if run is None:
        pytest.skip("capture made with --sampler-s 0")
    st = run["stats"]
    assert st["backend"] == "nvml" and st["samples"] > 0
    assert set(st) >= {"samples", "missed_deadlines", "fields_unsupported"}
    assert run["chunks"] < st["samples"]
    assert "sm_clock" in run["per_field"]
