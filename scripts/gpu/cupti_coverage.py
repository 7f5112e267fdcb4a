#!/usr/bin/env python3
"""Coverage check against CUPTI (issue 9 item 2): per API family, clockalign's count of driver
calls inside a marked window vs torch.profiler's (CUPTI) records of the same window.

    sudo python3 scripts/gpu/cupti_coverage.py --out OUT            # record + compare
    python3 scripts/gpu/cupti_coverage.py --out OUT --analyze-only  # compare existing outputs
    python3 scripts/gpu/cupti_coverage.py --out OUT --analyze-only --entrypoints EP.json

It runs
    clockalign record -o OUT/coverage.ca --counters none --no-gpu-clock --quiet -- \
        python3 scripts/workloads/coverage_window.py --out OUT/coverage-workload.json \
        --trace OUT/coverage-trace.json
    clockalign dump OUT/coverage.ca -o OUT/coverage-dump.jsonl
then counts, between the two marker connect()s (127.0.0.1:PORT, from the workload's JSON),
clockalign's cuda events of the workload's pid per family, and in the chrome trace the
runtime/driver API records inside the record_function("clockalign_window") range, the kernels
(by launching API; graph kernels per cudaGraphLaunch via correlation ids) and the GPU
memcpy/memset activities; writes OUT/coverage.md and OUT/coverage.json, every difference listed.

Families are keyed by symbol name with _ptsz/_ptds stripped (never by clockalign's function
ids): cuLaunchKernel, cuLaunchKernel_ptsz, cuLaunchKernelEx(_ptsz) all count as kernel
launches; cuMemcpyAsync's direction is unknown, so async copies compare as one family (the
directions too where clockalign saw only direction-named symbols).

Reference per family: CUPTI's API records (runtime + driver) where torch.profiler keeps them;
kineto keeps only the driver records it tracks (kernel launches), so for driver-only families
(VMM, module loads and unloads, direct driver memsets) the reference is the independent
entry-point counter (scripts/gpu/cuda_entrypoints.py: every exported cu* function, phase 1 =
the same marked window of another run of the same workload; --entrypoints, default
OUT/../entrypoints.json as scripts/gpu/session.sh writes it), else the workload's declared
count, or CUPTI's GPU activities (memsets), and the report says which.  A family short by
exactly the calls of symbols the recording did not probe (its run file's cuda_attached) is
"not probed", not a difference; the entry-point counter's window calls of every unprobed
symbol are listed, busiest first.
The functions above main() are pure (stdlib only): tests/unit/test_coverage_tools.py.
"""
import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
WINDOW = "clockalign_window"

FAMILIES = ["kernel_launch", "graph_launch", "graph_kernels", "copy_async", "copy_async_h2d",
            "copy_async_d2h", "copy_async_d2d", "copy_sync", "memset", "event_record",
            "stream_wait", "sync", "alloc", "free", "vmm", "module_load",
            "module_get_function", "module_unload"]

_SUFFIX = re.compile(r"_(ptsz|ptds)$")
_VER = re.compile(r"_v\d+$")

