"""Run-file reader: tells a foreign file, an unsupported version, a truncation and damage apart.

    run = RunReader("run.ca")           # NotARunFile / UnsupportedVersion raised here
    run.truncated                       # None, or "truncated at byte X (N chunks kept)", or
                                        # "damaged: 1 chunk skipped at byte A (to B) ..."
    ev = run.events()                   # numpy array of EVENT_DTYPE, all chunks
    run.columns(Chunk.GPU_CLOCK)        # dict of concatenated numpy columns
    for cols in run.iter_columns(Chunk.EVENTS): ...   # one chunk at a time, bounded memory
    run.decodes                         # Counter {Chunk: columnar chunks decoded so far}

Reads formats 1 and 2 (store/writer.py).  Every chunk is checked when the file is opened
(mark, known type, a length inside the file, checksum, a payload of the shape its type
needs); a damaged one is skipped and reading resumes at the next chunk that checks, so one
flipped byte costs one chunk, not the rest of the run.  Checksums are computed over the
mapped file in slices whose pages are given back, so a chunk that declares a huge length
costs no memory; only a chunk that checks is ever decoded.
"""
import collections
import mmap
import os
import zlib

import msgpack
import numpy as np
import zstandard

from ..errors import DamagedRun, NotARunFile, UnsupportedVersion
from . import codec
from .event_text import XidMessages
from .schema import EVENT_DTYPE, GPU_REC_DTYPE, MAGIC, Chunk
from .writer import CHUNK, CHUNK_MARK, CHUNK_TYPE_LEN, END, END_MARK, HEADER, HEADER_CRC

READABLE_VERSIONS = (1, 2)
CRC_SLICE = 8 << 20
COLUMNAR = {Chunk.EVENTS, Chunk.CPU_CLOCK, Chunk.GPU_CLOCK, Chunk.COUNTERS, Chunk.GPU_ACTIVITY}
REQUIRED_COLUMNS = {
    Chunk.EVENTS: {n: EVENT_DTYPE[n] for n in EVENT_DTYPE.names},
    Chunk.CPU_CLOCK: dict.fromkeys(("domain", "t0", "remote", "t1")),
    Chunk.GPU_CLOCK: dict.fromkeys(("gpu", "method", "t0", "remote", "t1")),
    Chunk.COUNTERS: dict.fromkeys(("gpu", "field", "t_real_ns", "value")),
    Chunk.GPU_ACTIVITY: {n: GPU_REC_DTYPE[n] for n in GPU_REC_DTYPE.names},
}
KNOWN_TYPES = frozenset(int(c) for c in Chunk)


class BadChunk(ValueError):
    """A chunk whose checksum holds but whose payload is not what its type needs."""


def _dtype(s):
    if not isinstance(s, str):
        raise BadChunk(f"dtype {s!r} is not a string")
    try:
        dt = np.dtype(s)
    except (TypeError, ValueError) as e:
        raise BadChunk(f"bad dtype {s!r}") from e
    if dt.hasobject or dt.itemsize == 0 or dt.fields or dt.subdtype:
        raise BadChunk(f"dtype {s!r} is not a plain column type")
    return dt


