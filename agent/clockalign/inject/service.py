"""The reference inference service: KServe V2 over HTTP on loopback (uvicorn + Starlette),
one engine worker process behind it, a watchdog and a supervisor, as a real service has.

    python -m clockalign.inject.service --engine onnxruntime --port 8000 --events ev.jsonl

Endpoints: GET /v2, /v2/health/live, /v2/health/ready, /v2/models/{m}, /v2/models/{m}/ready;
POST /v2/models/{m}/infer (JSON tensors).  The model is ``pointset`` (model.py).

What it does on a fault: strict validation rejects NaN/Inf, wrong shapes and datatypes
(400) before the engine sees them; an engine out-of-memory is the worker's (free, retry
split, reject 507, canary, ready again); the watchdog thread (``ca-watchdog``) kills a
worker whose request runs past --deadline-ms (504), and the supervisor (``ca-supervisor``)
starts a new one when a worker exits, whatever the reason (a sticky CUDA error: 500);
readiness is 503 from the fault until the new worker has loaded the model and run one
inference.  Every step is stamped in the event log (eventlog.py).
"""
import argparse
import itertools
import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection

import numpy as np

from . import model
from .eventlog import EventLog, die_with_parent, name_thread
from .worker import MAX_MEMORY_GIB

MODEL = "pointset"
MAX_START_FAILURES = 3


class Worker:
    """The engine worker, its supervisor and watchdog.  One request is in the engine at a
    time; the others wait for it (or get 503 while no worker is ready)."""

    def __init__(self, engine, device, deadline_ms, log, max_memory_gib):
        self.engine, self.device, self.log = engine, device, log
        self.deadline_ns = int(deadline_ms * 1e6)
        self.max_memory_gib = max_memory_gib
        self.ready = threading.Event()
        self.failed = None               # why the first worker could not start
        self.gave_up = False
        self.info = {}
        self.stopping = False
        self.lock = threading.Lock()     # one request in the engine
        self.cond = threading.Condition()
        self.inflight = None             # (rid, deadline_ns) while the engine works
        self.reply = None
        self.replied = threading.Event()
        self.timed_out = set()
        self.proc = self.conn = None
        self.ids = itertools.count(1)
        self.threads = [threading.Thread(target=self._supervise, name="ca-supervisor",
                                         daemon=True),
                        threading.Thread(target=self._watch, name="ca-watchdog", daemon=True)]
        for t in self.threads:
            t.start()

    # ------------------------------------------------------------ supervisor
    def _spawn(self):
        mine, theirs = socket.socketpair()
        cmd = [sys.executable, "-m", "clockalign.inject.worker", "--fd", str(theirs.fileno()),
               "--engine", self.engine, "--device", self.device,
               "--max-memory-gib", str(self.max_memory_gib)]
        if self.log.path:
            cmd += ["--events", self.log.path]
        # its own process group: a Ctrl-C at the terminal is the service's to act on
        proc = subprocess.Popen(cmd, pass_fds=[theirs.fileno()], start_new_session=True)
        theirs.close()
        self.log.emit("worker_spawn", worker=proc.pid)
        return proc, Connection(os.dup(mine.fileno())), mine

    def _supervise(self):
        name_thread("ca-supervisor")
        failures = 0                      # workers in a row that died before being ready
        while not self.stopping:
            self.proc, self.conn, sock = self._spawn()
            was_ready = False
            while True:
                try:
                    msg = self.conn.recv()
                except (EOFError, OSError):
                    break
                if msg[0] == "ready":
                    if len(msg) > 1:
                        self.info = {"device": msg[1], "engine_version": msg[2]}
                    self.log.emit("ready", worker=self.proc.pid)
                    self.ready.set()
                    was_ready = True
                elif msg[0] == "failed":
                    self.failed = msg[1]
                elif msg[0] in ("ok", "error"):
                    if msg[0] == "error" and msg[4]:    # the worker is recovering
                        self.ready.clear()
                        self.log.emit("not_ready", why=msg[2])
                    self._answer(msg)
            self.ready.clear()
            code = self.proc.wait()
            self.log.emit("worker_exit", worker=self.proc.pid, code=code)
            self.conn.close()
            sock.close()
            self._answer(("gone", None, code))
            failures = 0 if was_ready else failures + 1
            if failures and (not self.info or failures >= MAX_START_FAILURES):
                self.log.emit("service_gives_up", why=self.failed or f"worker status {code}")
                self.gave_up = True
                os.kill(os.getpid(), signal.SIGTERM)   # never started, or cannot any more
                return
            if not self.stopping:
                if failures:
                    time.sleep(1.0)
                self.log.emit("restart")

    def _answer(self, msg):
        with self.cond:
            if self.inflight is None:
                return
            self.inflight = None
            self.reply = msg
            self.replied.set()
            self.cond.notify_all()

    # ------------------------------------------------------------ watchdog
    def _watch(self):
        name_thread("ca-watchdog")
        with self.cond:
            while not self.stopping:
                if self.inflight is None:
                    self.cond.wait()
                    continue
                rid, deadline, pid = self.inflight
                if deadline is None:
                    self.cond.wait()
                    continue
                left = deadline - time.monotonic_ns()
                if left > 0:
                    self.cond.wait(left / 1e9)
                    continue
                self.log.emit("watchdog_fired", worker=pid, rid=rid)
                self.timed_out.add(rid)
                self.ready.clear()
                self.inflight = (rid, None, pid)       # once per request
                try:
                    os.kill(pid, signal.SIGKILL)
                    self.log.emit("kill_sent", worker=pid)
                except ProcessLookupError:
                    pass

    # ------------------------------------------------------------ requests
    def infer(self, points, steps):
        """-> (HTTP status, body dict)."""
        with self.lock:
            if not self.ready.is_set():
                return 503, {"error": "model is not ready (worker restarting)"}
            rid = next(self.ids)
            with self.cond:
                self.replied.clear()
                self.inflight = (rid, time.monotonic_ns() + self.deadline_ns, self.proc.pid)
                self.cond.notify_all()
            try:
                self.conn.send(("infer", rid, points, steps))
            except OSError:
                pass
            self.replied.wait()
            msg = self.reply
        if rid in self.timed_out:
            self.timed_out.discard(rid)
            return 504, {"error": f"inference ran past the {self.deadline_ns / 1e6:.0f} ms "
                                  "deadline: the watchdog killed the worker; it is restarting"}
        if msg[0] == "ok":
            return 200, {"model_name": MODEL, "outputs": [
                {"name": model.OUTPUT, "datatype": "FP32", "shape": list(msg[2].shape),
                 "data": msg[2].ravel().tolist()}]}
        if msg[0] == "gone":
            return 500, {"error": f"the worker exited (status {msg[2]}) during inference; "
                                  "it is restarting"}
        status = {"oom": 507, "sticky": 500}.get(msg[2], 400)
        return status, {"error": f"{msg[2]}: {msg[3]}"}

    def stop(self):
        self.stopping = True
        self.ready.clear()
        with self.cond:
            self.cond.notify_all()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# ---------------------------------------------------------------- validation
