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
higher levels bought little size for a lot of time.  Measured by scripts/bench_runfile.py
on a synthetic launch storm (see results/runfile/runfile.md for the numbers and machine).
Decoding gives back the exact bytes of every column: it is lossless, whatever the values.

    payload = encode_columns({"ts": ts, "dur": dur})    # msgpack-able dict
    cols = decode_columns(payload)                      # {"ts": ndarray, "dur": ndarray}
"""
import numpy as np
import zstandard

from .schema import EVENT_DTYPE

CODEC = 1
LEVEL = 1
DELTA_COLUMNS = frozenset({"ts", "t0", "t1", "remote", "t_ns"})
MAX_ROWS = 1 << 21     # rows per chunk: bounds what a crafted chunk can make a reader allocate

_cctx = zstandard.ZstdCompressor(level=LEVEL)
_dctx = zstandard.ZstdDecompressor()


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


def _undo_zigzag_delta(z: np.ndarray, dtype: np.dtype) -> np.ndarray:
    d = (z >> z.dtype.type(1)) ^ (z.dtype.type(0) - (z & z.dtype.type(1)))
    return np.cumsum(d, dtype=d.dtype).view(dtype)


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


def encode_columns(cols: dict) -> dict:
    """Columns of equal length -> {"n", "codec", "layout" or "cols", "sizes", "z"}.

    ``cols`` spells the layout as [[name, dtype, how], ...] unless it is a named one;
    ``sizes`` gives the stored bytes of each sparse column, in order."""
    n = None
    spec, parts, sizes = [], [], []
    for name, arr in cols.items():
        arr = np.ascontiguousarray(arr)
        if n is None:
            n = len(arr)
        elif len(arr) != n:
            raise ValueError(f"column {name} has {len(arr)} rows, expected {n}")
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
    payload = {"n": n or 0, "codec": CODEC}
    lid = _LAYOUT_IDS.get(tuple(spec))
    if lid is None:
        payload["cols"] = [list(c) for c in spec]
    else:
        payload["layout"] = lid
    payload["sizes"] = sizes
    payload["z"] = _cctx.compress(b"".join(parts))
    return payload


def plan(payload: dict) -> tuple:
    """(rows, [(name, dtype, how, offset, nbytes)], total bytes) of a compact payload;
    CodecError when its description is inconsistent (nothing is decompressed)."""
    try:
        n = payload["n"]
        if payload.get("codec") != CODEC or not isinstance(n, int) or not 0 <= n <= MAX_ROWS:
            raise CodecError("unknown compact codec or bad row count")
        spec = LAYOUTS[payload["layout"]] if "layout" in payload else payload["cols"]
        sizes = list(payload["sizes"])
        if not isinstance(spec, list) or not isinstance(payload["z"], bytes):
            raise CodecError("bad column list")
        out, total = [], 0
        for name, dts, how in spec:
            if not isinstance(name, str) or not isinstance(dts, str):
                raise CodecError(f"bad column {name!r}")
            dt = np.dtype(dts)
            if dt.itemsize == 0 or dt.hasobject or dt.fields or dt.subdtype \
                    or how not in ("sparse", "raw", "delta", "shuffle") \
                    or (how == "raw" and dt.itemsize != 1) \
                    or (how == "delta" and dt.kind not in "iu"):
                raise CodecError(f"bad column {name!r}")
            if how == "sparse":
                if not sizes:
                    raise CodecError("sparse column sizes missing")
                nbytes = sizes.pop(0)
                if not isinstance(nbytes, int) or not (n + 7) // 8 <= nbytes <= \
                        (n + 7) // 8 + n * dt.itemsize:
                    raise CodecError(f"column {name} has a bad size")
            else:
                nbytes = n * dt.itemsize
            out.append((name, dt, how, total, nbytes))
            total += nbytes
        if sizes:
            raise CodecError("more sizes than sparse columns")
    except CodecError:
        raise
    except (KeyError, TypeError, ValueError) as e:
        raise CodecError(f"compact payload is inconsistent ({e})") from None
    return n, out, total


def _unshuffle(planes: np.ndarray, dst: np.ndarray) -> None:
    """Write byte planes (w, n) into the byte matrix dst (n, w), one plane at a time (a
    strided copy per plane is faster in numpy than one transposed copy)."""
    for k in range(planes.shape[0]):
        dst[:, k] = planes[k]


def decode_columns(payload: dict, into: np.ndarray = None) -> dict:
    """The exact columns given to encode_columns; CodecError if the payload is damaged.

    With ``into`` (a structured array of n rows whose fields include every column, in the
    columns' dtypes), the columns are written straight into it and {} is returned."""
    n, columns, total = plan(payload)
    try:
        buf = _dctx.decompress(payload["z"], max_output_size=total) if total else b""
    except zstandard.ZstdError as e:
        raise CodecError(f"compact payload does not decompress ({e})") from None
    if len(buf) != total:
        raise CodecError(f"compact payload holds {len(buf)} bytes, its columns say {total}")
    out = {}
    rowbytes = into.view(np.uint8).reshape(n, into.dtype.itemsize) if into is not None else None
    for name, dt, how, off, nbytes in columns:
        raw = np.frombuffer(buf, np.uint8, nbytes, off)
        w = dt.itemsize
        if into is not None:
            fdt, foff = into.dtype.fields[name][:2]
            if fdt != dt:
                raise CodecError(f"column {name} is {dt}, the output wants {fdt}")
            dst = rowbytes[:, foff:foff + w]
        else:
            dst = np.empty((n, w), np.uint8)
        if how == "sparse":
            nmask = (n + 7) // 8
            mask = np.unpackbits(raw[:nmask], count=n, bitorder="little").astype(bool)
            rows = raw[nmask:]
            if len(rows) != int(mask.sum()) * w:
                raise CodecError(f"column {name} has the wrong number of rows")
            if into is None:
                dst[:] = 0
            dst[mask] = rows.reshape(-1, w)
        elif how == "raw":
            dst[:, 0] = raw
        elif how == "delta":
            z = np.empty((n, w), np.uint8)
            _unshuffle(raw.reshape(w, n), z)
            v = _undo_zigzag_delta(z.reshape(-1).view(f"<u{w}"), dt)
            if into is not None:
                into[name] = v
                continue
            out[name] = v
            continue
        else:
            _unshuffle(raw.reshape(w, n), dst)
        if into is None:
            out[name] = dst.reshape(-1).view(dt)
    return out