def check_payload(ctype: int, payload, version: int) -> None:
    """Raise BadChunk unless ``payload`` has the shape chunk type ``ctype`` is read with."""
    if not isinstance(payload, dict):
        raise BadChunk("payload is not a map")
    if ctype in COLUMNAR:
        n = payload.get("n")
        if not isinstance(n, int) or not 0 < n <= codec.MAX_ROWS:
            raise BadChunk("no row count")
        cols = payload.get("cols")
        if "codec" in payload:
            try:
                _, plan, total = codec.plan(payload)
                size = zstandard.frame_content_size(payload["z"]) if total else 0
            except (codec.CodecError, zstandard.ZstdError) as e:
                raise BadChunk(str(e)) from None
            if size != total:
                raise BadChunk("compressed size does not match the columns")
            types = {name: dt for name, dt, _, _, _ in plan}
        else:
            if not isinstance(cols, dict):
                raise BadChunk("no columns")
            types = {}
            for name, c in cols.items():
                if not isinstance(c, (list, tuple)) or len(c) != 2 or not isinstance(c[1], bytes):
                    raise BadChunk(f"bad column {name!r}")
                dt = types[name] = _dtype(c[0])
                if len(c[1]) != n * dt.itemsize:
                    raise BadChunk(f"column {name!r} has the wrong length")
        need = REQUIRED_COLUMNS[ctype]
        missing = [k for k in need if k not in types]
        if missing:
            raise BadChunk(f"columns {', '.join(missing)} missing")
        for k, dt in need.items():
            if dt is not None and types[k] != dt:
                raise BadChunk(f"column {k} is {types[k]}, not {dt}")
        if ctype == Chunk.EVENTS and len(types) != len(need):
            raise BadChunk("unexpected event columns")
        return
    rows = payload.get("rows")
    if not isinstance(rows, list) or not rows:
        raise BadChunk("no rows")
    if ctype in (Chunk.NOTICES, Chunk.THREADS, Chunk.TRAILER, Chunk.CLOCK_INFO, Chunk.STATUS,
                 Chunk.GPU_NAMES) \
            and not all(isinstance(r, dict) for r in rows):
        raise BadChunk("a row is not a map")
    if ctype == Chunk.TRAILER and len(rows) != 1:
        raise BadChunk("a trailer holds one row")


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
        except (OSError, ValueError) as e:
            raise NotARunFile(f"{self.path} cannot be read as a file ({e})") from None
        self.size = len(data)
        if len(data) < HEADER.size or data[:8] != MAGIC:
            raise NotARunFile(f"{self.path} is not a clockalign run (no CLKALIGN header)")
        magic, version, _, meta_len = HEADER.unpack_from(data, 0)
        self.version = version
        if version not in READABLE_VERSIONS:
            raise UnsupportedVersion(
                f"{self.path} is run-file format version {version}; this clockalign reads "
                f"versions {', '.join(map(str, READABLE_VERSIONS))}")
        self._data = data
        self._view = memoryview(data)
        self._index = {}
        self._order = []
        self.trailer = None
        self.truncated_at = None
        self.skipped = []          # (start byte, end byte, chunks) of each damaged stretch
        self.header_damaged = None
        self.decode_errors = []
        self.xid_messages = XidMessages()
        # columnar chunks decoded (decompressed), by type: what one command costs in decoding
        self.decodes = collections.Counter()
        pos = self._read_header(meta_len)
        self.chunk_count = self._scan(pos)

    # ------------------------------------------------------------ opening
    def _read_header(self, meta_len: int) -> int:
        start = HEADER.size
        end = start + meta_len
        crc_len = HEADER_CRC.size if self.version >= 2 else 0
        meta, why = None, None
        if end + crc_len > self.size:
            why = "its header declares more metadata than the file holds"
        elif crc_len and HEADER_CRC.unpack_from(self._data, end)[0] != zlib.crc32(
                self._view[:end]):
            why = "its header metadata fails its checksum"
        else:
            try:
                meta = msgpack.unpackb(self._view[start:end], raw=False)
            except Exception:       # msgpack raises several unrelated types on bad input
                why = "its header metadata does not decode"
            else:
                if not isinstance(meta, dict):
                    meta, why = None, "its header metadata is not a map"
        self.meta = meta if meta is not None else {}
        if why is None:
            return end + crc_len
        self.header_damaged = why
        return HEADER.size

    def _crc(self, off: int, length: int, seed: int) -> int:
        crc = seed
        for s in range(off, off + length, CRC_SLICE):
            e = min(off + length, s + CRC_SLICE)
            crc = zlib.crc32(self._view[s:e], crc)
            self._release(s, e - s)
        return crc

    def _chunk_at(self, pos: int):
        """(ctype, payload length, payload) of a chunk that checks at pos, else None."""
        if self.size - pos < CHUNK.size:
            return None
        mark, ctype, plen, crc = CHUNK.unpack_from(self._data, pos)
        if mark != CHUNK_MARK or ctype not in KNOWN_TYPES or plen > self.size - pos - CHUNK.size:
            return None
        seed = zlib.crc32(CHUNK_TYPE_LEN.pack(ctype, plen)) if self.version >= 2 else 0
        if self._crc(pos + CHUNK.size, plen, seed) != crc:
            return None
        off = pos + CHUNK.size
        try:
            payload = msgpack.unpackb(self._view[off:off + plen], raw=False)
            check_payload(ctype, payload, self.version)
        except Exception:           # msgpack raises several unrelated types on bad input
            return None
        finally:
            self._release(off, plen)
        return ctype, plen, payload

    def _resync(self, start: int):
        """Offset of the next chunk that checks after damaged bytes, or None."""
        pos = start
        while True:
            pos = self._find_mark(pos)
            if pos < 0:
                return None
            if self._chunk_at(pos) is not None:
                return pos
            if self.trailer is not None and self._data[pos:pos + 5] == END_MARK:
                return pos
            pos += 1

    def _find_mark(self, pos: int, end: int = None) -> int:
        """Next chunk mark at or after pos (before end), searching in slices whose pages are
        given back, so a long stretch of damage costs no memory."""
        end = self.size if end is None else end
        while pos < end:
            stop = min(end, pos + CRC_SLICE)
            hit = self._data.find(CHUNK_MARK, pos, min(end, stop + 1))
            self._release(pos, stop - pos)
            if hit >= 0:
                return hit
            pos = stop
        return -1

    def _end_at(self, pos: int) -> bool:
        if self.trailer is None or self._data[pos:pos + len(END_MARK)] != END_MARK:
            return False
        return self.size - pos >= END.size and END.unpack_from(self._data, pos)[1] == \
            self._trailer_offset

    def _scan(self, pos: int) -> int:
        n = 0
        ended = False
        while pos < self.size:
            if self._end_at(pos):
                pos += END.size
                ended = True
                break
            got = self._chunk_at(pos)
            if got is None:
                nxt = self._resync(pos + 1)
                if nxt is None:
                    break
                self.skipped.append((pos, nxt, self._count_marks(pos, nxt)))
                pos = nxt
                continue
            ctype, plen, payload = got
            if ctype == Chunk.TRAILER:
                self.trailer = payload["rows"][0]
                self._trailer_offset = pos
            else:
                self._index.setdefault(ctype, []).append((pos + CHUNK.size, plen))
            self._order.append((ctype, pos + CHUNK.size, plen))
            n += 1
            pos += CHUNK.size + plen
        if not ended or pos != self.size:
            self.truncated_at = pos
        return n

    def _count_marks(self, start: int, end: int) -> int:
        """How many chunks a damaged stretch held, judged by the chunk marks in it."""
        k, pos = 0, start
        while pos < end:
            if self._data[pos:pos + 2] == CHUNK_MARK and self.size - pos >= CHUNK.size \
                    and CHUNK.unpack_from(self._data, pos)[1] in KNOWN_TYPES:
                k += 1
            pos = self._find_mark(pos + 1, end)
            if pos < 0:
                break
        return max(k, 1)

    # ------------------------------------------------------------ state
    @property
    def truncated(self):
        """None for a clean file, else one phrase: what is damaged or missing, what was kept."""
        parts = []
        if self.header_damaged:
            parts.append(f"damaged in its header ({self.header_damaged})")
        if self.skipped:
            k = sum(c for _, _, c in self.skipped)
            where = ", ".join(f"byte {a} (to {b})" for a, b, _ in self.skipped[:5])
            more = f" and {len(self.skipped) - 5} more places" if len(self.skipped) > 5 else ""
            parts.append(f"damaged: {k} chunk{'s' if k != 1 else ''} skipped at {where}{more}")
        for e in self.decode_errors:
            parts.append(f"damaged: {e}")
        if self.truncated_at is not None:
            if not parts:
                return f"truncated at byte {self.truncated_at} ({self.chunk_count} chunks kept)"
            parts.append(f"truncated at byte {self.truncated_at}")
        if not parts:
            return None
        return "; ".join(parts) + f" ({self.chunk_count} chunks kept)"

    @property
    def clean(self) -> bool:
        return self.truncated is None

    def check_clean(self):
        """Raise TruncatedRun (exit code 3) if the file did not end with its trailer."""
        if self.truncated:
            raise DamagedRun(f"{self.path} is {self.truncated}; the recorder did not finish it")

    def chunk_types(self):
        return sorted(self._index)

    def chunk_sizes(self, ctype: int):
        """(offset, bytes incl. header) of each chunk of one type, without decoding."""
        for off, plen in self._index.get(ctype, []):
            yield off - CHUNK.size, CHUNK.size + plen

    # ------------------------------------------------------------ decoding
    def _unpack(self, off: int, plen: int):
        try:
            return msgpack.unpackb(self._view[off:off + plen], raw=False)
        finally:
            self._release(off, plen)

    def _payloads(self, ctype: int):
        for off, plen in self._index.get(ctype, []):
            yield off, self._unpack(off, plen)

    def iter_chunks(self):
        """(chunk type, payload) of every intact chunk in file order, trailer included."""
        for ctype, off, plen in self._order:
            yield ctype, self._unpack(off, plen)

    def _release(self, off: int, length: int):
        """Drop the file pages of a decoded chunk from this process's memory: the payload
        was copied out, so a streaming reader's RSS stays flat however long the run."""
        if isinstance(self._data, mmap.mmap) and hasattr(mmap, "MADV_DONTNEED") and length:
            start = off - off % mmap.PAGESIZE
            self._data.madvise(mmap.MADV_DONTNEED, start, off + length - start)

    def decode_payload(self, payload: dict, where: int = None) -> dict:
        """{name: ndarray} of one columnar payload of either format."""
        if "codec" in payload:
            try:
                return codec.decode_columns(payload)
            except codec.CodecError as e:
                raise DamagedRun(f"{self.path} is damaged: the chunk at byte {where} does not "
                                 f"decode ({e})") from None
        return {name: np.frombuffer(raw, dtype=np.dtype(dt))
                for name, (dt, raw) in payload["cols"].items()}

    def iter_columns(self, ctype: int, want=None):
        """Yield {name: ndarray} per chunk of one type, decoding one chunk at a time;
        ``want(i)``, asked just before the i-th chunk of the type, can skip it undecoded."""
        for i, (off, plen) in enumerate(self._index.get(ctype, [])):
            if want is not None and not want(i):
                continue
            payload = self._unpack(off, plen)
            self.decodes[ctype] += 1
            yield self.decode_payload(payload, off - CHUNK.size)

    def count_rows(self, ctype: int) -> int:
        """Rows in all chunks of one type, from the payloads' row counts (no column decoded)."""
        total = 0
        for _, payload in self._payloads(ctype):
            total += payload["n"] if ctype in COLUMNAR else len(payload["rows"])
        return total

    def columns(self, ctype: int) -> dict:
        """Concatenate all columnar chunks of one type into {name: ndarray}."""
        parts = {}
        for cols in self.iter_columns(ctype):
            for name, arr in cols.items():
                parts.setdefault(name, []).append(arr)
        return {k: np.concatenate(v) for k, v in parts.items()}

    def rows(self, ctype: int) -> list:
        out = []
        for _, payload in self._payloads(ctype):
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
        """Yield EVENT_DTYPE arrays, one per EVENTS chunk (bounded memory).  The XID_MSG
        records are taken out into self.xid_messages: xid_messages.of(row) gives an Xid's
        whole message (iter_columns(Chunk.EVENTS) shows the records as they are)."""
        for off, payload in self._payloads(Chunk.EVENTS):
            self.decodes[Chunk.EVENTS] += 1
            if "codec" not in payload:
                out = self.as_events(self.decode_payload(payload))
            else:
                out = np.zeros(payload["n"], dtype=EVENT_DTYPE)
                try:
                    codec.decode_columns(payload, into=out)
                except codec.CodecError as e:
                    raise DamagedRun(f"{self.path} is damaged: the chunk at byte "
                                     f"{off - CHUNK.size} does not decode ({e})") from None
            yield self.xid_messages.take(out)

    def events(self) -> np.ndarray:
        """All BPF events as one EVENT_DTYPE array, in file order (XID_MSG parts taken out
        into self.xid_messages)."""
        return self.xid_messages.take(self.as_events(self.columns(Chunk.EVENTS)))
