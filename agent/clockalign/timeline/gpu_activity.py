"""GPU-side execution (record --gpu-activity) on MONOTONIC, each time with its uncertainty,
each execution joined to the driver call that launched it.

Mapping.  A raw CUPTI timestamp is the GPU's %globaltimer; it goes through that GPU's
alignment model (align/), found by the device UUID the injected library reported, so
unc_ns = band half-width + tick + CUPTI's stamping offset (CUPTI_STAMP_UNC_NS: how far
CUPTI's start/end lie from what a kernel stamps itself).  A converted timestamp (CUPTI's
own GPU->CPU conversion, where raw ones were not available or not asked for) is put on
MONOTONIC through the CUPTI clock sandwiches the library took, and has no bound:
unc_ns = -1 and ``raw`` False.

Join.  Each activity record carries CUPTI's correlation id; the library's callback on the
launching driver call carries the same id, the calling thread's tid and MONOTONIC stamps
taken inside the call.  The BPF probe of that same call is the CUDA event of that tid
whose [entry, return] contains those stamps: its entry becomes ``launch_t_ns``
(launch_src 1).  Without a BPF event (--no-cuda, an unprobed function) the callback's
own entry stamp is used (launch_src 2); with no callback record, -1 (launch_src 0).

    acts = load(tl)            # GpuActivity: rows (ACTIVITY_DTYPE), names, stats, notes
    acts.name(row)             # kernel name, or 'memcpy HtoD', 'memset'
"""
import dataclasses

import numpy as np

from ..store.schema import GPU_NAME_API, GPU_NAME_KERNEL, GpuKind
from .folds import CALL_DTYPE  # noqa: F401  (the calls' layout, Timeline.cuda_calls)

# How far CUPTI's raw start/end lie from a kernel's own first/last %globaltimer read
# (the stamping uncertainty of a raw record), the 99th percentile: H200, CUDA 13.0 CUPTI,
# 276 392 self-stamping kernels under load (scripts/gpu/activity.sh measure, 2026-12-01,
# results/gpu-activity.md): start -192..-1024 ns (p99 -384), end +416.. (p99 +608; the tail,
# up to 399 us, is a kernel still running after its last stamp).  CUPTI's start was before
# the first stamp and its end after the last in every one.  (300 kernels on 2026-11-29 gave
# -224..-256 and +416..+544.)
CUPTI_STAMP_UNC_NS = {"start": 384, "end": 608}

ACTIVITY_KINDS = (GpuKind.KERNEL, GpuKind.MEMCPY, GpuKind.MEMSET)
KIND_NAMES = {GpuKind.KERNEL: "gpu_kernel", GpuKind.MEMCPY: "gpu_copy",
              GpuKind.MEMSET: "gpu_memset"}
LAUNCH_NONE, LAUNCH_BPF, LAUNCH_CUPTI = 0, 1, 2
COPY_KINDS = {1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA",
              8: "DtoD", 9: "HtoH", 10: "PtoP"}

ACTIVITY_DTYPE = np.dtype([
    ("kind", "u1"), ("raw", "?"), ("launch_src", "u1"),
    ("t_ns", "<i8"), ("end_ns", "<i8"), ("unc_ns", "<i8"), ("end_unc_ns", "<i8"),
    ("gpu_start", "<u8"), ("gpu_end", "<u8"),
    ("pid", "<u4"), ("device", "<u4"), ("gpu", "<i4"), ("stream", "<u4"), ("name", "<u4"),
    ("corr", "<u4"), ("grid", "<u8"), ("block", "<u8"), ("bytes", "<u8"), ("aux", "<u4"),
    ("shmem", "<u4"), ("launch_tid", "<u4"), ("launch_t_ns", "<i8"), ("launch_end_ns", "<i8"),
    ("launch_fn", "<u4"), ("graph_node", "<u8"),     # kernels: aux = CUDA graph id (0: none)
])


@dataclasses.dataclass
class GpuActivity:
    rows: np.ndarray                 # ACTIVITY_DTYPE, sorted by t_ns
    names: dict                      # (pid, space, id) -> str
    stats: dict
    notes: list
    domains: dict                    # (pid, device) -> "GPU0" (or None: unmapped)
    windows: np.ndarray = None       # --gpu-activity-duty: [[start, end]] MONOTONIC ns

    def name(self, r) -> str:
        k = int(r["kind"])
        if k == GpuKind.KERNEL:
            return self.names.get((int(r["pid"]), GPU_NAME_KERNEL, int(r["name"])),
                                  f"kernel #{int(r['name'])}")
        if k == GpuKind.MEMCPY:
            return f"memcpy {COPY_KINDS.get(int(r['aux']) & 0xFF, 'copy')}"
        return "memset"

    def launch_function(self, r) -> str:
        return self.names.get((int(r["pid"]), GPU_NAME_API, int(r["launch_fn"])), "")

    def __len__(self):
        return len(self.rows)