DRIVER_RULES = [
    (r"cuLaunch(Kernel|KernelEx|CooperativeKernel|CooperativeKernelMultiDevice)", "kernel_launch"),
    (r"cuGraphLaunch", "graph_launch"),
    (r"cuMemcpy(HtoD|DtoH|DtoD|HtoA|AtoH|DtoA|AtoD|2D|3D|3DPeer|Peer|Batch|3DBatch)?Async(_v\d+)?",
     "copy_async"),
    (r"cuMemcpy(HtoD|DtoH|DtoD|HtoA|AtoH|DtoA|AtoD|AtoA|2D|2DUnaligned|3D|3DPeer|Peer)?(_v\d+)?",
     "copy_sync"),
    (r"cuMemsetD(2D)?(8|16|32)(Async)?(_v\d+)?", "memset"),
    (r"cuEventRecord(WithFlags)?", "event_record"),
    (r"cuStreamWaitEvent", "stream_wait"),
    (r"cu(Ctx|Stream|Event)Synchronize(_v\d+)?", "sync"),
    (r"cuMem(Alloc|AllocAsync|AllocFromPoolAsync|AllocHost|HostAlloc|AllocManaged|AllocPitch)"
     r"(_v\d+)?", "alloc"),
    (r"cuMem(Free|FreeAsync|FreeHost)(_v\d+)?", "free"),
    (r"cuMem(Create|Map|Unmap|Release|AddressReserve|AddressFree|SetAccess|MapArrayAsync)"
     r"(_v\d+)?", "vmm"),
    (r"cu(ModuleLoad|ModuleLoadData|ModuleLoadDataEx|ModuleLoadFatBinary|LibraryLoadData|"
     r"LibraryLoadFromFile)(_v\d+)?", "module_load"),
    (r"cu(ModuleGetFunction|LibraryGetKernel|LibraryGetModule|KernelGetFunction)", "module_get_function"),
    (r"cu(ModuleUnload|LibraryUnload)", "module_unload"),
]
RUNTIME_RULES = [
    (r"cudaLaunch(Kernel|KernelExC|KernelEx|CooperativeKernel|CooperativeKernelMultiDevice)",
     "kernel_launch"),
    (r"cudaGraphLaunch", "graph_launch"),
    (r"cudaMemcpy(2D|3D|Peer|3DPeer|ToSymbol|FromSymbol|2DToArray|2DFromArray|ToArray|FromArray|"
     r"Batch|3DBatch)?Async", "copy_async"),
    (r"cudaMemcpy(2D|3D|Peer|3DPeer|ToSymbol|FromSymbol|2DToArray|2DFromArray|ToArray|FromArray|"
     r"2DArrayToArray)?", "copy_sync"),
    (r"cudaMemset(2D|3D)?(Async)?", "memset"),
    (r"cudaEventRecord(WithFlags)?", "event_record"),
    (r"cudaStreamWaitEvent", "stream_wait"),
    (r"cuda(Device|Stream|Event)Synchronize", "sync"),
    (r"cuda(Malloc|MallocAsync|MallocHost|MallocManaged|MallocPitch|MallocFromPoolAsync|HostAlloc)",
     "alloc"),
    (r"cuda(Free|FreeAsync|FreeHost)", "free"),
    (r"cudaLibraryLoad(Data|FromFile)", "module_load"),
    (r"cudaLibraryUnload", "module_unload"),
]
_DRIVER = [(re.compile(p + "$"), f) for p, f in DRIVER_RULES]
_RUNTIME = [(re.compile(p + "$"), f) for p, f in RUNTIME_RULES]


def strip_suffix(name: str) -> str:
    """cuLaunchKernel_ptsz -> cuLaunchKernel; cudaLaunchKernel_v7000 -> cudaLaunchKernel."""
    name = _SUFFIX.sub("", name)
    if name.startswith("cuda"):
        name = _VER.sub("", name)
        name = _SUFFIX.sub("", name)
    return name


def family_of(name: str):
    """API family of a driver (cu*) or runtime (cuda*) function name, or None."""
    base = strip_suffix(name)
    rules = _RUNTIME if base.startswith("cuda") else _DRIVER
    for rx, fam in rules:
        if rx.match(base):
            return fam
    return None


def copy_direction(name: str):
    """'h2d' / 'd2h' / 'd2d' from a driver copy symbol or a CUPTI memcpy activity name, else
    None (cuMemcpyAsync: unknown)."""
    for key, d in (("HtoD", "h2d"), ("DtoH", "d2h"), ("DtoD", "d2d")):
        if key in name:
            return d
    return None


def _inc(d, k, n=1):
    d[k] = d.get(k, 0) + n


# ------------------------------------------------------------------ clockalign side

