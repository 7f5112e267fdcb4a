"""CPU clock sandwiches and the clock-probe thread, on the real clocks (no mocks)."""
import time

import numpy as np
import pytest

from clockalign.capture.clocks import cpuclock
from clockalign.capture.clocks.clockprobe import ClockProbeThread
from clockalign.capture.clocks.gpuclock import gpu_clock_available
from clockalign.store.reader import RunReader
from clockalign.store.schema import Chunk, ClockDomain
from clockalign.store.writer import RunWriter


def test_sandwiches_are_ordered():
    for cid in cpuclock.CLOCK_IDS.values():
        sw = cpuclock.sandwiches(cid, 23)
        assert sw.shape == (23, 3) and sw.dtype == np.int64
        assert np.all(sw[:, 0] <= sw[:, 2])
        assert np.all(np.diff(sw[:, 0]) >= 0)


def test_fastest_of_n_is_chosen():
    sw = cpuclock.sandwiches(time.CLOCK_REALTIME, 16)
    best = cpuclock.fastest(sw)
    widths = sw[:, 2] - sw[:, 0]
    assert best[2] - best[0] == widths.min()
    assert any(np.array_equal(best, row) for row in sw)
    # A hand-made set: the narrow one wins wherever it sits.
    made = np.array([[0, 50, 100], [200, 205, 210], [300, 350, 400]], dtype=np.int64)
    assert np.array_equal(cpuclock.fastest(made), made[1])


def test_round_has_one_fastest_sandwich_per_domain():
    cols = cpuclock.sample_round(reads=16)
    assert list(cols["domain"]) == [int(d) for d in cpuclock.CLOCK_IDS]
    assert cols["domain"].dtype == np.uint8
    for k in ("t0", "remote", "t1"):
        assert cols[k].dtype == np.int64
    assert np.all(cols["t0"] <= cols["t1"])


def test_realtime_offset_matches_time_time_ns():
    """The sandwich's REALTIME-MONOTONIC offset interval overlaps a direct reading of it."""
    t0, remote, t1 = cpuclock.fastest(cpuclock.sandwiches(time.CLOCK_REALTIME, 16))
    lo, hi = remote - t1, remote - t0          # offset = REALTIME - MONOTONIC
    m0 = time.monotonic_ns()
    r = time.time_ns()
    m1 = time.monotonic_ns()
    lo2, hi2 = r - m1, r - m0
    slack = 100  # ns: NTP slewing (<= 500 ppm) over the microseconds between the readings
    assert lo <= hi2 + slack and lo2 <= hi + slack, (lo, hi, lo2, hi2)


def test_monotonic_raw_and_boottime_run_at_monotonic_rate():
    a = cpuclock.sample_round()
    time.sleep(0.05)
    b = cpuclock.sample_round()
    mid_a = (a["t0"] + a["t1"]) // 2
    mid_b = (b["t0"] + b["t1"]) // 2
    for i, d in enumerate(a["domain"]):
        if d == ClockDomain.REALTIME:
            continue   # may be stepped by NTP at any time
        host = int(mid_b[i] - mid_a[i])
        remote = int(b["remote"][i] - a["remote"][i])
        width = int(a["t1"][i] - a["t0"][i] + b["t1"][i] - b["t0"][i])
        # 50 ms at up to 500 ppm of NTP frequency correction is 25 us.
        assert abs(remote - host) <= width + 25_000


def test_clock_info_rows():
    rows = {r["domain"]: r for r in cpuclock.clock_info_rows()}
    assert set(rows) == {"MONOTONIC", "REALTIME", "BOOTTIME", "MONOTONIC_RAW"}
    assert all(r["tick_ns"] >= 1 for r in rows.values())


def _record(tmp_path, seconds, **kw):
    path = tmp_path / "run.ca"
    with RunWriter(path, {"test": True}) as w:
        probe = ClockProbeThread(w, **kw)
        probe.start()
        time.sleep(seconds)
        probe.stop()
    return RunReader(path), probe.stats()


