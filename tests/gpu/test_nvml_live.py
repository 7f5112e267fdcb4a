"""NVML counters on a real GPU: 1 s at 10 ms through the real sampler and run file."""
import time

import numpy as np
import pytest

from clockalign.capture.gpu.counters import CounterSampler, gpu_inventory
from clockalign.capture.gpu.counters.nvml import NvmlBackend, nvml_status
from clockalign.store.counter_fields import FIELD_BY_NAME, FIELDS
from clockalign.store.reader import RunReader
from clockalign.store.schema import Chunk
from clockalign.store.writer import RunWriter

pytestmark = pytest.mark.gpu

_OK, _REASON = nvml_status()
if not _OK:
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason=_REASON)]


def _real_minus_mono():
    a = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    r = time.clock_gettime_ns(time.CLOCK_REALTIME)
    b = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    return r - (a + b) // 2


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    path = tmp_path_factory.mktemp("nvml") / "run.ca"
    backend = NvmlBackend(gpus=[0])
    start_real = time.clock_gettime_ns(time.CLOCK_REALTIME)
    start_mono = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    with RunWriter(path, {"test": "nvml_live"}) as w:
        sampler = CounterSampler(w, backend, interval_s=0.01)
        sampler.start()
        time.sleep(1.0)
        sampler.stop()
        backend.close()
        stats = sampler.stats()
    end_mono = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    end_real = time.clock_gettime_ns(time.CLOCK_REALTIME)
    run = RunReader(path)
    print("sampler stats:", stats)
    return {"stats": stats, "cols": run.columns(Chunk.COUNTERS), "run": run,
            "start_real": start_real, "end_real": end_real, "start_mono": start_mono,
            "end_mono": end_mono}


def test_sampled_at_10ms(recording):
    st = recording["stats"]
    assert st["backend"] == "nvml" and st["interval_s"] == 0.01
    assert 80 <= st["samples"] <= 102, st
    assert st["samples"] + st["skipped"] >= 95, st
    # measured on the H200 test host: 1-2 of 100 (slow reads are spread over ticks)
    assert st["missed_deadlines"] <= 10, st
    assert st["errors"] == 0, recording["run"].rows(Chunk.NOTICES)
    assert st["chunks"] >= 3 and st["chunks"] < st["samples"]


def test_fields_present_and_plausible(recording):
    cols = recording["cols"]
    seen = {FIELDS[int(f)][0] for f in np.unique(cols["field"])}
    for need in ("sm_clock", "mem_clock", "mem_used", "mem_free", "gpu_temp",
                 "clock_event_reasons"):
        assert need in seen, seen
    assert {"power", "power_avg"} & seen
    assert "gpu_util" in seen, "neither nvmlDeviceGetSamples nor GetUtilizationRates gave data"

    def vals(name):
        return cols["value"][cols["field"] == FIELD_BY_NAME[name]]
    assert np.all((vals("sm_clock") > 0) & (vals("sm_clock") < 5000))
    assert np.all((vals("gpu_temp") > 0) & (vals("gpu_temp") < 120))
    assert np.all((vals("gpu_util") >= 0) & (vals("gpu_util") <= 100))
    assert np.all(vals("mem_free") > 0)
    for p in ("power", "power_avg"):
        if p in seen:
            assert np.all((vals(p) > 10) & (vals(p) < 2000))
    # the fast items come every tick
    assert len(vals("sm_clock")) >= 0.9 * recording["stats"]["samples"]


def test_timestamps_monotone_and_inside_the_recording(recording):
    cols = recording["cols"]
    assert np.all(np.diff(cols["recv_mono_ns"]) >= 0)
    assert cols["recv_mono_ns"].min() >= recording["start_mono"]
    assert cols["recv_mono_ns"].max() <= recording["end_mono"]
    # utilisation samples reach up to 2 s back (their first window); others start with us
    assert cols["t_real_ns"].min() >= recording["start_real"] - 3_000_000_000
    assert cols["t_real_ns"].max() <= recording["end_real"]
    offset = _real_minus_mono()
    recv_real = cols["recv_mono_ns"] + offset
    # a value is taken before it is received (1 ms slack for the REALTIME/MONOTONIC snapshot)
    assert np.all(cols["t_real_ns"] - cols["latency_ns"] <= recv_real + 1_000_000)
    for fid in np.unique(cols["field"]):
        t = cols["t_real_ns"][cols["field"] == fid]
        assert np.all(np.diff(t) >= 0), FIELDS[int(fid)][0]


def test_latency_recorded(recording):
    cols = recording["cols"]
    lat = cols["latency_ns"]
    assert np.all(lat >= 0)
    assert np.all(lat < 100_000_000)
    sm = cols["field"] == FIELD_BY_NAME["sm_clock"]         # call-stamped: half the bracket
    assert np.all(lat[sm] > 0) and np.median(lat[sm]) < 1_000_000
    windows = cols["window_ns"][cols["field"] == FIELD_BY_NAME["gpu_util"]]
    assert np.all(windows > 0)


def test_inventory():
    gpus, why = gpu_inventory()
    assert why is None and gpus
    g = gpus[0]
    assert g["index"] == 0 and "NVIDIA" in g["name"] and g["uuid"].startswith("GPU-")
    assert g["memory_total"] > 1 << 30 and g["driver"] and ":" in g["pci_bus_id"]


def test_xid_watcher_starts_and_stops(tmp_path):
    backend = NvmlBackend(gpus=[0])
    with RunWriter(tmp_path / "ev.ca", {}) as w:
        backend.start_events(w)
        t = time.monotonic()
        backend.stop_events()
        assert time.monotonic() - t < 3.0
        notices = backend.drain_notices()
    backend.close()
    watcher = backend._events
    assert watcher.registered == [0] or notices, "no Xid registration and no notice saying why"
