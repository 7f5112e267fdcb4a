#!/usr/bin/env python3
"""Run-file size and speed, format 1 against format 2, on one core.

A synthetic launch storm (cuLaunchKernel from a few threads, a few functions, grids,
blocks and streams, ts rising with jitter, a few-µs durations with noise, some sched and
connect events, batches the size the recorder writes), then the real recordings under
tests/data: bytes per event, encode and decode events/s (single thread), and the time of
``clockalign dump`` to /dev/null, for both formats.

    .venv/bin/python scripts/bench/runfile.py --events 2000000 --out results/runfile
"""
import argparse
import datetime
import glob
import io
import json
import os
import platform
import subprocess
import sys
import time

import numpy as np

from clockalign.store import writer as W
from clockalign.store.reader import RunReader
from clockalign.store.schema import EVENT_DTYPE, Chunk, Kind
from export import cpu_model   # scripts/bench/

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def pack_dims(x, y, z):
    return np.uint64(x) | np.uint64(y) << np.uint64(32) | np.uint64(z) << np.uint64(48)


def launch_storm(n: int, seed: int = 1, threads: int = 4) -> np.ndarray:
    """n events: ~96 % cuLaunchKernel from `threads` threads, the rest sched/sync/connect."""
    rng = np.random.default_rng(seed)
    ev = np.zeros(n, dtype=EVENT_DTYPE)
    pid = 31337
    tids = pid + np.array([0, 17, 18, 23, 40, 41][:threads], dtype=np.uint32)
    ev["pid"] = pid
    ev["tid"] = tids[rng.integers(0, threads, n)]
    gap = rng.gamma(2.0, 250.0, n).astype(np.uint64) + 80        # ~580 ns apart, jittered
    ts = np.uint64(3_215_000_000_000) + np.cumsum(gap, dtype=np.uint64)
    dur = (rng.gamma(4.0, 900.0, n) + 1500).astype(np.uint64)    # a few µs, noisy
    # a CUDA event is stamped at entry but emitted at return: neighbours may swap
    swap = np.flatnonzero(rng.random(n - 1) < 0.05)
    ts[swap], ts[swap + 1] = ts[swap + 1].copy(), ts[swap].copy()
    ev["ts"], ev["dur"] = ts, dur
    ev["kind"] = Kind.CUDA
    ev["code"] = 1                                                # cuLaunchKernel
    funcs = np.uint64(0x7F3A_1C00_0000) + np.arange(24, dtype=np.uint64) * np.uint64(0x1A40)
    fsel = np.minimum(rng.zipf(1.6, n) - 1, len(funcs) - 1)
    ev["a0"] = funcs[fsel]
    grids = np.array([pack_dims(x, y, 1) for x, y in
                      [(1, 1), (32, 1), (108, 1), (132, 1), (264, 1), (512, 1), (16, 16),
                       (1024, 1)]], dtype=np.uint64)
    blocks = np.array([pack_dims(x, 1, 1) for x in (32, 64, 128, 256, 512, 1024)],
                      dtype=np.uint64)
    ev["a1"] = grids[(fsel * 3) % len(grids)]
    ev["a2"] = blocks[(fsel * 5) % len(blocks)]
    ev["a3"] = np.where(fsel % 4 == 0, 49152, 0).astype(np.uint64)
    streams = np.uint64(0x55D0_4E20_0000) + np.arange(4, dtype=np.uint64) * np.uint64(0x2F0)
    ev["a4"] = streams[np.searchsorted(tids, ev["tid"]) % len(streams)]
    other = rng.random(n)
    sched = other < 0.03
    ev["kind"][sched] = Kind.SCHED
    ev["code"][sched] = (rng.random(sched.sum()) < 0.3).astype(np.uint16)
    ev["ret"][sched] = np.where(ev["code"][sched] == 1, 0x100, 1)
    ev["dur"][sched] = rng.gamma(1.5, 20_000, sched.sum()).astype(np.uint64)
    ev["a0"][sched] = rng.integers(500, 30_000, sched.sum())
    ev["a1"][sched] = rng.integers(0, 16, sched.sum())
    ev["a2"][sched] = rng.integers(0, 16, sched.sum())
    ev["a3"][sched] = 0
    ev["a4"][sched] = 0
    sync = (other >= 0.03) & (other < 0.04)
    ev["code"][sync] = 9                                          # cuStreamSynchronize
    ev["a0"][sync] = ev["a4"][sync]
    ev["a1"][sync] = ev["a2"][sync] = ev["a3"][sync] = ev["a4"][sync] = 0
    ev["dur"][sync] = rng.gamma(2.0, 40_000, sync.sum()).astype(np.uint64)
    conn = other >= 0.9995
    ev["kind"][conn] = Kind.CONNECT
    ev["code"][conn] = 0
    ev["a0"][conn] = 7
    ev["a1"][conn] = 16
    ev["a2"][conn] = ev["a3"][conn] = ev["a4"][conn] = 0
    sa = np.zeros((conn.sum(), 56), np.uint8)
    sa[:, 0], sa[:, 2], sa[:, 3] = 2, 0x1F, 0x90
    sa[:, 4:8] = [10, 0, 0, 7]
    ev["data"][conn] = sa.view("V56").reshape(-1)
    return ev


