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

from ..store.schema import (GPU_FLAG_RAW, GPU_NAME_API, GPU_NAME_KERNEL, Chunk, GpuKind, Kind)

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


def _domains(dev, pairs, clock_info, models, notes, devices=()) -> dict:
    """(pid, device) -> clock domain name, by UUID (``dev``: the DEVICE records); else the
    recorder's device of that CUDA ordinal (``devices``, the run's table: the target's
    ordinals are its own, so this holds only where both saw the same CUDA_VISIBLE_DEVICES,
    and a note says so), or the only probed GPU.  ``pairs``: the (pid, device) pairs the
    activity records name."""
    by_uuid = {str(r.get("uuid")).lower(): r["domain"] for r in clock_info
               if isinstance(r, dict) and r.get("uuid") and r.get("domain")}
    out = {}
    for r in dev:
        key = (int(r["pid"]), int(r["device"]))
        if int(r["aux"]):
            out[key] = by_uuid.get(_uuid_text(r["grid"], r["block"]).lower())
    gpus = sorted(d for d in models if d.startswith("GPU"))
    for p, d in sorted(pairs):
        if out.get((p, d)):
            continue
        same = [x.name for x in devices if x.cuda_ordinal == d and x.name in models]
        guess = same[0] if same else (gpus[0] if len(gpus) == 1 else None)
        if guess:
            notes.append(f"process {p}'s CUDA device {d} had no UUID matching a probed GPU; "
                         f"its activity is mapped through {guess}")
        out[(p, d)] = guess
    return out


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


def _join_api(rows, api, stats):
    """launch_tid / launch_t_ns from the CUPTI callback records, by (pid, corr)."""
    if not len(api) or not len(rows):
        return np.full(len(rows), -1, dtype=np.int64)
    key_a = (api["pid"].astype(np.uint64) << np.uint64(32)) | api["corr"].astype(np.uint64)
    order = np.argsort(key_a, kind="stable")
    key_s = key_a[order]
    key_r = (rows["pid"].astype(np.uint64) << np.uint64(32)) | rows["corr"].astype(np.uint64)
    pos = np.minimum(np.searchsorted(key_s, key_r), len(key_s) - 1)
    hit = key_s[pos] == key_r
    idx = np.where(hit, order[pos], -1)
    stats["joined_callback"] = int(hit.sum())
    return idx


def _join_bpf(tids, t0, t1, cuda):
    """Index into ``cuda`` of the call of thread tids[i] whose [ts, ts+dur] holds
    [t0[i], t1[i]] (the latest such entry), or -1.  A call seen at its entry only (dur -1)
    holds what follows its entry: a thread's calls into the driver are sequential, so the
    latest entry before a callback is the call it ran in."""
    out = np.full(len(tids), -1, dtype=np.int64)
    if not len(cuda) or not len(tids):
        return out
    for tid in np.unique(tids).tolist():
        m = np.flatnonzero(tids == tid)
        c = np.flatnonzero(cuda["tid"] == tid)
        if not len(c):
            continue
        c = c[np.argsort(cuda["t_ns"][c], kind="stable")]
        ts = cuda["t_ns"][c]
        dur = cuda["dur_ns"][c]
        end = np.where(dur < 0, np.iinfo(np.int64).max, ts + np.maximum(dur, 0))
        for mb in _blocks(m):
            j = np.searchsorted(ts, t0[mb], side="right") - 1
            ok = j >= 0
            jj = np.maximum(j, 0)
            ok &= end[jj] >= t1[mb]
            out[mb[ok]] = c[jj[ok]]
    return out


# Rows mapped or joined at a time: each step's temporaries are a few of these long (the
# clock model's bounds make about a dozen int64 arrays of its input's length).
BLOCK = 1 << 18


def _blocks(idx):
    """``idx`` (an index array) in slices of at most BLOCK."""
    for a in range(0, len(idx), BLOCK):
        yield idx[a:a + BLOCK]


# What load() keeps of a CUPTI callback record (kind API): 32 bytes instead of 80.
API_DTYPE = np.dtype([("pid", "<u4"), ("corr", "<u4"), ("tid", "<u4"), ("aux", "<u4"),
                      ("start", "<u8"), ("end", "<u8")])
_COPIED = ("kind", "pid", "device", "stream", "name", "corr", "grid", "block", "aux", "shmem")
_OTHER_KINDS = (GpuKind.DEVICE, GpuKind.CLOCK, GpuKind.DROPPED, GpuKind.INFO)


