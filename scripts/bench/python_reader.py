#!/usr/bin/env python3
"""Benchmark arm: the event buffers read by a Python thread instead of native/reader.c's C
thread (the reader clockalign had before; scripts/bench/gil_stall.py and reader_cpu.sh
compare the two).  Not part of clockalign: ``install()`` swaps it into the recorder of this
process, and run as a program it is `clockalign` with the swap made.

    import python_reader; python_reader.install()           # in-process Recorder
    sudo .venv/bin/python scripts/bench/python_reader.py record --pid 1234 -o run.ca

The thread calls the buffers' read() (one pass of the C drain over every CPU, under the
GIL) and sleeps next_poll_s between reads.  Batches wait in a queue until the recorder takes
them; past max_bytes reading stops and the buffers fill (the probes count what is lost).
"""
import collections
import sys
import threading
import time

POLL_S = 0.05


def next_poll_s(fill: float, since_last_read_s: float, busy_s: float) -> float:
    """How long to sleep before the next read: POLL_S, or less where the fullest CPU
    buffer, filling as fast as it did since the last read, would be half full by then."""
    if fill <= 0 or since_last_read_s <= 0:
        return POLL_S
    rate = fill / since_last_read_s            # buffer fractions per second
    return max(0.0005, min(POLL_S, 0.5 / rate - busy_s))


class Drain:
    kind = "python"               # the trailer's buffer_reader

    def __init__(self, ring, poll, max_bytes: int = 256 << 20):
        self.ring = ring
        self.poll = poll              # (fill, since_last_read_s, busy_s) -> sleep seconds
        self.max_bytes = max_bytes
        self._batches = collections.deque()
        self._bytes = 0
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="clockalign-drain", daemon=True)
        self.error = None
        self.waited_s = 0.0           # time reading was held back by max_bytes

    def start(self):
        self._thread.start()
        return self

    def _run(self):
        t_read = time.monotonic()
        try:
            while not self._stop.is_set():
                t_prev, t_read = t_read, time.monotonic()
                batch = self.ring.read()
                busy = time.monotonic() - t_read
                if len(batch):
                    self._put(batch)
                self._stop.wait(self.poll(self.ring.last_fill, t_read - t_prev, busy))
        except BaseException as e:    # re-raised in the recording thread by get()
            self.error = e
            with self._cond:
                self._cond.notify_all()

    def _put(self, batch):
        with self._cond:
            t0 = time.monotonic()
            while self._bytes >= self.max_bytes and not self._stop.is_set():
                self._cond.wait(0.05)
            self.waited_s += time.monotonic() - t0
            self._batches.append(batch)
            self._bytes += batch.nbytes
            self._cond.notify_all()

    def get(self, timeout: float):
        """The oldest waiting batch, or None after timeout seconds without one.  A read
        error is raised once the batches read before it have all been taken."""
        with self._cond:
            if not self._batches and self.error is None:
                self._cond.wait(timeout)
            if not self._batches:
                if self.error is not None:
                    raise self.error
                return None
            batch = self._batches.popleft()
            self._bytes -= batch.nbytes
            self._cond.notify_all()
            return batch

    def stop(self) -> list:
        """Stop reading; the batches read and not yet taken, oldest first."""
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join()
        with self._cond:
            rest = list(self._batches)
            self._batches.clear()
            self._bytes = 0
        if self.error is not None:
            raise self.error
        return rest


def start_drain(ring, max_bytes: int = 256 << 20):
    return Drain(ring, next_poll_s, max_bytes).start()


def install():
    """The recorder of this process reads its buffers with the Python thread."""
    from clockalign.capture import recorder
    recorder.start_drain = start_drain


if __name__ == "__main__":
    install()
    from clockalign.cli.main import main
    sys.exit(main(sys.argv[1:]))
