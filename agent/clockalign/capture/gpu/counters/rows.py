"""A growing batch of counter rows, handed to the writer as one COUNTERS chunk.

Backends append one row per value taken; the sampler takes the batch every
``flush_interval`` (about 250 ms) and writes it, so a chunk holds many samples.

    rows = RowBuffer()
    rows.add(gpu=0, field=1, t_real_ns=t, latency_ns=500, recv_mono_ns=m, value=1980.0)
    writer.write_columns(Chunk.COUNTERS, rows.take())
"""
import numpy as np

from ....store.counter_fields import COUNTER_COLUMNS


class RowBuffer:
    """Column lists for COUNTER_COLUMNS; ``take()`` turns them into numpy arrays."""

    __slots__ = tuple(COUNTER_COLUMNS)

    def __init__(self):
        self._clear()

    def _clear(self):
        for name in COUNTER_COLUMNS:
            setattr(self, name, [])

    def add(self, gpu, field, t_real_ns, latency_ns, recv_mono_ns, value, window_ns=0):
        self.gpu.append(gpu)
        self.field.append(field)
        self.t_real_ns.append(t_real_ns)
        self.latency_ns.append(latency_ns)
        self.recv_mono_ns.append(recv_mono_ns)
        self.value.append(value)
        self.window_ns.append(window_ns)

    def __len__(self):
        return len(self.gpu)

    def columns(self) -> dict:
        """The rows as {column: ndarray} without clearing them."""
        return {name: np.asarray(getattr(self, name), dtype=np.dtype(dt))
                for name, dt in COUNTER_COLUMNS.items()}

    def take(self) -> dict:
        """The rows as {column: ndarray}; the buffer is empty afterwards."""
        cols = self.columns()
        self._clear()
        return cols
