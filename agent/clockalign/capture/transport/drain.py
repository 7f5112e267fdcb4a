"""The event buffers kept empty by a C thread while the recorder encodes and writes.

Reading the buffers is cheap (the C drain copies ~50 ns an event); encoding, compressing and
writing a batch is not, and a write can block on the disk.  With one thread doing both, a
CPU's buffer kept filling while the previous batch was written: on the H200, 8 threads at
250 k calls/s each lost 3.5 % of their events with the recorder at 0.9 of a core.  A Python
reader thread needs the GIL between its reads, and an import, a long numpy step or a
collection elsewhere in the recorder holds it for tens of milliseconds (with the GIL held
0.3 s every second it lost 13-17 % of a flat-out thread's events: scripts/bench/
gil_stall.py); so the reading is done by native/reader.c's thread, which never waits for
Python.  It gathers at most ``max_bytes``; beyond that it stops reading, the buffers fill,
and what cannot be written is counted: memory stays bounded and no event is lost uncounted.

    drain = start_drain(probes.ring)
    batch = drain.get(timeout=0.05)      # None when nothing came in time
    rest = drain.stop()                  # batches still waiting, oldest first
"""
import time

# The C thread's longest sleep.  A burst that starts while the buffers are idle is read this
# long after its start at the latest: one thread at 1 M calls/s writes 1.5 MB to its CPU's
# 8 MiB buffer in 10 ms, but 7.6 MB in the 50 ms the Python reader before it slept (record
# lost nothing at that rate on the H200 with no margin left, watch lost up to 9 %).  A pass
# over the control pages of every CPU costs about a microsecond, so 100 a second cost nothing.
READER_POLL_S = 0.01


def start_drain(ring, max_bytes: int = 256 << 20):
    """ring's C reader thread, started (NativeMissing where the helper is not built)."""
    ring.start_reader(max_bytes, READER_POLL_S)
    return Drain(ring)


class Drain:
    """What the recorder takes from the event buffers' C reader thread: get() takes what it
    gathered."""

    kind = "native"               # the trailer's buffer_reader

    def __init__(self, ring):
        self.ring = ring
        self.error = None

    @property
    def waited_s(self) -> float:
        return self.ring.reader_held_s

    BATCH_ROWS = 1 << 16      # take earlier than the timeout once this many have gathered

    def get(self, timeout: float):
        """What gathered within timeout seconds (sooner once BATCH_ROWS have), else None:
        batches large enough that the per-batch work (a chunk, a write) stays rare."""
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