def _decode(reader):
    """The run's GPU records in three sets: activity as ACTIVITY_DTYPE rows (times still
    unmapped), callbacks as API_DTYPE, and the few others as GPU_REC_DTYPE, read one chunk
    at a time straight into their arrays.  Those are sized by the chunks' row counts and
    made with np.zeros, whose pages the kernel maps only when written: the share of them
    the other kind fills stays untouched, so no full copy of the records is ever held."""
    from ..store.schema import GPU_REC_DTYPE
    total = reader.count_rows(Chunk.GPU_ACTIVITY)
    rows = np.zeros(total, dtype=ACTIVITY_DTYPE)
    api = np.zeros(total, dtype=API_DTYPE)
    other, na, nb = [], 0, 0
    for p in reader.iter_columns(Chunk.GPU_ACTIVITY):
        kind = p["kind"]
        a = np.flatnonzero(np.isin(kind, ACTIVITY_KINDS))
        dst = rows[na:na + len(a)]
        for f in _COPIED:
            dst[f] = p[f][a]
        is_k = kind[a] == GpuKind.KERNEL
        dst["bytes"] = np.where(is_k, 0, p["value"][a])
        dst["graph_node"] = np.where(is_k, p["value"][a], 0)
        dst["gpu_start"], dst["gpu_end"] = p["start"][a], p["end"][a]
        dst["raw"] = (p["flags"][a] & GPU_FLAG_RAW) != 0
        na += len(a)
        c = np.flatnonzero(kind == GpuKind.API)
        dst = api[nb:nb + len(c)]
        for f in API_DTYPE.names:
            dst[f] = p[f][c]
        nb += len(c)
        o = np.flatnonzero(np.isin(kind, _OTHER_KINDS))
        if len(o):
            rec = np.zeros(len(o), dtype=GPU_REC_DTYPE)
            for f in GPU_REC_DTYPE.names:
                rec[f] = p[f][o]
            other.append(rec)
        del p
    other = np.concatenate(other) if other else np.zeros(0, dtype=GPU_REC_DTYPE)
    return rows[:na], api[:nb], other


def _take(rows, idx):
    """rows[idx] into the first len(idx) rows of ``rows`` itself, a field at a time (one
    column's copy at a time instead of the whole table's)."""
    for f in rows.dtype.names:
        rows[f][:len(idx)] = rows[f][idx]
    return rows[:len(idx)]


