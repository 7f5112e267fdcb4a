"""The numbers of the report: CUDA latency per function, off-CPU time inside CUDA calls,
preemptions and wakeup latency, connect() per peer, the alignment's uncertainty budget.

Every function takes the compact columns of collect.py and returns plain rows (dicts),
which render.py prints and tests compare with the input.

    rows = cuda_table(data.cuda)          # [{"function", "count", "errors", "p50_ns", ...}]
    inside = offcpu_in_calls(data.cuda, data.sched)
"""
import numpy as np

from ..align.stats import int_grid, pct  # noqa: F401 (pct: the report's percentile)
from ..export import labels
from ..store import cuda_api
from ..store.schema import Chunk, ClockDomain

LAUNCH_FNS = list(cuda_api.ids("launch"))


def _named_counts(codes, namer) -> dict:
    """{name of code: how often} for an array of return codes."""
    return {namer(int(r)): int(c) for r, c in zip(*np.unique(codes, return_counts=True))}


def cuda_table(cuda, unfinished=None) -> list:
    """Per CUDA function: count, errors, p50/p99/p99.9/max latency (ns); busiest first."""
    rows = []
    fns = cuda["fn"].astype(np.int64)
    for f in np.unique(fns).tolist():
        m = fns == f
        d = cuda["dur"][m]
        ret = cuda["ret"][m]
        errs = _named_counts(ret[ret != 0], labels.cuda_result_name)
        rows.append({"function": labels.cuda_function_name(f), "fn": f, "count": int(m.sum()),
                     "errors": int((ret != 0).sum()), "error_names": errs,
                     "p50_ns": pct(d, 50), "p99_ns": pct(d, 99), "p999_ns": pct(d, 99.9),
                     "max_ns": int(d.max()), "total_ns": int(d.sum()),
                     "unfinished": int((unfinished["fn"] == f).sum()) if unfinished is not None
                     and len(unfinished["fn"]) else 0})
    rows.sort(key=lambda r: (-r["count"], r["function"]))
    return rows


def entry_counts(entries) -> dict:
    """{function: calls} of the calls seen at their entry only (CUDA_ENTRY), busiest first."""
    fns, n = np.unique(np.asarray(entries["fn"], dtype=np.int64), return_counts=True)
    rows = sorted(zip(n.tolist(), fns.tolist()), key=lambda r: (-r[0], r[1]))
    return {labels.cuda_function_name(f): c for c, f in rows}


def offcpu_in_calls(cuda, sched) -> dict:
    """Off-CPU time inside CUDA calls: per call (aligned with cuda rows) and summed.

    A thread runs to enter and to leave a driver call, so each off-CPU interval of a
    thread lies inside one of its calls or between two; the overlap is computed anyway.
    """
    n = len(cuda["t"])
    off = np.zeros(n, dtype=np.int64)
    npre = np.zeros(n, dtype=np.int64)
    if n and len(sched["t"]):
        ctid = cuda["tid"].astype(np.int64)
        stid = sched["tid"].astype(np.int64)
        for tid in np.intersect1d(np.unique(ctid), np.unique(stid)).tolist():
            ci = np.flatnonzero(ctid == tid)
            cs = cuda["t"][ci]
            ce = cs + cuda["dur"][ci]
            order = np.argsort(cs, kind="stable")
            ci, cs, ce = ci[order], cs[order], ce[order]
            si = np.flatnonzero(stid == tid)
            ss = sched["t"][si]
            se = ss + sched["dur"][si]
            k = np.searchsorted(cs, ss, side="right") - 1
            ok = k >= 0
            k = np.where(ok, k, 0)
            ov = np.minimum(se, ce[k]) - np.maximum(ss, cs[k])
            ov = np.where(ok, np.maximum(ov, 0), 0)
            hit = ov > 0
            np.add.at(off, ci[k[hit]], ov[hit])
            np.add.at(npre, ci[k[hit & sched["pre"][si]]], 1)
    dur = cuda["dur"].astype(np.int64)
    return {"per_call_ns": off, "preempted_per_call": npre, "total_ns": int(off.sum()),
            "calls_with_offcpu": int((off > 0).sum()), "calls": n,
            "call_time_ns": int(dur.sum()),
            "preemptions_in_calls": int(npre.sum())}


def offcpu_by_function(cuda, inside) -> list:
    rows = []
    fns = cuda["fn"].astype(np.int64)
    for f in np.unique(fns).tolist():
        m = fns == f
        off = inside["per_call_ns"][m]
        tot = int(cuda["dur"][m].sum())
        rows.append({"function": labels.cuda_function_name(f), "calls": int(m.sum()),
                     "calls_with_offcpu": int((off > 0).sum()), "offcpu_ns": int(off.sum()),
                     "share": float(off.sum() / tot) if tot else 0.0,
                     "preempted": int(inside["preempted_per_call"][m].sum()),
                     "p99_offcpu_ns": pct(off, 99)})
    rows.sort(key=lambda r: -r["offcpu_ns"])
    return rows


