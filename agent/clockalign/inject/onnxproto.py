"""Just enough of ONNX's protobuf (onnx.proto3) to write a model, so the reference model
is built and serialised in code with no `onnx` package (the GPU host has none).

Field numbers are ONNX's own (ModelProto, GraphProto, NodeProto, AttributeProto,
TensorProto, ValueInfoProto); tests/unit/test_inject_onnx.py parses the bytes back with
the real `onnx` package and runs its checker.

    g = graph("g", nodes=[node("Relu", ["x"], ["y"])], inputs=[value_info("x", FLOAT, [1, 4])],
              outputs=[value_info("y", FLOAT, [1, 4])], initializers=[])
    data = model(g, opset=13)
"""
import struct

import numpy as np

FLOAT, INT64, BOOL = 1, 7, 9                 # TensorProto.DataType
_ATTR_FLOAT, _ATTR_INT, _ATTR_GRAPH, _ATTR_INTS = 1, 2, 5, 7
_NP = {np.dtype(np.float32): FLOAT, np.dtype(np.int64): INT64, np.dtype(np.bool_): BOOL}


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1                       # int64 as two's complement, like protobuf
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _key(field: int, wire: int) -> bytes:
    return _varint(field << 3 | wire)


def _int(field: int, v: int) -> bytes:
    return _key(field, 0) + _varint(int(v))


def _bytes(field: int, v) -> bytes:
    if isinstance(v, str):
        v = v.encode()
    return _key(field, 2) + _varint(len(v)) + v


def tensor(name: str, array) -> bytes:
    """TensorProto with raw_data (little endian, as ONNX requires)."""
    a = np.ascontiguousarray(array)
    out = b"".join(_int(1, d) for d in a.shape) + _int(2, _NP[a.dtype]) + _bytes(8, name)
    return out + _bytes(9, a.astype(a.dtype.newbyteorder("<")).tobytes())


def attr(name: str, value) -> bytes:
    """AttributeProto: int, float, list of ints, or a graph (bytes from graph())."""
    out = _bytes(1, name)
    if isinstance(value, GraphBytes):
        return out + _bytes(6, value) + _int(20, _ATTR_GRAPH)
    if isinstance(value, float):
        return out + _key(2, 5) + struct.pack("<f", value) + _int(20, _ATTR_FLOAT)
    if isinstance(value, (list, tuple)):
        return out + b"".join(_int(8, v) for v in value) + _int(20, _ATTR_INTS)
    return out + _int(3, value) + _int(20, _ATTR_INT)


def node(op: str, inputs, outputs, name: str = "", **attrs) -> bytes:
    out = b"".join(_bytes(1, i) for i in inputs) + b"".join(_bytes(2, o) for o in outputs)
    out += _bytes(3, name or f"{op}_{outputs[0]}") + _bytes(4, op)
    return out + b"".join(_bytes(5, attr(k, v)) for k, v in attrs.items())


def value_info(name: str, elem_type: int, shape) -> bytes:
    """ValueInfoProto of a tensor; a str in ``shape`` is a symbolic dimension."""
    dims = b"".join(_bytes(1, _bytes(2, d) if isinstance(d, str) else _int(1, d))
                    for d in shape)
    tensor_type = _int(1, elem_type) + _bytes(2, dims)
    return _bytes(1, name) + _bytes(2, _bytes(1, tensor_type))


class GraphBytes(bytes):
    """A serialised GraphProto (kept apart from other bytes so attr() knows it)."""


def graph(name, nodes, inputs, outputs, initializers) -> GraphBytes:
    out = b"".join(_bytes(1, n) for n in nodes) + _bytes(2, name)
    out += b"".join(_bytes(5, t) for t in initializers)
    out += b"".join(_bytes(11, v) for v in inputs) + b"".join(_bytes(12, v) for v in outputs)
    return GraphBytes(out)


def model(g: GraphBytes, opset: int = 13, ir_version: int = 8,
          producer: str = "clockalign") -> bytes:
    opset_id = _bytes(1, "") + _int(2, opset)
    return (_int(1, ir_version) + _bytes(2, producer) + _bytes(7, g) + _bytes(8, opset_id))