class Invalid(Exception):
    pass


_DT = {"FP32": np.float32, "INT64": np.int64}


def parse_request(body: bytes):
    """Strict V2 request validation -> (points [B, L, 2] float32, steps int, request id);
    Invalid carries the request id too (None when the request has none)."""
    try:
        req = json.loads(body)
    except ValueError as e:
        raise Invalid(f"request body is not JSON: {e}") from None
    rid = req.get("id") if isinstance(req, dict) and isinstance(req.get("id"), str) else None
    try:
        return _parse(req) + (rid,)
    except Invalid as e:
        e.rid = rid
        raise


def _parse(req):
    if not isinstance(req, dict) or not isinstance(req.get("inputs"), list):
        raise Invalid("request has no 'inputs' list")
    by_name = {}
    for t in req["inputs"]:
        if not isinstance(t, dict) or "name" not in t:
            raise Invalid("every input needs a name")
        by_name[t["name"]] = t
    unknown = set(by_name) - {model.INPUT, model.STEPS}
    if unknown:
        raise Invalid(f"unknown input {sorted(unknown)[0]!r}")
    if model.INPUT not in by_name:
        raise Invalid(f"input {model.INPUT!r} is missing")
    points = _tensor(by_name[model.INPUT], "FP32")
    if points.ndim != 3 or points.shape[2] != 2 or points.shape[0] < 1 or points.shape[1] < 1:
        raise Invalid(f"input {model.INPUT!r} must have shape [B, L, 2], got "
                      f"{list(points.shape)}")
    if not np.isfinite(points).all():
        bad = "NaN" if np.isnan(points).any() else "Inf"
        raise Invalid(f"input {model.INPUT!r} holds {bad}")
    steps = 1
    if model.STEPS in by_name:
        s = _tensor(by_name[model.STEPS], "INT64")
        if s.shape != (1,) or int(s[0]) < 1:
            raise Invalid(f"input {model.STEPS!r} must be shape [1] and at least 1")
        steps = int(s[0])
    return points, steps


