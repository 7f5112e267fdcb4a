"""Readable names for raw event fields, as the exporters and the report show them.

The names themselves live in timeline/ (codes.py, events.py), so a trace, a report and
``clockalign faults`` name things alike; this adds the vectorised helpers export needs.

    cuda_result_name(700)            # 'CUDA_ERROR_ILLEGAL_ADDRESS'
    peer_str(raw56, addrlen)         # '10.0.0.7:8000', '[::1]:443', 'unix:/run/x.sock'
    strings, idx = unique_strings(data_rows(ev), comm_str)   # decode each distinct row once
"""
import numpy as np

from ..store import cuda_api
from ..store.schema import CUDA_FUNCTIONS, task_state_name  # noqa: F401 (re-exported)
from ..timeline.codes import cuda_result_name, errno_name, signal_name, xid_name  # noqa: F401
from ..timeline.events import decode_comm, decode_sockaddr

# How each traced CUDA argument (schema.CUDA_FUNCTIONS names) is shown.
POINTER_ARGS = frozenset({"func", "dptr", "stream", "dst", "src", "event", "graph_exec",
                          "module", "library", "handle", "ctx", "dst_ctx", "pool", "image",
                          "addr"})
DIMS_ARGS = frozenset({"grid", "block"})


def data_str(raw) -> str:
    """The C string a record keeps in its 56-byte data (cuModuleGetFunction's kernel name)."""
    return bytes(raw).split(b"\0", 1)[0].decode("utf-8", "replace")


cuda_function_name = cuda_api.function_name    # the one spelling: "cuda_fn_N" when unknown


def connect_result(ret: int) -> str:
    """connect() return: 0 -> 'OK', -111 -> 'ECONNREFUSED'."""
    return "OK" if int(ret) >= 0 else errno_name(int(ret))


def comm_str(raw) -> str:
    return decode_comm(bytes(raw))


def peer_str(raw, addrlen=None) -> str:
    return decode_sockaddr(bytes(raw), addrlen)


def dims_str(packed: int) -> str:
    """A packed x | y << 32 | z << 48 launch dimension as 'XxYxZ'."""
    p = int(packed)
    return f"{p & 0xFFFFFFFF}x{(p >> 32) & 0xFFFF}x{p >> 48}"


def data_rows(events) -> np.ndarray:
    """The 56-byte ``data`` field of each event as an (n, 56) uint8 array."""
    return np.ascontiguousarray(events["data"]).view(np.uint8).reshape(len(events), -1)


def unique_strings(rows: np.ndarray, fn) -> tuple:
    """fn applied once per distinct row of a 2-D array: (strings, index into them per row)."""
    if len(rows) == 0:
        return [], np.zeros(0, dtype=np.intp)
    rows = np.ascontiguousarray(rows)
    keys = rows.view(np.dtype((np.void, rows.dtype.itemsize * rows.shape[1]))).ravel()
    _, first, inv = np.unique(keys, return_index=True, return_inverse=True)
    return [fn(rows[i]) for i in first], inv.reshape(-1)
