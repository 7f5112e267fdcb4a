"""Vectorised assembly of byte records (the protobuf packets of the Perfetto export),
millions per second.

Building one Python object per event runs at ~50k events/s; here a record is a list of
*parts*, each a column of byte strings (``Part.b``: uint8 ``(rows, w)``, or ``(1, w)`` for
the same bytes on every row).  ``flatten`` lays the parts side by side in one matrix and
returns the rows' bytes concatenated.

Speed comes from giving every row the same layout: a varint column is written with the
column's widest width (an overlong varint, e.g. 5 as ``85 80 00``, which every protobuf
parser reads as 5), a string from a ByteTable is padded after its end where the field
allows it.  Then the matrix needs no per-byte mask: constants are one template row copied
to all rows, and only parts that are absent on some rows (``masked``) or of really
variable length cost a boolean mask.  (JSON text goes into its rows in place instead:
export/jsontext.py.)

    parts = [const(b"\x0a"), varint(lengths), const(b"..."), fixed64(values)]
    blob = flatten(parts, rows)
"""
import numpy as np

_U64 = np.uint64
_VARINT_LIMITS = np.array([1 << (7 * k) for k in range(1, 10)], dtype=np.uint64)


class Part:
    """Byte strings, one per row (b: (rows|1, w)), with length n (int: all rows; or array).

    ``keep`` (bool per row) marks rows where the part is present at all.  ``group``:
    (parts, bytes per row) when this part starts a run of that many parts whose length is
    known (a length-delimited field: grouped()), so total() need not add them up again.
    """

    __slots__ = ("b", "n", "keep", "group")

    def __init__(self, b, n, keep=None, group=None):
        self.b = b
        self.n = n
        self.keep = keep
        self.group = group

    @property
    def width(self) -> int:
        return self.b.shape[1]

    @property
    def fixed(self) -> bool:
        return np.isscalar(self.n) or isinstance(self.n, (int, np.integer))

    def lengths(self, rows):
        n = np.broadcast_to(np.asarray(self.n, dtype=np.int64), (rows,))
        return n if self.keep is None else np.where(self.keep, n, 0)


def const(data: bytes) -> Part:
    """The same bytes on every row."""
    return Part(np.frombuffer(bytes(data), dtype=np.uint8).reshape(1, -1), len(data))


def as_u64(values):
    v = np.asarray(values)
    if v.dtype == np.uint64:
        return v
    if v.dtype.kind == "i":
        return v.astype(np.int64, copy=False).view(np.uint64)
    return v.astype(np.uint64)


def varint_width(vmax: int) -> int:
    return int(np.searchsorted(_VARINT_LIMITS, np.uint64(vmax), side="right")) + 1


def varint(values, width: int = None) -> Part:
    """Protobuf varints of uint64 values (int64 as two's complement), all ``width`` bytes
    (default: the widest value's), padded overlong where a value needs fewer."""
    v = as_u64(values)
    rows = v.shape[0]
    if width is None:
        width = varint_width(int(v.max())) if rows else 1
    out = np.empty((rows, width), dtype=np.uint8)
    for k in range(width):
        col = (v >> _U64(7 * k)) if k else v
        out[:, k] = col.astype(np.uint8) & np.uint8(0x7F)
        if k < width - 1:
            out[:, k] |= np.uint8(0x80)
    return Part(out, width)


def varint_min(values) -> Part:
    """Protobuf varints of uint64 values, each in its fewest bytes (a part of variable
    length: worth its mask where the values span widths, as time deltas do)."""
    v = as_u64(values)
    rows = v.shape[0]
    if not rows:
        return Part(np.zeros((0, 1), np.uint8), 1)
    w = np.searchsorted(_VARINT_LIMITS, v, side="right").astype(np.int64) + 1
    lo, hi = int(w.min()), int(w.max())
    if lo == hi:
        return varint(v, hi)
    out = np.empty((rows, hi), dtype=np.uint8)
    for k in range(hi):
        col = (v >> _U64(7 * k)) if k else v
        out[:, k] = col.astype(np.uint8) & np.uint8(0x7F)
        if k < hi - 1:
            out[:, k] |= (w > k + 1).astype(np.uint8) << np.uint8(7)
    return Part(out, w)


def varint_scalar(v: int, width: int = None) -> bytes:
    """One varint as bytes (overlong to ``width`` if given)."""
    width = width or varint_width(v)
    out = bytearray()
    for k in range(width):
        out.append(((v >> (7 * k)) & 0x7F) | (0x80 if k < width - 1 else 0))
    return bytes(out)


def fixed64(values) -> Part:
    """Little-endian 8-byte values (protobuf fixed64 / double)."""
    v = np.ascontiguousarray(values)
    return Part(v.view(np.uint8).reshape(-1, 8), 8)


