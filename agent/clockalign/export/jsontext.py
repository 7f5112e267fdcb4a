"""Numbers as JSON text, written into their place in a row matrix (the Chrome JSON export).

Each writer fills a hole of a row matrix in place (``dst``: uint8 (rows, w), a column slice
of the matrix), so no per-part buffer is made and copied again.  Numbers are right-aligned
after ``PAD`` bytes (NUL: never part of JSON text, so jsonrows.py cuts every one out of the
finished rows); four digits at a time come from one table lookup.  Microseconds keep only
the decimals their nanoseconds need ('1000001', '1000001.5', '1000001.003').

    d = np.zeros((len(ts), micros_width(ts)), np.uint8)
    put_micros(d, ts)            # '\0\01000001.003' per row
"""
import numpy as np

from .varbytes import as_u64 as _as_u64

_U64 = np.uint64
_POW10 = np.array([10 ** k for k in range(20)], dtype=np.uint64)
PAD = 0            # filler byte of a hole, cut out of the finished text
_SPACE = PAD


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
_FRACTION = np.array([int.from_bytes(f".{i:03d}".rstrip("0").rstrip(".").encode().ljust(4, b"\0"),
                                      "little") for i in range(1000)],
                     dtype=np.uint32)                 # '.042', '.5' + PAD, PAD for .000
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
    """Nanoseconds as microseconds with the decimals they need ('1000001.003', '1000001.5',
    '1000001'), right-aligned; PAD after the last digit fills the rest of the hole."""
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
