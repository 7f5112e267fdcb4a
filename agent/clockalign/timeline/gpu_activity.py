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
# (the stamping uncertainty of a raw record): H200, CUDA 13.0 CUPTI, 300 self-stamping
# kernels (issue 14, 2026-11-29): start -224..-256 ns, end +416..+544 ns; re-measured by
# scripts/gpu_activity.sh (results/gpu-activity.md).
CUPTI_STAMP_UNC_NS = {"start": 256, "end": 544}

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
    ("launch_fn", "<u4"),
])


@dataclasses.dataclass
class GpuActivity:
    rows: np.ndarray                 # ACTIVITY_DTYPE, sorted by t_ns
    names: dict                      # (pid, space, id) -> str
    stats: dict
    notes: list
    domains: dict                    # (pid, device) -> "GPU0" (or None: unmapped)

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


def _domains(recs, clock_info, models, notes, devices=()) -> dict:
    """(pid, device) -> clock domain name, by UUID; else the recorder's device of that CUDA
    ordinal (``devices``, the run's table: the target's ordinals are its own, so this holds
    only where both saw the same CUDA_VISIBLE_DEVICES, and a note says so), or the only
    probed GPU."""
    by_uuid = {str(r.get("uuid")).lower(): r["domain"] for r in clock_info
               if isinstance(r, dict) and r.get("uuid") and r.get("domain")}
    out = {}
    dev = recs[recs["kind"] == GpuKind.DEVICE]
    for r in dev:
        key = (int(r["pid"]), int(r["device"]))
        if int(r["aux"]):
            out[key] = by_uuid.get(_uuid_text(r["grid"], r["block"]).lower())
    acts = recs[np.isin(recs["kind"], ACTIVITY_KINDS)]
    gpus = sorted(d for d in models if d.startswith("GPU"))
    for p, d in {(int(p), int(d)) for p, d in zip(acts["pid"], acts["device"])}:
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
    [t0[i], t1[i]] (the latest such entry), or -1."""
    out = np.full(len(tids), -1, dtype=np.int64)
    if not len(cuda) or not len(tids):
        return out
    ctid = cuda["tid"].astype(np.int64)
    for tid in np.unique(tids).tolist():
        m = np.flatnonzero(tids == tid)
        c = np.flatnonzero(ctid == tid)
        if not len(c):
            continue
        c = c[np.argsort(cuda["t_ns"][c], kind="stable")]
        ts = cuda["t_ns"][c]
        end = ts + np.maximum(cuda["dur_ns"][c], 0)
        j = np.searchsorted(ts, t0[m], side="right") - 1
        ok = j >= 0
        jj = np.maximum(j, 0)
        ok &= end[jj] >= t1[m]
        out[m[ok]] = c[jj[ok]]
    return out


def load(tl) -> GpuActivity:
    """Every GPU activity record of ``tl``'s run, mapped and joined (see module doc)."""
    reader = tl.reader
    parts = list(reader.iter_columns(Chunk.GPU_ACTIVITY))
    notes, stats = [], {}
    names = {(int(r["pid"]), int(r["space"]), int(r["id"])): str(r["name"])
             for r in reader.rows(Chunk.GPU_NAMES) if isinstance(r, dict)}
    if not parts:
        return GpuActivity(np.zeros(0, ACTIVITY_DTYPE), names, stats, notes, {})
    from ..store.schema import GPU_REC_DTYPE
    recs = np.zeros(sum(len(p["kind"]) for p in parts), dtype=GPU_REC_DTYPE)
    at = 0
    for p in parts:
        n = len(p["kind"])
        for f in GPU_REC_DTYPE.names:
            recs[f][at:at + n] = p[f]
        at += n
    acts = recs[np.isin(recs["kind"], ACTIVITY_KINDS)]
    api = recs[recs["kind"] == GpuKind.API]
    models = tl.models
    domains = _domains(recs, reader.rows(Chunk.CLOCK_INFO), models, notes, tl.devices)
    rows = np.zeros(len(acts), dtype=ACTIVITY_DTYPE)
    for f in ("kind", "pid", "device", "stream", "name", "corr", "grid", "block", "aux",
              "shmem"):
        rows[f] = acts[f]
    rows["bytes"] = np.where(acts["kind"] == GpuKind.KERNEL, 0, acts["value"])
    rows["gpu_start"], rows["gpu_end"] = acts["start"], acts["end"]
    rows["raw"] = (acts["flags"] & GPU_FLAG_RAW) != 0
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
            t, u = tl.map(dom, rows[gcol][m].astype(np.int64), CUPTI_STAMP_UNC_NS[stamp])
            rows[col][m], rows[ucol][m] = t, u
        rows["gpu"][m] = int(dom[3:]) if dom[3:].isdigit() else -1
        keep |= m
    conv = ~rows["raw"]
    if conv.any():
        clocks = recs[recs["kind"] == GpuKind.CLOCK]
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
    rows = rows[keep]
    # the launching call: CUPTI callback (pid, corr), then the BPF call that holds it
    stats["activity"] = int(len(rows))
    ai = _join_api(rows, api, stats)
    has = ai >= 0
    rows["launch_tid"][has] = api["tid"][ai[has]]
    rows["launch_fn"][has] = api["aux"][ai[has]]
    cb0 = np.where(has, api["start"][np.maximum(ai, 0)].astype(np.int64), -1)
    cb1 = np.where(has, api["end"][np.maximum(ai, 0)].astype(np.int64), -1)
    rows["launch_t_ns"], rows["launch_end_ns"] = cb0, cb1
    rows["launch_src"] = np.where(has, LAUNCH_CUPTI, LAUNCH_NONE)
    cuda = cuda_calls(tl)
    bi = np.full(len(rows), -1, dtype=np.int64)
    bi[has] = _join_bpf(rows["launch_tid"][has].astype(np.int64), cb0[has], cb1[has], cuda)
    hb = bi >= 0
    rows["launch_t_ns"][hb] = cuda["t_ns"][bi[hb]]
    rows["launch_end_ns"][hb] = cuda["t_ns"][bi[hb]] + cuda["dur_ns"][bi[hb]]
    rows["launch_src"][hb] = LAUNCH_BPF
    stats["joined_bpf"] = int(hb.sum())
    if has.any() and len(cuda) and not hb[has].all():
        notes.append(f"{int(has.sum() - hb.sum())} launching calls seen by CUPTI had no BPF "
                     "CUDA event around them (an unprobed function, or events lost); their "
                     "launch time is CUPTI's callback stamp")
    for k, name in KIND_NAMES.items():
        stats[name] = int((rows["kind"] == k).sum())
    dropped = recs["kind"] == GpuKind.DROPPED
    stats["cupti_dropped"] = int(recs["value"][dropped].sum())
    if stats["cupti_dropped"]:
        notes.append(f"CUPTI dropped {stats['cupti_dropped']} activity records (full buffers)")
    info = recs[recs["kind"] == GpuKind.INFO]
    stats["processes"] = sorted(set(info["pid"].tolist()))
    rows = rows[np.argsort(rows["t_ns"], kind="stable")]
    return GpuActivity(rows, names, stats, notes, domains)