class ByteTable:
    """Small table of byte strings; ``take(idx)`` gives row idx[i] on row i.

    ``pad``: a byte to fill short strings up to the longest, giving a fixed-width Part.
    """

    def __init__(self, items, pad: bytes = None):
        items = [bytes(x) for x in items]
        w = max([len(x) for x in items] + [1])
        fill = pad[0] if pad else 0
        self.b = np.full((max(len(items), 1), w), fill, dtype=np.uint8)
        self.n = np.zeros(max(len(items), 1), dtype=np.int64)
        for i, x in enumerate(items):
            self.b[i, :len(x)] = np.frombuffer(x, np.uint8)
            self.n[i] = len(x)
        self.pad = pad
        self.fixed = pad is not None or len(set(self.n.tolist())) == 1
        self.width = w

    def take(self, idx) -> Part:
        """Row idx[i] on row i; a padded table is cut to the longest string taken."""
        idx = np.asarray(idx, dtype=np.intp)
        if self.b.shape[0] == 1:
            return Part(self.b, self.width if self.fixed else int(self.n[0]))
        if self.fixed:
            w = int(self.n[idx].max()) if len(idx) and self.pad else self.width
            return Part(self.b[idx, :w], w)
        return Part(self.b[idx], self.n[idx])


def masked(part: Part, keep) -> Part:
    """The part on rows where keep is true, nothing on the others."""
    keep = np.asarray(keep, dtype=bool)
    if part.keep is not None:
        keep = keep & part.keep
    group = part.group and (part.group[0], np.where(keep, part.group[1], 0))
    return Part(part.b, part.n, keep, group)


def grouped(parts: list, n) -> list:
    """``parts`` marked as one run of known length ``n`` bytes per row (int or array)."""
    if parts:
        p = parts[0]
        parts = [Part(p.b, p.n, p.keep, (len(parts), n))] + parts[1:]
    return parts


def total(parts, rows):
    """Per-row byte length of a record made of parts (an int when it is the same)."""
    fixed = 0
    var = None
    i = 0
    while i < len(parts):
        p = parts[i]
        if p.group is not None:
            ln = p.group[1]
            i += p.group[0]
        else:
            ln = int(p.n) if p.fixed and p.keep is None else p.lengths(rows)
            i += 1
        if isinstance(ln, (int, np.integer)):
            fixed += int(ln)
        else:
            var = ln.astype(np.int64) if var is None else var + ln
    return fixed if var is None else var + fixed


def flatten(parts, rows: int) -> bytes:
    """Concatenate the records (each = its parts in order) of all rows, in row order: in
    one pass by native/flatten.c (built at install; NativeMissing when it is not)."""
    if rows == 0:
        return b""
    size = total(parts, rows)
    size = int(size) * rows if isinstance(size, int) else int(size.sum())
    parts = [p for p in parts if p.width and not (p.fixed and p.keep is None and p.n == 0)]
    if not parts:
        return b""
    return _flatten_native(parts, rows, size)


_NATIVE = []


def _native():
    """native/flatten.c's ca_flatten, typed (NativeMissing when it is not built)."""
    if not _NATIVE:
        import ctypes
        from .. import native
        fn = native.load("flatten").ca_flatten
        fn.restype = ctypes.c_int64
        fn.argtypes = [ctypes.c_int64, ctypes.c_int32] + [ctypes.c_void_p] * 6
        _NATIVE.append(fn)
    return _NATIVE[0]


def _flatten_native(parts, rows: int, size: int):
    fn = _native()
    k = len(parts)
    keepalive = []
    ptrs = np.zeros((4, k), dtype=np.uint64)        # b, nlen, keep pointers; stride
    nconst = np.zeros(k, dtype=np.int64)
    stride = np.zeros(k, dtype=np.int64)
    for j, p in enumerate(parts):
        b = np.ascontiguousarray(p.b)
        if b.shape[0] != 1 and b.shape[0] != rows:
            raise ValueError("a part has neither one row nor one per record")
        stride[j] = 0 if b.shape[0] == 1 else b.shape[1]
        keepalive.append(b)
        ptrs[0, j] = b.ctypes.data
        if p.fixed:
            nconst[j] = int(p.n)
        else:
            n = np.ascontiguousarray(np.broadcast_to(p.n, (rows,)), dtype=np.int64)
            keepalive.append(n)
            ptrs[1, j] = n.ctypes.data
        if p.keep is not None:
            kp = np.ascontiguousarray(p.keep, dtype=np.bool_).view(np.uint8)
            keepalive.append(kp)
            ptrs[2, j] = kp.ctypes.data
    out = np.empty(size, dtype=np.uint8)
    got = fn(rows, k, ptrs[0].ctypes.data, stride.ctypes.data, nconst.ctypes.data,
             ptrs[1].ctypes.data, ptrs[2].ctypes.data, out.ctypes.data)
    if got != size:
        raise AssertionError(f"flatten wrote {got} bytes, not {size}")
    return out.tobytes()


# protobuf wire type of each field type (google.protobuf FieldDescriptor.TYPE_* numbers):
# 0 varint, 1 64-bit, 2 length-delimited, 5 32-bit.  Groups (10) are not written here.
WIRE_TYPES = {1: 1, 2: 5, 3: 0, 4: 0, 5: 0, 6: 1, 7: 5, 8: 0, 9: 2, 11: 2, 12: 2, 13: 0,
              14: 0, 15: 5, 16: 1, 17: 0, 18: 0}


def field_key(number: int, field_type: int, width: int = None) -> bytes:
    """The key (tag) bytes of a protobuf field: number << 3 | wire type; a field type with
    no wire type here (a group, or one protobuf adds later) is refused, not guessed."""
    if field_type not in WIRE_TYPES:
        raise ValueError(f"protobuf field type {field_type} has no wire type here")
    return varint_scalar(number << 3 | WIRE_TYPES[field_type], width)
