"""Vectorised assembly of byte records (protobuf packets, JSON lines), millions per second.

Building one Python object per event runs at ~50k events/s; here a record is a list of
*parts*, each a column of byte strings (``Part.b``: uint8 ``(rows, w)``, or ``(1, w)`` for
the same bytes on every row).  ``flatten`` lays the parts side by side in one matrix and
returns the rows' bytes concatenated.

Speed comes from giving every row the same layout: a varint column is written with the
column's widest width (an overlong varint, e.g. 5 as ``85 80 00``, which every protobuf
parser reads as 5), a JSON number is right-aligned with leading spaces (whitespace is
allowed between JSON tokens), a string from a Table is padded after its closing quote.
Then the matrix needs no per-byte mask: constants are one template row copied to all rows,
and only parts that are absent on some rows (``masked``) or of really variable length
cost a boolean mask.

    parts = [const(b"\\x0a"), varint(lengths), const(b"..."), decimal(ts, pad=True)]
    blob = flatten(parts, rows)
"""
import numpy as np

_U64 = np.uint64
_VARINT_LIMITS = np.array([1 << (7 * k) for k in range(1, 10)], dtype=np.uint64)
_POW10 = np.array([10 ** k for k in range(20)], dtype=np.uint64)
_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
_SPACE = 32


class Part:
    """Byte strings, one per row (b: (rows|1, w)), with length n (int: all rows; or array).

    ``keep`` (bool per row) marks rows where the part is present at all.
    """

    __slots__ = ("b", "n", "keep")

    def __init__(self, b, n, keep=None):
        self.b = b
        self.n = n
        self.keep = keep

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


def _as_u64(values):
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
    v = _as_u64(values)
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


def _digits(v, base_pow, min_digits, pad):
    rows = v.shape[0]
    if rows == 0:
        return Part(np.zeros((0, 1), np.uint8), 1)
    nd = np.searchsorted(base_pow[1:], v, side="right") + 1
    np.maximum(nd, min_digits, out=nd)
    w = int(nd.max())
    if pad is None:
        e = nd[:, None] - 1 - np.arange(w)[None, :]          # left-aligned, variable length
    else:
        e = (w - 1 - np.arange(w))[None, :] + np.zeros((rows, 1), np.int64)
    ec = np.clip(e, 0, len(base_pow) - 1)
    return nd, w, e, ec