def clockalign_window(lines, peer, pid=None, main_tid=None):
    """Count clockalign's cuda events between the first two connect()s to peer (dump's JSON
    lines, or dicts).  Returns {window, families, symbols, other_threads, unfinished,
    errors}."""
    evs = []
    for ln in lines:
        if isinstance(ln, str) and not ln.strip():
            continue
        d = json.loads(ln) if isinstance(ln, str) else ln
        if not d or (pid is not None and d.get("pid") != pid):
            continue
        evs.append(d)
    marks = sorted(d["t_ns"] for d in evs if d.get("kind") == "connect" and d.get("peer") == peer)
    out = {"markers": len(marks), "window": None, "families": {}, "symbols": {},
           "other_threads": {}, "unfinished": {}, "errors": {}, "unclassified": {}}
    if len(marks) < 2:
        return out
    t0, t1 = marks[0], marks[1]
    out["window"] = [t0, t1]
    for d in evs:
        if d.get("kind") not in ("cuda", "cuda_unfinished") or not (t0 < d["t_ns"] < t1):
            continue
        fn = d["fn"]
        if d["kind"] == "cuda_unfinished":
            _inc(out["unfinished"], fn)
        _inc(out["symbols"], fn)
        if main_tid is not None and d.get("tid") != main_tid:
            _inc(out["other_threads"], fn)
        if d.get("ret"):
            _inc(out["errors"], f"{fn} -> {d['ret']}")
        fam = family_of(fn)
        if fam is None:
            _inc(out["unclassified"], fn)
            continue
        _inc(out["families"], fam)
        if fam == "copy_async":
            _inc(out["families"], "copy_async_" + (copy_direction(fn) or "unknown"))
    return out


# ------------------------------------------------------------------ CUPTI (chrome trace) side

def cupti_window(trace):
    """Counts from a torch.profiler chrome trace (dict) inside the clockalign_window range."""
    evs = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    ann = [e for e in evs if e.get("name") == WINDOW and e.get("cat") == "user_annotation"]
    out = {"window_found": bool(ann), "api": {}, "families": {}, "kernels_by_api": {},
           "graph_launches": [], "gpu": {}, "gpu_unlinked": {}, "unclassified_api": {}}
    if ann:
        lo, hi = float(ann[0]["ts"]), float(ann[0]["ts"]) + float(ann[0].get("dur", 0))
    else:
        lo, hi = float("-inf"), float("inf")
    api = {}
    for e in evs:
        if e.get("cat") not in ("cuda_runtime", "cuda_driver"):
            continue
        ts = float(e["ts"])
        if not (lo <= ts <= hi):
            continue
        corr = (e.get("args") or {}).get("correlation")
        name = e["name"]
        api[corr] = name
        _inc(out["api"], name)
        fam = family_of(name)
        if fam is None:
            _inc(out["unclassified_api"], name)
        else:
            _inc(out["families"], fam)
    graph = {c: [] for c, n in api.items() if family_of(n) == "graph_launch"}
    for e in evs:
        cat = e.get("cat")
        if cat not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        corr = (e.get("args") or {}).get("correlation")
        parent = api.get(corr)
        if parent is None:
            ts = float(e["ts"])
            if lo <= ts <= hi + 1000.0:          # GPU work of an API record kineto dropped
                _inc(out["gpu_unlinked"], cat)
                if cat == "gpu_memset":
                    _inc(out["gpu"], "memset")
                elif cat == "gpu_memcpy":
                    _inc(out["gpu"], "memcpy_" + (copy_direction(e["name"]) or "other"))
            continue
        in_graph = corr in graph
        if cat == "kernel":
            if in_graph:
                graph[corr].append(e["name"])
            else:
                _inc(out["kernels_by_api"], strip_suffix(parent))
                _inc(out["gpu"], "kernels")
        elif cat == "gpu_memcpy":
            _inc(out["gpu"], ("graph_" if in_graph else "") + "memcpy_" +
                 (copy_direction(e["name"]) or "other"))
            if not in_graph and family_of(parent) == "copy_async":
                d = copy_direction(e["name"])
                if d:
                    _inc(out["families"], "copy_async_" + d)
        elif cat == "gpu_memset":
            _inc(out["gpu"], ("graph_" if in_graph else "") + "memset")
            if not in_graph and family_of(parent) != "memset":
                _inc(out["gpu"], f"memset_from_{strip_suffix(parent)}")
    out["graph_launches"] = [{"correlation": c, "kernels": len(k)} for c, k in graph.items()]
    out["families"]["graph_kernels"] = sum(len(k) for k in graph.values())
    return out


