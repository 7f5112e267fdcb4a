"""watch's /metrics server (watch/server.py) under a burst, with idle and slow clients
(issue 24): 200 concurrent scrapes of a real Aggregator served within 5 s, each answer a
complete exposition; a client that sends nothing (or half a request) closed after the idle
timeout without holding a worker; HEAD answered like GET; threads and descriptors back to
where they were after repeated bursts."""
import http.client
import os
import socket
import threading
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from clockalign.store.schema import Chunk
from clockalign.watch.aggregate import Aggregator
from clockalign.watch.metrics import build_registry, serve
from clockalign.watch.server import BACKLOG, IDLE_S, MetricsServer

from .test_watch_aggregate import ONE_GPU, cuda, events

BURST = 200
BURST_LIMIT_S = 5.0


@pytest.fixture
def agg():
    a = Aggregator()
    a.open(ONE_GPU)
    a.write_columns(Chunk.EVENTS, events(*[cuda("cuLaunchKernel", pid=100 + i % 7)
                                           for i in range(100)],
                                         cuda("cuMemAlloc_v2", ret=2, bytes=1 << 40)))
    return a


@pytest.fixture
def server(agg):
    reg, _ = build_registry(agg)
    s = serve(reg, "127.0.0.1", 0)
    yield s
    s.server_close()


def _scrape(port, method="GET", timeout=30):
    """(status, headers, body) of one scrape on a raw socket, as a scraper would send it."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(f"{method} /metrics HTTP/1.1\r\nHost: x\r\nAccept: text/plain\r\n\r\n"
                  .encode())
        data = b""
        while True:
            chunk = s.recv(1 << 16)
            if not chunk:
                break
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(ln.split(": ", 1) for ln in lines[1:])
    return int(lines[0].split()[1]), headers, body


def _burst(port, n=BURST):
    go = threading.Barrier(n + 1)
    got, errors = [], []

    def one():
        go.wait()
        try:
            got.append(_scrape(port))
        except OSError as e:
            errors.append(e)
    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    go.wait()
    t0 = time.monotonic()
    for t in threads:
        t.join()
    return time.monotonic() - t0, got, errors


def _calls(body):
    fams = {f.name: f for f in text_string_to_metric_families(body.decode())}
    return sum(s.value for s in fams["clockalign_cuda_calls"].samples
               if s.name.endswith("_total"))


def test_burst_of_200_concurrent_scrapes_within_5_s(server):
    wall, got, errors = _burst(server.server_address[1])
    assert not errors, errors[:3]
    assert wall < BURST_LIMIT_S, f"{BURST} concurrent scrapes took {wall:.1f} s"
    assert len(got) == BURST and all(status == 200 for status, _, _ in got)
    for _, headers, body in got:
        assert int(headers["Content-Length"]) == len(body)
        assert _calls(body) == 101                   # every answer the whole exposition
    assert server.scrapes == BURST
    assert server.renders < BURST / 4, server.renders   # scrapes waiting together share one


def test_the_listen_backlog_takes_a_burst():
    """The backlog asked for is far above the burst (prometheus_client's was 5)."""
    assert BACKLOG >= 4 * BURST


def test_head_is_answered_like_get(server):
    port = server.server_address[1]
    status, headers, body = _scrape(port, "HEAD")
    g_status, g_headers, g_body = _scrape(port, "GET")
    assert (status, body) == (200, b"") and g_status == 200
    assert headers["Content-Type"] == g_headers["Content-Type"]
    assert int(headers["Content-Length"]) > 1000 and _calls(g_body) == 101
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    c.request("POST", "/metrics", body=b"x")
    r = c.getresponse()
    assert r.status == 405 and "GET" in r.getheader("Allow")
    c.close()


def _closed_within(sock, limit_s):
    """Seconds until the server closed ``sock`` (recv returns b""), or None."""
    sock.settimeout(limit_s)
    t0 = time.monotonic()
    try:
        while True:
            if sock.recv(4096) == b"":
                return time.monotonic() - t0
    except socket.timeout:
        return None
    except ConnectionResetError:
        return time.monotonic() - t0


def test_idle_and_half_sent_connections_are_closed_after_the_timeout(agg):
    reg, _ = build_registry(agg)
    idle_s = 1.0
    s = MetricsServer(reg, "127.0.0.1", 0, idle_s=idle_s)
    port = s.server_address[1]
    try:
        silent = [socket.create_connection(("127.0.0.1", port)) for _ in range(20)]
        half = socket.create_connection(("127.0.0.1", port))
        half.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")      # never finished
        time.sleep(0.2)
        t0 = time.monotonic()                  # 21 clients hold no worker: a scrape is served
        status, _, body = _scrape(port, timeout=idle_s / 2)
        assert status == 200 and _calls(body) == 101 and time.monotonic() - t0 < idle_s / 2
        for c in silent + [half]:
            waited = _closed_within(c, idle_s + 3)
            assert waited is not None, "an idle connection was not closed"
            c.close()
        assert s.idle_closed == 21 and not s._idle
    finally:
        s.server_close()
    assert 10.0 >= IDLE_S >= 1.0              # the default: Prometheus's scrape_timeout


def test_idle_connections_are_capped(agg):
    """More idle clients than the cap: the oldest are closed, none holds a thread."""
    reg, _ = build_registry(agg)
    s = MetricsServer(reg, "127.0.0.1", 0, idle_s=60, max_idle=10)
    threads = threading.active_count()
    try:
        conns = [socket.create_connection(("127.0.0.1", s.server_address[1]))
                 for _ in range(30)]
        closed = [_closed_within(c, 2.0) for c in conns[:20]]
        assert all(t is not None for t in closed), closed
        time.sleep(0.3)
        assert len(s._idle) == 10 and threading.active_count() == threads
        for c in conns:
            c.close()
    finally:
        s.server_close()


def test_repeated_bursts_keep_threads_and_descriptors_flat(server):
    port = server.server_address[1]
    _burst(port, 50)
    threads = threading.active_count()
    fds = len(os.listdir("/proc/self/fd"))
    for _ in range(4):
        wall, got, errors = _burst(port)
        assert not errors and len(got) == BURST and wall < BURST_LIMIT_S
    time.sleep(0.3)
    assert threading.active_count() == threads
    assert len(os.listdir("/proc/self/fd")) <= fds
    assert not server._idle


def test_a_failing_collector_answers_500_and_the_server_stays_up(agg):
    reg, _ = build_registry(agg)

    class Broken:
        def collect(self):
            raise RuntimeError("aggregator gone")
    broken = Broken()
    reg.register(broken)
    s = MetricsServer(reg, "127.0.0.1", 0)
    try:
        status, _, body = _scrape(s.server_address[1])
        assert status == 500 and b"aggregator gone" in body
        reg.unregister(broken)
        assert _scrape(s.server_address[1])[0] == 200
    finally:
        s.server_close()
