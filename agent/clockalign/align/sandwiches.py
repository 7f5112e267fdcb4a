"""A run file's clock sandwiches per domain, and the CSV they are written out as (the input of
``clockalign align --pairs``).

    s = run_sandwiches(RunReader("run.ca"))     # {"REALTIME": Sandwiches, "GPU0": ..., ...}
    s["GPU0"].t0, s["GPU0"].remote, s["GPU0"].t1, s["GPU0"].method   # int64 ns; method: GPUs
    recorded_ticks(reader)                      # {"GPU0": 32, ...} from CLOCK_INFO
    write_csv("gpu0_sandwiches.csv", s["GPU0"])  # t0_ns,remote_ns,t1_ns[,method]
    write_pairs(s, "pairs/")                    # every domain: [(path, n)], GPUs first
"""
import dataclasses
import os

import numpy as np

from ..store.schema import Chunk, ClockDomain


@dataclasses.dataclass
class Sandwiches:
    """One domain's sandwiches in file order: host t0 <= remote reading <= host t1."""
    t0: np.ndarray
    remote: np.ndarray
    t1: np.ndarray
    method: np.ndarray = None      # GPU domains: the probe method of each (ping-pong, launch+sync)

    def __len__(self):
        return len(self.t0)


def cpu_domain_name(d) -> str:
    return ClockDomain(d).name if d in ClockDomain._value2member_map_ else f"CPU{d}"


def _take(cols, sel, method=False) -> Sandwiches:
    arrays = [np.asarray(cols[k][sel]).astype(np.int64) for k in ("t0", "remote", "t1")]
    return Sandwiches(*arrays, method=np.asarray(cols["method"][sel]).astype(np.int64)
                      if method else None)


def run_sandwiches(reader) -> dict:
    """{domain name: Sandwiches}: the CPU clock domains, then each GPU, in ascending order."""
    out = {}
    cpu = reader.columns(Chunk.CPU_CLOCK)
    if cpu:
        for d in np.unique(cpu["domain"]):
            out[cpu_domain_name(d)] = _take(cpu, cpu["domain"] == d)
    gpu = reader.columns(Chunk.GPU_CLOCK)
    if gpu:
        for g in np.unique(gpu["gpu"]):
            out[f"GPU{g}"] = _take(gpu, gpu["gpu"] == g, method="method" in gpu)
    return out


def recorded_ticks(reader) -> dict:
    """{domain name: tick ns} as CLOCK_INFO recorded them (0 where none was)."""
    return {row["domain"]: int(row.get("tick_ns") or 0)
            for row in reader.rows(Chunk.CLOCK_INFO) if isinstance(row, dict) and "domain" in row}


def pairs_name(domain: str) -> str:
    """gpu<N>_sandwiches.csv for GPU<N>, cpu_<DOMAIN>_sandwiches.csv for a CPU clock domain."""
    return (domain.lower() if domain.startswith("GPU") else f"cpu_{domain}") + "_sandwiches.csv"


def write_pairs(found: dict, outdir) -> list:
    """Each domain of run_sandwiches' answer as outdir/pairs_name(domain), GPUs first:
    [(path, sandwiches written)]."""
    os.makedirs(outdir, exist_ok=True)
    out = []
    for name, s in sorted(found.items(), key=lambda kv: not kv[0].startswith("GPU")):
        path = os.path.join(outdir, pairs_name(name))
        write_csv(path, s)
        out.append((path, len(s)))
    return out


def write_csv(path, s: Sandwiches):
    """t0_ns,remote_ns,t1_ns (and method where the sandwiches have one), one row each."""
    cols = [s.t0, s.remote, s.t1] + ([s.method] if s.method is not None else [])
    with open(path, "w") as f:
        f.write("t0_ns,remote_ns,t1_ns" + (",method" if s.method is not None else "") + "\n")
        for row in zip(*(c.tolist() for c in cols)):
            f.write(",".join(str(v) for v in row) + "\n")