_PAIRS = np.array([[48 + i // 10, 48 + i % 10] for i in range(100)], dtype=np.uint8)


def decimal(values, min_digits: int = 1, pad: bool = False) -> Part:
    """ASCII decimal of non-negative integers, zero-padded to at least min_digits; with
    ``pad`` all rows right-aligned with leading spaces to the widest (fixed width)."""
    v = _as_u64(values)
    rows = v.shape[0]
    if rows == 0:
        return Part(np.zeros((0, 1), np.uint8), 1)
    nd = np.searchsorted(_POW10[1:], v, side="right") + 1
    np.maximum(nd, min_digits, out=nd)
    w = int(nd.max())
    w2 = w + (w & 1)
    out = np.empty((rows, w2), dtype=np.uint8)
    if w <= 15:                        # exact in float64, whose division is much faster
        rest = v.astype(np.float64)
        for k in range(w2 // 2):       # two digits per division, from the right
            q = np.floor(rest * 0.01)
            r = rest - q * 100.0
            low, high = r < 0, r >= 100
            q[low] -= 1
            r[low] += 100
            q[high] += 1
            r[high] -= 100
            out[:, w2 - 2 - 2 * k:w2 - 2 * k] = _PAIRS[r.astype(np.intp)]
            rest = q
    else:
        rest = v.copy()
        hundred = _U64(100)
        for k in range(w2 // 2):
            q = rest // hundred
            out[:, w2 - 2 - 2 * k:w2 - 2 * k] = _PAIRS[(rest - q * hundred).astype(np.intp)]
            rest = q
    out = out[:, w2 - w:]
    if pad:
        out[np.arange(w)[None, :] < (w - nd)[:, None]] = _SPACE
        return Part(out, w)
    if (nd == w).all():
        return Part(out, w)
    shift = w - nd                     # left-align: drop the leading zeros of short rows
    cols = np.minimum(np.arange(w)[None, :] + shift[:, None], w - 1)
    return Part(np.take_along_axis(out, cols, axis=1), nd)


def signed_decimal(values, pad: bool = False) -> Part:
    """ASCII decimal of int64 values, '-' before the negative ones."""
    v = np.asarray(values, dtype=np.int64)
    neg = v < 0
    mag = decimal(np.where(neg, -v, v), pad=pad)
    rows, w = mag.b.shape
    b = np.empty((rows, w + 1), dtype=np.uint8)
    if pad:
        b[:, 0] = _SPACE
        b[:, 1:] = mag.b
        # move the '-' to just before the first digit
        first = (mag.b == _SPACE).sum(axis=1)
        r = np.flatnonzero(neg)
        b[r, first[r]] = ord("-")
        return Part(b, w + 1)
    b[:, 0] = ord("-")
    b[:, 1:] = mag.b
    b[~neg, :-1] = b[~neg, 1:]
    return Part(b, mag.n + neg)


def hexadecimal(values, pad: bool = False) -> Part:
    """'0x' + lowercase hex of uint64 values; with ``pad`` zero-padded to the widest."""
    v = _as_u64(values)
    rows = v.shape[0]
    if rows == 0:
        return Part(np.zeros((0, 1), np.uint8), 1)
    pow16 = np.array([1 << (4 * k) for k in range(16)], dtype=np.uint64)
    nd, w, e, ec = _digits(v, pow16, 1, pad or None)
    nib = (v[:, None] >> (ec.astype(np.uint64) * _U64(4))) & _U64(0xF)
    b = np.empty((rows, w + 2), dtype=np.uint8)
    b[:, 0], b[:, 1] = ord("0"), ord("x")
    b[:, 2:] = _HEX[nib.astype(np.intp)]
    return Part(b, w + 2) if pad else Part(b, nd + 2)


class Table:
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
    return Part(part.b, part.n, keep)


def total(parts, rows):
    """Per-row byte length of a record made of parts (an int when it is the same)."""
    fixed = 0
    var = None
    for p in parts:
        if p.fixed and p.keep is None:
            fixed += int(p.n)
        else:
            ln = p.lengths(rows)
            var = ln.astype(np.int64) if var is None else var + ln
    return fixed if var is None else var + fixed


def flatten(parts, rows: int) -> bytes:
    """Concatenate the records (each = its parts in order) of all rows, in row order."""
    parts = [p for p in parts if p.width and not (p.fixed and p.keep is None and p.n == 0)]
    if rows == 0 or not parts:
        return b""
    width = sum(p.width for p in parts)
    mat = np.empty((rows, width), dtype=np.uint8)
    template = np.zeros(width, dtype=np.uint8)
    off = 0
    for p in parts:
        if p.b.shape[0] == 1:
            template[off:off + p.width] = p.b[0]
        off += p.width
    mat[:] = template
    keep = None
    off = 0
    for p in parts:
        w = p.width
        if p.b.shape[0] != 1:
            mat[:, off:off + w] = p.b
        if not p.fixed or p.keep is not None or p.n != w:
            if keep is None:
                keep = np.ones((rows, width), dtype=bool)
            if p.fixed:
                if p.n != w:
                    keep[:, off + p.n:off + w] = False
                if p.keep is not None:
                    keep[:, off:off + min(int(p.n), w)] = p.keep[:, None]
            else:
                k = np.arange(w)[None, :] < np.asarray(p.n)[:, None]
                if p.keep is not None:
                    k &= p.keep[:, None]
                keep[:, off:off + w] = k
        off += w
    if keep is None:
        return mat.tobytes()
    return mat[keep].tobytes()


# ---------------------------------------------------------------------- text into place
# The writers below fill a hole of a row matrix in place (``dst``: uint8 (rows, w), a column
# slice of the matrix), so no per-part buffer is made and copied again.  Numbers are
# right-aligned with leading spaces; four digits at a time come from one table lookup.
def _digit_table() -> np.ndarray:
    i = np.arange(10000)
    d = np.stack([i // 1000, i // 100 % 10, i // 10 % 10, i % 10], axis=1).astype(np.uint8) + 48
    zero = d.copy()                                   # '0042' (more digits to the left)
    lead = d.copy()                                   # '  42' (the number starts here)
    for k, p in enumerate((1000, 100, 10)):
        lead[i < p, k] = _SPACE
    last = lead.copy()                                # '   0' for the number 0 itself
    lead[0, 3] = _SPACE                               # '    ' (the number ended before)
    return np.ascontiguousarray(np.concatenate([zero, lead, last])).view(np.uint32).ravel()


_DIGITS4 = _digit_table()
_FRACTION = np.array([int.from_bytes(f".{i:03d}".encode(), "little") for i in range(1000)],
                     dtype=np.uint32)                 # '.042'
_HEX2 = np.array([[ord(a), ord(b)] for a in "0123456789abcdef" for b in "0123456789abcdef"],
                 dtype=np.uint8)                      # byte -> two hex digits
_POW16 = np.array([1 << (4 * k) for k in range(16)], dtype=np.uint64)


def decimal_digits(vmax: int) -> int:
    """Digits of the non-negative integer vmax."""
    return len(str(int(vmax)))


def _put4(dst, col: int, width: int, words: np.ndarray):
    """Four-byte words into columns [col, col + width) of dst (the last ``width`` bytes)."""
    if width == 4:
        dst[:, col:col + 4].view(np.uint32)[:, 0] = words
    else:
        dst[:, col:col + width] = words.view(np.uint8).reshape(-1, 4)[:, 4 - width:]


def put_decimal(dst, values):
    """Non-negative integers as decimal text right-aligned in dst (rows, w), leading spaces;
    w must hold the widest value."""
    rest = _as_u64(values)
    pos, section = dst.shape[1], 2 * 10000
    while pos > 0:
        if pos < dst.shape[1] and not rest.any():
            dst[:, :pos] = _SPACE
            break
        q = rest // _U64(10000)
        idx = (rest - q * _U64(10000)).astype(np.intp)
        idx += (q == 0) * section
        k = min(4, pos)
        _put4(dst, pos - k, k, _DIGITS4[idx])
        pos -= k
        rest, section = q, 10000


def put_signed(dst, values):
    """int64 values as decimal text right-aligned in dst, '-' just before the digits."""
    v = np.asarray(values, dtype=np.int64)
    neg = v < 0
    mag = np.where(neg, -v, v).view(np.uint64)      # -2**63 stays its own magnitude
    put_decimal(dst, mag)
    if neg.any():
        r = np.flatnonzero(neg)
        nd = np.searchsorted(_POW10[1:], mag[r], side="right") + 1
        dst[r, dst.shape[1] - 1 - nd] = ord("-")


def micros_width(ns: np.ndarray) -> int:
    """Width of ``put_micros`` text for these nanoseconds."""
    ns = np.asarray(ns, dtype=np.int64)
    if not len(ns):
        return 5
    lo, hi = int(ns.min()), int(ns.max())
    return decimal_digits(max(abs(lo), abs(hi)) // 1000) + (lo < 0) + 4


def put_micros(dst, ns):
    """Nanoseconds as microseconds with three decimals ('1000001.003'), right-aligned."""
    ns = np.asarray(ns, dtype=np.int64)
    w = dst.shape[1]
    neg = ns < 0
    mag = np.where(neg, -ns, ns).view(np.uint64) if neg.any() else ns.view(np.uint64)
    us = mag // _U64(1000)
    put_decimal(dst[:, :w - 4], us)
    _put4(dst, w - 4, 4, _FRACTION[(mag - us * _U64(1000)).astype(np.intp)])
    if neg.any():
        r = np.flatnonzero(neg)
        nd = np.searchsorted(_POW10[1:], us[r], side="right") + 1
        dst[r, w - 5 - nd] = ord("-")


def hex_digits(values) -> np.ndarray:
    """Hex digits of each uint64 value (1 for 0)."""
    return np.searchsorted(_POW16[1:], _as_u64(values), side="right") + 1


def put_hex(dst, values, digits=None):
    """uint64 values as lowercase hex digits, left-aligned in dst, each followed by ``"``
    (dst's width: the most digits + 1; the '"0x' before is the caller's)."""
    v = np.ascontiguousarray(_as_u64(values))
    nd = hex_digits(v) if digits is None else digits
    text = _HEX2[v.view(np.uint8).reshape(-1, 8)[:, ::-1]].reshape(-1, 16)
    counts = np.bincount(nd, minlength=17)
    for d in np.flatnonzero(counts).tolist():
        rows = slice(None) if counts[d] == len(v) else np.flatnonzero(nd == d)
        blk = np.empty((counts[d], d + 1), dtype=np.uint8)
        blk[:, :d] = text[rows, 16 - d:]
        blk[:, d] = ord('"')
        if isinstance(rows, slice):
            dst[:, :d + 1] = blk
        else:
            dst[rows, :d + 1] = blk
