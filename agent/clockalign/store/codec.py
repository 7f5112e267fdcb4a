"""Compact columnar chunks (run-file format 2): cheap numpy transforms, then zstd.

A launch storm is very regular: timestamps climb by a few hundred ns, durations are a few
µs, the function pointer, grid, block and stream come from a handful of values, and most
events carry no ``data`` bytes at all.  Raw, that is 128 bytes per event (format 1); so
each column is first turned into something a general compressor sees as repetitive:

- ``delta``: integer time columns (ts, t0, t1, remote, t_ns) become zigzagged wrapping
  differences from the previous row, so an increasing (or slightly reordered: a CUDA event
  is stamped at entry but emitted at return) clock becomes small numbers;
- ``shuffle``: every multi-byte column is stored byte plane by byte plane (all low bytes,
  then all second bytes, ...), so the always-zero high bytes of small numbers and the
  shared high bytes of pointers become long runs;
- ``sparse``: a fixed-size raw column (``data``, 56 bytes) keeps a bitmap of its non-zero
  rows and only those rows;
- one byte-wide columns are stored as they are.

The planes of all columns go through one zstd frame at level 1 (zstandard, the reference
libzstd binding): level 1 already removes the runs and repeats the transforms expose, and
higher levels bought little size for a lot of time.  Measured by scripts/bench/runfile.py
on a synthetic launch storm (see results/runfile/runfile.md for the numbers and machine).
Decoding gives back the exact bytes of every column: it is lossless, whatever the values.
Decoding into a structured array (RunReader.iter_events) writes the byte planes of all the
columns that sit side by side in its rows with one cache-blocked transpose, rebuilds a delta
column contiguous before assigning it, and writes only the non-zero rows of a sparse one:
faster than format 1's per-field copies (results/runfile/runfile.md).

    payload = encode_columns({"ts": ts, "dur": dur})    # msgpack-able dict
    cols = decode_columns(payload)                      # {"ts": ndarray, "dur": ndarray}
"""
import threading

import numpy as np
import zstandard

from ..native import batch as native_batch
from .schema import EVENT_DTYPE

CODEC = 1
LEVEL = 1
DELTA_COLUMNS = frozenset({"ts", "t0", "t1", "remote", "t_ns"})
MAX_ROWS = 1 << 21     # rows per chunk: bounds what a crafted chunk can make a reader allocate

# zstandard's contexts must not be used by two threads at once (the recorder's loop, clock
# probe and counter sampler all write chunks; a shared compressor crashed the recorder with
# SIGSEGV under load), so each thread has its own.
_contexts = threading.local()


def _cctx() -> zstandard.ZstdCompressor:
    c = getattr(_contexts, "c", None)
    if c is None:
        c = _contexts.c = zstandard.ZstdCompressor(level=LEVEL)
    return c


def _dctx() -> zstandard.ZstdDecompressor:
    d = getattr(_contexts, "d", None)
    if d is None:
        d = _contexts.d = zstandard.ZstdDecompressor()
    return d


class CodecError(ValueError):
    """A compact payload that does not decode (a damaged or crafted chunk)."""


def _zigzag_delta(a: np.ndarray) -> np.ndarray:
    u = a.view(np.dtype(f"<u{a.dtype.itemsize}"))
    d = np.empty_like(u)
    d[:1] = u[:1]
    np.subtract(u[1:], u[:-1], out=d[1:])
    s = d.view(np.dtype(f"<i{a.dtype.itemsize}"))
    bits = a.dtype.itemsize * 8 - 1
    return ((s << 1) ^ (s >> bits)).view(u.dtype)


def _planes(a: np.ndarray) -> np.ndarray:
    w = a.dtype.itemsize
    return np.ascontiguousarray(a.view(np.uint8).reshape(len(a), w).T)


def _how(name: str, dt: np.dtype) -> str:
    if dt.kind == "V" or dt.kind == "S":
        return "sparse"
    if dt.itemsize == 1:
        return "raw"
    if name in DELTA_COLUMNS and dt.kind in "iu":
        return "delta"
    return "shuffle"


