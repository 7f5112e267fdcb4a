"""Streaming, crash-safe run-file writer.

Layout of format 2 (all integers little endian)::

    header:  MAGIC(8) | version u16 | reserved u16 | meta_len u32 | meta (msgpack map)
             | crc32(every header byte before it) u32
    chunk:   b"CK" | type u16 | payload_len u32 | crc32(type, payload_len, payload) u32
             | payload (msgpack)
    ...
    trailer: one chunk of type TRAILER, then b"CAEND" + u64 offset of that chunk

A chunk payload is ``{"rows": [...]}`` or columnar: ``{"n", "codec", "cols", "z"}`` in
format 2 (store/codec.py: per-column transforms + zstd, ~8 bytes per launch event instead
of 128), ``{"n", "cols": {name: [dtype, bytes]}}`` in format 1.  Format 1 had no header
checksum and left the type out of the chunk checksum; it is still read (store/reader.py)
and written on request (``format_version=1``, for tests and benchmarks).  Every chunk is
self-delimiting and checksummed, and the file is flushed to the OS at least every
``flush_interval`` seconds, so a SIGKILL of the recorder loses at most what was written
since the last flush.

Run files hold command lines, peers and thread names: they are created 0600 and, under
sudo, handed to the invoking user (SUDO_UID/SUDO_GID).

    with RunWriter("run.ca", meta) as w:
        w.write_columns(Chunk.EVENTS, {"ts": ts, ...})
"""
import errno
import os
import stat
import struct
import threading
import time
import zlib

import msgpack

from ..errors import ClockalignError, RunFileWriteError
from . import codec
from .schema import FORMAT_VERSION, MAGIC, Chunk

HEADER = struct.Struct("<8sHHI")
HEADER_CRC = struct.Struct("<I")
CHUNK = struct.Struct("<2sHII")
CHUNK_TYPE_LEN = struct.Struct("<HI")
CHUNK_MARK = b"CK"
END = struct.Struct("<5sQ")
END_MARK = b"CAEND"
WRITABLE_VERSIONS = (1, 2)


def encode_columns(cols: dict) -> dict:
    """Format-1 columnar payload: each numpy column as (dtype string, raw bytes)."""
    n, cols = codec.equal_columns(cols)
    return {"n": n, "cols": {name: [arr.dtype.str, arr.tobytes()] for name, arr in cols.items()}}


def chunk_crc(version: int, ctype: int, body) -> int:
    """The checksum a chunk header carries: of the payload (v1), of type+length+payload (v2)."""
    if version == 1:
        return zlib.crc32(body)
    return zlib.crc32(body, zlib.crc32(CHUNK_TYPE_LEN.pack(ctype, len(body))))


