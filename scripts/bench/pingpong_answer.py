#!/usr/bin/env python3
"""The GPU clock ping-pong's two answers side by side on one GPU (issue 14 item 5).

fenced:   the kernel stores %globaltimer, membar.sys, then the request number (ptx
          ca_pingpong); the fence waits for the first store to reach the host.
one word: one 8-byte store, %globaltimer with its low 5 bits replaced by the request's, no
          fence (ptx ca_pingpong_word); only where every timer value is a multiple of 32.

Two GpuClock objects on the same GPU take bursts in turn (word, fenced, word, ...), one every
--period / 2 seconds, for --seconds, optionally beside a bf16 matmul loop in another process
(--load).  Each answer's sandwiches are fitted like a recording's (align.fit_sandwiches), with
the same cross-validation (fit on even sandwiches, every odd one's [t0, t1] must hold its
mapped point within the uncertainty).

    sudo python3 scripts/bench/pingpong_answer.py --seconds 60 --load --out OUT.json
"""
import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time

import numpy as np

from clockalign.align import fit_sandwiches
from clockalign.align.stats import pct
from clockalign.capture.clocks import gpuclock
from clockalign.capture.clocks.gpuclock import METHOD_PINGPONG, GpuClock

LOAD = """
import torch, time
a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
print("load ready", flush=True)
while True:
    for _ in range(20):
        a @ a
    torch.cuda.synchronize()
"""


def open_clock(ordinal, fenced):
    """A GpuClock with clockalign's choice of answer, or (fenced) the fenced one whatever the
    timer's values: the benchmark's arm, made by standing in for the choice while it opens."""
    choose = gpuclock.word_protocol_note
    if fenced:
        gpuclock.word_protocol_note = lambda vals: "the benchmark asks for the fenced answer"
    try:
        return GpuClock(ordinal).open()
    finally:
        gpuclock.word_protocol_note = choose


def stats(v):
    v = np.asarray(v, dtype=np.int64)
    return {"n": int(len(v)), "min": int(v.min()), "p1": int(pct(v, 1)), "p50": int(pct(v, 50)),
            "p99": int(pct(v, 99)), "max": int(v.max())}


def analyse(t0, rem, t1, tick, window_ns):
    order = np.argsort(t0, kind="stable")
    t0, rem, t1 = t0[order], rem[order], t1[order]
    model = fit_sandwiches(t0, rem, t1, tick_ns=tick, window_ns=window_ns)
    host, unc = model.map(rem)
    even = np.arange(len(t0)) % 2 == 0
    m_even = fit_sandwiches(t0[even], rem[even], t1[even], tick_ns=tick, window_ns=window_ns)
    h_odd, u_odd = m_even.map(rem[~even])
    miss = np.abs(h_odd - np.clip(h_odd, t0[~even], t1[~even])) > u_odd
    return {"sandwiches": int(len(t0)), "rtt_ns": stats(t1 - t0),
            "band_halfwidth_ns": stats(unc - tick), "floor_ns": int((t1 - t0).min() // 2),
            "cross_validation": {"odd": int((~even).sum()), "misses": int(miss.sum())}}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--period", type=float, default=0.25, help="seconds between a pair of bursts")
    ap.add_argument("--pings", type=int, default=64)
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--window", type=float, default=5.0, help="fit window, seconds")
    ap.add_argument("--load", action="store_true", help="a bf16 matmul loop in another process")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    load = None
    if a.load:
        load = subprocess.Popen([sys.executable, "-c", LOAD], stdout=subprocess.PIPE, text=True)
        load.stdout.readline()
    clocks = {"one word": open_clock(a.gpu, False), "fenced": open_clock(a.gpu, True)}
    if clocks["one word"].info["pingpong_answer"] != "one word":
        print("the one-word answer is not used on this GPU:",
              clocks["one word"].info.get("pingpong_answer_note"), file=sys.stderr)
    got = {k: ([], [], []) for k in clocks}
    notes = []
    end = time.monotonic() + a.seconds
    try:
        while time.monotonic() < end:
            for name, c in clocks.items():
                _, t0, rem, t1 = c.burst(a.pings, METHOD_PINGPONG)
                if c.last_note:
                    notes.append(f"{name}: {c.last_note}")
                for lst, arr in zip(got[name], (t0, rem, t1)):
                    lst.append(arr)
                time.sleep(a.period / 2)
    finally:
        for c in clocks.values():
            c.close()
        if load:
            load.kill()
            load.wait()
    res = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "command": " ".join(["python3"] + sys.argv), "host": platform.node(),
           "kernel": platform.release(), "load": a.load, "seconds": a.seconds,
           "period_s": a.period, "pings": a.pings, "notes": notes[:20], "answers": {}}
    for name, c in clocks.items():
        t0, rem, t1 = (np.concatenate(x) if x else np.zeros(0, np.int64) for x in got[name])
        r = {"info": {k: v for k, v in c.info.items() if k.startswith(("pingpong", "host_loop",
                                                                        "tick", "device"))}}
        if len(t0) >= 2:
            r.update(analyse(t0, rem, t1, c.tick_ns or 0, int(a.window * 1e9)))
        res["answers"][name] = r
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    for name, r in res["answers"].items():
        if "rtt_ns" in r:
            print(f"{name:9s} rtt min/p50 {r['rtt_ns']['min']}/{r['rtt_ns']['p50']} ns, band "
                  f"half-width p50/p99 {r['band_halfwidth_ns']['p50']}/"
                  f"{r['band_halfwidth_ns']['p99']} ns, floor {r['floor_ns']} ns, "
                  f"cross-validation misses {r['cross_validation']['misses']} of "
                  f"{r['cross_validation']['odd']}  ({r['info']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
