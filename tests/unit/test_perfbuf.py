"""The perf buffers' C drain (native/batch.c ca_drain) against a reference parser written
here: fixed-stride samples, LOST records in the middle, a sample of another size, the wrap."""
import struct

import numpy as np
import pytest

from clockalign.capture.transport.perfbuf import (PERF_RECORD_LOST, PERF_RECORD_SAMPLE,
                                                  per_cpu_size, sample_dtype)
from clockalign.native import batch as native_batch
from clockalign.store.schema import EVENT_DTYPE

_HDR = struct.Struct("<IHH")
_U64 = struct.Struct("<Q")


def parse_samples(buf: bytes, rec: np.dtype):
    """([arrays of bodies], records lost, samples of another size) of one CPU's batch, the
    slow way, record by record: the reference the C drain is checked against."""
    parts, lost, malformed, pos = [], 0, 0, 0
    while len(buf) - pos >= 8:
        typ, _, size = _HDR.unpack_from(buf, pos)
        if size < 8:
            break
        if typ == PERF_RECORD_SAMPLE and size == rec.itemsize:
            parts.append(np.frombuffer(buf, dtype=rec, count=1, offset=pos)["body"].copy())
        elif typ == PERF_RECORD_LOST and pos + 24 <= len(buf):
            lost += _U64.unpack_from(buf, pos + 16)[0]
        elif typ == PERF_RECORD_SAMPLE:
            malformed += 1
        pos += size
    return parts, lost, malformed


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
    parts, lost, _ = parse_samples(buf, sample_dtype(EVENT_DTYPE))
    assert _ts(parts) == list(range(1, 12)) and lost == 0


def test_lost_records_are_counted_and_the_rest_kept():
    buf = (b"".join(_sample(t) for t in range(1, 6)) + _lost(1234) +
           b"".join(_sample(t) for t in range(6, 9)) + _lost(5) + _sample(9))
    parts, lost, _ = parse_samples(buf, sample_dtype(EVENT_DTYPE))
    assert _ts(parts) == list(range(1, 10))
    assert lost == 1239


def test_leading_lost_and_empty():
    rec = sample_dtype(EVENT_DTYPE)
    assert parse_samples(b"", rec) == ([], 0, 0)
    parts, lost, _ = parse_samples(_lost(3) + _sample(42), rec)
    assert _ts(parts) == [42] and lost == 3


def test_per_cpu_size_is_a_power_of_two_pages():
    for total, ncpu in ((64 << 20, 16), (1 << 20, 3), (4096, 8)):
        size = per_cpu_size(total, ncpu)
        pages = size // 4096
        assert size % 4096 == 0 and pages & (pages - 1) == 0
        assert size <= max(4096, total // ncpu)


def _ring(records: bytes, size: int, at: int):
    """A perf ring's data area of size bytes holding records from absolute position at
    (so that they wrap around the end when at + len > size)."""
    data = bytearray(size)
    for i, b in enumerate(records):
        data[(at + i) % size] = b
    return np.frombuffer(bytes(data), np.uint8).copy()


@pytest.mark.parametrize("at", [0, 4096 - 144 * 3 - 20, 4096 - 7, 8192 * 3 + 100])
def test_native_drain_matches_the_numpy_parser_across_the_wrap(at):
    recs = (b"".join(_sample(t) for t in range(1, 6)) + _lost(1234) + _sample(6)
            + _lost(5) + b"".join(_sample(t) for t in range(7, 20)))
    size = 4096
    ring = _ring(recs, size, at)
    out = np.empty(len(recs) // 140 + 1, EVENT_DTYPE)
    ts = np.empty(len(out), np.uint64)
    got, lost, bad = native_batch.drain_into(ring.ctypes.data, size, at, at + len(recs),
                                             out, ts, 0)
    parts, want_lost, _ = parse_samples(recs, sample_dtype(EVENT_DTYPE))
    want = np.concatenate(parts)
    assert (got, lost, bad) == (len(want), want_lost, 0)
    assert out[:got].tobytes() == want.tobytes()
    assert ts[:got].tolist() == list(range(1, 20))


def _odd_sample():
    return struct.pack("<IHHI", PERF_RECORD_SAMPLE, 0, 32, 20) + b"\1" * 20


def test_reference_parser_counts_a_sample_of_another_size():
    parts, lost, malformed = parse_samples(_sample(1) + _odd_sample() + _sample(2),
                                           sample_dtype(EVENT_DTYPE))
    assert _ts(parts) == [1, 2] and (lost, malformed) == (0, 1)


def test_native_drain_counts_a_sample_of_another_size():
    recs = _sample(1) + _odd_sample() + _sample(2)
    ring = _ring(recs, 4096, 0)
    out = np.empty(4, EVENT_DTYPE)
    ts = np.empty(4, np.uint64)
    got, lost, bad = native_batch.drain_into(ring.ctypes.data, 4096, 0, len(recs), out, ts, 0)
    assert (got, lost, bad) == (2, 0, 1) and ts[:2].tolist() == [1, 2]


def test_native_take_is_a_row_gather():
    rows = np.zeros(1000, EVENT_DTYPE)
    rows["ts"] = np.random.default_rng(3).permutation(1000)
    rows["a4"] = rows["ts"] * 7
    order = np.argsort(rows["ts"], kind="stable")
    assert native_batch.take(rows, order).tobytes() == rows[order].tobytes()
