"""Chrome JSON records as rows of a byte matrix, built by shape: the machinery the event
rows (chrome_json.py) and the GPU executions (gpu_json.py) share.

Bulk rows are built by shape (same kind, name and annotations): a shape's rows share one
template row, and only what varies (thread, times, values) is written into its holes,
numbers right-aligned after PAD bytes and strings padded with PAD after their closing
quote.  The batch is then one matrix of rows, each row padded with PAD after its closing
brace; PAD (NUL) is never part of JSON text (json.dumps escapes control characters, UTF-8
has no zero byte in a multi-byte character), so cutting every PAD byte out of the matrix
(``text``) leaves each record with no byte the format does not need.  A rare shape much
wider than the rest is written between the matrix's rows rather than widening them all.

    row = Row(SEP + b'{"ph":"X","name":"k","ts":')
    row.hole(micros_width(ts), put_micros, ts)       # jsontext.py
    row.const(b"}")
    blob = interleave(len(ts), [(np.arange(len(ts)), row.build(len(ts)))])
"""
import json

import numpy as np

from .jsontext import PAD

SEP = b",\n"
SP = PAD

# Args left out of the events that hold the value nearly all of them have, and said once,
# in the "clockalign" metadata record's args ("defaults"): a reader puts a rule's args back
# on each event it matches that lacks them.  An event matches when it has each "when" key
# with that value (or one of those listed), every arg named in "with", none in "without".
DEFAULTS = [
    {"when": {"ph": "X", "cat": ["cuda", "stream"], "without": ["running_ns"]},
     "args": {"result": "CUDA_SUCCESS"}},           # a failed call names its error too
    {"when": {"ph": "X", "cat": ["cuda", "stream"], "with": ["grid"]},
     "args": {"shared_mem": 0}},                     # a launch with no dynamic shared memory
    {"when": {"ph": "X", "cat": "gpu"}, "args": {"timestamps": "raw"}},
    {"when": {"ph": "X", "cat": "gpu", "with": ["grid"]},
     "args": {"graph": {"id": 0, "node": 0}}},       # a kernel launched outside a graph
]
WIDE_SHARE = 64        # shapes holding at most 1/64 of a batch may be wider than the matrix


def defaults_for(ph: str, cat: str, keys) -> dict:
    """Arg name -> JSON text of its default (DEFAULTS) for an event of phase ``ph`` and
    category ``cat`` whose args are named ``keys``."""
    keys, out = set(keys), {}
    for rule in DEFAULTS:
        w = rule["when"]
        if all(v in (w[k] if isinstance(w[k], list) else [w[k]])
               for k, v in (("ph", ph), ("cat", cat)) if k in w) and (
                set(w.get("with", ())) <= keys and not keys & set(w.get("without", ()))):
            out.update({a: json.dumps(v, separators=(",", ":")).encode()
                        for a, v in rule["args"].items()})
    return out


def js(s) -> bytes:
    return json.dumps(s, ensure_ascii=False).encode()


class Texts:
    """Byte strings by id, exact (``items``) and space-padded in a matrix for gathering
    (``b``, lengths ``n``).  Grows in place: a snapshot taken before growth stays valid for
    the ids it had, so encoder threads can use one while the main thread adds more."""

    def __init__(self):
        self.items = []
        self.b = np.full((64, 8), SP, dtype=np.uint8)
        self.n = np.zeros(64, dtype=np.int64)

    def extend(self, texts):
        if not texts:
            return
        start = len(self.items)
        self.items.extend(texts)
        need, w = len(self.items), max(len(t) for t in texts)
        if need > len(self.n) or w > self.b.shape[1]:
            cap = max(need, 2 * len(self.n))
            b = np.full((cap, max(w, self.b.shape[1])), SP, dtype=np.uint8)
            b[:start, :self.b.shape[1]] = self.b[:start]
            n = np.zeros(cap, dtype=np.int64)
            n[:start] = self.n[:start]
            self.b, self.n = b, n
        for i, t in enumerate(texts, start):
            self.b[i, :len(t)] = np.frombuffer(t, dtype=np.uint8)
            self.n[i] = len(t)

    def snapshot(self):
        return self.items, self.b, self.n


class Row:
    """A template row with holes: ``const`` bytes, ``hole(width, fill, *args)`` where
    ``fill(dst, *args)`` writes the hole of every row (dst: uint8 (rows, width))."""

    def __init__(self, head: bytes):
        self.tpl = bytearray(head)
        self.holes = []

    def const(self, data: bytes):
        self.tpl += data

    def hole(self, width: int, fill, *args):
        self.holes.append((len(self.tpl), width, fill, args))
        self.tpl += bytes([PAD]) * width

    def build(self, rows: int) -> np.ndarray:
        m = np.empty((rows, len(self.tpl)), dtype=np.uint8)
        m[:] = np.frombuffer(bytes(self.tpl), dtype=np.uint8)
        for off, w, fill, args in self.holes:
            fill(m[:, off:off + w], *args)
        return m


def text(m: np.ndarray, chunk: int = 1 << 20) -> np.ndarray:
    """The bytes of row matrix ``m`` (writable, the caller's to spend) with every PAD byte
    cut out, as a uint8 view of its start (bytes-like: written and joined as it is).  Cut in
    place, a chunk at a time, so no mask or copy as big as the matrix is made: a chunk's
    kept bytes never land past the chunk's own start."""
    flat = m.reshape(-1)
    w = 0
    for a in range(0, len(flat), chunk):
        kept = flat[a:a + chunk]
        kept = kept[kept != PAD]
        flat[w:w + len(kept)] = kept
        w += len(kept)
    return flat[:w]


def gather(dst, table, idx):
    dst[:] = table[idx, :dst.shape[1]]


def interleave(n: int, shapes: list):
    """One batch's rows in row order from its shapes' matrices: one matrix as wide as the
    shapes that hold most rows, and the rows of rare wider shapes written between its rows."""
    if len(shapes) == 1 and len(shapes[0][0]) == n:
        return text(shapes[0][1])
    by_width = sorted(shapes, key=lambda s: -s[1].shape[1])
    wide, spare = [], n // WIDE_SHARE
    for s in by_width[:-1]:
        if len(s[0]) > spare:
            break
        wide.append(s)
        spare -= len(s[0])
    width = by_width[len(wide)][1].shape[1]
    mat = np.full((n, width), SP, dtype=np.uint8)
    for rows, m in by_width[len(wide):]:
        mat[rows, :m.shape[1]] = m
    if not wide:
        return text(mat)
    at = np.concatenate([rows for rows, _ in wide])
    texts = [m[i] for _, m in wide for i in range(len(m))]
    pieces, prev = [], 0
    for k in np.argsort(at, kind="stable").tolist():
        r = int(at[k])
        pieces.append(mat[prev:r].reshape(-1))
        pieces.append(texts[k])
        prev = r + 1
    pieces.append(mat[prev:].reshape(-1))
    return text(np.concatenate(pieces))
