"""Fixed-bucket histograms of nanosecond durations: counts per bucket and a sum, no samples.

Bounds are inclusive upper limits (Prometheus ``le``); a batch is added with one
``searchsorted`` and one ``bincount``, whatever its size.

    h = Histogram(CUDA_CALL_BOUNDS_NS)
    h.observe(np.array([1500, 2_000_000]))
    h.cumulative()      # [(le_seconds, count <= le), ..., (inf, total)]
"""
import numpy as np


def bounds_ns(seconds) -> np.ndarray:
    return np.array([int(round(s * 1e9)) for s in seconds], dtype=np.int64)


def _decades(lo_exp, hi_exp, steps=(1, 2.5, 5)):
    return [m * 10.0 ** e for e in range(lo_exp, hi_exp) for m in steps] + [10.0 ** hi_exp]


# a CUDA driver call: 1 µs (a launch) .. 10 s (a synchronize waiting on a long kernel)
CUDA_CALL_BOUNDS_NS = bounds_ns(_decades(-6, 1))
# from a wakeup to running on a CPU: 1 µs .. 1 s
WAKEUP_BOUNDS_NS = bounds_ns(_decades(-6, 0))
# a connect(): 10 µs (loopback, refused) .. 10 s (a SYN retried)
CONNECT_BOUNDS_NS = bounds_ns(_decades(-5, 1))
# a module or library load: 100 µs (a cached cubin) .. 100 s (a JIT of a big PTX)
MODULE_LOAD_BOUNDS_NS = bounds_ns(_decades(-4, 2))


class Histogram:
    __slots__ = ("bounds", "counts", "sum_ns")

    def __init__(self, bounds):
        self.bounds = bounds
        self.counts = np.zeros(len(bounds) + 1, dtype=np.int64)   # the last: above every bound
        self.sum_ns = 0

    def observe(self, ns) -> None:
        ns = np.asarray(ns, dtype=np.int64)
        if not len(ns):
            return
        self.counts += np.bincount(np.searchsorted(self.bounds, ns, side="left"),
                                   minlength=len(self.counts))
        self.sum_ns += int(ns.sum())

    @property
    def count(self) -> int:
        return int(self.counts.sum())

    def cumulative(self):
        """[(upper bound in seconds, observations <= it), ..., (inf, all)]."""
        c = np.cumsum(self.counts)
        les = [b / 1e9 for b in self.bounds.tolist()] + [float("inf")]
        return list(zip(les, c.tolist()))

    def copy(self) -> "Histogram":
        h = Histogram(self.bounds)
        h.counts = self.counts.copy()
        h.sum_ns = self.sum_ns
        return h