def _is_run_file(path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


def check_output(path, force: bool = False, what: str = "run file") -> None:
    """Raise a one-sentence ClockalignError unless ``path`` can be created as a private file:
    its directory exists and is writable, it is not a directory, a device or a symlink, and
    an existing file is replaced only when it is a run file (or with force)."""
    path = os.fspath(path)
    if not path:
        raise ClockalignError(f"no {what} path given")
    d = os.path.dirname(os.path.abspath(path))
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    except NotADirectoryError:
        raise ClockalignError(f"cannot write {path}: a part of that path is a file, "
                              "not a directory") from None
    except OSError as e:
        raise ClockalignError(f"cannot write {path}: {e.strerror}") from None
    if st is not None:
        if stat.S_ISLNK(st.st_mode):
            if not force:
                raise ClockalignError(f"{path} is a symbolic link: refusing to write through "
                                      "it (remove it, or give --force)")
        elif stat.S_ISDIR(st.st_mode):
            raise ClockalignError(f"cannot write {path}: it is a directory")
        elif not stat.S_ISREG(st.st_mode):
            raise ClockalignError(f"cannot write {path}: it is not a regular file")
        elif not force and what == "run file" and st.st_size and not _is_run_file(path):
            raise ClockalignError(f"{path} exists and is not a clockalign run: refusing to "
                                  "overwrite it (choose another -o, or give --force)")
    if not os.path.isdir(d):
        if os.path.exists(d):
            raise ClockalignError(f"cannot write {path}: {d} is not a directory")
        raise ClockalignError(f"cannot write {path}: directory {d} does not exist")
    if not os.access(d, os.W_OK | os.X_OK):
        raise ClockalignError(f"cannot write {path}: directory {d} is not writable")
    if os.path.realpath(d).startswith(("/proc/", "/sys/")) or os.path.realpath(d) in (
            "/proc", "/sys"):
        raise ClockalignError(f"cannot write {path}: {d} is a kernel file system")


def _owner():
    """(uid, gid) of the user behind sudo when we are root through sudo, else None."""
    if os.geteuid() != 0:
        return None
    try:
        uid, gid = int(os.environ["SUDO_UID"]), int(os.environ["SUDO_GID"])
    except (KeyError, ValueError):
        return None
    return (uid, gid) if uid != 0 else None


def open_private(path, mode: str = "wb", force: bool = True):
    """Open ``path`` for writing as a 0600 file owned by the sudo user (if any).

    Replaces an existing file (not a symlink unless force) by a new inode, so an old
    file's looser mode or owner is not inherited."""
    path = os.fspath(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)
    if not force:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        st = os.lstat(path)
        if stat.S_ISREG(st.st_mode) and (st.st_mode & 0o077 or _owner() and
                                         (st.st_uid, st.st_gid) != _owner()):
            os.unlink(path)
    except OSError:
        pass
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise ClockalignError(f"{path} is a symbolic link: refusing to write through it")
        raise ClockalignError(f"cannot write {path}: {e.strerror}") from None
    try:
        os.fchmod(fd, 0o600)
        owner = _owner()
        if owner:
            os.fchown(fd, *owner)
    except OSError:
        pass
    return os.fdopen(fd, mode)


class RunWriter:
    """Appends checksummed chunks to a run file; thread-safe.

    A failed write (a full disk, an I/O error) raises RunFileWriteError once, closes the
    file where it stands (every chunk before it stays readable) and makes later writes
    no-ops, so the recording can end cleanly."""

    def __init__(self, path, meta: dict, flush_interval: float = 0.25,
                 format_version: int = FORMAT_VERSION, force: bool = True):
        if format_version not in WRITABLE_VERSIONS:
            raise ValueError(f"cannot write run-file format {format_version}")
        self.path = os.fspath(path)
        self.version = format_version
        self._lock = threading.Lock()
        self._last_flush = time.monotonic()
        self.flush_interval = flush_interval
        self.chunks = 0
        self.closed = False
        self.failed = None
        self._owner_thread = threading.get_ident()
        self._size_at_fail = 0
        self._f = open_private(self.path, "wb", force=force)
        body = msgpack.packb(meta, use_bin_type=True)
        head = HEADER.pack(MAGIC, format_version, 0, len(body)) + body
        if format_version >= 2:
            head += HEADER_CRC.pack(zlib.crc32(head))
        with self._lock:
            self._write_locked(head)
            if not self.failed:
                self._flush_locked()
        self._raise_failed()

    @property
    def size(self) -> int:
        with self._lock:
            return self._f.tell() if not self._f.closed else self._size_at_fail

    def _fail_locked(self, e: OSError):
        try:
            self._size_at_fail = os.fstat(self._f.fileno()).st_size
        except (OSError, ValueError):
            self._size_at_fail = 0
        self.failed = RunFileWriteError(
            f"cannot write {self.path}: {e.strerror or e} — the recording stopped there; "
            f"the file keeps its first {self.chunks} chunks and stays readable "
            "(it reads as truncated)")
        try:
            self._f.close()
        except OSError:
            pass
        self.closed = True

    def _raise_failed(self):
        """Raise a write failure once, in the thread that opened the writer (helper threads
        writing their own chunks see later writes become no-ops instead)."""
        if self.failed is not None and not getattr(self, "_reported", False) \
                and threading.get_ident() == self._owner_thread:
            self._reported = True
            raise self.failed

    def _write_locked(self, b) -> bool:
        try:
            self._f.write(b)
            return True
        except OSError as e:
            self._fail_locked(e)
            return False

    def _write_chunk(self, ctype: int, payload: dict):
        body = msgpack.packb(payload, use_bin_type=True)
        with self._lock:
            if self.failed is not None:
                pass
            elif self.closed:
                raise ValueError("run file already closed")
            else:
                offset = self._f.tell()
                head = CHUNK.pack(CHUNK_MARK, int(ctype), len(body),
                                  chunk_crc(self.version, int(ctype), body))
                if self._write_locked(head + body):
                    self.chunks += 1
                    if time.monotonic() - self._last_flush >= self.flush_interval:
                        self._flush_locked()
                    if self.failed is None:
                        return offset
        self._raise_failed()
        return None

    def write_columns(self, ctype: int, cols: dict) -> None:
        """Write one columnar chunk (all columns the same length); empty input writes nothing."""
        if not cols:
            return
        n = len(next(iter(cols.values())))
        if n > codec.MAX_ROWS:
            for i in range(0, n, codec.MAX_ROWS):
                self.write_columns(ctype, {k: v[i:i + codec.MAX_ROWS] for k, v in cols.items()})
            return
        payload = codec.encode_columns(cols) if self.version >= 2 else encode_columns(cols)
        if payload["n"]:
            self._write_chunk(ctype, payload)

    def write_records(self, ctype: int, rows) -> None:
        """Write a structured array as one columnar chunk per MAX_ROWS rows, one column per
        field (the recorder's event batches: format 2 encodes them natively)."""
        if self.version < 2:
            self.write_columns(ctype, {name: rows[name] for name in rows.dtype.names})
            return
        for i in range(0, len(rows), codec.MAX_ROWS):
            payload = codec.encode_records(rows[i:i + codec.MAX_ROWS])
            if payload["n"]:
                self._write_chunk(ctype, payload)

    def write_rows(self, ctype: int, rows: list) -> None:
        """Write one chunk of msgpack-able rows (dicts); empty input writes nothing."""
        if rows:
            self._write_chunk(ctype, {"rows": list(rows)})

    def _flush_locked(self):
        try:
            self._f.flush()
        except OSError as e:
            self._fail_locked(e)
        self._last_flush = time.monotonic()

    def flush(self) -> None:
        """Hand everything written so far to the OS (survives a SIGKILL of this process)."""
        with self._lock:
            if not self.closed:
                self._flush_locked()
        self._raise_failed()

    def close(self, trailer: dict = None) -> None:
        """Write the trailer (counts, drops, why the recording ended) and close."""
        if self.closed:
            self._raise_failed()
            return
        trailer = dict(trailer or {})
        trailer.setdefault("t_ns", time.clock_gettime_ns(time.CLOCK_MONOTONIC))
        trailer["chunks"] = self.chunks
        offset = self._write_chunk(Chunk.TRAILER, {"rows": [trailer]})
        with self._lock:
            if self.failed is None and self._write_locked(END.pack(END_MARK, offset)):
                try:
                    self._f.flush()
                    os.fsync(self._f.fileno())
                    self._size_at_fail = self._f.tell()
                    self._f.close()
                except OSError as e:
                    self._fail_locked(e)
                self.closed = True
        self._raise_failed()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close({"reason": "exception" if exc[0] else "closed"})
