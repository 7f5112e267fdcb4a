"""The reference inference service: KServe V2 over HTTP on loopback (uvicorn + Starlette),
one engine worker process behind it (and --standby N warm ones), a watchdog and a
supervisor, as a real service has (the workers: pool.py).

    python -m clockalign.inject.service --engine onnxruntime --port 8000 --events ev.jsonl

Endpoints: GET /v2, /v2/health/live, /v2/health/ready, /v2/models/{m}, /v2/models/{m}/ready;
POST /v2/models/{m}/infer (JSON tensors).  The model is ``pointset`` (model.py).

What it does on a fault: strict validation rejects NaN/Inf, wrong shapes and datatypes
(400) before the engine sees them; an engine out-of-memory is the worker's (free, retry
split, reject 507, canary, ready again); the watchdog thread (``ca-watchdog``) kills a
worker whose request runs past --deadline-ms (504), and the supervisor (``ca-supervisor``)
starts a new one when a worker exits, whatever the reason (a sticky CUDA error: 500);
readiness is 503 from the fault until the new worker has loaded the model and run one
inference.  With --standby N a ready standby serves at once instead and readiness stays
200; the new worker replenishes the standbys (the model metadata's parameters say how many
are ready).  Every step is stamped in the event log (eventlog.py).
"""
import argparse
import json
import math
import signal
import sys

import numpy as np

from . import model
from .eventlog import EventLog, die_with_parent
from .pool import MODEL, Pool
from .worker import MAX_MEMORY_GIB


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
def make_app(pool: Pool, log: EventLog, engine: str):
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
            "parameters": {"engine": engine, **pool.info,
                           "deadline_ms": pool.deadline_ns / 1e6, **pool.params()}})

    def live(request):
        return Response(status_code=200)

    def ready(request):
        return Response(status_code=200 if pool.ready.is_set() else 503)

    def model_ready(request):
        if request.path_params["m"] != MODEL:
            return Response(status_code=404)
        return ready(request)

    def server(request):
        return JSONResponse({"name": "clockalign-reference", "version": "1",
                             "extensions": []})

    def index(request):
        return JSONResponse([{"name": MODEL, "version": "1",
                              "state": "READY" if pool.ready.is_set() else "UNAVAILABLE"}])

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
        status, out = await run_in_threadpool(pool.infer, points, steps)
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
    ap.add_argument("--standby", type=int, default=0,
                    help="warm standby workers kept ready besides the serving one")
    ap.add_argument("--events")
    a = ap.parse_args(argv)
    import uvicorn
    die_with_parent(signal.SIGTERM)
    log = EventLog(a.events)
    log.emit("service_start", engine=a.engine, port=a.port, **(
        {"standby": a.standby} if a.standby else {}))
    pool = Pool(a.engine, a.device, a.deadline_ms, log, a.max_memory_gib, a.standby)
    # uvicorn re-raises the signal that stopped it once it has shut down: let that end
    # this process through the finally below (the worker stopped, the log closed)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: sys.exit(0))
    config = uvicorn.Config(make_app(pool, log, a.engine), host="127.0.0.1", port=a.port,
                            log_level="warning", access_log=False, lifespan="off")
    try:
        uvicorn.Server(config).run()
    except SystemExit:       # our own signal handler, above
        pass
    finally:
        pool.stop()
        log.emit("service_stop")
    return 1 if pool.gave_up else 0


if __name__ == "__main__":
    sys.exit(main())