def load(tl) -> GpuActivity:
    """Every GPU activity record of ``tl``'s run, mapped and joined (see module doc)."""
    reader = tl.reader
    notes, stats = [], {}
    names = {(int(r["pid"]), int(r["space"]), int(r["id"])): str(r["name"])
             for r in reader.rows(Chunk.GPU_NAMES) if isinstance(r, dict)}
    if Chunk.GPU_ACTIVITY not in reader.chunk_types():
        return GpuActivity(np.zeros(0, ACTIVITY_DTYPE), names, stats, notes, {})
    rows, api, other = _decode(reader)
    models = tl.models
    pd = np.unique((rows["pid"].astype(np.int64) << 32) | rows["device"].astype(np.int64))
    domains = _domains(other[other["kind"] == GpuKind.DEVICE],
                       {(v >> 32, v & 0xFFFFFFFF) for v in pd.tolist()},
                       reader.rows(Chunk.CLOCK_INFO), models, notes, tl.devices)
    rows["gpu"] = -1
    rows["t_ns"] = rows["end_ns"] = -1
    rows["unc_ns"] = rows["end_unc_ns"] = -1
    keep = np.zeros(len(rows), dtype=bool)
    for (pid, dev), dom in domains.items():
        m = (rows["pid"] == pid) & (rows["device"] == dev) & rows["raw"]
        if not m.any():
            continue
        if dom is None or dom not in models:
            stats.setdefault("unmapped", 0)
            stats["unmapped"] += int(m.sum())
            continue
        for col, ucol, gcol, stamp in (("t_ns", "unc_ns", "gpu_start", "start"),
                                       ("end_ns", "end_unc_ns", "gpu_end", "end")):
            for ii in _blocks(np.flatnonzero(m)):
                t, u = tl.map(dom, rows[gcol][ii].astype(np.int64), CUPTI_STAMP_UNC_NS[stamp])
                rows[col][ii], rows[ucol][ii] = t, u
        rows["gpu"][m] = int(dom[3:]) if dom[3:].isdigit() else -1
        keep |= m
    conv = ~rows["raw"]
    if conv.any():
        clocks = other[other["kind"] == GpuKind.CLOCK]
        for col, gcol in (("t_ns", "gpu_start"), ("end_ns", "gpu_end")):
            rows[col][conv] = _map_converted(rows[gcol][conv], rows["pid"][conv], clocks)
        ok = conv & (rows["t_ns"] >= 0)
        for (pid, dev), dom in domains.items():
            m = ok & (rows["pid"] == pid) & (rows["device"] == dev)
            rows["gpu"][m] = int(dom[3:]) if dom and dom[3:].isdigit() else int(dev)
        keep |= ok
        notes.append(f"{int(conv.sum())} GPU activity records carry CUPTI's converted "
                     "timestamps: placed through CUPTI's clock, with no stated bound "
                     "(unc_ns -1)")
    if stats.get("unmapped"):
        notes.append(f"{stats['unmapped']} GPU activity records of a GPU with no clock "
                     "samples could not be mapped and are left out")
    kept = np.flatnonzero(keep)
    rows = _take(rows, kept[np.argsort(rows["t_ns"][kept], kind="stable")])
    del keep, kept
    # the launching call: CUPTI callback (pid, corr), then the BPF call that holds it
    stats["activity"] = int(len(rows))
    ai = _join_api(rows, api, stats)
    has = ai >= 0
    ai = ai[has]
    rows["launch_tid"][has] = api["tid"][ai]
    rows["launch_fn"][has] = api["aux"][ai]
    rows["launch_t_ns"] = rows["launch_end_ns"] = -1
    rows["launch_t_ns"][has] = api["start"][ai].astype(np.int64)
    rows["launch_end_ns"][has] = api["end"][ai].astype(np.int64)
    rows["launch_src"] = np.where(has, LAUNCH_CUPTI, LAUNCH_NONE)
    del ai, api             # the callbacks are used up: let them go before the CUDA calls
    cuda = cuda_calls(tl)
    bi = np.full(len(rows), -1, dtype=np.int64)
    bi[has] = _join_bpf(rows["launch_tid"][has].astype(np.int64), rows["launch_t_ns"][has],
                        rows["launch_end_ns"][has], cuda)
    hb = bi >= 0
    rows["launch_t_ns"][hb] = cuda["t_ns"][bi[hb]]
    known = np.zeros(len(rows), dtype=bool)          # the return probed: its end
    known[hb] = cuda["dur_ns"][bi[hb]] >= 0
    rows["launch_end_ns"][known] = cuda["t_ns"][bi[known]] + cuda["dur_ns"][bi[known]]
    rows["launch_src"][hb] = LAUNCH_BPF
    stats["joined_bpf"] = int(hb.sum())
    if has.any() and len(cuda) and not hb[has].all():
        notes.append(f"{int(has.sum() - hb.sum())} launching calls seen by CUPTI had no BPF "
                     "CUDA event around them (an unprobed function, or events lost); their "
                     "launch time is CUPTI's callback stamp")
    for k, name in KIND_NAMES.items():
        stats[name] = int((rows["kind"] == k).sum())
    dropped = other["kind"] == GpuKind.DROPPED
    stats["cupti_dropped"] = int(other["value"][dropped].sum())
    if stats["cupti_dropped"]:
        notes.append(f"CUPTI dropped {stats['cupti_dropped']} activity records (full buffers)")
    info = other[other["kind"] == GpuKind.INFO]
    stats["processes"] = sorted(set(info["pid"].tolist()))
    return GpuActivity(rows, names, stats, notes, domains, sampled_windows(reader, stats))


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


CALL_DTYPE = np.dtype([("t_ns", "<i8"), ("dur_ns", "<i8"), ("tid", "<u4"), ("code", "<u2")])


def cuda_calls(tl) -> np.ndarray:
    """The run's CUDA calls, only the fields the join needs (CALL_DTYPE, 22 bytes a call
    instead of a whole event's 136), filled a chunk at a time into one array sized by the
    chunks' row counts (np.zeros: the pages left unfilled are never mapped).  A call seen at
    its entry only (--cuda-returns blocking) has dur_ns -1: its return is unknown."""
    out = np.zeros(tl.reader.count_rows(Chunk.EVENTS), dtype=CALL_DTYPE)
    at = 0
    for ev in tl.iter_events(kinds=[Kind.CUDA, Kind.CUDA_ENTRY]):
        dst = out[at:at + len(ev)]
        for f in CALL_DTYPE.names:
            dst[f] = ev[f]
        dst["dur_ns"][ev["kind"] == Kind.CUDA_ENTRY] = -1
        at += len(ev)
    return out[:at]


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
    proto = np.zeros(1, dtype=r.dtype)
    out = []
    for k, p, n, a in uniq:
        proto["kind"], proto["pid"], proto["name"], proto["aux"] = k, p, n, a
        out.append(acts.name(proto[0]))
    return out, inv


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
