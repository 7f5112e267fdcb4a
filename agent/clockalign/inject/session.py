"""The recorded process tree of one engine x fault: this session starts the reference
service (unless --url names another V2 server), the background load, and drives the
repetitions; clockalign records it, so the client, the service and its workers are all on
the recording.  Results go to --work: client.json (the client's stamps), and the service's
event log.  Run by run.py under the recorder, not by hand:

    python -m clockalign.inject.session --engine onnxruntime --fault timeout -n 5 \
        --port 8011 --work DIR/onnxruntime-timeout
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import time

from ..errors import ClockalignError
from .driver import Driver
from .faults import FAULTS, normal_request

SERVICE_START_S = 300
SETTLE_S = 0.2


class _Stop(Exception):
    pass


def _stop(signum, frame):
    raise _Stop(signal.Signals(signum).name)


def _end(proc, sig=signal.SIGTERM, wait_s=10):
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(wait_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def start_service(a, events):
    cmd = [sys.executable, "-m", "clockalign.inject.service", "--engine", a.engine,
           "--port", str(a.port), "--deadline-ms", str(a.deadline_ms), "--events", events,
           "--device", a.device] + (["--standby", str(a.standby)] if a.standby else [])
    proc = subprocess.Popen(cmd, start_new_session=True)     # stopped by us, not by a Ctrl-C
    d = Driver(f"http://127.0.0.1:{a.port}", "pointset")
    end = time.monotonic() + SERVICE_START_S
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise ClockalignError(f"the {a.engine} service exited with status "
                                  f"{proc.returncode} before it was ready"
                                  + _why_failed(events))
        if d.ready_once():
            d.close()
            return proc, d
        time.sleep(0.05)
    raise ClockalignError(f"the {a.engine} service was not ready within {SERVICE_START_S} s")


def _why_failed(events):
    from .eventlog import read_events
    why = [r.get("message") or r.get("why") for r in read_events(events)
           if r["ev"] in ("worker_failed", "service_gives_up")]
    return f": {why[0]}" if why else ""


def _standbys_ready(d, n):
    """With standbys: wait until all n are ready again (each fault meets a full pool) ->
    the MONOTONIC ns the client saw it; None without standbys."""
    if not n:
        return None
    t = d.wait_standby(n, SERVICE_START_S)
    if t is None:
        raise ClockalignError(f"the service's {n} standby workers were not ready within "
                              f"{SERVICE_START_S} s")
    return t


def run(a) -> dict:
    os.makedirs(a.work, exist_ok=True)
    events = os.path.join(a.work, "events.jsonl")
    service = load = None
    try:
        if a.url:
            d = Driver(a.url, a.model)
            d.check_live()
        else:
            service, d = start_service(a, events)
        meta = d.metadata()
        fault = FAULTS[a.fault]
        bodies = [fault.request(meta, i) for i in range(a.n)]
        if a.load:
            body_path = os.path.join(a.work, "load-request.json")
            with open(body_path, "wb") as f:
                f.write(normal_request(meta))
            load = subprocess.Popen([
                sys.executable, "-m", "clockalign.inject.load", "--url", d.url,
                "--model", d.model, "--users", str(a.load), "--body", body_path,
                "--max-seconds", str(a.load_max_s), "--generator", a.load_generator,
                "--out", os.path.join(a.work, "load.json")], start_new_session=True)
            time.sleep(1.0)                     # let the load reach its steady state
        t_ready, _ = d.wait_ready()
        if t_ready is None:
            raise ClockalignError(f"{d.url} is not ready")
        reps = []
        for i, body in enumerate(bodies):
            _standbys_ready(d, a.standby)
            rep = d.repetition(body)
            rep["i"] = i
            if a.standby and rep["t_ready_ns"] is not None:
                rep["t_full_ns"] = _standbys_ready(d, a.standby)
            reps.append(rep)
            state = (f"{rep['status']} after {(rep['t_answer_ns'] - rep['t_send_ns']) / 1e6:.1f} ms"
                     if rep["t_send_ns"] else rep["error"])
            ready = (f"ready after {(rep['t_ready_ns'] - rep['t_answer_ns']) / 1e6:.1f} ms"
                     if rep["t_ready_ns"] else "NOT ready again")
            if rep.get("t_full_ns"):
                ready += (f"; {a.standby} standby ready after "
                          f"{(rep['t_full_ns'] - rep['t_ready_ns']) / 1e6:.1f} ms")
            print(f"inject: {a.engine} {a.fault} {i + 1}/{a.n}: {state}; {ready}",
                  file=sys.stderr, flush=True)
            if rep["t_ready_ns"] is None:
                break
            time.sleep(SETTLE_S)
        d.close()
        out = {"engine": a.engine, "fault": a.fault, "url": d.url, "model": d.model,
               "metadata": meta, "n": a.n, "load_users": a.load, "standby": a.standby,
               "pid": os.getpid(),
               "service_pid": service.pid if service else None, "repetitions": reps}
    finally:
        _end(load, signal.SIGTERM, 30)
        _end(service)
    if load is not None:
        try:
            with open(os.path.join(a.work, "load.json")) as f:
                out["load"] = json.load(f)
        except (OSError, ValueError):
            out["load"] = None
    with open(os.path.join(a.work, "client.json"), "w") as f:
        json.dump(out, f, indent=1)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", required=True)
    ap.add_argument("--fault", required=True, choices=sorted(FAULTS))
    ap.add_argument("-n", type=int, default=20)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--url")
    ap.add_argument("--model")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--deadline-ms", type=float, default=1000.0)
    ap.add_argument("--standby", type=int, default=0)
    ap.add_argument("--load", type=int, default=0)
    ap.add_argument("--load-max-s", type=float, default=900)
    ap.add_argument("--load-generator", default="auto")
    ap.add_argument("--work", required=True)
    a = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, _stop)
    try:
        run(a)
    except ClockalignError as e:
        print(f"clockalign: {e}", file=sys.stderr)
        return 2
    except (_Stop, KeyboardInterrupt):
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
