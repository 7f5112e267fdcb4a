"""The export pipeline: a TraceModel's batches through a format's writer, encoded on other
threads, written in order.

    stats = stream(TraceModel(tl), writer, progress=bar.update)
"""
import os


def stream(model, writer, progress=None, workers: int = None):
    """Drive a writer over all batches, encoding on a second thread.

    ``writer.prepare(batch)`` runs here, in order (it owns the writer's state: tracks
    declared, strings interned) and may write packets; ``writer.encode(batch, ctx)`` is
    mostly numpy, which releases the GIL, so encoding runs on the other cores while this
    thread reads and builds the next batch; it returns bytes or a 1-D uint8 array.  Output order is kept: a batch's bytes follow what its
    prepare wrote, batches in order.  Memory stays bounded: at most workers + 1 batches wait.
    """
    import collections
    import io
    from concurrent.futures import ThreadPoolExecutor

    workers = workers or max(1, min(4, os.cpu_count() or 1))
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
            for b in model.batches():
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
