"""The perf-buffer batch parser: fixed-stride samples, a LOST record in the middle, the end."""
import struct

import numpy as np

from clockalign.capture.perfbuf import (PERF_RECORD_LOST, PERF_RECORD_SAMPLE, parse_samples,
                                        per_cpu_size, sample_dtype)
from clockalign.store.schema import EVENT_DTYPE


def _sample(ts):
    body = np.zeros(1, dtype=EVENT_DTYPE)
    body["ts"] = ts
    body["kind"] = 1
    rec = sample_dtype(EVENT_DTYPE)
    raw = struct.pack("<IHHI", PERF_RECORD_SAMPLE, 0, rec.itemsize, EVENT_DTYPE.itemsize + 4)
    raw += body.tobytes()
    return raw + b"\0" * (rec.itemsize - len(raw))


def _lost(n):
    return struct.pack("<IHHQQ", PERF_RECORD_LOST, 0, 24, 7, n)


def _ts(parts):
    return [int(t) for p in parts for t in p["ts"]]


def test_sample_stride_is_the_kernels():
    assert sample_dtype(EVENT_DTYPE).itemsize == 144      # 8 + 4 + 128 + 4 padding


def test_plain_run_of_samples():
    buf = b"".join(_sample(t) for t in range(1, 12))
    parts, lost = parse_samples(buf, sample_dtype(EVENT_DTYPE))
    assert _ts(parts) == list(range(1, 12)) and lost == 0


def test_lost_records_are_counted_and_the_rest_kept():
    buf = (b"".join(_sample(t) for t in range(1, 6)) + _lost(1234) +
           b"".join(_sample(t) for t in range(6, 9)) + _lost(5) + _sample(9))
    parts, lost = parse_samples(buf, sample_dtype(EVENT_DTYPE))
    assert _ts(parts) == list(range(1, 10))
    assert lost == 1239


def test_leading_lost_and_empty():
    rec = sample_dtype(EVENT_DTYPE)
    assert parse_samples(b"", rec) == ([], 0)
    parts, lost = parse_samples(_lost(3) + _sample(42), rec)
    assert _ts(parts) == [42] and lost == 3


def test_per_cpu_size_is_a_power_of_two_pages():
    for total, ncpu in ((64 << 20, 16), (1 << 20, 3), (4096, 8)):
        size = per_cpu_size(total, ncpu)
        pages = size // 4096
        assert size % 4096 == 0 and pages & (pages - 1) == 0
        assert size <= max(4096, total // ncpu)
