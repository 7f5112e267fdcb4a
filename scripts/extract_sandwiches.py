#!/usr/bin/env python3
"""Write a run file's raw clock sandwiches as CSV (the input of `clockalign align --pairs`).

    python3 scripts/extract_sandwiches.py run.ca OUTDIR
    -> OUTDIR/gpu<N>_sandwiches.csv (t0_ns,remote_ns,t1_ns,method),
       OUTDIR/cpu_<DOMAIN>_sandwiches.csv (t0_ns,remote_ns,t1_ns)
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "agent"))
from clockalign.align.sandwiches import run_sandwiches, write_csv  # noqa: E402
from clockalign.store.reader import RunReader  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", help="run file (.ca)")
    ap.add_argument("out", help="directory for the CSV files")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    found = run_sandwiches(RunReader(a.run))
    for name, s in sorted(found.items(), key=lambda kv: not kv[0].startswith("GPU")):  # GPUs first
        file = (name.lower() if name.startswith("GPU") else f"cpu_{name}") + "_sandwiches.csv"
        path = os.path.join(a.out, file)
        write_csv(path, s)
        print(f"{path}: {len(s)} sandwiches")


if __name__ == "__main__":
    main()
