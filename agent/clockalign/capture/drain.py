"""A thread that keeps the per-CPU event buffers empty while the recorder encodes and writes.

Reading the buffers is cheap (the native helper copies ~50 ns an event, without the GIL);
encoding, compressing and writing a batch is not, and a write can block on the disk. With one
thread doing both, a CPU's buffer kept filling while the previous batch was written: on the
H200, 8 threads at 250 k calls/s each lost 3.5 % of their events with the recorder at 0.9 of a
core. Here the reading never waits for the writing, except when the batches waiting exceed
``max_bytes``: then the thread stops reading, the buffers fill, and the kernel counts what it
cannot send. Memory stays bounded and no event is lost without being counted.

    drain = start_drain(probes.ring, poll=next_poll_s)   # the C reader where it builds
    batch = drain.get(timeout=0.05)      # None when nothing came in time
    rest = drain.stop()                  # batches still waiting, oldest first

The Python thread needs the GIL between its native reads, and an import, a long numpy step
or a collection elsewhere in the recorder holds it for tens of milliseconds; so where the C
helper builds, the reading is done by a C thread instead (native/reader.c, NativeDrain
here), which never waits for Python.  CLOCKALIGN_DRAIN=python keeps the Python thread.
"""
import collections
import os
import threading
import time


# The C thread's longest sleep.  A burst that starts while the buffers are idle is read this
# long after its start at the latest: one thread at 1 M calls/s writes 1.5 MB to its CPU's
# 8 MiB buffer in 10 ms, but 7.6 MB in the Python thread's 50 ms (record lost nothing at that
# rate on the H200 with no margin left, watch lost up to 9 %).  A pass over the control pages
# of every CPU costs about a microsecond, so 100 a second cost nothing.
READER_POLL_S = 0.01


def start_drain(ring, poll, max_bytes: int = 256 << 20):
    """The C reader thread (NativeDrain) where it starts, else the Python one (Drain)."""
    if ring is not None and os.environ.get("CLOCKALIGN_DRAIN") != "python" \
            and ring.start_reader(max_bytes, READER_POLL_S):
        return NativeDrain(ring)
    return Drain(ring, poll, max_bytes).start()


class NativeDrain:
    """Drain's interface over the event buffers' C reader thread: get() takes what it
    gathered."""

    kind = "native"

    def __init__(self, ring):
        self.ring = ring
        self.error = None

    @property
    def waited_s(self) -> float:
        return self.ring.reader_held_s

    BATCH_ROWS = 1 << 16      # take earlier than the timeout once this many have gathered

    def get(self, timeout: float):
        """What gathered within timeout seconds (sooner once BATCH_ROWS have), else None:
        batches as large as the Python thread's, so the per-batch work stays as rare."""
        t_end = time.monotonic() + timeout
        while self.ring.reader_pending() < self.BATCH_ROWS:
            left = t_end - time.monotonic()
            if left <= 0:
                break
            time.sleep(min(left, 0.005))
        batch = self.ring.read()
        return batch if len(batch) else None

    def stop(self) -> list:
        """Stop the reader (it reads once more); what it gathered and nobody took."""
        self.ring.stop_reader()
        rest = []
        while self.ring.reader_running:
            batch = self.ring.read()
            if len(batch):
                rest.append(batch)
        return rest


class Drain:
    kind = "python"

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
