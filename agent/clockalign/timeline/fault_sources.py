"""Faults that are not failing calls: exits and fatal signals, Xids (tracepoint and
NVML/DCGM sightings merged), GPU clock capping from the counters.

    death_faults, deaths = death_faults(tl, data["other"])
    xids = xid_faults(tl, data["other"]); link_xids(xids, cuda_roots, deaths)
"""
import re

import numpy as np

from ..store.counter_fields import CAPPING, FIELD_BY_NAME, clock_reason_changes
from ..store.schema import Kind
from .codes import FATAL_SIGNALS, signal_name, xid_name
from .events import decode_comm
from .fault import (KERNEL_SOURCES, SIGNAL_DELIVERED, XID_LINK_NS, XID_RECEIPT_TOLERANCE_NS,
                    Fault, entry)
from .stamps import probe_type

_PID_IN_XID = re.compile(r"pid=(\d+)")


def death_faults(tl, other) -> tuple:
    """Exit and signal faults, and {pid: death record} for closing chains."""
    faults, deaths = [], {}
    if other is None:
        return faults, deaths
    for pid in np.unique(other["pid"]):
        ev = other[other["pid"] == pid]
        pid = int(pid)
        exits = ev[ev["kind"] == Kind.PROC_EXIT]
        groupdead = ev[(ev["kind"] == Kind.THREAD_EXIT) & (ev["code"] == 1)]
        sigs = ev[(ev["kind"] == Kind.SIGNAL)
                  & np.isin(ev["ret"], np.asarray(sorted(FATAL_SIGNALS), dtype=np.int32))
                  & np.isin(ev["code"], np.asarray(SIGNAL_DELIVERED, dtype=np.uint16))]
        death_t = int(groupdead["t_ns"][0]) if len(groupdead) else None
        exit_fault = None
        rec = None
        if len(exits):
            x = exits[0]
            status = int(x["ret"]) & 0xFF
            if status:
                exit_fault = Fault(0, int(x["t_ns"]), int(x["unc_ns"]), "exit", status,
                                   f"exit status {status}", f"exit_group({int(x['ret'])})",
                                   pid=pid, tid=int(x["tid"]))
                exit_fault.sightings.append(_sighting(x))
                faults.append(exit_fault)
            rec = {"t_ns": int(x["t_ns"]), "unc_ns": int(x["unc_ns"]), "code": status,
                   "name": f"exit status {status}", "fault": exit_fault, "tid": int(x["tid"])}
        # killed: a fatal signal, then the group died without calling exit_group (a
        # handled signal followed by exit() is the exit's story, not a kill)
        cand = sigs if death_t is None else sigs[sigs["t_ns"] <= death_t]
        if len(cand) and not len(exits) and (death_t is not None or int(cand[-1]["ret"]) == 9):
            s = cand[-1]
            sig, sender = int(s["ret"]), int(s["a0"])
            who = ("raised by the process itself" if sender == pid
                   else f"sent by pid {sender} ({decode_comm(s['data'])})")
            msg = f"killed by {signal_name(sig)}, {who}"
            if death_t is None:
                msg += "; its exit was not recorded"
            sf = Fault(0, int(s["t_ns"]), int(s["unc_ns"]), "signal", sig, signal_name(sig), msg,
                       pid=pid, tid=int(s["tid"]))
            sf.sightings.append(_sighting(s))
            if death_t is not None:
                sf.chain.append(entry(sf, death_t, 0, "exit", name="process ended"))
            faults.append(sf)
            rec = {"t_ns": death_t if death_t is not None else sf.t_ns, "unc_ns": 0,
                   "code": None, "name": f"killed by {signal_name(sig)}", "fault": sf,
                   "tid": None}
        if rec is None and death_t is not None:
            rec = {"t_ns": death_t, "unc_ns": 0, "code": None, "name": "process ended",
                   "fault": None, "tid": None}
        if rec is not None:
            deaths[pid] = rec
    return faults, deaths


def _sighting(ev) -> dict:
    return {"source": probe_type(ev["kind"]), "t_ns": int(ev["t_ns"]),
            "unc_ns": int(ev["unc_ns"]), "domain": "MONOTONIC"}


def xid_sightings(tl, other) -> list:
    out = []
    if other is not None:
        for ev in other[other["kind"] == Kind.XID]:
            dev, msg, _ = tl.xid_text(ev)
            m = _PID_IN_XID.search(msg)
            out.append({"source": "tracepoint", "t_ns": int(ev["t_ns"]),
                        "unc_ns": int(ev["unc_ns"]), "domain": "MONOTONIC",
                        "code": int(ev["ret"]), "gpu": tl.gpu_of_pci(dev), "dev": dev,
                        "msg": msg, "pid": int(m.group(1)) if m else None})
    for row in tl.gpu_events():
        if str(row.get("type", "")).lower() != "xid":
            continue
        msg = str(row.get("message") or row.get("msg") or "")
        m = _PID_IN_XID.search(msg)
        gpu = row.get("gpu")
        out.append({"source": str(row.get("source") or "nvml"), "t_ns": int(row["t_ns"]),
                    "unc_ns": int(row["unc_ns"]), "domain": row["domain"],
                    "code": int(row["code"]), "gpu": None if gpu is None else int(gpu),
                    "dev": None, "msg": msg, "pid": int(m.group(1)) if m else None})
    out.sort(key=lambda s: (s["t_ns"], s["source"] not in KERNEL_SOURCES))
    return out