def _layout(name: str, dt: np.dtype) -> tuple:
    return (name, dt.str, _how(name, dt))


# Column layouts common enough to be named by a number instead of spelled out in every
# chunk (a few-event chunk would otherwise spend ~250 bytes on names).  Never reuse one.
LAYOUTS = {1: [_layout(n, EVENT_DTYPE[n]) for n in EVENT_DTYPE.names]}
_LAYOUT_IDS = {tuple(v): k for k, v in LAYOUTS.items()}


def equal_columns(cols: dict):
    """(rows, {name: contiguous array}); ValueError unless every column has as many rows."""
    out, n = {}, None
    for name, arr in cols.items():
        arr = np.ascontiguousarray(arr)
        if n is None:
            n = len(arr)
        elif len(arr) != n:
            raise ValueError(f"column {name} has {len(arr)} rows, expected {n}")
        out[name] = arr
    return n or 0, out


def encode_columns(cols: dict) -> dict:
    """Columns of equal length -> {"n", "codec", "layout" or "cols", "sizes", "z"}.

    ``cols`` spells the layout as [[name, dtype, how], ...] unless it is a named one;
    ``sizes`` gives the stored bytes of each sparse column, in order."""
    n, cols = equal_columns(cols)
    spec, parts, sizes = [], [], []
    for name, arr in cols.items():
        dt = arr.dtype
        if dt.byteorder == ">":
            arr = arr.astype(dt.newbyteorder("<"))
            dt = arr.dtype
        how = _how(name, dt)
        if how == "sparse":
            rows = arr.view(np.uint8).reshape(len(arr), dt.itemsize)
            mask = rows.any(axis=1)
            part = np.packbits(mask, bitorder="little").tobytes() + rows[mask].tobytes()
            sizes.append(len(part))
        elif how == "raw":
            part = arr.tobytes()
        elif how == "delta":
            part = _planes(_zigzag_delta(arr)).tobytes()
        else:
            part = _planes(arr).tobytes()
        spec.append((name, dt.str, how))
        parts.append(part)
    return _payload(n or 0, spec, sizes, b"".join(parts))


def _payload(n: int, spec: list, sizes: list, data) -> dict:
    payload = {"n": n, "codec": CODEC}
    lid = _LAYOUT_IDS.get(tuple(spec))
    if lid is None:
        payload["cols"] = [list(c) for c in spec]
    else:
        payload["layout"] = lid
    payload["sizes"] = sizes
    payload["z"] = _cctx().compress(data)
    return payload


def encode_records(rows: np.ndarray) -> dict:
    """encode_columns of a structured array's fields, in field order: the same payload, built
    by the C helper (clockalign/native/batch.c) in one pass over the rows, for the recorder's
    event batches (numpy's strided copies cost ~1 us an event); encode_columns itself for a
    layout batch.c does not take (big-endian, over 64 columns or a field over 64 bytes).
    NativeMissing where the helper is not built."""
    spec = [_layout(name, rows.dtype[name]) for name in rows.dtype.names]
    if all(rows.dtype[name].byteorder != ">" for name in rows.dtype.names):
        built = native_batch.encode(np.ascontiguousarray(rows), spec)
        if built is not None:
            return _payload(len(rows), spec, built[1], built[0])
    return encode_columns({name: rows[name] for name in rows.dtype.names})


_SPECS = {}             # layout (id or spelled out) -> checked columns; see _spec
_SPECS_MAX = 1024       # distinct spelled-out layouts remembered (a crafted file may vary them)


def _check_spec(spec) -> tuple:
    """((name, dtype, how, itemsize), ...) of a column list; CodecError if one is bad."""
    if not isinstance(spec, list):
        raise CodecError("bad column list")
    out = []
    for name, dts, how in spec:
        if not isinstance(name, str) or not isinstance(dts, str):
            raise CodecError(f"bad column {name!r}")
        dt = np.dtype(dts)
        if dt.itemsize == 0 or dt.hasobject or dt.fields or dt.subdtype \
                or how not in ("sparse", "raw", "delta", "shuffle") \
                or (how == "raw" and dt.itemsize != 1) \
                or (how == "delta" and dt.kind not in "iu"):
            raise CodecError(f"bad column {name!r}")
        out.append((name, dt, how, dt.itemsize))
    return tuple(out)


