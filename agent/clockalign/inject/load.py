"""Steady background load on a V2 model while faults are injected, in its own process:
Locust as a library (FastHttpUser) where it is installed, else a bounded thread pool.

    python -m clockalign.inject.load --url http://127.0.0.1:8000 --model pointset \
        --users 8 --body req.json --max-seconds 600 --out load.json

Bounded: loopback URLs only, each user waits USER_WAIT_S between requests, and the load
stops by itself after --max-seconds (or at SIGTERM/SIGINT, whichever is first).  The JSON
written at the end: generator, requests, failures by status, latency p50/p99 (ms).
"""
import argparse
import ipaddress
import json
import os
import signal
import socket
import sys
import threading
import time

USER_WAIT_S = 0.05


def is_loopback(host: str) -> bool:
    try:
        return all(ipaddress.ip_address(a[4][0]).is_loopback
                   for a in socket.getaddrinfo(host, None))
    except (OSError, ValueError):
        return False


def _summary(generator, lat_ms, failures, users, seconds):
    lat = sorted(lat_ms)

    def q(p):
        return round(lat[min(len(lat) - 1, int(p * len(lat)))], 3) if lat else None
    return {"generator": generator, "users": users, "seconds": round(seconds, 3),
            "requests": len(lat) + sum(failures.values()),
            "failures": dict(failures), "ok": len(lat), "p50_ms": q(0.5), "p99_ms": q(0.99)}


def run_locust(url, path, body, users, max_s, stop_sig):
    import gevent
    from locust import FastHttpUser, constant, task
    from locust.env import Environment
    failures = {}
    lat = []

    class V2User(FastHttpUser):
        host = url
        wait_time = constant(USER_WAIT_S)

        @task
        def infer(self):
            with self.client.post(path, data=body, catch_response=True,
                                  headers={"Content-Type": "application/json"}) as r:
                if r.status_code == 200:
                    lat.append(r.request_meta["response_time"])
                    r.success()
                else:
                    failures[str(r.status_code)] = failures.get(str(r.status_code), 0) + 1
                    r.failure(f"status {r.status_code}")

    env = Environment(user_classes=[V2User])
    runner = env.create_local_runner()
    t0 = time.monotonic()
    runner.start(users, spawn_rate=users)
    for s in stop_sig:
        gevent.signal_handler(s, runner.quit)
    gevent.spawn_later(max_s, runner.quit)
    runner.greenlet.join()
    return _summary("locust", lat, failures, users, time.monotonic() - t0)


def run_threads(url, path, body, users, max_s, stop_sig):
    import http.client
    from .driver import split_url
    host, port = split_url(url)
    stop = threading.Event()
    lock = threading.Lock()
    failures, lat = {}, []
    for s in stop_sig:
        signal.signal(s, lambda *_: stop.set())

    def user():
        c = None
        while not stop.is_set():
            t = time.monotonic()
            try:
                c = c or http.client.HTTPConnection(host, port, timeout=60)
                c.request("POST", path, body=body, headers={"Content-Type": "application/json"})
                r = c.getresponse()
                r.read()
                status = r.status
            except (OSError, http.client.HTTPException):
                status = "connection"
                if c is not None:
                    c.close()
                c = None
            with lock:
                if status == 200:
                    lat.append((time.monotonic() - t) * 1e3)
                else:
                    failures[str(status)] = failures.get(str(status), 0) + 1
            stop.wait(USER_WAIT_S)

    t0 = time.monotonic()
    ts = [threading.Thread(target=user, daemon=True) for _ in range(users)]
    for t in ts:
        t.start()
    stop.wait(max_s)
    stop.set()
    for t in ts:
        t.join(65)
    return _summary("threads", lat, failures, users, time.monotonic() - t0)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--users", type=int, required=True)
    ap.add_argument("--body", required=True, help="file with the request body")
    ap.add_argument("--max-seconds", type=float, default=600)
    ap.add_argument("--generator", choices=["auto", "locust", "threads"], default="auto")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    from .driver import split_url
    from .eventlog import die_with_parent
    die_with_parent(signal.SIGTERM)
    if not is_loopback(split_url(a.url)[0]):
        print(f"load: {a.url} is not a loopback address; load goes to loopback only",
              file=sys.stderr)
        return 2
    with open(a.body, "rb") as f:
        body = f.read()
    path = f"/v2/models/{a.model}/infer"
    gen = a.generator
    if gen == "auto":
        import importlib.util
        gen = "locust" if importlib.util.find_spec("locust") else "threads"
    stop_sig = (signal.SIGTERM, signal.SIGINT)
    run = run_locust if gen == "locust" else run_threads
    s = run(a.url, path, body, a.users, a.max_seconds, stop_sig)
    tmp = a.out + ".partial"
    with open(tmp, "w") as f:
        json.dump(s, f, indent=1)
    os.replace(tmp, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