def worst_calls(cuda, inside, tl, k=10) -> list:
    off = inside["per_call_ns"]
    if not len(off) or off.max() == 0:
        return []
    idx = np.argsort(-off, kind="stable")[:k]
    out = []
    for i in idx.tolist():
        if off[i] == 0:
            break
        tid = int(cuda["tid"][i])
        out.append({"t_ns": int(cuda["t"][i]), "tid": tid, "thread": tl.threads.get(tid, ""),
                    "function": labels.cuda_function_name(int(cuda["fn"][i])),
                    "dur_ns": int(cuda["dur"][i]), "offcpu_ns": int(off[i]),
                    "preempted": int(inside["preempted_per_call"][i])})
    return out


def sched_summary(sched, tl) -> dict:
    pre = sched["pre"].astype(bool)
    wake = sched["wake"]
    w = wake[wake > 0]
    per_thread = []
    tids = sched["tid"].astype(np.int64)
    for tid in np.unique(tids).tolist():
        m = tids == tid
        ww = wake[m & (wake > 0)]
        per_thread.append({"tid": tid, "thread": tl.threads.get(tid, ""),
                           "offcpu_ns": int(sched["dur"][m].sum()),
                           "intervals": int(m.sum()), "preempted": int((m & pre).sum()),
                           "wake_p50_ns": pct(ww, 50), "wake_p99_ns": pct(ww, 99)})
    per_thread.sort(key=lambda r: -r["offcpu_ns"])
    return {"intervals": int(len(pre)), "preempted": int(pre.sum()),
            "blocked": int((~pre).sum()), "offcpu_ns": int(sched["dur"].sum()),
            "wake_n": int(len(w)), "wake_p50_ns": pct(w, 50), "wake_p99_ns": pct(w, 99),
            "wake_max_ns": int(w.max()) if len(w) else None, "per_thread": per_thread}


def offcpu_heatmap(sched, start, end, bins=120):
    """(tids, edges, matrix ns) of off-CPU time per thread per time bin (exact overlap)."""
    tids = np.unique(sched["tid"].astype(np.int64))
    edges = np.linspace(start, end, bins + 1).astype(np.int64)
    mat = np.zeros((len(tids), bins), dtype=np.float64)
    stid = sched["tid"].astype(np.int64)
    for i, tid in enumerate(tids.tolist()):
        m = stid == tid
        s = np.sort(sched["t"][m].astype(np.int64))
        e = np.sort((sched["t"][m] + sched["dur"][m]).astype(np.int64))
        cs = np.concatenate([[0], np.cumsum(s)]).astype(np.float64)
        ce = np.concatenate([[0], np.cumsum(e)]).astype(np.float64)
        ks = np.searchsorted(s, edges, side="left")
        ke = np.searchsorted(e, edges, side="left")
        # F(t) = time off-CPU before t = sum_{s<t}(t - s) - sum_{e<t}(t - e)
        f = (ks * edges.astype(np.float64) - cs[ks]) - (ke * edges.astype(np.float64) - ce[ke])
        mat[i] = np.diff(f)
    return tids, edges, mat


def connect_table(conn, peers) -> list:
    rows = []
    pid = conn["peer"].astype(np.int64)
    for p in np.unique(pid).tolist():
        m = pid == p
        d = conn["dur"][m]
        ret = conn["ret"][m]
        errs = _named_counts(ret[ret < 0], labels.errno_name)
        rows.append({"peer": peers[p], "_peer_id": p, "count": int(m.sum()),
                     "errors": int((ret < 0).sum()),
                     "error_names": errs, "p50_ns": pct(d, 50), "p99_ns": pct(d, 99),
                     "max_ns": int(d.max())})
    rows.sort(key=lambda r: -r["count"])
    return rows


def alignment(tl) -> list:
    """Per clock domain: the fit's summary, its budget and series for the figure."""
    out = []
    counter_lat = None
    cols = tl.columns(Chunk.COUNTERS)
    if len(cols.get("latency_ns", ())):
        counter_lat = cols["latency_ns"].astype(np.int64)
    sw = {}
    cpu = tl.columns(Chunk.CPU_CLOCK)
    for d in np.unique(cpu.get("domain", np.zeros(0))).tolist():
        name = ClockDomain(d).name if d in ClockDomain._value2member_map_ else f"CPU{d}"
        m = cpu["domain"] == d
        sw[name] = (cpu["t0"][m], cpu["remote"][m], cpu["t1"][m])
    gpu = tl.columns(Chunk.GPU_CLOCK)
    for g in np.unique(gpu.get("gpu", np.zeros(0))).tolist():
        m = gpu["gpu"] == g
        sw[f"GPU{g}"] = (gpu["t0"][m], gpu["remote"][m], gpu["t1"][m])
    for name, model in sorted(tl.models.items()):
        s = model.summary()
        hw = s.get("halfwidth_ns") or {}
        row = {"domain": name, "device": tl.devices.describe(name),
               "summary": s, "segments": len(s.get("segments", [])),
               "skew_ppm": float(s.get("skew_ppm") or 0.0), "offset_ns": s.get("offset_ns"),
               "samples_used": s.get("samples_used"), "samples_total": s.get("samples_total"),
               "min_rtt_ns": s.get("min_rtt_ns"), "floor_ns": s.get("floor_ns"),
               "hw_p50": hw.get("p50"), "hw_p99": hw.get("p99"), "hw_max": hw.get("max"),
               "steps": s.get("steps") or [], "tick_ns": s.get("tick_ns", 0),
               "stamp_p50": None, "stamp_p99": None, "assumption": s.get("assumption", "")}
        if name == "REALTIME" and counter_lat is not None:
            row["stamp_p50"], row["stamp_p99"] = pct(counter_lat, 50), pct(counter_lat, 99)
        if name in sw:
            t0, r, t1 = (np.asarray(a, dtype=np.int64) for a in sw[name])
            mid = t0 + (t1 - t0) // 2
            row["residual_t"] = mid
            row["residual_ns"] = mid - model.center_map(r)
            row["residual_half_rtt"] = (t1 - t0) // 2
            grid_r = int_grid(r.min(), r.max(), 400)
            row["band_t"], row["band_ns"] = model.map(grid_r)
        out.append(row)
    return out


