"""Columns of equal length, each integer column in the narrowest type its values need.

GPU activity of a long run is millions of rows; as one ACTIVITY_DTYPE array it costs 139
bytes a row.  A reader that wants a few fields (the report) gets them as a Table instead:
one array a field, an integer field stored in the narrowest signed or unsigned type that
holds its smallest and largest value (a stream number, a kernel-name id and a duration fit
in one or two bytes), a time in int64.  Reading a field gives its values; derived fields
(``end_ns`` from ``t_ns`` + ``dur_ns``) are computed when read.

    t = Table({"t_ns": t, "dur_ns": d}, derived={"end_ns": lambda c: c["t_ns"] + c["dur_ns"]})
    t["end_ns"], t.take("end_ns", idx), t[idx] (a Table of those rows), t[3] (a dict)
    col = Concat(); col.add(part) ...; col.array()     # the narrowest type over all parts
"""
import numpy as np

from .gpu_activity import row_keys

_SIGNED = (np.int8, np.int16, np.int32, np.int64)


def fit(lo: int, hi: int) -> np.dtype:
    """The narrowest integer type holding every value in [lo, hi]; past 32 bits int64
    (uint64 only where int64 cannot hold it), so that arithmetic with an int64 time stays
    int64 (numpy makes int64 - uint64 a float)."""
    for t in ((np.uint8, np.uint16, np.uint32, np.int64, np.uint64) if lo >= 0 else _SIGNED):
        info = np.iinfo(t)
        if info.min <= lo and hi <= info.max:
            return np.dtype(t)
    raise ValueError(f"no integer type holds {lo}..{hi}")


class Concat:
    """Parts of one column, joined into one array of the narrowest type over all of them
    (each part is kept in its own narrowest type meanwhile)."""

    def __init__(self):
        self.parts, self.lo, self.hi, self.dtype = [], None, None, None

    def add(self, a: np.ndarray):
        a = np.asarray(a)
        if a.dtype.kind in "iu" and len(a):
            lo, hi = int(a.min()), int(a.max())
            self.lo = lo if self.lo is None else min(self.lo, lo)
            self.hi = hi if self.hi is None else max(self.hi, hi)
            a = a.astype(fit(lo, hi), copy=False)
        elif self.dtype is None or a.dtype.kind not in "iu":
            self.dtype = a.dtype
        self.parts.append(a)

    def patch(self, k: int, pos: np.ndarray, values: np.ndarray):
        """Set rows ``pos`` of part ``k`` to ``values``, widening that part if needed."""
        if not len(pos):
            return
        lo, hi = int(values.min()), int(values.max())
        self.lo = lo if self.lo is None else min(self.lo, lo)
        self.hi = hi if self.hi is None else max(self.hi, hi)
        part = self.parts[k]
        want = fit(min(lo, int(part.min())), max(hi, int(part.max())))
        if want != part.dtype:
            part = self.parts[k] = part.astype(want)
        part[pos] = values

    def array(self, dtype=None) -> np.ndarray:
        """The parts joined (each let go as it is copied); ``dtype``: the type wanted instead
        of the narrowest."""
        n = sum(len(p) for p in self.parts)
        if dtype is None:
            dtype = fit(self.lo, self.hi) if self.lo is not None else (self.dtype or np.int64)
        out = np.empty(n, dtype=dtype)
        at = 0
        while self.parts:
            p = self.parts.pop(0)
            out[at:at + len(p)] = p
            at += len(p)
        return out


class Table:
    """Named columns of equal length; ``derived``: {name: fn(table) -> array} read like a
    column."""

    def __init__(self, cols: dict, derived: dict = None):
        self.cols = cols
        self.derived = derived or {}
        self.n = len(next(iter(cols.values()))) if cols else 0

    @property
    def names(self) -> tuple:
        return tuple(self.cols) + tuple(self.derived)

    def __len__(self):
        return self.n

    def __contains__(self, name):
        return name in self.cols or name in self.derived

    def __getitem__(self, key):
        if isinstance(key, str):
            if key in self.cols:
                return self.cols[key]
            if key in self.derived:
                return self.derived[key](self)
            raise KeyError(key)
        if isinstance(key, (int, np.integer)):
            one = self[np.array([key])]
            return {k: one[k][0] for k in self.names}
        return Table({k: v[key] for k, v in self.cols.items()}, self.derived)

    def take(self, name: str, idx) -> np.ndarray:
        """self[name][idx], a derived field computed for those rows only."""
        if name in self.cols:
            return self.cols[name][idx]
        return self.derived[name](_Rows(self.cols, idx))


class _Rows:
    """Some rows of a Table's columns, read a column at a time (what a derived field's
    function is given by Table.take)."""

    def __init__(self, cols, idx):
        self.cols, self.idx = cols, idx

    def __getitem__(self, name):
        return self.cols[name][self.idx]


# Rows read at a time where a step would otherwise make whole-run temporaries.
BLOCK = 1 << 18


def blocks(n: int):
    """Slices of at most BLOCK rows over n."""
    for a in range(0, n, BLOCK):
        yield slice(a, min(n, a + BLOCK))


def take(rows, name, idx):
    """rows[name][idx]; from a Table (Timeline.gpu_activity(fields=...)), a derived field
    is computed for those rows only."""
    return rows.take(name, idx) if isinstance(rows, Table) else rows[name][idx]


def group_ids(rows, names, idx=None) -> tuple:
    """(the distinct tuples of the integer fields ``names`` over rows ``idx`` (None: all),
    sorted as row_keys sorts them; each row's index in them, in the narrowest type), a
    block of rows at a time: no whole-run temporary but the answer."""
    n = len(rows) if idx is None else len(idx)
    seen, parts = {}, Concat()
    for b in blocks(n):
        sel = b if idx is None else idx[b]
        uniq, inv = row_keys(*(take(rows, f, sel) for f in names))
        ids = np.array([seen.setdefault(u, len(seen)) for u in uniq], dtype=np.int64)
        parts.add(ids[inv])
    keys = sorted(seen)
    perm = np.zeros(max(len(keys), 1), dtype=np.int64)
    for new, key in enumerate(keys):
        perm[seen[key]] = new
    ids = parts.array()
    out = np.empty(len(ids), dtype=fit(0, max(len(keys) - 1, 0)))
    for b in blocks(len(ids)):
        out[b] = perm[ids[b]]
    return keys, out
