"""Run-file reader: tells a foreign file, an unsupported version and a truncation apart.

    run = RunReader("run.ca")           # NotARunFile / UnsupportedVersion raised here
    run.truncated                       # None, or "truncated at byte X (N chunks kept)"
    ev = run.events()                   # numpy array of EVENT_DTYPE, all chunks
    run.columns(Chunk.GPU_CLOCK)        # dict of concatenated numpy columns
    for cols in run.iter_columns(Chunk.EVENTS): ...   # one chunk at a time, bounded memory
"""
import mmap
import os
import struct
import zlib

import msgpack
import numpy as np

from ..errors import NotARunFile, TruncatedRun, UnsupportedVersion
from .schema import EVENT_DTYPE, FORMAT_VERSION, MAGIC, Chunk
from .writer import CHUNK, CHUNK_MARK, END, END_MARK, HEADER


class RunReader:
    """Reads every intact chunk of a run file into memory-light per-type lists."""

    def __init__(self, path):
        self.path = os.fspath(path)
        try:
            with open(self.path, "rb") as f:
                data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if os.fstat(
                    f.fileno()).st_size else b""
        except FileNotFoundError:
            raise NotARunFile(f"{self.path} does not exist") from None
        except IsADirectoryError:
            raise NotARunFile(f"{self.path} is a directory, not a clockalign run") from None
        except PermissionError:
            raise NotARunFile(f"{self.path} is not readable (permission denied)") from None
        self.size = len(data)
        if len(data) < HEADER.size or data[:8] != MAGIC:
            raise NotARunFile(f"{self.path} is not a clockalign run (no CLKALIGN header)")
        magic, version, _, meta_len = HEADER.unpack_from(data, 0)
        self.version = version
        if version != FORMAT_VERSION:
            raise UnsupportedVersion(
                f"{self.path} is run-file format version {version}; this clockalign reads "
                f"version {FORMAT_VERSION}")
        pos = HEADER.size
        try:
            self.meta = msgpack.unpackb(data[pos:pos + meta_len], raw=False)
        except Exception:
            raise TruncatedRun(f"{self.path} is truncated at byte {pos} (0 chunks kept): "
                               "its header is damaged") from None
        pos += meta_len
        self._data = data
        self._index = {}
        self.trailer = None
        self.truncated = None
        self.truncated_at = None
        n = 0
        while pos < len(data):
            if data[pos:pos + 5] == END_MARK and self.trailer is not None:
                pos += END.size
                break
            if len(data) - pos < CHUNK.size:
                break
            mark, ctype, plen, crc = CHUNK.unpack_from(data, pos)
            body = data[pos + CHUNK.size: pos + CHUNK.size + plen]
            if mark != CHUNK_MARK or len(body) != plen or zlib.crc32(body) != crc:
                break
            if ctype == Chunk.TRAILER:
                self.trailer = msgpack.unpackb(body, raw=False)["rows"][0]
            else:
                self._index.setdefault(ctype, []).append((pos + CHUNK.size, plen))
            self._release(pos, CHUNK.size + plen)
            n += 1
            pos += CHUNK.size + plen
        self.chunk_count = n
        if self.trailer is None or pos != len(data):
            self.truncated_at = pos
            self.truncated = f"truncated at byte {pos} ({n} chunks kept)"

    @property
    def clean(self) -> bool:
        return self.truncated is None

    def check_clean(self):
        """Raise TruncatedRun (exit code 3) if the file did not end with its trailer."""
        if self.truncated:
            raise TruncatedRun(f"{self.path} is {self.truncated}; the recorder did not finish it")

    def chunk_types(self):
        return sorted(self._index)

    def _payloads(self, ctype: int):
        for off, plen in self._index.get(ctype, []):
            payload = msgpack.unpackb(self._data[off:off + plen], raw=False)
            self._release(off, plen)
            yield payload

    def _release(self, off: int, length: int):
        """Drop the file pages of a decoded chunk from this process's memory: the payload
        was copied out, so a streaming reader's RSS stays flat however long the run."""
        if isinstance(self._data, mmap.mmap) and hasattr(mmap, "MADV_DONTNEED"):
            start = off - off % mmap.PAGESIZE
            self._data.madvise(mmap.MADV_DONTNEED, start, off + length - start)

    def iter_columns(self, ctype: int):
        """Yield {name: ndarray} per chunk of one type, decoding one chunk at a time."""
        for payload in self._payloads(ctype):
            yield {name: np.frombuffer(raw, dtype=np.dtype(dt))
                   for name, (dt, raw) in payload["cols"].items()}

    def columns(self, ctype: int) -> dict:
        """Concatenate all columnar chunks of one type into {name: ndarray}."""
        parts = {}
        for cols in self.iter_columns(ctype):
            for name, arr in cols.items():
                parts.setdefault(name, []).append(arr)
        return {k: np.concatenate(v) for k, v in parts.items()}

    def rows(self, ctype: int) -> list:
        out = []
        for payload in self._payloads(ctype):
            out.extend(payload["rows"])
        return out

    @staticmethod
    def as_events(cols: dict) -> np.ndarray:
        """One EVENTS chunk's columns as an EVENT_DTYPE array."""
        out = np.zeros(len(cols.get("ts", ())), dtype=EVENT_DTYPE)
        for name in EVENT_DTYPE.names:
            if name in cols:
                out[name] = cols[name].view(EVENT_DTYPE[name]) if name == "data" else cols[name]
        return out

    def iter_events(self):
        """Yield EVENT_DTYPE arrays, one per EVENTS chunk (bounded memory)."""
        for cols in self.iter_columns(Chunk.EVENTS):
            yield self.as_events(cols)

    def events(self) -> np.ndarray:
        """All BPF events as one EVENT_DTYPE array, in file order."""
        return self.as_events(self.columns(Chunk.EVENTS))