# ------------------------------------------------------------------ entry-point counter side

def entrypoint_window(ep, phase="1"):
    """Counts of scripts/gpu/cuda_entrypoints.py's JSON in one phase (1 = the marked window):
    {window_found, symbols, families}.  A key "a=b" is one address exported under both
    names; its family is that of the first name that has one."""
    calls = (ep or {}).get("calls_by_phase", {}).get(str(phase))
    out = {"window_found": calls is not None, "symbols": dict(calls or {}), "families": {}}
    for key, n in (calls or {}).items():
        fam = next((f for f in map(family_of, key.split("=")) if f), None)
        if fam is None:
            continue
        _inc(out["families"], fam, n)
        if fam == "copy_async":
            _inc(out["families"], "copy_async_" + (copy_direction(key) or "unknown"), n)
    out["families"].pop("copy_async_unknown", None)
    return out


def is_probed(key, probed):
    """key: a symbol or an entry-point alias group "a=b"; probed: symbols (None = unknown)."""
    return probed is None or any(k in probed for k in key.split("="))


def unprobed_calls(ep_symbols, probed, family=None):
    """{symbol: window calls} of the entry-point counter's symbols that were not probed
    (of one family, or of none: family="")."""
    if probed is None:
        return {}
    out = {}
    for key, n in ep_symbols.items():
        fam = next((f for f in map(family_of, key.split("=")) if f), "")
        if (family is None or fam == family) and not is_probed(key, probed) and n:
            out[key] = n
    return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))


# what vmm_body calls per iteration, in order (workloads before the per-symbol declaration
# only wrote the total)
VMM_EXPLICIT = ("cuMemAddressReserve", "cuMemCreate", "cuMemMap", "cuMemSetAccess",
                "cuMemUnmap", "cuMemRelease", "cuMemAddressFree")


def vmm_explicit_symbols(declared_entry):
    """{symbol: n} the workload called explicitly (its declaration, or n/7 of each)."""
    if not declared_entry:
        return {}
    if declared_entry.get("symbols"):
        return dict(declared_entry["symbols"])
    per = declared_entry["n"] // len(VMM_EXPLICIT)
    return {s: per for s in VMM_EXPLICIT}


# ------------------------------------------------------------------ declared counts

def declared_counts(workload):
    """{family: {"n", "exact", "notes"}} summed over the workload's parts."""
    out = {}
    for part, rec in (workload.get("parts") or {}).items():
        for e in rec.get("expect", []):
            if "family" not in e:
                continue
            d = out.setdefault(e["family"], {"n": 0, "exact": True, "notes": []})
            d["n"] += e["n"]
            d["exact"] = d["exact"] and e["exact"]
            for sym, k in (e.get("symbols") or {}).items():
                d.setdefault("symbols", {})
                d["symbols"][sym] = d["symbols"].get(sym, 0) + k
            d["notes"].append(f"{part}: {e['note']}" if e.get("note") else part)
    return out


# ------------------------------------------------------------------ comparison

DRIVER_ONLY = {"vmm", "module_load", "module_get_function", "module_unload"}
STATUSES = ("ok", "not probed", "DIFF", "info")


