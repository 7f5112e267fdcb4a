"""The counter sampler: its own thread, fixed slots, batched COUNTERS chunks.

Samples are due at base + k * interval on CLOCK_MONOTONIC.  A sample that starts more
than ``late_tolerance_s`` after its slot is *late*; slots that passed entirely while an
earlier sample was still running are *skipped* (nothing is taken for them).  Both count
as missed deadlines, so a slow NVML call shows up in ``stats()`` instead of silently
stretching the interval.  Rows are written as one chunk per ``flush_interval_s``.

    sampler = CounterSampler(writer, open_backend("nvml"), interval_s=0.1)
    sampler.start(); ...; sampler.stop()
    sampler.stats()   # {"samples": 600, "missed_deadlines": 0, "fields_unsupported": [...]}
"""
import threading
import time

from ....errors import ClockalignError
from ....store.schema import Chunk
from .rows import RowBuffer

MIN_INTERVAL_S = 0.01
_mono = time.monotonic_ns


class CounterSampler:
    """Samples ``backend`` every ``interval_s`` in a daemon thread, writing to ``writer``.

    The backend needs ``sample(rows)``; ``drain_notices()``, ``start_events(writer)``,
    ``stop_events()``, ``unsupported`` and ``name`` are used when present.
    """

    def __init__(self, writer, backend, interval_s=0.1, flush_interval_s=0.25,
                 late_tolerance_s=None):
        if interval_s < MIN_INTERVAL_S:
            raise ClockalignError(f"counter interval {interval_s * 1000:g} ms is below the "
                                  f"{MIN_INTERVAL_S * 1000:g} ms minimum")
        self.writer = writer
        self.backend = backend
        self.interval_ns = int(round(interval_s * 1e9))
        self.flush_ns = int(flush_interval_s * 1e9)
        tol = 0.1 * interval_s if late_tolerance_s is None else late_tolerance_s
        self.late_tolerance_ns = int(tol * 1e9)
        self._rows = RowBuffer()
        self._stop = threading.Event()
        self._thread = None
        self._lock = threading.Lock()
        self.samples = 0
        self.late = 0
        self.skipped = 0
        self.max_late_ns = 0
        self.values = 0
        self.chunks = 0
        self.errors = 0
        self._error_texts = set()
        self.started_ns = None
        self.stopped_ns = None

    def start(self):
        if self._thread is not None:
            raise RuntimeError("sampler already started")
        if hasattr(self.backend, "start_events"):
            self.backend.start_events(self.writer)
        self._thread = threading.Thread(target=self._run, name="clockalign-counters",
                                        daemon=True)
        self._thread.start()

    def _run(self):
        interval = self.interval_ns
        base = self.started_ns = _mono()
        last_flush = base
        k = 0
        while True:
            slot = base + k * interval
            now = _mono()
            if now < slot:
                if self._stop.wait((slot - now) / 1e9):
                    break
                now = _mono()
            elif self._stop.is_set():
                break
            late = now - slot
            if late >= interval:
                passed = late // interval
                with self._lock:
                    self.skipped += passed
                k += passed
                slot += passed * interval
                late = now - slot
            with self._lock:
                if late > self.late_tolerance_ns:
                    self.late += 1
                self.max_late_ns = max(self.max_late_ns, late)
            self._sample_once()
            k += 1
            if _mono() - last_flush >= self.flush_ns:
                self._flush()
                last_flush = _mono()
        self.stopped_ns = _mono()
        self._flush()

    def _sample_once(self):
        try:
            self.backend.sample(self._rows)
        except Exception as e:                # a failing backend must not kill the recorder
            with self._lock:
                self.errors += 1
            text = f"counter sampling failed: {type(e).__name__}: {e}"
            if text not in self._error_texts and len(self._error_texts) < 10:
                self._error_texts.add(text)
                self._write_notices([("warning", text)])
        with self._lock:
            self.samples += 1

    def _flush(self):
        if hasattr(self.backend, "drain_notices"):
            self._write_notices(self.backend.drain_notices())
        if len(self._rows):
            n = len(self._rows)
            self.writer.write_columns(Chunk.COUNTERS, self._rows.take())
            with self._lock:
                self.values += n
                self.chunks += 1

    def _write_notices(self, notices):
        if notices:
            t = _mono()
            self.writer.write_rows(Chunk.NOTICES, [{"t_ns": t, "level": level, "text": text}
                                                   for level, text in notices])

    def stop(self, timeout=10.0):
        """Stop sampling, write what is left; the backend stays open (close it yourself)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if hasattr(self.backend, "stop_events"):
            self.backend.stop_events()
        if self._thread is not None and not self._thread.is_alive() and \
                hasattr(self.backend, "drain_notices"):
            self._write_notices(self.backend.drain_notices())

    def stats(self) -> dict:
        with self._lock:
            return {
                "backend": getattr(self.backend, "name", type(self.backend).__name__),
                "interval_s": self.interval_ns / 1e9,
                "samples": self.samples,
                "missed_deadlines": self.late + self.skipped,
                "late": self.late,
                "skipped": self.skipped,
                "max_late_ns": self.max_late_ns,
                "values": self.values,
                "chunks": self.chunks,
                "errors": self.errors + getattr(self.backend, "errors", 0),
                "events": getattr(self.backend, "event_count", 0),
                "fields_unsupported": list(getattr(self.backend, "unsupported", [])),
            }
