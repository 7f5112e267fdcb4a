"""CounterSampler on real clocks: its own thread, deadline accounting, batching, notices.

The backends here read real things (CLOCK_REALTIME, the load average, CLOCK_MONOTONIC)
and really sleep, so the timing the sampler sees is the machine's, not a script's.
"""
import os
import threading
import time

import numpy as np
import pytest

from clockalign.capture.gpu.counters import CounterSampler
from clockalign.errors import ClockalignError
from clockalign.store.counter_fields import COUNTER_COLUMNS
from clockalign.store.reader import RunReader
from clockalign.store.schema import Chunk
from clockalign.store.writer import RunWriter


class HostClockBackend:
    """Reports the host's own REALTIME clock and load average as two 'GPU 0' fields."""

    name = "hostclock"

    def __init__(self, sleep_s=0.0):
        self.sleep_s = sleep_s
        self.threads = set()
        self.events_started = self.events_stopped = False
        self.unsupported = ["gpu0 loadavg_15 (test): NOT_SUPPORTED"]
        self._notices = [("info", "host clock backend ready")]

    def sample(self, rows):
        self.threads.add(threading.get_ident())
        t0 = time.clock_gettime_ns(time.CLOCK_REALTIME)
        load1 = os.getloadavg()[0]
        if self.sleep_s:
            time.sleep(self.sleep_s)
        t1 = time.clock_gettime_ns(time.CLOCK_REALTIME)
        recv = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        rows.add(0, 1, (t0 + t1) // 2, (t1 - t0 + 1) // 2, recv, float(t1 % 1_000_000_000), 0)
        rows.add(0, 3, t1, 0, recv, load1, 60_000_000_000)

    def drain_notices(self):
        out, self._notices = self._notices, []
        return out

    def start_events(self, writer):
        self.events_started = True

    def stop_events(self):
        self.events_stopped = True


class FlakyBackend(HostClockBackend):
    """Every third sample raises, as a driver call failing now and then would."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def sample(self, rows):
        self.n += 1
        if self.n % 3 == 0:
            raise OSError("driver went away for a moment")
        super().sample(rows)


def _run(tmp_path, backend, interval_s, seconds, **kw):
    path = tmp_path / "run.ca"
    with RunWriter(path, {"test": "sampler"}) as w:
        s = CounterSampler(w, backend, interval_s=interval_s, **kw)
        s.start()
        time.sleep(seconds)
        s.stop()
        stats = s.stats()
    return stats, RunReader(path)


def test_samples_on_schedule_in_its_own_thread_and_batches_chunks(tmp_path):
    b = HostClockBackend()
    stats, run = _run(tmp_path, b, 0.02, 0.6)
    assert b.threads and threading.get_ident() not in b.threads
    assert 15 <= stats["samples"] <= 32
    assert stats["values"] == 2 * stats["samples"]
    # about one chunk per 250 ms, not one per sample
    assert 1 <= stats["chunks"] <= 5 < stats["samples"]
    assert stats["fields_unsupported"] == b.unsupported
    assert b.events_started and b.events_stopped
    cols = run.columns(Chunk.COUNTERS)
    for name, dt in COUNTER_COLUMNS.items():
        assert cols[name].dtype == np.dtype(dt)
    assert len(cols["gpu"]) == stats["values"]
    assert np.all(np.diff(cols["recv_mono_ns"]) >= 0)
    real = cols["t_real_ns"][cols["field"] == 1]
    assert np.all(np.diff(real) > 0)
    assert abs(real[-1] - time.clock_gettime_ns(time.CLOCK_REALTIME)) < 10e9
    assert any(n["text"] == "host clock backend ready" for n in run.rows(Chunk.NOTICES))


def test_slow_backend_misses_deadlines_and_says_so(tmp_path):
    # each sample sleeps 35 ms at a 10 ms interval: every later sample skips >= 2 slots
    stats, _ = _run(tmp_path, HostClockBackend(sleep_s=0.035), 0.01, 0.5)
    n = stats["samples"]
    assert 5 <= n <= 15
    assert stats["skipped"] >= 2 * (n - 1)
    assert stats["missed_deadlines"] == stats["late"] + stats["skipped"]
    assert stats["missed_deadlines"] >= 2 * (n - 1)


def test_fast_backend_misses_few_deadlines(tmp_path):
    stats, _ = _run(tmp_path, HostClockBackend(), 0.02, 0.5, late_tolerance_s=0.015)
    assert stats["samples"] >= 15
    assert stats["missed_deadlines"] <= stats["samples"] // 3


def test_blocked_backend_does_not_stall_the_caller(tmp_path):
    path = tmp_path / "run.ca"
    with RunWriter(path, {}) as w:
        s = CounterSampler(w, HostClockBackend(sleep_s=0.3), interval_s=0.01)
        s.start()
        t = time.monotonic()
        ticks = 0
        while time.monotonic() - t < 0.25:       # the event path keeps running meanwhile
            ticks += 1
            time.sleep(0.001)
        s.stop()
    assert ticks >= 50


def test_failing_backend_is_counted_and_noticed_once(tmp_path):
    stats, run = _run(tmp_path, FlakyBackend(), 0.01, 0.4)
    assert stats["errors"] >= 3
    assert stats["samples"] >= 9
    texts = [n["text"] for n in run.rows(Chunk.NOTICES)]
    assert texts.count("counter sampling failed: OSError: driver went away for a moment") == 1


def test_interval_floor():
    with pytest.raises(ClockalignError, match="below the 10 ms minimum"):
        CounterSampler(None, HostClockBackend(), interval_s=0.005)