def _tensor(t: dict, datatype: str) -> np.ndarray:
    if t.get("datatype") != datatype:
        raise Invalid(f"input {t['name']!r} must be {datatype}, got {t.get('datatype')!r}")
    shape = t.get("shape")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise Invalid(f"input {t['name']!r} has no valid shape")
    try:
        a = np.asarray(t.get("data"), dtype=_DT[datatype])
    except (TypeError, ValueError, OverflowError):
        raise Invalid(f"input {t['name']!r} data are not {datatype} numbers") from None
    if a.size != math.prod(shape):
        raise Invalid(f"input {t['name']!r}: {a.size} values for shape {shape}")
    return a.reshape(shape)


# ---------------------------------------------------------------- HTTP
def make_app(worker: Worker, log: EventLog, engine: str):
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    def metadata(request):
        if request.path_params["m"] != MODEL:
            return JSONResponse({"error": f"unknown model {request.path_params['m']}"}, 404)
        return JSONResponse({
            "name": MODEL, "versions": ["1"], "platform": engine,
            "inputs": [{"name": model.INPUT, "datatype": "FP32", "shape": [-1, -1, 2]},
                       {"name": model.STEPS, "datatype": "INT64", "shape": [1]}],
            "outputs": [{"name": model.OUTPUT, "datatype": "FP32", "shape": [-1, model.CLASSES]}],
            "parameters": {"engine": engine, **worker.info,
                           "deadline_ms": worker.deadline_ns / 1e6}})

    def live(request):
        return Response(status_code=200)

    def ready(request):
        return Response(status_code=200 if worker.ready.is_set() else 503)

    def model_ready(request):
        if request.path_params["m"] != MODEL:
            return Response(status_code=404)
        return ready(request)

    def server(request):
        return JSONResponse({"name": "clockalign-reference", "version": "1",
                             "extensions": []})

    def index(request):
        return JSONResponse([{"name": MODEL, "version": "1",
                              "state": "READY" if worker.ready.is_set() else "UNAVAILABLE"}])

    async def infer(request):
        if request.path_params["m"] != MODEL:
            return JSONResponse({"error": f"unknown model {request.path_params['m']}"}, 404)
        body = await request.body()
        try:       # off the event loop: an 8 MB body must not stall the health checks
            points, steps, rid = await run_in_threadpool(parse_request, body)
        except Invalid as e:
            log.emit("rejected", why=str(e), id=getattr(e, "rid", None))
            return JSONResponse({"error": str(e)}, 400)
        if rid:
            log.emit("accepted", id=rid)
        status, out = await run_in_threadpool(worker.infer, points, steps)
        if rid:
            out["id"] = rid
        return JSONResponse(out, status)

    return Starlette(routes=[
        Route("/v2", server), Route("/v2/health/live", live), Route("/v2/health/ready", ready),
        Route("/v2/repository/index", index, methods=["POST"]),
        Route("/v2/models/{m}", metadata), Route("/v2/models/{m}/ready", model_ready),
        Route("/v2/models/{m}/infer", infer, methods=["POST"]),
    ])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", required=True, choices=["torch", "onnxruntime"])
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--deadline-ms", type=float, default=1000.0)
    ap.add_argument("--max-memory-gib", type=float, default=MAX_MEMORY_GIB)
    ap.add_argument("--events")
    a = ap.parse_args(argv)
    import uvicorn
    die_with_parent(signal.SIGTERM)
    log = EventLog(a.events)
    log.emit("service_start", engine=a.engine, port=a.port)
    worker = Worker(a.engine, a.device, a.deadline_ms, log, a.max_memory_gib)
    # uvicorn re-raises the signal that stopped it once it has shut down: let that end
    # this process through the finally below (the worker stopped, the log closed)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: sys.exit(0))
    config = uvicorn.Config(make_app(worker, log, a.engine), host="127.0.0.1", port=a.port,
                            log_level="warning", access_log=False, lifespan="off")
    try:
        uvicorn.Server(config).run()
    except SystemExit:       # our own signal handler, above
        pass
    finally:
        worker.stop()
        log.emit("service_stop")
    return 1 if worker.gave_up else 0


if __name__ == "__main__":
    sys.exit(main())
