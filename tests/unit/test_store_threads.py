"""Several recorder threads writing chunks into one run file at once (the event loop, the
clock probe, the counter sampler and the GPU activity reader do): every chunk decodes to
exactly what was written.  A zstd compressor shared between threads corrupted chunks."""
import threading

import numpy as np

from clockalign.store.reader import RunReader
from clockalign.store.schema import GPU_REC_DTYPE, Chunk
from clockalign.store.writer import RunWriter


def test_concurrent_column_writers_give_intact_chunks(tmp_path):
    path = tmp_path / "t.ca"
    threads, chunks, rows = 4, 60, 4000
    with RunWriter(path, {"tool": "clockalign"}) as w:
        def work(k):
            rng = np.random.default_rng(k)
            for c in range(chunks):
                r = np.zeros(rows, dtype=GPU_REC_DTYPE)
                r["kind"] = 1
                r["pid"] = k
                r["corr"] = c
                r["start"] = np.cumsum(rng.integers(0, 1 << 20, rows)).astype(np.uint64)
                r["end"] = r["start"] + rng.integers(0, 1 << 16, rows).astype(np.uint64)
                w.write_columns(Chunk.GPU_ACTIVITY, {n: r[n] for n in GPU_REC_DTYPE.names})
        ts = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    r = RunReader(path)
    assert r.clean
    seen = 0
    for cols in r.iter_columns(Chunk.GPU_ACTIVITY):
        k, c = int(cols["pid"][0]), int(cols["corr"][0])
        rng = np.random.default_rng(k)
        for _ in range(c):                      # replay that thread's generator to chunk c
            rng.integers(0, 1 << 20, rows), rng.integers(0, 1 << 16, rows)
        start = np.cumsum(rng.integers(0, 1 << 20, rows)).astype(np.uint64)
        assert (cols["start"] == start).all()
        seen += 1
    assert seen == threads * chunks
