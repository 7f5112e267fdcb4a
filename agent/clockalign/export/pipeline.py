"""The export driver: one run through a format's writer, the same steps for every format.

    stats = export(tl, PerfettoWriter(f))           # or JsonWriter(f) (chrome_json.py)
    stats = export(tl, JsonWriter(f), select=Selection.parse(tl, "12.5", "14"))  # part of it

``select`` (export/window.py) picks a window, pids and kinds, here once for every format:
events as they stream, counters, GPU activity, faults and clock bands.  The clock snapshot
and the descriptors of the tracks written are always there, so a part opens like the whole.

export() builds the TraceModel, finds the faults and the GPU launch flows, then calls the
writer in this order; a writer is a class with these methods:

    begin(model, tl, snap)      the file's head (snap: clocks.clock_snapshot)
    prepare(batch) -> ctx       per batch, on this thread: new tracks, interned strings
    encode(batch, ctx) -> bytes per batch, on an encoder thread (stream() below)
    count(batch)                per batch, after its prepare
    counters(rows)              every GPU counter sample (timeline counters(), by time)
    clock_band(gpu, t, u)       each fitted GPU clock's band, where CLOCK_BANDS is true
    faults(faults, unmatched)   fault instants and the flows of their chains
    gpu_activity(acts, flows)   the GPU executions of a --gpu-activity run -> how many
    end(tl, snap)               the file's tail
    stats() -> dict             what only this format counts (packets, records)

and keeps ``f`` (the binary file) and ``bytes`` (written so far).
"""
import os


def _workers(workers: int = None) -> int:
    return workers or max(1, min(4, os.cpu_count() or 1))


def in_order(fn, items, workers: int = None):
    """fn(item) for each of ``items``, run on worker threads (numpy releases the GIL),
    yielded in the items' order; at most workers + 1 wait (bounded memory)."""
    import collections
    from concurrent.futures import ThreadPoolExecutor

    workers = _workers(workers)
    pending = collections.deque()
    with ThreadPoolExecutor(workers, thread_name_prefix="clockalign-export") as pool:
        try:
            for it in items:
                pending.append(pool.submit(fn, it))
                while len(pending) > workers + 1:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for fut in pending:
                fut.cancel()


def stream(batches, writer, progress=None, workers: int = None):
    """Drive a writer over ``batches`` (TraceModel.batches(), gpu_tracks.gpu_batches),
    encoding on other threads.

    ``writer.prepare(batch)`` runs here, in order (it owns the writer's state: tracks
    declared, strings interned) and may write packets; ``writer.encode(batch, ctx)`` is
    mostly numpy, which releases the GIL, so encoding runs on the other cores while this
    thread reads and builds the next batch; it returns bytes or a 1-D uint8 array.  Output order is kept: a batch's bytes follow what its
    prepare wrote, batches in order.  Memory stays bounded: at most workers + 1 batches wait.
    """
    import collections
    import io
    from concurrent.futures import ThreadPoolExecutor

    workers = _workers(workers)
    depth = workers + 1
    pending = collections.deque()
    out = writer.f

    def drain(k):
        while len(pending) > k:
            head, fut, nrows = pending.popleft()
            if head:
                out.write(head)
            blob = fut.result()
            out.write(blob)
            writer.bytes += len(blob)
            if progress:
                progress(nrows)

    with ThreadPoolExecutor(workers, thread_name_prefix="clockalign-export") as pool:
        try:
            for b in batches:
                buf = io.BytesIO()
                writer.f = buf
                try:
                    ctx = writer.prepare(b)
                finally:
                    writer.f = out
                pending.append((buf.getvalue(), pool.submit(writer.encode, b, ctx), b.n))
                writer.count(b)
                drain(depth)
            drain(0)
        finally:
            for _, fut, _ in pending:
                fut.cancel()


def export(tl, writer, progress=None, batch_rows: int = None, select=None) -> dict:
    """Write the run behind Timeline ``tl`` (the part ``select`` picks, if given) through
    ``writer``; returns what was written."""
    import numpy as np

    from ..timeline.spool import spool_dir
    from .clocks import clock_snapshot, gpu_clock_bands
    from ..timeline.heap import reuse_heap
    from .gpu_tracks import EXPORT_FIELDS, LaunchFlows
    from .model import TraceModel
    # the first pass (thread names, faults) and the rows each read every event: decode once
    tl.spool(spool_dir(writer.f))
    if select is not None and select.everything:
        select = None
    model = TraceModel(tl, select=select, **({"batch_rows": batch_rows} if batch_rows else {}))
    faults = tl.faults() if select is None else select.faults(tl.faults())
    model.set_chains(faults)
    acts = tl.gpu_activity(fields=EXPORT_FIELDS)       # narrow columns (gpu_tracks.py)
    if select is not None and len(acts):
        acts = select.gpu_activity(acts)
    if len(acts):
        model.gpu_flows = LaunchFlows(acts)
    reuse_heap()         # from here, batch arrays reused, not mapped afresh (timeline/heap.py)
    snap = clock_snapshot(tl)
    writer.begin(model, tl, snap)
    stream(model.batches(), writer, progress)
    cnt = tl.counters() if select is None else select.counters(tl.counters())
    if cnt is not None and len(cnt):
        writer.counters(cnt)
    if writer.CLOCK_BANDS:
        for name, (t, u) in gpu_clock_bands(tl).items():
            if select is not None:
                t, u = select.band(t, u)
            writer.clock_band(int(name[3:]), t, u)
    steps = model.unmatched_steps()
    writer.faults(faults, steps if select is None else select.steps(faults, steps))
    gpu_n = writer.gpu_activity(acts, model.gpu_flows) if len(acts) else 0
    writer.end(tl, snap)
    return {"events": dict(model.counts), **writer.stats(), "bytes": writer.bytes,
            "tracks": len(model.tracks.all), "faults": len(faults), "gpu_activity": gpu_n,
            "gpu_flows": int(np.sum(model.gpu_flows.matched)) if model.gpu_flows else 0,
            "counters": 0 if cnt is None else len(cnt), "clock_snapshot": snap.describe()}
