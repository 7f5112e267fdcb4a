"""Compare a recording with what a reference workload says it did.

    rows = check_reference_gpu(reader.events(), workload_json)   # [(what, expected, seen, ok)]
"""
import errno

import numpy as np

from ..store import cuda_api
from ..store.schema import CUDA_FN_BY_NAME, Kind

LAUNCH_FNS = cuda_api.names("launch")
ALLOC_FNS = tuple(cuda_api.function_name(i) for i in cuda_api.ALLOC_IDS)
CTX_SYNC_FNS = tuple(n for n in cuda_api.names("sync") if n.startswith("cuCtxSynchronize"))


def cuda_counts(ev, pid=None, window=None):
    """{function name: calls that returned} for one pid and MONOTONIC window (inclusive)."""
    cuda = ev[ev["kind"] == Kind.CUDA]
    if pid is not None:
        cuda = cuda[cuda["pid"] == pid]
    if window is not None:
        cuda = cuda[(cuda["ts"] >= window[0]) & (cuda["ts"] <= window[1])]
    ids, n = np.unique(cuda["code"], return_counts=True)
    names = {fid: name for name, fid in CUDA_FN_BY_NAME.items()}
    return {names.get(int(i), str(i)): int(c) for i, c in zip(ids, n)}


def _count(counts, fns):
    return sum(counts.get(f, 0) for f in fns)


def check_reference_gpu(ev, w: dict):
    """Rows (what, expected, seen, ok) for clockalign.workloads.reference_gpu's JSON."""
    pid = w["pid"]
    ph = w["phases"]
    rows = []
    launch = cuda_counts(ev, pid, ph["launch"])
    seen = _count(launch, LAUNCH_FNS)
    rows.append(("kernel launches in the launch loop", w["launches"], seen, seen == w["launches"]))
    cuda = ev[(ev["kind"] == Kind.CUDA) & (ev["pid"] == pid)]
    in_oom = cuda[(cuda["ts"] >= ph["oom"][0]) & (cuda["ts"] <= ph["oom"][1])]
    alloc_ids = [CUDA_FN_BY_NAME[f] for f in ALLOC_FNS]
    allocs = in_oom[np.isin(in_oom["code"], alloc_ids)]
    ooms = int(np.sum(allocs["ret"] == 2))
    rows.append(("allocations returning OUT_OF_MEMORY (2) in the OOM phase",
                 ">= 1" if w.get("oom_raised") else 0, ooms,
                 ooms >= 1 if w.get("oom_raised") else ooms == 0))
    ok_retry = int(np.sum((allocs["ret"] == 0) & (allocs["a1"] >= w["retry_bytes"])))
    rows.append(("successful retry allocation after the OOM", 1, ok_retry, ok_retry >= 1))
    sync = cuda_counts(ev, pid, ph["sync"])
    seen = _count(sync, CTX_SYNC_FNS)
    rows.append(("cuCtxSynchronize(_v2) in the sync loop", w["syncs"], seen, seen == w["syncs"]))
    conns = ev[(ev["kind"] == Kind.CONNECT) & (ev["pid"] == pid)]
    conns = conns[(conns["ts"] >= ph["connect"][0]) & (conns["ts"] <= ph["connect"][1])]
    refused = int(np.sum(conns["ret"] == -errno.ECONNREFUSED))
    rows.append(("connect() calls", 2, len(conns), len(conns) == 2))
    rows.append(("connect() refused (ECONNREFUSED)", 1, refused, refused == 1))
    return rows


def check_standin(ev, pid, expected_calls, expected_oom):
    counts = cuda_counts(ev, pid)
    rows = [(f"{fn} calls", n, counts.get(fn, 0), counts.get(fn, 0) == n)
            for fn, n in expected_calls.items()]
    cuda = ev[(ev["kind"] == Kind.CUDA) & (ev["pid"] == pid)]
    ooms = int(np.sum((cuda["code"] == CUDA_FN_BY_NAME["cuMemAlloc_v2"]) & (cuda["ret"] == 2)))
    rows.append(("cuMemAlloc_v2 returning OUT_OF_MEMORY (2)", expected_oom, ooms,
                 ooms == expected_oom))
    return rows
