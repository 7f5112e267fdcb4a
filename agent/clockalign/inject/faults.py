"""The four faults, each injected through a real request, and the recovery a real service
does about it (service.py and worker.py carry the recovery out).

    f = FAULTS["timeout"]; body = f.request(meta, i)      # the i-th repetition's request
    body = normal_request(meta)                            # what the background load sends

For the reference model (``pointset``, model.py) the requests are:

- oom: an oversized batch, 2 x 262144 points (8 MB of JSON): attention scores of 2 x L x L
  floats (550 GB) cannot be allocated.  The worker frees the engine's cached memory,
  retries the batch split in two (275 GB each, fails again), rejects it (507), runs a
  canary inference and turns ready again;
- invalid-input: NaN, Inf, or points of the wrong shape, in turn: strict validation
  rejects the request (400) before the engine sees it; the service stays ready;
- timeout: steps = 10^15 refinement iterations, an engine call that never ends: the
  watchdog kills the worker at the deadline (504), the supervisor starts a new one;
- illegal-address (GPU only): one finite point far outside [0, 1): its grid cell indexes
  the table 500 TB out, the unchecked CUDA gather reads unmapped memory, the context is
  lost (CUDA_ERROR_ILLEGAL_ADDRESS, sticky; an Xid), the worker answers 500 and exits, and
  a new one starts.

Another V2 server (--engine v2) gets the generic forms built from its model metadata:
invalid-input (NaN/Inf in float inputs, a wrong element count) and oom (the first
variable dimension made large, within OOM_PAYLOAD_BYTES of payload).
"""
import json
import math
from dataclasses import dataclass

import numpy as np

from ..errors import ClockalignError
from . import model

OOM_POINTS = 1 << 18
OOM_BATCH = 2
HANG_STEPS = 10 ** 15
FAR_POINT = 1e9
OOM_PAYLOAD_BYTES = 64 << 20
NORMAL_POINTS = 64


@dataclass(frozen=True)
class Fault:
    name: str
    gpu_only: bool
    generic: bool          # has a form for any V2 model (--engine v2)
    recovery: str

    def request(self, meta: dict, i: int) -> bytes:
        if meta.get("name") == "pointset" and not self.generic_only(meta):
            return _REFERENCE[self.name](i)
        return _GENERIC[self.name](meta, i)

    @staticmethod
    def generic_only(meta) -> bool:
        names = {t.get("name") for t in meta.get("inputs", [])}
        return names != {model.INPUT, model.STEPS}


FAULTS = {
    "oom": Fault("oom", False, True, "free the engine's cached memory, retry split, reject; "
                 "canary inference; ready"),
    "invalid-input": Fault("invalid-input", False, True, "reject in validation; stays ready"),
    "timeout": Fault("timeout", False, False, "watchdog kills the worker at the deadline; "
                     "new worker: engine init, model load, first inference; ready"),
    "illegal-address": Fault("illegal-address", True, False, "sticky CUDA error: the worker "
                             "answers and exits; new worker: CUDA init, model load, first "
                             "launch; ready"),
}


def _body(inputs, rid=None) -> bytes:
    return json.dumps({"inputs": inputs, **({"id": rid} if rid else {})}).encode()


def request_id(i: int) -> str:
    """The V2 request id of repetition i (the service logs it, segments.py matches it)."""
    return f"inject-{i}"


def _points(points, name=model.INPUT, datatype="FP32", shape=None):
    return {"name": name, "datatype": datatype, "shape": list(shape or points.shape),
            "data": points.ravel().tolist()}


def _normal_points(rng, n=NORMAL_POINTS, batch=1):
    """Points in [0, 1) with 4 decimals (short JSON; rounding could reach 1.0: floor)."""
    return (np.floor(rng.random((batch, n, 2)) * 1e4) / 1e4).astype(np.float32)


def _ref_oom(i):
    p = _normal_points(np.random.default_rng(i), OOM_POINTS, OOM_BATCH)
    return _body([_points(p)], request_id(i))


def _ref_invalid(i):
    p = _normal_points(np.random.default_rng(i))
    kind = i % 3
    if kind == 2:
        return _body([_points(p[..., :1].repeat(3, axis=-1), shape=[1, NORMAL_POINTS, 3])],
                     request_id(i))
    data = p.ravel().tolist()
    data[5] = math.nan if kind == 0 else math.inf
    return _body([{"name": model.INPUT, "datatype": "FP32", "shape": list(p.shape),
                   "data": data}], request_id(i))


def _ref_timeout(i):
    p = _normal_points(np.random.default_rng(i))
    return _body([_points(p), {"name": model.STEPS, "datatype": "INT64", "shape": [1],
                               "data": [HANG_STEPS]}], request_id(i))


def _ref_illegal(i):
    p = _normal_points(np.random.default_rng(i))
    p[0, 0] = FAR_POINT
    return _body([_points(p)], request_id(i))


_REFERENCE = {"oom": _ref_oom, "invalid-input": _ref_invalid, "timeout": _ref_timeout,
              "illegal-address": _ref_illegal}

_NP = {"FP32": np.float32, "FP64": np.float64, "FP16": np.float16, "INT64": np.int64,
       "INT32": np.int32, "INT16": np.int16, "INT8": np.int8, "UINT8": np.uint8,
       "BOOL": np.bool_}


def _generic_tensor(t, rng, batch=None):
    shape = [1 if d < 0 else d for d in t.get("shape", [])]
    if batch is not None:
        var = [k for k, d in enumerate(t.get("shape", [])) if d < 0]
        if var:
            shape[var[0]] = batch
    dt = t.get("datatype", "FP32")
    if dt not in _NP:
        raise ClockalignError(f"input {t.get('name')!r} has datatype {dt}, which this "
                              "driver does not generate")
    n = math.prod(shape)
    a = (rng.random(n) * 4).astype(_NP[dt]) if dt != "BOOL" else rng.random(n) > 0.5
    return {"name": t["name"], "datatype": dt, "shape": shape, "data": a.tolist()}


def normal_request(meta: dict, seed: int = 0) -> bytes:
    """A valid request: the reference model's 64 points, or ones from any model's metadata."""
    rng = np.random.default_rng(seed)
    if meta.get("name") == "pointset" and not Fault.generic_only(meta):
        return _body([_points(_normal_points(rng))])
    return _body([_generic_tensor(t, rng) for t in meta["inputs"]])


def _gen_invalid(meta, i):
    rng = np.random.default_rng(i)
    ts = [_generic_tensor(t, rng) for t in meta["inputs"]]
    floats = [t for t in ts if t["datatype"].startswith("FP")]
    kind = i % 3 if floats else 2
    if kind == 2:
        ts[0]["data"] = ts[0]["data"] + ts[0]["data"][:1]     # one value too many
    else:
        floats[0]["data"][0] = math.nan if kind == 0 else math.inf
    return _body(ts, request_id(i))


def _gen_oom(meta, i):
    rng = np.random.default_rng(i)
    t0 = meta["inputs"][0]
    per_item = max(1, math.prod(d for d in t0.get("shape", []) if d > 0))
    batch = max(2, OOM_PAYLOAD_BYTES // (8 * per_item))
    return _body([_generic_tensor(t, rng, batch) for t in meta["inputs"]], request_id(i))


_GENERIC = {"oom": _gen_oom, "invalid-input": _gen_invalid}