def test_probe_thread_writes_cpu_clock_chunks(tmp_path):
    run, stats = _record(tmp_path, 0.5, gpu=False, cpu_period_s=0.02, flush_period_s=0.1)
    assert run.clean
    cols = run.columns(Chunk.CPU_CLOCK)
    assert set(cols) == {"domain", "t0", "remote", "t1"}
    assert cols["domain"].dtype == np.uint8 and cols["t0"].dtype == np.int64
    # ~25 rounds plus the one at stop(); a loaded CI box may run late, never early.
    assert 5 <= stats["cpu_rounds"] <= 30
    assert len(cols["t0"]) == 3 * stats["cpu_rounds"]
    assert len(list(run.iter_columns(Chunk.CPU_CLOCK))) >= 2   # flushed in several chunks
    for d in ClockDomain:
        sel = cols["domain"] == d
        assert sel.sum() == stats["cpu_rounds"] == stats["sandwiches"][d.name]
        assert np.all(np.diff(cols["t0"][sel]) > 0)
        assert np.all(cols["t0"][sel] <= cols["t1"][sel])
        if d != ClockDomain.REALTIME:
            assert np.all(np.diff(cols["remote"][sel]) > 0)
    info = {r["domain"] for r in run.rows(Chunk.CLOCK_INFO)}
    assert {"MONOTONIC", "REALTIME", "BOOTTIME", "MONOTONIC_RAW"} <= info
    assert run.rows(Chunk.GPU_CLOCK) == [] and not run.columns(Chunk.GPU_CLOCK)
    assert run.rows(Chunk.NOTICES) == []
    assert stats["gpu"] is False and stats["gpu_off_reason"] == "not requested"


def test_probe_thread_pause_stops_sampling(tmp_path):
    path = tmp_path / "run.ca"
    with RunWriter(path, {}) as w:
        probe = ClockProbeThread(w, gpu=False, cpu_period_s=0.01)
        probe.start()
        time.sleep(0.1)
        probe.pause()
        n = probe.stats()["cpu_rounds"]
        time.sleep(0.2)
        assert probe.stats()["cpu_rounds"] == n
        probe.resume()
        time.sleep(0.1)
        probe.stop()
    assert probe.stats()["cpu_rounds"] > n


@pytest.mark.skipif(gpu_clock_available()[0], reason="a GPU is usable here; see tests/gpu")
def test_probe_thread_notes_why_gpu_is_off(tmp_path):
    ok, reason = gpu_clock_available()
    assert not ok and reason and "\n" not in reason
    run, stats = _record(tmp_path, 0.2, gpu=True, gpus=[0], cpu_period_s=0.05)
    notices = run.rows(Chunk.NOTICES)
    assert len(notices) == 1
    assert notices[0]["level"] == "warning"
    assert notices[0]["text"].startswith("GPU clock probing is off")
    assert reason in notices[0]["text"]
    assert stats["gpu"] is False and stats["gpu_off_reason"] == reason
    assert len(run.columns(Chunk.CPU_CLOCK)["t0"]) > 0     # CPU clocks still recorded
    assert not run.columns(Chunk.GPU_CLOCK)


def test_missing_gpu_ordinal_is_a_notice_not_an_error(tmp_path):
    run, stats = _record(tmp_path, 0.1, gpu=True, gpus=[99], cpu_period_s=0.05)
    texts = [n["text"] for n in run.rows(Chunk.NOTICES)]
    assert len(texts) == 1 and "GPU clock probing is off" in texts[0]
    assert stats["gpu"] is False
    assert len(run.columns(Chunk.CPU_CLOCK)["t0"]) > 0


def test_missing_cuda_bindings_is_one_sentence(monkeypatch):
    import sys

    from clockalign.capture.clocks import cudadriver, gpuclock
    monkeypatch.setattr(cudadriver, "_driver", None)
    monkeypatch.setattr(cudadriver, "_inited", False)
    for name in ("cuda", "cuda.bindings", "cuda.bindings.driver", "cuda.cuda"):
        monkeypatch.setitem(sys.modules, name, None)
    ok, reason = gpuclock.gpu_clock_available()
    assert not ok
    assert reason.startswith("cuda-bindings is not installed") and "\n" not in reason