def compare(ca, cupti, declared, probed=None, ep=None):
    """One row per family: cupti, clockalign, entrypoints, declared, reference (and its
    basis), diff, status, note.  probed: symbols the recording probed; ep: entrypoint_window.
    status "not probed": clockalign is short by exactly the window calls of unprobed symbols
    (the entry-point counter's, or the workload's explicit VMM calls)."""
    cf, uf = ca.get("families", {}), cupti.get("families", {})
    ef = (ep or {}).get("families", {})
    have_ep = bool(ep and ep.get("window_found"))
    gpu = cupti.get("gpu", {})
    rows = []
    fams = [f for f in FAMILIES if f in cf or f in uf or f in declared or f in ef]
    fams += sorted((set(cf) | set(uf) | set(ef)) - set(fams) - {"copy_async_unknown"})
    for fam in fams:
        c, u = cf.get(fam, 0), uf.get(fam, 0)
        e = ef.get(fam, 0) if have_ep else None
        dec = declared.get(fam)
        ref, basis = u, "CUPTI API records"
        missing = {}                  # window calls of symbols the recording did not probe
        if have_ep:
            missing = unprobed_calls(ep["symbols"], probed, fam)
        if fam == "graph_kernels":
            c, e, basis = None, None, ("CUPTI kernels under cudaGraphLaunch (clockalign sees "
                                       "launches only)")
        elif fam == "memset":
            ref = max(u, gpu.get("memset", 0))
            basis = "CUPTI GPU memset activities" if ref != u else basis
        elif fam in DRIVER_ONLY and u == 0 and have_ep:
            ref, basis = e, ("entry-point counter (kineto keeps no driver records of this "
                             "family)")
        elif fam == "vmm":
            sym = vmm_explicit_symbols(declared.get("vmm_explicit"))
            ref = sum(sym.values())
            basis = "workload (explicit VMM calls; torch's expandable segments add more)"
            if probed is not None:
                missing = {k: n for k, n in sym.items() if k not in probed}
        elif fam in DRIVER_ONLY and u == 0 and dec:
            ref, basis = dec["n"], "workload (kineto keeps no driver records of this family)"
            if probed is not None and not any(family_of(p) == fam for p in probed):
                missing = {f"(declared; no {fam} symbol probed)": dec["n"]}
        elif fam.startswith("copy_async_") and cf.get("copy_async_unknown"):
            basis = "CUPTI memcpy kind (clockalign: some cuMemcpyAsync of unknown direction)"
        row = {"family": fam, "cupti": u, "clockalign": c, "entrypoints": e,
               "declared": dec["n"] if dec else None,
               "declared_exact": dec["exact"] if dec else None, "reference": ref,
               "basis": basis, "unprobed": missing}
        if c is None:
            row["diff"], row["status"] = None, "info"
        else:
            row["diff"] = c - ref
            if fam == "vmm" and basis.startswith("workload"):
                sym = vmm_explicit_symbols(declared.get("vmm_explicit"))
                seen = ca.get("symbols", {})
                short = {k: n for k, n in sym.items() if seen.get(k, 0) < n}
                row["status"] = ("ok" if not short else "not probed"
                                 if set(short) <= set(missing) else "DIFF")
            elif fam.startswith("copy_async_") and cf.get("copy_async_unknown"):
                row["status"] = "ok" if c <= ref else "DIFF"
            elif c == ref:
                row["status"] = "ok"
            elif missing and c + sum(missing.values()) == ref:
                row["status"] = "not probed"
            else:
                row["status"] = "DIFF"
        row["note"] = explain(row, ca, cupti, probed, ep)
        rows.append(row)
    return rows


def _counts(d):
    return ", ".join(f"{k} {v}" for k, v in sorted(d.items()))