def _uuid_text(lo: int, hi: int) -> str:
    h = int(lo).to_bytes(8, "little").hex() + int(hi).to_bytes(8, "little").hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _map_converted(t, pid, clocks):
    """CUPTI-clock times -> MONOTONIC by the nearest CUPTI clock sandwiches of that pid."""
    out = np.full(len(t), -1, dtype=np.int64)
    for p in np.unique(pid).tolist():
        m = pid == p
        c = clocks[clocks["pid"] == p]
        if not len(c):
            continue
        c = c[np.argsort(c["value"])]
        off = (c["start"].astype(np.int64) + (c["end"].astype(np.int64) -
               c["start"].astype(np.int64)) // 2) - c["value"].astype(np.int64)
        v = c["value"].astype(np.int64)
        tt = t[m].astype(np.int64)
        if len(c) == 1:
            out[m] = tt + off[0]
        else:       # offsets interpolated in float on offsets from the first sandwich
            base = v[0]
            o = np.interp((tt - base).astype(np.float64), (v - base).astype(np.float64),
                          (off - off[0]).astype(np.float64))
            out[m] = tt + off[0] + np.round(o).astype(np.int64)
    return out


class BpfCalls:
    """The run's CUDA calls (CALL_DTYPE) sorted by thread, then entry (stable), to find the
    call that launched a CUPTI callback (``find``); ``t`` and ``dur`` in that order (the
    calls given can be let go)."""

    NO_END = np.iinfo(np.int64).max       # the end of a call seen at its entry only

    def __init__(self, cuda):
        order = np.lexsort((cuda["t_ns"], cuda["tid"]))
        self.t = cuda["t_ns"][order]
        self.dur = cuda["dur_ns"][order]
        tids = cuda["tid"][order]
        self.order = order.astype(np.uint32) if len(order) < 1 << 32 else order
        cut = np.r_[0, np.flatnonzero(np.diff(tids)) + 1, len(tids)]
        self.by_tid = {int(tids[a]): (a, b) for a, b in zip(cut[:-1], cut[1:]) if b > a}

    def find(self, tids, t0, t1, sorted_index=False) -> np.ndarray:
        """Index of the call of thread tids[i] whose [ts, ts+dur] holds [t0[i], t1[i]]
        (the latest such entry), or -1: into the calls given, or with ``sorted_index``
        into ``t``/``dur``.  A call seen at its entry only (dur -1) holds what follows its
        entry: a thread's calls into the driver are sequential, so the latest entry before
        a callback is the call it ran in."""
        out = np.full(len(tids), -1, dtype=np.int64)
        if not self.by_tid or not len(tids):
            return out
        for tid in np.unique(tids).tolist():
            got = self.by_tid.get(tid)
            if got is None:
                continue
            a, b = got
            m = np.flatnonzero(tids == tid)
            j = np.searchsorted(self.t[a:b], t0[m], side="right") - 1
            ok = j >= 0
            jj = np.maximum(j, 0) + a
            d = self.dur[jj]
            ok &= np.where(d < 0, self.NO_END, self.t[jj] + np.maximum(d, 0)) >= t1[m]
            out[m[ok]] = jj[ok]
        if not sorted_index:
            hit = out >= 0
            out[hit] = self.order[out[hit]]
        return out


def _join_bpf(tids, t0, t1, cuda):
    """BpfCalls(cuda).find(tids, t0, t1)."""
    return BpfCalls(cuda).find(tids, t0, t1)


def load(tl, fields=None) -> GpuActivity:
    """Every GPU activity record of ``tl``'s run, mapped and joined (timeline/gpu_load.py);
    ``fields``: only these, as columns (gpu_table.Table)."""
    from .gpu_load import load as _load
    return _load(tl, fields)


def sampled_windows(reader, stats):
    """The windows of --gpu-activity-duty from the trailer ([n, 2] int64), or None (CUPTI
    on all the time); the share goes into stats["sampled"]."""
    duty = (((reader.trailer or {}).get("helpers") or {}).get("gpu_activity") or {}).get("duty")
    if not isinstance(duty, dict) or not isinstance(duty.get("windows"), list):
        return None
    w = np.asarray([x for x in duty["windows"] if isinstance(x, list) and len(x) == 2],
                   dtype=np.int64).reshape(-1, 2)
    stats["sampled"] = {"share": duty.get("share"), "period_s": duty.get("period_s"),
                        "windows": int(len(w)), "armed_ns": int((w[:, 1] - w[:, 0]).sum())}
    return w




def cuda_calls(tl) -> np.ndarray:
    """The run's CUDA calls, only the fields the join needs (CALL_DTYPE, 22 bytes a call
    instead of a whole event's 136): Timeline.cuda_calls()."""
    return tl.cuda_calls()


def waiting_syncs(rows, cuda, sync_fns) -> np.ndarray:
    """Per activity row: the return time of the first sync call (``sync_fns`` ids) that
    its launching thread entered after the launch call, or -1 (the sync that waited for it
    when the thread launches, then synchronises)."""
    out = np.full(len(rows), -1, dtype=np.int64)
    s = cuda[np.isin(cuda["code"], np.asarray(list(sync_fns), dtype=np.uint16))]
    for tid in np.unique(rows["launch_tid"]).tolist():
        m = np.flatnonzero((rows["launch_tid"] == tid) & (rows["launch_t_ns"] >= 0))
        c = s[s["tid"] == tid]
        if not len(c) or not len(m):
            continue
        c = c[np.argsort(c["t_ns"], kind="stable")]
        j = np.searchsorted(c["t_ns"], rows["launch_t_ns"][m], side="right")
        ok = j < len(c)
        out[m[ok]] = c["t_ns"][j[ok]] + c["dur_ns"][j[ok]]
    return out


def row_keys(*cols) -> tuple:
    """(the distinct tuples of the integer columns ``cols``, as a list; index of each row's
    tuple in it), as np.unique(np.stack(cols, 1), axis=0) gives, but a column at a time on
    int64 keys (unique over rows of a 2-D array is many times slower)."""
    inv = np.zeros(len(cols[0]), dtype=np.int64)
    for c in cols:
        u, i = np.unique(np.asarray(c).astype(np.int64), return_inverse=True)
        u, inv = np.unique(inv * len(u) + i.reshape(-1), return_inverse=True)
    inv = inv.reshape(-1)
    first = np.zeros(len(u), dtype=np.int64)
    first[inv] = np.arange(len(inv))         # a row of each tuple (any: they agree)
    return [tuple(int(np.asarray(c)[j]) for c in cols) for j in first.tolist()], inv


def activity_names(acts: GpuActivity, r) -> tuple:
    """(names, index per row): acts.name() computed once per distinct (kind, pid, name,
    copy kind) of rows ``r``, not once per row."""
    uniq, inv = row_keys(r["kind"], r["pid"], r["name"], r["aux"] & 0xFF)
    return [acts.name({"kind": k, "pid": p, "name": n, "aux": a}) for k, p, n, a in uniq], inv


def activity_dicts(acts: GpuActivity, block: int = 1 << 16):
    """dump's lines for GPU activity: kind gpu_kernel / gpu_copy / gpu_memset (a block of
    rows at a time, as Python lists: no numpy scalar per field)."""
    from ..store.schema import unpack_dims
    for a in range(0, len(acts.rows), block):
        r = acts.rows[a:a + block]
        names, ni = activity_names(acts, r)
        fns = {}
        c = {f: r[f].tolist() for f in ("kind", "raw", "t_ns", "end_ns", "unc_ns", "end_unc_ns",
                                        "pid", "device", "gpu", "stream", "corr", "shmem",
                                        "bytes", "aux", "launch_src", "launch_tid",
                                        "launch_t_ns", "launch_end_ns", "launch_fn",
                                        "graph_node")}
        grid = np.stack(unpack_dims(r["grid"]), axis=1).tolist()
        blk = np.stack(unpack_dims(r["block"]), axis=1).tolist()
        ni = ni.tolist()
        for i in range(len(r)):
            k, raw = c["kind"][i], c["raw"][i]
            gpu = c["gpu"][i]
            d = {"kind": KIND_NAMES[k], "t_ns": c["t_ns"][i], "end_ns": c["end_ns"][i],
                 "unc_ns": c["unc_ns"][i] if raw else None,
                 "end_unc_ns": c["end_unc_ns"][i] if raw else None,
                 "timestamps": "raw" if raw else "converted",
                 "pid": c["pid"][i], "device": c["device"][i],
                 "gpu": gpu if gpu >= 0 else None, "stream": c["stream"][i],
                 "name": names[ni[i]], "correlation": c["corr"][i]}
            if k == GpuKind.KERNEL:
                d["grid"] = grid[i]
                d["block"] = blk[i]
                d["shared_mem"] = c["shmem"][i]
                d["graph"] = {"id": c["aux"][i], "node": c["graph_node"][i]}   # 0: no graph
            else:
                d["bytes"] = c["bytes"][i]
                if k == GpuKind.MEMSET:
                    d["value"] = c["aux"][i]
            src = c["launch_src"][i]
            if src == LAUNCH_NONE:
                d["launch"] = None
            else:
                key = (c["pid"][i], c["launch_fn"][i])
                fn = fns.get(key)
                if fn is None:
                    fn = fns[key] = acts.names.get((key[0], GPU_NAME_API, key[1]), "")
                d["launch"] = {"tid": c["launch_tid"][i], "t_ns": c["launch_t_ns"][i],
                               "end_ns": c["launch_end_ns"][i], "fn": fn,
                               "source": "bpf" if src == LAUNCH_BPF else "cupti callback"}
            yield d
