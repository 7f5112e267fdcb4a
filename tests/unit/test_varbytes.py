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