CALL_DTYPE = np.dtype([("t_ns", "<i8"), ("dur_ns", "<i8"), ("tid", "<u4"), ("code", "<u2")])


def cuda_calls(tl) -> np.ndarray:
    """The run's CUDA calls, only the fields the join needs (CALL_DTYPE, 22 bytes a call
    instead of a whole event's 136)."""
    parts = []
    for ev in tl.iter_events(kinds=[Kind.CUDA]):
        c = np.empty(len(ev), dtype=CALL_DTYPE)
        for f in CALL_DTYPE.names:
            c[f] = ev[f]
        parts.append(c)
    return np.concatenate(parts) if parts else np.zeros(0, dtype=CALL_DTYPE)


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


def activity_dicts(acts: GpuActivity):
    """dump's lines for GPU activity: kind gpu_kernel / gpu_copy / gpu_memset."""
    from ..store.schema import unpack_dims
    r = acts.rows
    if not len(r):
        return
    gx, gy, gz = unpack_dims(r["grid"])
    bx, by, bz = unpack_dims(r["block"])
    for i in range(len(r)):
        e = r[i]
        k = int(e["kind"])
        raw = bool(e["raw"])
        d = {"kind": KIND_NAMES[k], "t_ns": int(e["t_ns"]), "end_ns": int(e["end_ns"]),
             "unc_ns": int(e["unc_ns"]) if raw else None,
             "end_unc_ns": int(e["end_unc_ns"]) if raw else None,
             "timestamps": "raw" if raw else "converted",
             "pid": int(e["pid"]), "device": int(e["device"]),
             "gpu": int(e["gpu"]) if e["gpu"] >= 0 else None, "stream": int(e["stream"]),
             "name": acts.name(e), "correlation": int(e["corr"])}
        if k == GpuKind.KERNEL:
            d["grid"] = [int(gx[i]), int(gy[i]), int(gz[i])]
            d["block"] = [int(bx[i]), int(by[i]), int(bz[i])]
            d["shared_mem"] = int(e["shmem"])
        else:
            d["bytes"] = int(e["bytes"])
            if k == GpuKind.MEMSET:
                d["value"] = int(e["aux"])
        src = int(e["launch_src"])
        d["launch"] = None if src == LAUNCH_NONE else {
            "tid": int(e["launch_tid"]), "t_ns": int(e["launch_t_ns"]),
            "end_ns": int(e["launch_end_ns"]), "fn": acts.launch_function(e),
            "source": "bpf" if src == LAUNCH_BPF else "cupti callback"}
        yield d