def batches(ev: np.ndarray, size: int):
    for i in range(0, len(ev), size):
        yield ev[i:i + size]


def write_file(path, ev_batches, version, meta=None, extra=None):
    """Write a run in one format; returns (seconds spent in write_columns, events)."""
    w = W.RunWriter(path, meta or {"host": "bench", "clocks": {"MONOTONIC": 0}},
                    format_version=version)
    spent, n = 0.0, 0
    for b in ev_batches:
        cols = {name: b[name] for name in EVENT_DTYPE.names}
        t = time.perf_counter()
        w.write_columns(Chunk.EVENTS, cols)
        spent += time.perf_counter() - t
        n += len(b)
    for ctype, kind, payload in extra or []:
        (w.write_columns if kind == "cols" else w.write_rows)(ctype, payload)
    w.close({"reason": "bench"})
    return spent, n


def read_time(path, repeat=1):
    """Best of `repeat` passes of RunReader(path).iter_events(), open included."""
    best = None
    for _ in range(repeat):
        t = time.perf_counter()
        n = sum(len(b) for b in RunReader(path).iter_events())
        dt = time.perf_counter() - t
        best = dt if best is None else min(best, dt)
    return best, n


def dump_time(path, repeat=1):
    best = None
    for _ in range(repeat):
        t = time.perf_counter()
        p = subprocess.run([sys.executable, "-m", "clockalign.cli.main", "dump", path],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        dt = time.perf_counter() - t
        if p.returncode not in (0, 3):
            raise SystemExit(f"dump {path} failed: {p.stderr.decode()[-300:]}")
        best = dt if best is None else min(best, dt)
    return best, p.stdout


def copy_run(src, dst, version):
    """Rewrite a recorded run in `version`, chunk by chunk, in file order."""
    r = RunReader(src)
    w = W.RunWriter(dst, r.meta, format_version=version)
    spent, n = 0.0, 0
    for ctype, payload in r.iter_chunks():
        if "rows" in payload:
            w.write_rows(ctype, payload["rows"])
        else:
            cols = r.decode_payload(payload)
            t = time.perf_counter()
            w.write_columns(ctype, cols)
            if ctype == Chunk.EVENTS:
                spent += time.perf_counter() - t
                n += len(next(iter(cols.values())))
    tr = dict(r.trailer or {"reason": "copied"})
    tr.pop("chunks", None)
    w.close(tr)
    return spent, n


def measure(label, make, tmp, dump_repeat, decode_repeat=1):
    row = {"input": label}
    outs = {}
    for v in (1, 2):
        path = os.path.join(tmp, f"bench-v{v}.ca")
        enc_s, n = make(path, v)
        dec_s, n2 = read_time(path, decode_repeat)
        assert n2 == n, (n, n2)
        size = sum(ln for _, ln in RunReader(path).chunk_sizes(Chunk.EVENTS))
        d_s, out = dump_time(path, dump_repeat)
        outs[v] = out
        row[f"v{v}"] = {"events": n, "file_bytes": os.path.getsize(path),
                        "events_chunk_bytes": size, "bytes_per_event": round(size / n, 2),
                        "encode_s": round(enc_s, 4), "encode_events_per_s": round(n / enc_s),
                        "decode_s": round(dec_s, 4), "decode_events_per_s": round(n / dec_s),
                        "dump_s": round(d_s, 3)}
        os.unlink(path)
    row["dump_identical"] = outs[1] == outs[2]
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000, help="synthetic storm size")
    ap.add_argument("--batch", type=int, default=50_000,
                    help="events per chunk (the recorder writes one chunk per ring read)")
    ap.add_argument("--dump-repeat", type=int, default=1)
    ap.add_argument("--decode-repeat", type=int, default=5,
                    help="decode passes per file; the best is reported (a loaded VM is noisy)")
    ap.add_argument("--tmp", default="/tmp")
    ap.add_argument("--out", help="directory for runfile.json and runfile.md")
    ap.add_argument("--note", help="a paragraph written into runfile.md under the command")
    a = ap.parse_args()
    load_before = os.getloadavg()
    ev = launch_storm(a.events)
    rows = [measure(f"synthetic launch storm, {a.events:,} events, {a.batch:,} per chunk",
                    lambda p, v: write_file(p, batches(ev, a.batch), v), a.tmp, a.dump_repeat,
                    a.decode_repeat)]
    for src in sorted(glob.glob(os.path.join(ROOT, "tests", "data", "**", "*.ca"),
                            recursive=True)):
        r = RunReader(src)
        if not r.clean or not sum(1 for _ in r.chunk_sizes(Chunk.EVENTS)):
            continue
        rows.append(measure(os.path.relpath(src, ROOT),
                            lambda p, v, s=src: copy_run(s, p, v), a.tmp, a.dump_repeat,
                            a.decode_repeat))
    for row in rows:
        print(json.dumps(row))
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        doc = {"machine": {"host": platform.node(), "cpus": os.cpu_count(),
                           "cpu": cpu_model(), "python": platform.python_version(),
                           "numpy": np.__version__, "zstandard": _zstd_version(),
                           "load_avg_before": [round(x, 2) for x in load_before],
                           "load_avg_after": [round(x, 2) for x in os.getloadavg()]},
               "command": " ".join([os.path.relpath(sys.argv[0], ROOT)] + _without_note(
                   sys.argv[1:])),
               "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "note": a.note, "results": rows}
        with open(os.path.join(a.out, "runfile.json"), "w") as f:
            json.dump(doc, f, indent=1)
        with open(os.path.join(a.out, "runfile.md"), "w") as f:
            f.write(markdown(doc))


def _without_note(argv):
    """The command line less --note's text (written into the md on its own)."""
    out, skip = [], False
    for x in argv:
        if skip:
            skip = False
        elif x == "--note":
            skip = True
        elif not x.startswith("--note="):
            out.append(x)
    return out


def _zstd_version():
    import zstandard
    return zstandard.__version__


def markdown(doc):
    m = doc["machine"]
    s = io.StringIO()
    s.write("# Run-file size and speed: format 1 against format 2\n\n")
    s.write(f"Machine: {m['host']}, {m['cpus']} CPUs ({m['cpu']}), Python {m['python']}, "
            f"numpy {m['numpy']}, zstandard {m['zstandard']}. Date: {doc['date']}.\n\n")
    s.write(f"Command: `.venv/bin/python {doc['command']}`\n\n")
    if "load_avg_before" in m:
        busy = max(m["load_avg_before"][0], m["load_avg_after"][0]) > 0.5 * m["cpus"]
        s.write(f"Load average (1, 5, 15 min) before the run {m['load_avg_before']}, after "
                f"{m['load_avg_after']}" + (
                    ": other work was running on the machine, so absolute rates are low and "
                    "noisy; v1 and v2 of each input ran back to back under the same load"
                    if busy else "") + ".\n\n")
    if doc.get("note"):
        s.write(doc["note"].strip() + " (given with --note)\n\n")
    s.write("Bytes per event count the EVENTS chunks (headers included); encode is the time "
            "inside `RunWriter.write_columns` and decode the time of `RunReader.iter_events` "
            "over the file (open included, best of --decode-repeat passes), both on one "
            "thread; dump is the wall time of `clockalign dump FILE > /dev/null` (whole "
            "process).\n\n")
    s.write("| input | events | v1 B/event | v2 B/event | v1 encode ev/s | v2 encode ev/s | "
            "v1 decode ev/s | v2 decode ev/s | v1 dump s | v2 dump s | dump identical |\n")
    s.write("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
    for r in doc["results"]:
        a, b = r["v1"], r["v2"]
        s.write(f"| {r['input']} | {a['events']:,} | {a['bytes_per_event']} | "
                f"{b['bytes_per_event']} | {a['encode_events_per_s']:,} | "
                f"{b['encode_events_per_s']:,} | {a['decode_events_per_s']:,} | "
                f"{b['decode_events_per_s']:,} | {a['dump_s']} | {b['dump_s']} | "
                f"{'yes' if r['dump_identical'] else 'NO'} |\n")
    return s.getvalue()


if __name__ == "__main__":
    main()