def explain(row, ca, cupti, probed, ep=None):
    fam = row["family"]
    syms = {s: n for s, n in ca.get("symbols", {}).items() if family_of(s) == fam}
    api = {s: n for s, n in cupti.get("api", {}).items() if family_of(s) == fam}
    eps = {s: n for s, n in (ep or {}).get("symbols", {}).items()
           if any(family_of(k) == fam for k in s.split("="))}
    parts = []
    if api:
        parts.append("CUPTI: " + _counts(api))
    if syms:
        parts.append("clockalign: " + _counts(syms))
    if eps:
        parts.append("entry points: " + _counts(eps))
    if row.get("unprobed"):
        parts.append("not probed in this recording: " + _counts(row["unprobed"]))
    if row["status"] == "DIFF" and not syms and probed is not None:
        mine = sorted(s for s in probed if family_of(s) == fam)
        parts.append("clockalign probes " + (", ".join(mine) if mine else "no symbol of this "
                     "family") + (" (none called in the window)" if mine else ""))
    if fam == "copy_async" and ca.get("families", {}).get("copy_async_unknown"):
        parts.append(f"{ca['families']['copy_async_unknown']} clockalign copies of unknown "
                     "direction (cuMemcpyAsync)")
    if fam == "vmm" and row["basis"].startswith("workload"):
        extra = (row["clockalign"] or 0) - (row["reference"] or 0)
        parts.append(f"{extra:+d} calls against the explicit ones (torch expandable segments "
                     "add more; unprobed explicit ones are missing)")
    if fam == "graph_kernels":
        k = [g["kernels"] for g in cupti.get("graph_launches", [])]
        if k:
            parts.append(f"{len(k)} graph launches, kernels per launch {sorted(set(k))}")
    if fam == "kernel_launch":
        kb = cupti.get("kernels_by_api", {})
        if kb:
            parts.append("kernels by launching API: " + _counts(kb))
    return "; ".join(parts)


def runtime_to_driver(cupti, ca, ep=None):
    """Per family: the runtime API records CUPTI saw and the driver entry points reached in
    the window (entry-point counter, else clockalign), with whether a _ptsz/_ptds twin was."""
    drv = (ep or {}).get("symbols") or ca.get("symbols", {})
    rows = []
    for fam in FAMILIES:
        rt = {s: n for s, n in cupti.get("api", {}).items()
              if s.startswith("cuda") and family_of(s) == fam}
        if not rt:
            continue
        d = {s: n for s, n in drv.items() if any(family_of(k) == fam for k in s.split("="))}
        rows.append({"family": fam, "runtime": rt, "driver": d,
                     "per_thread": sorted(s for s in d if _SUFFIX.search(s))})
    return rows


