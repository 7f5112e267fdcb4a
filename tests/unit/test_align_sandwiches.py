"""align/sandwiches: a run file's sandwiches per domain, and their CSV read back by --pairs."""
import os

import numpy as np

from clockalign.align.pairs import read_pairs
from clockalign.align.sandwiches import recorded_ticks, run_sandwiches, write_csv
from clockalign.store.reader import RunReader
from clockalign.store.schema import Chunk

DATA = os.path.join(os.path.dirname(__file__), "..", "data")


def test_gpu_run_sandwiches_match_the_chunks(tmp_path):
    r = RunReader(os.path.join(DATA, "gpu-h200", "reference.ca"))
    s = run_sandwiches(r)
    assert list(s) == ["REALTIME", "BOOTTIME", "MONOTONIC_RAW", "GPU0"]
    g = r.columns(Chunk.GPU_CLOCK)
    assert np.array_equal(s["GPU0"].remote, g["remote"].astype(np.int64))
    assert np.array_equal(s["GPU0"].method, g["method"].astype(np.int64))
    assert s["REALTIME"].method is None and (s["REALTIME"].t1 >= s["REALTIME"].t0).all()
    assert recorded_ticks(r)["GPU0"] > 0
    path = tmp_path / "gpu0.csv"
    write_csv(path, s["GPU0"])
    assert path.read_text().splitlines()[0] == "t0_ns,remote_ns,t1_ns,method"
    t0, remote, t1 = read_pairs(str(path))
    assert np.array_equal(t0, s["GPU0"].t0) and np.array_equal(remote, s["GPU0"].remote) \
        and np.array_equal(t1, s["GPU0"].t1)


def test_cpu_only_run(tmp_path):
    s = run_sandwiches(RunReader(os.path.join(DATA, "synthetic", "aligned.ca")))
    assert list(s) == ["REALTIME"] and len(s["REALTIME"]) == 1500
    write_csv(tmp_path / "rt.csv", s["REALTIME"])
    assert (tmp_path / "rt.csv").read_text().startswith("t0_ns,remote_ns,t1_ns\n")
