#!/usr/bin/env python3
"""Write a run file's raw clock sandwiches as CSV (the input of `clockalign align --pairs`).

    python3 scripts/extract_sandwiches.py run.ca OUTDIR
    -> OUTDIR/gpu<N>_sandwiches.csv, OUTDIR/cpu_<DOMAIN>_sandwiches.csv (t0_ns,remote_ns,t1_ns[,method])
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "agent"))
from clockalign.store.reader import RunReader  # noqa: E402
from clockalign.store.schema import Chunk, ClockDomain  # noqa: E402


def main():
    run, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    r = RunReader(run)
    g = r.columns(Chunk.GPU_CLOCK)
    for gpu in sorted(set(g.get("gpu", []).tolist())):
        m = g["gpu"] == gpu
        path = os.path.join(out, f"gpu{gpu}_sandwiches.csv")
        with open(path, "w") as f:
            f.write("t0_ns,remote_ns,t1_ns,method\n")
            for row in zip(g["t0"][m], g["remote"][m], g["t1"][m], g["method"][m]):
                f.write(",".join(str(int(v)) for v in row) + "\n")
        print(f"{path}: {int(m.sum())} sandwiches")
    c = r.columns(Chunk.CPU_CLOCK)
    for dom in sorted(set(c.get("domain", []).tolist())):
        m = c["domain"] == dom
        path = os.path.join(out, f"cpu_{ClockDomain(dom).name}_sandwiches.csv")
        with open(path, "w") as f:
            f.write("t0_ns,remote_ns,t1_ns\n")
            for row in zip(c["t0"][m], c["remote"][m], c["t1"][m]):
                f.write(",".join(str(int(v)) for v in row) + "\n")
        print(f"{path}: {int(m.sum())} sandwiches")


if __name__ == "__main__":
    main()
