"""One engine worker of the reference service: loads the model, answers inference
requests over a socket from the service, and does what a real worker does on a fault.

    python -m clockalign.inject.worker --fd 5 --engine onnxruntime --events ev.jsonl

Messages (multiprocessing.connection frames): in ("infer", id, points, steps); out
("ready",), ("ok", id, logits), ("error", id, kind, message, recovering).
On out-of-memory it frees the engine's cached memory and retries once with the batch
split in two; if that fails too it rejects the request, then runs a canary inference
before it says ready again.  On a sticky CUDA error (the context is lost) it answers and
exits with status 3: the service restarts it.  CPU engines run under RLIMIT_AS
(--max-memory-gib) so an oversized allocation fails inside the engine, bounded.
"""
import argparse
import os
import resource
import signal
import sys
from multiprocessing.connection import Connection

import numpy as np

from .eventlog import EventLog, die_with_parent

STICKY_EXIT = 3
# RLIMIT_AS of a CPU engine's worker: far above what normal requests need (ONNX Runtime's
# threads reserve address space per core), far below an oversized batch's 275-550 GB
MAX_MEMORY_GIB = 64.0
CANARY_POINTS = 64


def canary_input() -> np.ndarray:
    return np.random.default_rng(7).random((1, CANARY_POINTS, 2), dtype=np.float32)


def _infer_with_retry(eng, log, points, steps):
    from .engines import EngineError
    try:
        return eng.infer(points, steps)
    except EngineError as e:
        if e.kind != "oom":
            raise
        log.emit("engine_oom", message=str(e), batch=int(points.shape[0]))
        eng.free()
        log.emit("freed")
        if points.shape[0] < 2:
            raise
        half = points.shape[0] // 2
        log.emit("oom_retry", batch=half)
        try:
            return np.concatenate([eng.infer(points[:half], steps),
                                   eng.infer(points[half:], steps)])
        except EngineError as e2:
            log.emit("oom_retry_failed", message=str(e2))
            raise


def serve(conn, eng, log):
    from .engines import EngineError
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return 0
        _, rid, points, steps = msg
        try:
            out = _infer_with_retry(eng, log, points, steps)
            conn.send(("ok", rid, out))
        except EngineError as e:
            if e.kind == "sticky":
                log.emit("engine_sticky_error", message=str(e))
                conn.send(("error", rid, e.kind, str(e), True))
                return STICKY_EXIT
            if e.kind == "oom":
                conn.send(("error", rid, e.kind, str(e), True))
                eng.free()
                eng.infer(canary_input(), 1)
                log.emit("canary_ok")
                conn.send(("ready",))
            else:
                log.emit("engine_error", message=str(e))
                conn.send(("error", rid, e.kind, str(e), False))


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--fd", type=int, required=True)
    ap.add_argument("--engine", required=True)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--events")
    ap.add_argument("--max-memory-gib", type=float, default=MAX_MEMORY_GIB)
    a = ap.parse_args(argv)
    die_with_parent(signal.SIGKILL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)     # the service decides when we stop
    log = EventLog(a.events)
    conn = Connection(a.fd)
    log.emit("worker_start", engine=a.engine)
    from .engines import EngineError, open_engine
    try:
        eng = open_engine(a.engine, a.device)
        if eng.device == "cpu":       # a CUDA context reserves far more address space
            lim = int(a.max_memory_gib * (1 << 30))
            resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
        log.emit("model_loaded", device=eng.device, version=eng.version)
        eng.infer(canary_input(), 1)
    except (EngineError, Exception) as e:     # the service reports why the worker died
        log.emit("worker_failed", message=f"{type(e).__name__}: {e}")
        try:
            conn.send(("failed", f"{type(e).__name__}: {e}"))
        except OSError:
            pass
        return 2
    log.emit("first_success", device=eng.device)
    try:
        conn.send(("ready", eng.device, eng.version))
        rc = serve(conn, eng, log)
    except (OSError, EOFError):      # the service went away: nothing to answer
        rc = 0
    log.emit("worker_exit", code=rc)
    sys.stdout.flush()
    os._exit(rc)     # a lost CUDA context must not be torn down


if __name__ == "__main__":
    sys.exit(main())
