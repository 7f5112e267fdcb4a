"""The drain thread: batches in order, reading held back (not lost) past max_bytes, errors
raised in the recording thread."""
import threading
import time

import numpy as np
import pytest

from clockalign.capture.drain import Drain


class Ring:
    """Gives the batches it is handed, one a read, then empty ones."""
    def __init__(self, batches, fail_after=None):
        self.batches = list(batches)
        self.reads = 0
        self.last_fill = 0.0
        self.fail_after = fail_after

    def read(self):
        self.reads += 1
        if self.fail_after is not None and self.reads > self.fail_after:
            raise OSError("buffer unmapped")
        return self.batches.pop(0) if self.batches else np.empty(0, np.uint64)


def _poll(fill, since, busy):
    return 0.001


def test_batches_arrive_in_order_and_stop_returns_the_rest():
    batches = [np.arange(i * 10, i * 10 + 10, dtype=np.uint64) for i in range(20)]
    d = Drain(Ring(batches), _poll).start()
    got = [d.get(timeout=1.0) for _ in range(5)]
    time.sleep(0.1)
    rest = d.stop()
    seen = np.concatenate(got + rest)
    assert seen.tolist() == list(range(200))


def test_reading_waits_past_max_bytes_and_resumes():
    batches = [np.zeros(1000, np.uint64) for _ in range(10)]   # 8000 bytes each
    ring = Ring(batches)
    d = Drain(ring, _poll, max_bytes=16000).start()
    time.sleep(0.3)
    assert ring.reads <= 3            # two batches held (16000 bytes), the third waits to go in
    assert d.waited_s > 0 or ring.reads == 3
    total = 0
    while total < 10:
        b = d.get(timeout=1.0)
        assert b is not None
        total += 1
    assert d.stop() == []


def test_a_read_error_is_raised_by_get():
    d = Drain(Ring([np.zeros(3, np.uint64)], fail_after=1), _poll).start()
    assert len(d.get(timeout=1.0)) == 3
    with pytest.raises(OSError, match="unmapped"):
        for _ in range(50):
            d.get(timeout=0.1)
    with pytest.raises(OSError):
        d.stop()


def test_get_times_out_with_nothing():
    d = Drain(Ring([]), _poll).start()
    t0 = time.monotonic()
    assert d.get(timeout=0.05) is None
    assert time.monotonic() - t0 >= 0.04
    d.stop()
    assert not any(t.name == "clockalign-drain" and t.is_alive() for t in threading.enumerate())


def test_batches_read_before_an_error_are_all_given_first():
    """The recording thread gets every batch read before a read error, then the error: a
    late get() (a loaded machine) must not lose them (CI once raised before the first)."""
    d = Drain(Ring([np.zeros(3, np.uint64), np.ones(2, np.uint64)], fail_after=2),
              _poll).start()
    deadline = time.monotonic() + 5
    while d.error is None and time.monotonic() < deadline:
        time.sleep(0.01)                     # the error is in before anything is taken
    assert len(d.get(timeout=1.0)) == 3 and len(d.get(timeout=1.0)) == 2
    with pytest.raises(OSError, match="unmapped"):
        d.get(timeout=0.1)
    with pytest.raises(OSError):
        d.stop()
