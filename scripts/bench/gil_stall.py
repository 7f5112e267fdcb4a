#!/usr/bin/env python3
"""Does a recording survive the GIL being held?  The buffer reader as a Python thread
(scripts/bench/python_reader.py, the benchmark's arm) against clockalign's C thread
(native/reader.c, capture/transport/drain.py), interleaved.

One storm thread calls the stand-in cuLaunchKernel flat out for --seconds under an
in-process Recorder (--pid, everything on but counters and GPU clock), whose extra sink holds
the GIL for --stall-ms at the first event batch and every --every s after (a ctypes.PyDLL
usleep: what an import, a long numpy step or a garbage collection does to the recorder's
other threads).  Per run: the storm's own call count, the events recorded, the drops the
probes counted, the fullest buffer.  Needs root (BPF).

    sudo .venv/bin/python scripts/bench/gil_stall.py --seconds 3 --stall-ms 300 --rounds 3 --out DIR

Writes DIR/gil_stall.json and DIR/gil_stall.md.
"""
import argparse
import ctypes
import datetime
import json
import os
import platform
import sys
import tempfile
import threading
import time
from pathlib import Path

import probe_cost as bpc   # scripts/bench/
import python_reader   # scripts/bench/
from clockalign.capture import recorder
from clockalign.capture.recorder import Recorder, RecordOptions
from clockalign.store.schema import Chunk

C_READER = recorder.start_drain


class StallSink:
    """A sink that holds the GIL for stall_ms at the first event batch and every every_s."""

    def __init__(self, stall_ms, every_s):
        self.usleep = ctypes.PyDLL(None).usleep        # PyDLL: the GIL stays held
        self.usleep.argtypes = [ctypes.c_uint]
        self.stall_us, self.every_s, self.next, self.stalls = int(stall_ms * 1000), every_s, 0, 0

    def open(self, meta):
        pass

    def write_columns(self, ctype, cols):
        if ctype == Chunk.EVENTS and time.monotonic() >= self.next:
            self.usleep(self.stall_us)
            self.stalls += 1
            self.next = time.monotonic() + self.every_s

    def write_rows(self, ctype, rows):
        pass

    def close(self, trailer=None):
        pass


def one(storm, lib, reader, seconds, stall_ms, every_s, tmp):
    recorder.start_drain = python_reader.start_drain if reader == "python" else C_READER
    st = bpc.Storm(storm, lib, threads=1, seconds=seconds)
    sink = StallSink(stall_ms, every_s)
    out = tmp / f"{reader}.ca"
    if out.exists():
        out.unlink()                # its appearance says the probes are armed
    rec = Recorder(RecordOptions(output=str(out), pids=[st.pid], sinks=[sink], counters="none",
                                 gpu_clock=False, libcuda=lib, status=False, force=True))
    box = {}

    def go():                       # the storm starts once the recording has armed
        while not out.exists():
            time.sleep(0.02)
        time.sleep(0.5)
        box["storm"] = st.go()
    t = threading.Thread(target=go, daemon=True)
    t.start()
    s = rec.run() or {}             # the main thread (it installs signal handlers); ends
    t.join(timeout=60)              # when the storm's process exits
    res = box["storm"]
    drops = s.get("drops") or {}
    recorded = (s.get("counts") or {}).get("cuda", 0)
    return {"reader": s.get("buffer_reader"), "calls": res["total"],
            "rate_per_s": res["total"] / res["wall_s"], "recorded": recorded,
            "dropped": sum(drops.values()), "drops": drops,
            "unaccounted": res["total"] - recorded - drops.get("cuda", 0),
            "ring_peak_fill": s.get("ring_peak_fill"), "stalls": sink.stalls}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=3)
    ap.add_argument("--stall-ms", type=float, default=300)
    ap.add_argument("--every", type=float, default=1.0, help="seconds between stalls")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("gil_stall: needs root (BPF)")
    tmp = Path(tempfile.mkdtemp(prefix="gil-stall-"))
    _, lib, storm = bpc.build_tools(tmp)
    runs = []
    for rnd in range(a.rounds):
        for reader in (("python", "native") if rnd % 2 == 0 else ("native", "python")):
            r = one(storm, lib, reader, a.seconds, a.stall_ms, a.every, tmp)
            r["round"] = rnd
            runs.append(r)
            print(json.dumps(r), flush=True)
    res = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "command": "python3 " + " ".join(sys.argv), "machine": platform.node(),
           "cpus": os.cpu_count(), "kernel": platform.release(), "seconds": a.seconds,
           "stall_ms": a.stall_ms, "every_s": a.every, "runs": runs}
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "gil_stall.json"), "w") as f:
        json.dump(res, f, indent=1)
    md = ["# The buffer reader while the GIL is held", "", f"- date: {res['date']}",
          f"- command: `{res['command']}`",
          f"- machine: {res['machine']}, {res['cpus']} CPUs, kernel {res['kernel']}",
          f"- one storm thread flat out for {a.seconds} s; the GIL held {a.stall_ms:g} ms at "
          f"the first event batch and every {a.every:g} s after", "",
          "| round | reader | M calls/s | storm's calls | recorded | dropped (counted) | "
          "unaccounted | fullest buffer | stalls |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in runs:
        md.append(f"| {r['round']} | {r['reader']} | {r['rate_per_s'] / 1e6:.3f} | {r['calls']} | "
                  f"{r['recorded']} | {r['dropped']} | {r['unaccounted']} | "
                  f"{r['ring_peak_fill']} | {r['stalls']} |")
    with open(os.path.join(a.out, "gil_stall.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