def render_md(rows, ca, cupti, workload, meta, ep=None, probed=None):
    L = ["# clockalign vs CUPTI: API coverage in one marked window", ""]
    L.append(f"Made by `{meta.get('command', 'scripts/gpu/cupti_coverage.py')}` on {meta.get('host', '?')}"
             f" ({meta.get('date', '?')}); torch {workload.get('torch')}, CUDA "
             f"{workload.get('torch_cuda')}, allocator {workload.get('alloc_conf')}.")
    L.append(f"Window: clockalign markers found {ca.get('markers')}, CUPTI window range "
             f"found {cupti.get('window_found')}, entry-point counter window found "
             f"{bool(ep and ep.get('window_found'))}; n = {workload.get('n')} per part.")
    L.append("")
    L.append("| family | CUPTI | clockalign | entry points | declared | reference (basis) | diff "
             "| status |")
    L.append("|---|---:|---:|---:|---:|---|---:|---|")
    blank = lambda v: "" if v is None else v          # noqa: E731
    for r in rows:
        dec = "" if r["declared"] is None else (str(r["declared"]) +
                                                ("" if r["declared_exact"] else "+"))
        L.append(f"| {r['family']} | {r['cupti']} | {blank(r['clockalign'])} | "
                 f"{blank(r.get('entrypoints'))} | {dec} | {r['reference']} ({r['basis']}) | "
                 f"{blank(r['diff'])} | {r['status']} |")
    L += ["", "declared: the workload's own count ('+' = at least); entry points: "
          "scripts/gpu/cuda_entrypoints.py's count in the same window of another run of the "
          "workload", ""]
    diffs = [r for r in rows if r["status"] == "DIFF"]
    L.append(f"## Differences ({len(diffs)})")
    L.append("")
    for r in diffs:
        L.append(f"- **{r['family']}**: clockalign {r['clockalign']} vs {r['reference']} "
                 f"({r['basis']}), diff {r['diff']:+d}. {r['note']}")
    if not diffs:
        L.append("none")
    gaps = [r for r in rows if r["status"] == "not probed"]
    if gaps:
        L += ["", f"## Not probed in this recording ({len(gaps)})", ""]
        for r in gaps:
            L.append(f"- **{r['family']}**: clockalign {r['clockalign']} vs {r['reference']}, "
                     f"short by exactly {_counts(r['unprobed'])}")
    rt = runtime_to_driver(cupti, ca, ep)
    if rt:
        L += ["", "## Runtime API -> driver entry points reached", "",
              "| family | runtime API (CUPTI) | driver entry points (window) | _ptsz/_ptds |",
              "|---|---|---|---|"]
        for r in rt:
            L.append(f"| {r['family']} | {_counts(r['runtime'])} | {_counts(r['driver'])} | "
                     f"{', '.join(r['per_thread']) or 'none'} |")
    if ep and ep.get("window_found") and probed is not None:
        hot = unprobed_calls(ep["symbols"], probed, family="")
        if hot:
            L += ["", "## Called in the window, no family, not probed (entry-point counter)", "",
                  "| symbol | window calls |", "|---|---:|"]
            L += [f"| {k} | {v} |" for k, v in hot.items()]
    L += ["", "## Details", ""]
    for r in rows:
        if r["note"]:
            L.append(f"- {r['family']}: {r['note']}")
    if ca.get("unclassified"):
        L.append(f"- clockalign symbols of no family: {ca['unclassified']}")
    if ca.get("other_threads"):
        L.append(f"- clockalign calls on threads other than the workload's main thread: "
                 f"{ca['other_threads']}")
    if ca.get("errors"):
        L.append(f"- non-zero return codes: {ca['errors']}")
    if cupti.get("unclassified_api"):
        L.append(f"- CUPTI API records of no family: {cupti['unclassified_api']}")
    L.append(f"- CUPTI GPU activities: {cupti.get('gpu')}; unlinked to an API record: "
             f"{cupti.get('gpu_unlinked')}")
    if workload.get("skipped"):
        L += ["", "## Skipped parts", ""]
        L += [f"- {k}: {v}" for k, v in sorted(workload["skipped"].items())]
    failed = {k: v["failed_in_window"] for k, v in workload.get("parts", {}).items()
              if "failed_in_window" in v}
    if failed:
        L += ["", "## Parts that failed inside the window", ""]
        L += [f"- {k}: {v}" for k, v in sorted(failed.items())]
    inner = [(p, e) for p, rec in workload.get("parts", {}).items()
             for e in rec.get("expect", []) if "skipped" in e]
    L += [f"- {p}: skipped {e['skipped']}: {e['reason']}" for p, e in inner]
    if workload.get("timings_s"):
        L += ["", f"Timings (s): {workload['timings_s']}"]
    return "\n".join(L) + "\n"


def analyze(out_dir, probed=None, meta=None, entrypoints=None):
    """Compare the outputs in out_dir (coverage-workload.json, coverage-dump.jsonl,
    coverage-trace.json; entrypoints: the entry-point counter's JSON, optional); writes
    coverage.md and coverage.json there."""
    with open(os.path.join(out_dir, "coverage-workload.json")) as f:
        workload = json.load(f)
    with open(os.path.join(out_dir, "coverage-dump.jsonl")) as f:
        ca = clockalign_window(f, workload["marker_peer"], workload.get("pid"),
                               workload.get("main_tid"))
    tpath = workload.get("trace") or os.path.join(out_dir, "coverage-trace.json")
    if not os.path.exists(tpath):                 # moved off the host it was made on
        tpath = os.path.join(out_dir, "coverage-trace.json")
    if os.path.exists(tpath):
        with open(tpath) as f:
            cupti = cupti_window(json.load(f))
    else:
        cupti = {"window_found": False, "missing": tpath, "families": {}, "api": {}, "gpu": {}}
    ep = None
    if entrypoints and os.path.exists(entrypoints):
        with open(entrypoints) as f:
            ep = entrypoint_window(json.load(f))
        ep["source"] = entrypoints
    declared = declared_counts(workload)
    rows = compare(ca, cupti, declared, probed, ep)
    md = render_md(rows, ca, cupti, workload, meta or {}, ep, probed)
    res = {"rows": rows, "clockalign": ca, "cupti": cupti, "entrypoints": ep,
           "declared": declared, "probed": sorted(probed) if probed is not None else None,
           "runtime_to_driver": runtime_to_driver(cupti, ca, ep),
           "workload": workload, "meta": meta or {}}
    with open(os.path.join(out_dir, "coverage.json"), "w") as f:
        json.dump(res, f, indent=1)
    with open(os.path.join(out_dir, "coverage.md"), "w") as f:
        f.write(md)
    return res, md