def _spec(payload: dict):
    """(cache key, checked columns) of a payload's layout, checked once per distinct layout:
    a run of small chunks would otherwise spend most of its decoding parsing dtypes."""
    if "layout" in payload:
        key = payload["layout"]
        if isinstance(key, list):
            raise CodecError("bad layout")
        key = ("id", key)
    else:
        cols = payload["cols"]
        if not isinstance(cols, list):
            raise CodecError("bad column list")
        key = ("cols", tuple(tuple(c) if isinstance(c, list) else c for c in cols))
        try:
            hash(key)
        except TypeError:                   # not a plain list of lists: check, do not keep
            return None, _check_spec(cols)
    got = _SPECS.get(key)
    if got is None:
        got = _check_spec(LAYOUTS[key[1]] if key[0] == "id" else payload["cols"])
        if len(_SPECS) < _SPECS_MAX:
            _SPECS[key] = got
    return key, got


_PLANS = {}             # (layout key, rows, sparse sizes) -> _plan's answer
_PLANS_MAX = 4096       # emptied when full: chunks of a run mostly repeat a few shapes


def plan(payload: dict) -> tuple:
    """(rows, [(name, dtype, how, offset, nbytes)], total bytes) of a compact payload;
    CodecError when its description is inconsistent (nothing is decompressed)."""
    return _plan(payload)[:3]


def _plan(payload: dict) -> tuple:
    """plan() and the layout's cache key."""
    try:
        n = payload["n"]
        if payload.get("codec") != CODEC or not isinstance(n, int) or not 0 <= n <= MAX_ROWS:
            raise CodecError("unknown compact codec or bad row count")
        key, spec = _spec(payload)
        sizes = payload["sizes"]
        if not isinstance(sizes, list):
            sizes = list(sizes)
        if not isinstance(payload["z"], bytes):
            raise CodecError("bad column list")
        pkey = (key, n, *sizes) if key is not None and type(n) is int and all(
            type(x) is int for x in sizes) else None  # 7.0 == 7: a float is checked each time
        got = _PLANS.get(pkey) if pkey is not None else None
        if got is not None:
            return got
        out, total, k = [], 0, 0
        nmask = (n + 7) // 8
        for name, dt, how, w in spec:
            if how == "sparse":
                if k == len(sizes):
                    raise CodecError("sparse column sizes missing")
                nbytes = sizes[k]
                k += 1
                if not isinstance(nbytes, int) or not nmask <= nbytes <= nmask + n * w:
                    raise CodecError(f"column {name} has a bad size")
            else:
                nbytes = n * w
            out.append((name, dt, how, total, nbytes))
            total += nbytes
        if k != len(sizes):
            raise CodecError("more sizes than sparse columns")
        got = (n, tuple(out), total, key)
        if pkey is not None:
            if len(_PLANS) >= _PLANS_MAX:
                _PLANS.clear()
            _PLANS[pkey] = got
    except CodecError:
        raise
    except (KeyError, TypeError, ValueError) as e:
        raise CodecError(f"compact payload is inconsistent ({e})") from None
    return got


BLOCK_ROWS = 2048      # rows per block of the byte transpose into a structured array
SMALL_ROWS = 512       # up to this many rows, one transposed copy beats a copy per plane


def _undo_zigzag_delta(z: np.ndarray, dtype: np.dtype) -> np.ndarray:
    one = z.dtype.type(1)
    sign = np.bitwise_and(z, one)
    np.negative(sign, out=sign)                 # 0 or all ones: unsigned, wraps
    d = np.right_shift(z, one)
    np.bitwise_xor(d, sign, out=d)
    return np.cumsum(d, out=d).view(dtype)


def _undo_zigzag_delta_in_place(v: np.ndarray) -> None:
    """_undo_zigzag_delta on an unsigned (possibly strided) view, overwriting it."""
    one = v.dtype.type(1)
    sign = np.bitwise_and(v, one)
    np.negative(sign, out=sign)
    np.right_shift(v, one, out=v)
    np.bitwise_xor(v, sign, out=v)
    np.cumsum(v, out=v)


