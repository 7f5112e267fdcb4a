"""Streaming, crash-safe run-file writer.

Layout (all integers little endian)::

    header:  MAGIC(8) | version u16 | reserved u16 | meta_len u32 | meta (msgpack map)
    chunk:   b"CK" | type u16 | payload_len u32 | crc32(payload) u32 | payload (msgpack)
    ...
    trailer: one chunk of type TRAILER, then b"CAEND" + u64 offset of that chunk

A chunk payload is ``{"cols": {name: [dtype, bytes]}, "n": rows}`` (columnar) or
``{"rows": [...]}``.  Every chunk is self-delimiting and checksummed, and the file is
flushed to the OS at least every ``flush_interval`` seconds, so a SIGKILL of the recorder
loses at most what was written since the last flush.

    with RunWriter("run.ca", meta) as w:
        w.write_columns(Chunk.EVENTS, {"ts": ts, ...})
"""
import os
import struct
import threading
import time
import zlib

import msgpack
import numpy as np

from .schema import FORMAT_VERSION, MAGIC, Chunk

HEADER = struct.Struct("<8sHHI")
CHUNK = struct.Struct("<2sHII")
CHUNK_MARK = b"CK"
END = struct.Struct("<5sQ")
END_MARK = b"CAEND"


def encode_columns(cols: dict) -> dict:
    """Columnar payload: each numpy column as (dtype string, raw bytes)."""
    n = None
    enc = {}
    for name, arr in cols.items():
        arr = np.ascontiguousarray(arr)
        if n is None:
            n = len(arr)
        elif len(arr) != n:
            raise ValueError(f"column {name} has {len(arr)} rows, expected {n}")
        enc[name] = [arr.dtype.str, arr.tobytes()]
    return {"n": n or 0, "cols": enc}


class RunWriter:
    """Appends checksummed chunks to a run file; thread-safe."""

    def __init__(self, path, meta: dict, flush_interval: float = 0.25):
        self.path = os.fspath(path)
        self._f = open(self.path, "wb")
        self._lock = threading.Lock()
        self._last_flush = time.monotonic()
        self.flush_interval = flush_interval
        self.chunks = 0
        self.closed = False
        body = msgpack.packb(meta, use_bin_type=True)
        self._f.write(HEADER.pack(MAGIC, FORMAT_VERSION, 0, len(body)) + body)
        self.flush()

    @property
    def size(self) -> int:
        with self._lock:
            return self._f.tell()

    def _write_chunk(self, ctype: int, payload: dict) -> int:
        body = msgpack.packb(payload, use_bin_type=True)
        with self._lock:
            if self.closed:
                raise ValueError("run file already closed")
            offset = self._f.tell()
            self._f.write(CHUNK.pack(CHUNK_MARK, int(ctype), len(body), zlib.crc32(body)) + body)
            self.chunks += 1
            if time.monotonic() - self._last_flush >= self.flush_interval:
                self._flush_locked()
        return offset

    def write_columns(self, ctype: int, cols: dict) -> None:
        """Write one columnar chunk (all columns the same length); empty input writes nothing."""
        payload = encode_columns(cols)
        if payload["n"]:
            self._write_chunk(ctype, payload)

    def write_rows(self, ctype: int, rows: list) -> None:
        """Write one chunk of msgpack-able rows (dicts); empty input writes nothing."""
        if rows:
            self._write_chunk(ctype, {"rows": list(rows)})

    def _flush_locked(self):
        self._f.flush()
        self._last_flush = time.monotonic()

    def flush(self) -> None:
        """Hand everything written so far to the OS (survives a SIGKILL of this process)."""
        with self._lock:
            if not self.closed:
                self._flush_locked()

    def close(self, trailer: dict = None) -> None:
        """Write the trailer (counts, drops, why the recording ended) and close."""
        if self.closed:
            return
        trailer = dict(trailer or {})
        trailer.setdefault("t_ns", time.clock_gettime_ns(time.CLOCK_MONOTONIC))
        trailer["chunks"] = self.chunks
        offset = self._write_chunk(Chunk.TRAILER, {"rows": [trailer]})
        with self._lock:
            self._f.write(END.pack(END_MARK, offset))
            self._f.flush()
            os.fsync(self._f.fileno())
            self._f.close()
            self.closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close({"reason": "exception" if exc[0] else "closed"})
