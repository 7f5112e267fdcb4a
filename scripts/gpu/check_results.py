#!/usr/bin/env python3
"""Write results/record-gpu.md and results/faults-gpu.md from the H200 recordings.

    python3 scripts/gpu/check_results.py [--data tests/data/gpu-h200] [--out results]

The recordings were made by `scripts/gpu/session.sh` on the H200 host and are committed under
tests/data/gpu-h200/ (reference.ca + reference-workload.json: `clockalign demo`; faults.ca +
faults-workload.json: `clockalign record -- python3 scripts/workloads/known_faults.py`; idle.ca,
busy.ca: an idle and a busy GPU).  Everything in the two reports is computed here from those
files, so anyone can regenerate them.
"""
import argparse
import json
import os

import numpy as np

from clockalign.workloads.check import check_reference_gpu, cuda_counts
from clockalign.store.reader import RunReader
from clockalign.store.schema import CUDA_FN_BY_NAME, Chunk, Kind
from clockalign.timeline import Timeline


def us(ns):
    return f"{ns / 1e3:,.1f} µs"


def record_md(data, out):
    r = RunReader(os.path.join(data, "reference.ca"))
    with open(os.path.join(data, "reference-workload.json")) as f:
        w = json.load(f)
    ev = r.events()
    rows = check_reference_gpu(ev, w)
    counts = cuda_counts(ev, w["pid"])
    cuda = ev[(ev["kind"] == Kind.CUDA) & (ev["pid"] == w["pid"])]
    ooms = cuda[(cuda["code"] == CUDA_FN_BY_NAME["cuMemAlloc_v2"]) & (cuda["ret"] != 0)]
    m = r.meta
    lines = [
        "# Recording a real PyTorch CUDA workload on the H200",
        "",
        f"- host: {m['host']}, kernel {m['kernel']}, {m['driver']}",
        f"- GPU: {', '.join(g['name'] + ' ' + g['uuid'] for g in m['gpus'])}",
        f"- libcuda probed: {m['targets'][0]['libcuda']}",
        "- BCC: the offline bundle (`scripts/make_bundle.sh` here, `scripts/install_bundle.sh` "
        "there), Debian's libbpfcc 0.26 on Ubuntu 24.04, headers 6.1 linked for kernel 6.18",
        "- command (from `scripts/gpu/session.sh align`): `clockalign demo -o DIR`, which runs "
        "`clockalign record -- python3 -m clockalign.workloads.reference_gpu --out DIR/workload.json`",
        f"- workload: torch {w['torch']}, {w['launches']} `x.add_(1.0)` launches, a 10 TiB "
        "`torch.empty` (out of memory) and a 256 MiB retry, "
        f"{w['syncs']} `torch.cuda.synchronize()`, a connect() to a listener and one to a closed port",
        f"- regenerate: `python3 scripts/gpu/check_results.py` (reads tests/data/gpu-h200/)",
        "",
        "## What the workload says it did vs what was recorded",
        "",
        "| check | workload | recorded | |",
        "|---|---|---|---|",
    ]
    for what, exp, seen, ok in rows:
        lines.append(f"| {what} | {exp} | {seen} | {'match' if ok else 'DIFFERS'} |")
    lines += [
        "",
        f"torch's own counters: num_ooms {w['torch_num_ooms']}, num_alloc_retries "
        f"{w['torch_num_alloc_retries']} — the caching allocator tries cudaMalloc, frees its "
        f"cache and tries again, so one torch OOM is {len(ooms)} driver calls:",
        "",
        "| call | bytes | return code | duration |",
        "|---|---|---|---|",
    ]
    for e in ooms:
        lines.append(f"| cuMemAlloc_v2 | {int(e['a1']):,} | {int(e['ret'])} "
                     f"(CUDA_ERROR_OUT_OF_MEMORY) | {us(int(e['dur']))} |")
    lines += ["", "All CUDA driver calls of the workload process, by function:", "",
              "| function | calls | errors | p50 | max |", "|---|---|---|---|---|"]
    for name, n in sorted(counts.items(), key=lambda kv: -kv[1]):
        c = cuda[cuda["code"] == CUDA_FN_BY_NAME[name]]
        lines.append(f"| {name} | {n} | {int(np.sum(c['ret'] != 0))} | "
                     f"{us(float(np.median(c['dur'])))} | {us(int(c['dur'].max()))} |")
    drops = (r.trailer or {}).get("drops") or {}
    lines += ["", f"Drops: {sum(drops.values())}. Recording ended: {r.trailer.get('reason')}.",
              "", "Findings:",
              "- The runtime (CUDA 13, torch 2.11) launches through the exported "
              "`cuLaunchKernel`, allocates through `cuMemAlloc_v2`, and its "
              "`cudaDeviceSynchronize` reaches `cuCtxSynchronize_v2`, not `cuCtxSynchronize`; "
              "both are probed.",
              "- torch must run with `expandable_segments:False` for allocations to show as "
              "cuMemAlloc_v2; with expandable segments it maps memory with cuMemCreate/cuMemMap, "
              "which are not probed yet."]
    late = RunReader(os.path.join(data, "late-import.ca"))
    lev = late.events()
    lcounts = cuda_counts(lev, late.meta["targets"][0]["pid"])
    notice = next((n["text"] for n in late.rows(Chunk.NOTICES) if "not loaded" in n["text"]), "")
    lines += ["", "## --pid on a process that loads libcuda later",
              "",
              "`clockalign record --pid PID` on a python3 that sleeps, then imports torch and runs "
              "100 `x.add_(1)` (tests/data/gpu-h200/late-import.ca, `scripts/gpu/session.sh "
              "final`):", "", f"- notice: {notice}",
              "- recorded: " + ", ".join(f"{k} {v}" for k, v in sorted(lcounts.items())) +
              " (cuLaunchKernel: the 100 launches of the loop and 1 for the fill of `torch.ones`)"]
    with open(os.path.join(out, "record-gpu.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def counters_near(tl, t_ns, fields, span_ns=500_000_000):
    c = tl.counters(fields=fields)
    near = c[(c["t_ns"] >= t_ns - span_ns) & (c["t_ns"] <= t_ns + span_ns)]
    out = []
    for fid in np.unique(near["field"]):
        s = near[near["field"] == fid]
        out.append((tl.field_name(int(fid)), s))
    return out


def faults_md(data, out):
    tl = Timeline.open(os.path.join(data, "faults.ca"))
    with open(os.path.join(data, "faults-workload.json")) as f:
        w = json.load(f)
    faults = tl.faults()
    t0 = tl.start_ns
    lines = [
        "# Real faults on the H200, on one timeline",
        "",
        "- command (from `scripts/gpu/session.sh record`): `clockalign record -o faults.ca "
        "--counter-interval 0.02 -- python3 scripts/workloads/known_faults.py --out faults.json`",
        "- faults injected by the workload: an out-of-memory allocation and its retry, refused "
        "connect()s, an illegal address from a one-thread PTX kernel (a user-space fault in the "
        "workload's own context; the GPU was not reset or reconfigured), sticky errors after it",
        f"- regenerate: `python3 scripts/gpu/check_results.py` (reads tests/data/gpu-h200/)",
        f"- clock models: " + ", ".join(f"{d} (p99 half-width "
                                        f"{m.summary()['halfwidth_ns']['p99']:.0f} ns)"
                                        for d, m in sorted(tl.models.items())),
        "",
        "## Faults, every source that saw each, times on MONOTONIC",
        "",
        "| # | t (s from start) | ± | kind | what | seen by | recovery |",
        "|---|---|---|---|---|---|---|",
    ]
    for f in faults:
        if f.kind == "cuda_sticky_error":
            continue
        seen = ", ".join(sorted({s["source"] for s in f.sightings}))
        rec = us(f.recovery_ns) if f.recovery_ns is not None else "-"
        lines.append(f"| {f.id} | {(f.t_ns - t0) / 1e9:.6f} | {f.unc_ns} ns | {f.kind} | "
                     f"{f.name} | {seen} | {rec} |")
    sticky = [f for f in faults if f.kind == "cuda_sticky_error"]
    lines += ["", f"{len(sticky)} sticky errors (every later call returned the same code) are "
              "grouped under the first ILLEGAL_ADDRESS.", ""]
    lines += ["## Between the sources", ""]
    for f in faults:
        for d in f.delays:
            lines.append(f"- {f.name}: {d['to']} saw it {us(d['delay_ns'])} ± "
                         f"{us(d['unc_ns'])} after {d['from']} (NVML events carry no timestamp: "
                         "stamped on receipt, the wait's poll interval is the uncertainty).")
    xid = [f for f in faults if f.kind == "xid"]
    ill = [f for f in faults if f.kind == "cuda_error" and f.code == 700]
    if xid and ill:
        x, c = xid[0], ill[0]
        lines.append(f"- The Xid ({x.name}) fired {us(x.t_ns - c.t_ns)} after the failing "
                     f"{c.function} was entered; that call returned 700 after "
                     f"{us(c.dur_ns)}, i.e. {us(c.t_ns + c.dur_ns - x.t_ns)} after the Xid.")
    lines += ["", "## The workload's own marks (CLOCK_MONOTONIC, from faults-workload.json)", "",
              "| step | start (s) | end (s) | faults recorded inside |", "|---|---|---|---|"]
    for st in w.get("steps", []):
        a, b = st.get("t_start_ns"), st.get("t_end_ns")
        if a is None or b is None:
            continue
        inside = [f"#{f.id} {f.name}" for f in faults
                  if a <= f.t_ns <= b and f.kind != "cuda_sticky_error"]
        lines.append(f"| {st['step']} | {(a - t0) / 1e9:.6f} | {(b - t0) / 1e9:.6f} | "
                     f"{', '.join(inside) or '-'} |")
    lines += ["", "## NVML samples around each fault (±0.5 s)", ""]
    fields = ["sm_clock", "power", "gpu_util", "mem_used", "clock_event_reasons"]
    for f in faults:
        if f.kind not in ("cuda_error", "xid"):
            continue
        lines.append(f"### #{f.id} {f.name} at +{(f.t_ns - t0) / 1e9:.6f} s")
        lines += ["", "| counter | samples | min | max | last before | first after |",
                  "|---|---|---|---|---|---|"]
        for name, s in counters_near(tl, f.t_ns, fields):
            before = s[s["t_ns"] <= f.t_ns]
            after = s[s["t_ns"] > f.t_ns]
            lb = f"{before['value'][-1]:g} (±{us(int(before['unc_ns'][-1]))})" if len(before) else "-"
            fa = f"{after['value'][0]:g}" if len(after) else "-"
            lines.append(f"| {name} | {len(s)} | {s['value'].min():g} | {s['value'].max():g} "
                         f"| {lb} | {fa} |")
        lines.append("")
    lines += ["## Idle vs busy GPU (5 s idle; 6 s of bf16 8192³ matmuls)", "",
              "| counter | idle mean | busy mean | busy max |", "|---|---|---|---|"]
    idle = Timeline.open(os.path.join(data, "idle.ca"))
    busy = Timeline.open(os.path.join(data, "busy.ca"))
    for name in ["sm_clock", "mem_clock", "gpu_util", "mem_util", "power", "gpu_temp",
                 "mem_used", "pcie_tx", "pcie_rx"]:
        try:
            a = idle.counters(fields=[name])["value"]
            b = busy.counters(fields=[name])["value"]
        except Exception:
            continue
        if len(a) and len(b):
            lines.append(f"| {name} | {a.mean():,.1f} | {b.mean():,.1f} | {b.max():,.1f} |")
    with open(os.path.join(out, "faults-gpu.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=os.path.join(os.path.dirname(__file__), "..", "..", "tests",
                                                   "data", "gpu-h200"))
    ap.add_argument("--out", default="results")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    record_md(a.data, a.out)
    faults_md(a.data, a.out)
    print(f"wrote {a.out}/record-gpu.md and {a.out}/faults-gpu.md")


if __name__ == "__main__":
    main()