def _unshuffle(planes: np.ndarray, dst: np.ndarray) -> None:
    """Write byte planes (w, n) into a contiguous byte matrix dst (n, w): one plane at a time
    (a strided copy per plane is faster in numpy than one transposed copy), or one transposed
    copy for a few rows, where the per-call cost is what counts."""
    if planes.shape[1] <= SMALL_ROWS:
        dst[...] = planes.T
        return
    for k in range(planes.shape[0]):
        dst[:, k] = planes[k]


def _transpose_into(planes: np.ndarray, dst: np.ndarray) -> None:
    """Write byte planes (W, n) into dst (n, W), a strided slice of a structured array's rows.

    Plane by plane would walk all of dst's rows once per plane (W passes over a 128-byte
    stride); blocks of BLOCK_ROWS rows keep source and destination in cache, and one block
    covers every column of the run.  Planes n bytes apart, n a multiple of 4096 (8192-row
    chunks), all fall in the same few cache sets and evict each other: the transpose is 2 to
    4 times slower, so such planes are first copied 64 bytes apart."""
    w, n = planes.shape
    if w > 8 and n > SMALL_ROWS and len({(k * n >> 6) & 63 for k in range(min(w, 64))}) < w // 4:
        padded = np.empty((w, n + 64), np.uint8)
        padded[:, :n] = planes
        planes = padded
    for i in range(0, n, BLOCK_ROWS):
        dst[i:i + BLOCK_ROWS] = planes[:, i:min(n, i + BLOCK_ROWS)].T


def _sparse_rows(raw: np.ndarray, n: int, w: int, name: str):
    """(indices of the non-zero rows, their bytes as (k, w)) of a sparse column."""
    nmask = (n + 7) // 8
    rows = raw[nmask:]
    if not len(rows) and not raw[:nmask].any():     # the usual case: no row has data
        return None, rows
    idx = np.flatnonzero(np.unpackbits(raw[:nmask], count=n, bitorder="little"))
    if len(rows) != len(idx) * w:
        raise CodecError(f"column {name} has the wrong number of rows")
    return idx, rows.reshape(-1, w)


def _decompress(payload: dict, total: int) -> bytes:
    try:
        buf = _dctx().decompress(payload["z"], max_output_size=total) if total else b""
    except zstandard.ZstdError as e:
        raise CodecError(f"compact payload does not decompress ({e})") from None
    if len(buf) != total:
        raise CodecError(f"compact payload holds {len(buf)} bytes, its columns say {total}")
    return buf


def _delta_column(raw: np.ndarray, n: int, dt: np.dtype) -> np.ndarray:
    w = dt.itemsize
    z = np.empty((n, w), np.uint8)
    _unshuffle(raw.reshape(w, n), z)
    return _undo_zigzag_delta(z.reshape(-1).view(f"<u{w}"), dt)


def decode_columns(payload: dict, into: np.ndarray = None) -> dict:
    """The exact columns given to encode_columns; CodecError if the payload is damaged.

    With ``into`` (a zeroed C-contiguous structured array of n rows whose fields include
    every column, in the columns' dtypes), the columns are written straight into it and {}
    is returned."""
    n, columns, total, key = _plan(payload)
    if into is not None:
        if len(into) != n or into.dtype.fields is None or not into.flags.c_contiguous:
            raise CodecError(f"the output is not a contiguous structured array of {n} rows")
        steps = _steps(key, columns, into.dtype, n <= SMALL_ROWS)
        _decode_into(n, columns, steps, _decompress(payload, total), into)
        return {}
    buf = _decompress(payload, total)
    if n <= SMALL_ROWS:
        rows = _packed(key, columns)
        if rows is not None:        # few rows: numpy calls cost more than bytes; see _packed
            tmp = np.zeros(n, rows)
            _decode_into(n, columns, _steps(key, columns, rows, True), buf, tmp)
            return {c[0]: tmp[c[0]].copy() for c in columns}
    out = {}
    for name, dt, how, off, nbytes in columns:
        raw = np.frombuffer(buf, np.uint8, nbytes, off)
        w = dt.itemsize
        if how == "delta":
            out[name] = _delta_column(raw, n, dt)
            continue
        if how == "sparse":
            idx, rows = _sparse_rows(raw, n, w, name)
            dst = np.zeros((n, w), np.uint8)
            if idx is not None:
                dst[idx] = rows
        else:
            dst = np.empty((n, w), np.uint8)
            _unshuffle(raw.reshape(w, n), dst)      # a raw column is one plane
        out[name] = dst.reshape(-1).view(dt)
    return out


