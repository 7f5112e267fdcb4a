"""The protobuf wire types the Perfetto export writes: complete, and refusing what it lacks."""
import pytest
from google.protobuf import descriptor
from google.protobuf.internal import type_checkers

from clockalign.export import varbytes as vb


def test_wire_types_match_protobuf_for_every_field_type():
    types = {v for k, v in vars(descriptor.FieldDescriptor).items() if k.startswith("TYPE_")}
    assert set(vb.WIRE_TYPES) == types - {descriptor.FieldDescriptor.TYPE_GROUP}
    for t, w in vb.WIRE_TYPES.items():
        assert w == type_checkers.FIELD_TYPE_TO_WIRE_TYPE[t], t


def test_field_key_refuses_a_type_it_has_no_wire_type_for():
    assert vb.field_key(2, descriptor.FieldDescriptor.TYPE_STRING) == b"\x12"
    assert vb.field_key(1, descriptor.FieldDescriptor.TYPE_DOUBLE) == b"\x09"
    with pytest.raises(ValueError, match="no wire type"):
        vb.field_key(1, descriptor.FieldDescriptor.TYPE_GROUP)
    with pytest.raises(ValueError, match="no wire type"):
        vb.field_key(1, 99)


def flatten_numpy(parts, rows: int) -> bytes:
    """The reference layout, with numpy only (what native/flatten.c must equal)."""
    import numpy as np
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




def test_native_flatten_equals_numpy():
    """native/flatten.c lays records out byte for byte as the numpy path does: fixed,
    variable-length, one-row and masked parts."""
    import numpy as np
    rng = np.random.default_rng(3)
    rows = 5000
    vals = rng.integers(0, 2 ** 40, rows, dtype=np.uint64) >> rng.integers(0, 40, rows).astype(
        np.uint64)
    table = vb.ByteTable([b"a", b"bcd", b"", b"efgh"])
    parts = [vb.const(b"\x0a"), vb.varint_min(vals), vb.varint(vals),
             vb.masked(vb.varint_min(vals[::-1].copy()), rng.random(rows) < 0.3),
             table.take(rng.integers(0, 4, rows)), vb.fixed64(vals),
             vb.masked(vb.const(b"xyz"), rng.random(rows) < 0.5)]
    keep = [p for p in parts if p.width]
    assert vb.flatten(parts, rows) == flatten_numpy(keep, rows)
    n = vb.total(parts, rows)
    assert len(vb.flatten(parts, rows)) == int(np.sum(n))