def gpu_clock_pairs(tl) -> list:
    """Every probed GPU's timer against the first one's (align/compare.py): skew, offset
    and how well a time of one is known against a time of the other."""
    from ..align.compare import compare
    gpu = tl.columns(Chunk.GPU_CLOCK)
    names = [f"GPU{g}" for g in np.unique(gpu.get("gpu", np.zeros(0))).tolist()]
    names = [n for n in names if n in tl.models]
    out = []
    for b in names[1:]:
        a = names[0]
        ra = gpu["remote"][gpu["gpu"] == int(a[3:])]
        rb = gpu["remote"][gpu["gpu"] == int(b[3:])]
        rel = compare(tl.models[a], ra, tl.models[b], rb)
        if rel is not None:
            out.append({"a": a, "b": b, "a_label": tl.devices.label(a),
                        "b_label": tl.devices.label(b), **rel})
    return out


def role_table(cuda) -> list:
    """Per role of the CUDA table (launch, graph_launch, copy, memset, alloc, module, ...):
    calls, errors, time in the calls, p50/p99 and the bytes named by the calls."""
    roles = np.array([cuda_api.role_of(f) or "other" for f in range(max(
        int(cuda["fn"].max()) + 1 if len(cuda["fn"]) else 1, 1))], dtype=object)
    fns = cuda["fn"].astype(np.int64)
    rows = []
    if not len(fns):
        return rows
    of = roles[fns]
    nbytes = cuda["bytes"].astype(np.uint64) if "bytes" in cuda else np.zeros(len(fns), np.uint64)
    for role in [r for r in cuda_api.ROLES if r in set(of.tolist())] + (
            ["other"] if "other" in set(of.tolist()) else []):
        m = of == role
        d = cuda["dur"][m]
        ok = m & (cuda["ret"] == 0)
        rows.append({"role": role, "calls": int(m.sum()), "errors": int((cuda["ret"][m] != 0).sum()),
                     "total_ns": int(d.sum()), "p50_ns": pct(d, 50), "p99_ns": pct(d, 99),
                     "bytes": int(nbytes[ok].sum()) if role in ("copy", "memset", "alloc", "vmm")
                     else None})
    return rows


def kernel_table(cuda, kernels: dict, k: int = 20) -> list:
    """Launches per kernel (named where cuModuleGetFunction/cuLibraryGetKernel returned its
    handle; the handle otherwise), busiest first."""
    m = np.isin(cuda["fn"].astype(np.int64), LAUNCH_FNS)
    if not m.any():
        return []
    pid, func, dur, ret = (cuda["pid"][m].astype(np.int64), cuda["a0"][m].astype(np.uint64),
                           cuda["dur"][m], cuda["ret"][m])
    keys = np.stack([pid.astype(np.uint64), func], axis=1)
    uniq, inv = np.unique(keys, axis=0, return_inverse=True)
    inv = inv.reshape(-1)
    rows = []
    for i, (p, h) in enumerate(uniq.tolist()):
        sel = inv == i
        rows.append({"kernel": kernels.get((p, h)), "func": int(h), "pid": int(p),
                     "launches": int(sel.sum()), "errors": int((ret[sel] != 0).sum()),
                     "p50_ns": pct(dur[sel], 50), "p99_ns": pct(dur[sel], 99)})
    rows.sort(key=lambda r: (-r["launches"], r["func"]))
    return rows[:k]


def module_loads(cuda) -> list:
    """Each module/library load (cuModuleLoadData/Ex, cuLibraryLoadData) with its duration:
    model-load latency, a precursor users watch."""
    fns = cuda["fn"].astype(np.int64)
    m = np.isin(fns, cuda_api.ids("module"))
    return [{"t_ns": int(t), "tid": int(tid), "function": labels.cuda_function_name(int(f)),
             "dur_ns": int(d), "ret": int(r), "result": labels.cuda_result_name(int(r))}
            for t, tid, f, d, r in zip(cuda["t"][m], cuda["tid"][m], fns[m], cuda["dur"][m],
                                       cuda["ret"][m])]