_PACKED = {}            # layout key -> its columns as one packed structured dtype, or False


def _packed(key, columns: tuple):
    """The columns of a layout as fields of one packed structured dtype (None when two
    share a name, or the layout is not kept): a chunk of few rows decodes faster into one
    array of those (a handful of numpy calls) with a copy of each field than column by
    column (several calls per column)."""
    if key is None:
        return None
    got = _PACKED.get(key)
    if got is None:
        names = [c[0] for c in columns]
        try:
            got = np.dtype([(c[0], c[1]) for c in columns])
            if got.names != tuple(names):
                got = False
        except (TypeError, ValueError):
            got = False
        if len(_PACKED) < _SPECS_MAX:
            _PACKED[key] = got
    return got or None


_STEPS = {}             # (layout key, output dtype, few rows) -> steps; see _steps


def _steps(key, columns: tuple, dtype: np.dtype, few: bool) -> tuple:
    """How to decode one layout into one structured dtype, worked out once: ("planes", first
    column, field offset, bytes per row) for consecutive byte-plane columns that sit side by
    side in its rows, as every EVENT_DTYPE column from dur to a4 does (one run of planes in
    the buffer, one blocked transpose); ("delta", column), rebuilt contiguous and assigned;
    ("sparse", column), writing only the non-zero rows.  With ``few`` rows, where the cost
    is numpy calls, not bytes, a delta column joins the planes (ts with dur..a4: one
    transpose for the 72 bytes) and ("undo", column) then rebuilds it where it lies."""
    ck = (key, dtype, few)
    got = _STEPS.get(ck) if key is not None else None
    if got is not None:
        return got
    fields = dtype.fields
    steps, undo, run = [], [], None
    for i, (name, dt, how, _, _) in enumerate(columns):
        if name not in fields:
            raise CodecError(f"the output has no column {name}")
        fdt, foff = fields[name][:2]
        if fdt != dt:
            raise CodecError(f"column {name} is {dt}, the output wants {fdt}")
        if how in ("shuffle", "raw") or (few and how == "delta"):
            if how == "delta":
                undo.append(("undo", i))
            if run is not None and run[2] + run[3] == foff:
                run[3] += dt.itemsize
                continue
            run = ["planes", i, foff, dt.itemsize]
            steps.append(run)
        else:
            run = None
            steps.append((how, i))
    steps = tuple(tuple(s) for s in steps + undo)
    if key is not None and len(_STEPS) < _SPECS_MAX:
        _STEPS[ck] = steps
    return steps


def _decode_into(n: int, columns: tuple, steps: tuple, buf: bytes, into: np.ndarray) -> None:
    rowbytes = into.view(np.uint8).reshape(n, into.dtype.itemsize)
    for step in steps:
        name, dt, how, off, nbytes = columns[step[1]]
        kind = step[0]
        if kind == "planes":
            if n:
                width, f0 = step[3], step[2]
                planes = np.frombuffer(buf, np.uint8, width * n, off).reshape(width, n)
                _transpose_into(planes, rowbytes[:, f0:f0 + width])
        elif kind == "undo":
            v = into[name].view(f"<u{dt.itemsize}")
            _undo_zigzag_delta_in_place(v)
        elif kind == "delta":
            into[name] = _delta_column(np.frombuffer(buf, np.uint8, nbytes, off), n, dt)
        else:
            idx, rows = _sparse_rows(np.frombuffer(buf, np.uint8, nbytes, off), n,
                                     dt.itemsize, name)
            if idx is not None:
                into[name][idx] = rows.reshape(-1).view(dt)