# ------------------------------------------------------------------ driver

def probed_symbols(run_file=None):
    """Symbols the recording probed (its run file's cuda_attached), else those clockalign
    probes now (its table), or None when clockalign is not importable."""
    try:
        from clockalign.store.schema import CUDA_FUNCTIONS
    except ImportError:
        return None
    if run_file and os.path.exists(run_file):
        try:
            from clockalign.store.reader import RunReader
            attached = RunReader(run_file).meta.get("cuda_attached")
            if attached:
                return sorted(attached)
        except Exception as e:                    # an unreadable file: say so, use the table
            print(f"probed symbols of {run_file}: {e}; using clockalign's table",
                  file=sys.stderr)
    return [v[0] for v in CUDA_FUNCTIONS.values()]


def run(cmd, log, timeout):
    log("$ " + " ".join(shlex.quote(c) for c in cmd))
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, timeout=timeout)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        rc = "timeout"
    log(f"  -> {rc} in {time.monotonic() - t0:.1f} s")
    return rc


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--analyze-only", action="store_true")
    ap.add_argument("--clockalign", default="clockalign", help="clockalign command")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--entrypoints", help="cuda_entrypoints.py JSON of the same workload "
                    "(default: OUT/../entrypoints.json when it exists)")
    ap.add_argument("workload_args", nargs=argparse.REMAINDER,
                    help="-- extra arguments for scripts/workloads/coverage_window.py")
    a = ap.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    log = lambda s: print(s, file=sys.stderr, flush=True)
    extra = a.workload_args[1:] if a.workload_args[:1] == ["--"] else a.workload_args
    ca_cmd = shlex.split(a.clockalign)
    t0 = time.monotonic()
    status = {}
    if not a.analyze_only:
        wl = [a.python, os.path.join(HERE, "..", "workloads", "coverage_window.py"),
              "--out", os.path.join(a.out, "coverage-workload.json"),
              "--trace", os.path.join(a.out, "coverage-trace.json")] + extra
        status["record"] = run(ca_cmd + ["record", "-o", os.path.join(a.out, "coverage.ca"),
                                         "--counters", "none", "--no-gpu-clock", "--quiet",
                                         "--"] + wl, log, a.timeout)
        status["dump"] = run(ca_cmd + ["dump", os.path.join(a.out, "coverage.ca"), "-o",
                                       os.path.join(a.out, "coverage-dump.jsonl")], log, 120)
    meta = {"command": "scripts/gpu/cupti_coverage.py " + " ".join(argv or sys.argv[1:]),
            "host": os.uname().nodename, "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
            "status": status, "run_s": round(time.monotonic() - t0, 1)}
    try:
        ep = a.entrypoints or os.path.join(os.path.dirname(os.path.abspath(a.out)),
                                           "entrypoints.json")
        res, md = analyze(a.out, probed_symbols(os.path.join(a.out, "coverage.ca")), meta, ep)
    except FileNotFoundError as e:
        log(f"cannot analyze: {e}")
        return 1
    print(md)
    log(f"wrote {a.out}/coverage.md and coverage.json ({meta['run_s']} s)")
    return 0 if not any(r["status"] == "DIFF" for r in res["rows"]) else 3   # 3: differences


if __name__ == "__main__":
    sys.exit(main())