def _xid_match(a: dict, b: dict) -> bool:
    """Could sightings a and b be the same Xid?"""
    if a["code"] != b["code"] or a["source"] == b["source"]:
        return False
    if a["gpu"] is not None and b["gpu"] is not None and a["gpu"] != b["gpu"]:
        return False
    u = a["unc_ns"] + b["unc_ns"]
    ak, bk = a["source"] in KERNEL_SOURCES, b["source"] in KERNEL_SOURCES
    if ak != bk:
        k, r = (a, b) if ak else (b, a)
        return -u <= r["t_ns"] - k["t_ns"] <= u + XID_RECEIPT_TOLERANCE_NS
    return abs(a["t_ns"] - b["t_ns"]) <= u + XID_RECEIPT_TOLERANCE_NS


def xid_faults(tl, other) -> list:
    groups = []
    for s in xid_sightings(tl, other):
        for g in groups:
            if all(x["source"] != s["source"] for x in g) and _xid_match(g[0], s):
                g.append(s)
                break
        else:
            groups.append([s])
    faults = []
    for g in groups:
        best = min(g, key=lambda s: (s["unc_ns"], s["source"] not in KERNEL_SOURCES, s["t_ns"]))
        code = best["code"]
        gpu = next((s["gpu"] for s in g if s["gpu"] is not None), None)
        pid = next((s["pid"] for s in g if s["pid"] is not None), None)
        msg = next((s["msg"] for s in g if s["msg"]), "")
        dev = next((s["dev"] for s in g if s["dev"]), None)
        text = (f"PCI {dev}: " if dev else "") + msg
        f = Fault(0, best["t_ns"], best["unc_ns"], "xid", code, xid_name(code), text,
                  pid=pid, gpu=gpu)
        f.sightings = [{k: s[k] for k in ("source", "t_ns", "unc_ns", "domain")}
                       for s in sorted(g, key=lambda s: s["t_ns"])]
        f.delays = [{"from": best["source"], "to": s["source"],
                     "delay_ns": s["t_ns"] - best["t_ns"],
                     "unc_ns": s["unc_ns"] + best["unc_ns"]} for s in g if s is not best]
        faults.append(f)
    return faults


def link_xids(xids, cuda_roots, deaths):
    """Chain an Xid to the first CUDA error of its process that returned after it."""
    for x in xids:
        if x.pid is None:
            continue
        cands = [r for r in cuda_roots if r.pid == x.pid
                 and r.t_ns + r.dur_ns >= x.t_ns - x.unc_ns
                 and r.t_ns <= x.t_ns + XID_LINK_NS]
        if cands:
            r = min(cands, key=lambda r: r.t_ns)
            x.chain.append(entry(x, r.t_ns, r.unc_ns, "error", function=r.function,
                                  code=r.code, name=r.name, tid=r.tid, dur_ns=r.dur_ns,
                                  fault=r))
            x.related.append(r)
            r.related.append(x)
            if r.healthy_ns is not None:
                x.healthy_ns = r.t_ns + r.healthy_ns - x.t_ns
        death = deaths.get(x.pid)
        if death is not None and death["t_ns"] >= x.t_ns:
            x.chain.append(entry(x, death["t_ns"], death["unc_ns"], "exit", code=death["code"],
                                  name=death["name"], fault=death["fault"]))


def throttle_faults(tl) -> list:
    """One fault per power/thermal capping reason switching on (counter_fields.CAPPING), its
    chain the sample where it cleared."""
    fid = FIELD_BY_NAME.get("clock_event_reasons")
    if fid is None:
        return []
    c = tl.counters(fields=[fid])
    faults = []
    for gpu in np.unique(c["gpu"]):
        g = c[(c["gpu"] == gpu) & np.isfinite(c["value"])]
        changes = clock_reason_changes(g["value"].astype(np.int64), CAPPING)
        for n, (i, bit, name, on) in enumerate(changes):
            if not on:
                continue
            t, u = _between(g, i)
            f = Fault(0, t, u, "throttle", bit, name,
                      f"GPU{int(gpu)} clocks held down: {name} "
                      + ("set in the first sample (it may have been on before)" if i == 0
                         else "switched on between two samples"), gpu=int(gpu))
            f.sightings.append({"source": "counters", "t_ns": int(g["t_ns"][i]),
                                "unc_ns": int(g["unc_ns"][i]),
                                "domain": "REALTIME" if "REALTIME" in tl.models
                                else "receipt"})
            off = next((j for j, b2, _, o in changes[n + 1:] if b2 == bit and not o), None)
            if off is not None:
                tc, uc = _between(g, off)
                f.chain.append(entry(f, tc, uc, "cleared", name=name))
                f.recovery_ns = tc - t
                f.recovery_unc_ns = uc + u
            faults.append(f)
    return faults


def _between(g, i):
    """A reason bit changed between sample i-1 and sample i: the midpoint, ± half the gap
    plus the samples' own uncertainty."""
    t, u = int(g["t_ns"][i]), int(g["unc_ns"][i])
    if i == 0:
        return t, u
    tp, up = int(g["t_ns"][i - 1]), int(g["unc_ns"][i - 1])
    half = (t - tp) // 2
    return tp + half, (t - tp - half) + max(u, up)
