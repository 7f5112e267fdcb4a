"""watch's HTTP server for /metrics: a scrape burst is served in a few seconds, an idle
client costs a socket (not a thread) and is closed after IDLE_S, memory stays flat.

prometheus_client's own server (a thread per connection, listen backlog 5) took 15-28 s
for 200 concurrent scrapes: the kernel dropped the SYNs that overflowed the backlog and the
clients retried after 1, 3, 7 s; a client that connected and sent nothing held a thread
for ever.  Here one thread accepts (backlog BACKLOG) and reads, with a selector, each
connection's request head (at most HEAD_BYTES, within IDLE_S of the connect, else it is
closed); only a complete request goes to a worker of a fixed pool (WORKERS), so a slow or
silent client never holds a worker.
Scrapes that arrive while the metrics are being rendered wait for the next rendering and
share it, so a burst costs a few renderings, not one per client, and no answer is older
than its request.  One request per connection (Connection: close), GET and HEAD.

    server = MetricsServer(registry, "127.0.0.1", 9464)     # serving in daemon threads
    server.server_address[1]                                 # the port bound
    server.shutdown(); server.server_close()
"""
import gzip
import http.server
import io
import queue
import selectors
import socket
import threading
import time
from urllib.parse import parse_qs, urlsplit

from prometheus_client.exposition import choose_encoder, gzip_accepted

from ..errors import ClockalignError

BACKLOG = 1024            # the kernel caps it at net.core.somaxconn (4096 since Linux 5.4)
WORKERS = 4
IDLE_S = 10.0             # Prometheus's default scrape_timeout: connect to the request's end,
                          # and each write of the answer
HEAD_BYTES = 64 << 10
MAX_IDLE_CONNECTIONS = 512
TICK_S = 0.25


class _Writer:
    def __init__(self, conn):
        self.conn = conn

    def write(self, b):
        self.conn.sendall(b)

    def flush(self):
        pass


class _Handler(http.server.BaseHTTPRequestHandler):
    """One request, read already (request = (connection, head bytes, MONOTONIC ns it was
    complete)); the server renders."""
    protocol_version = "HTTP/1.1"
    server_version = "clockalign"

    def setup(self):
        self.connection, head, self.arrived = self.request
        self.rfile = io.BytesIO(head)
        self.wfile = _Writer(self.connection)

    def finish(self):
        pass

    def do_GET(self):
        self._metrics(body=True)

    def do_HEAD(self):
        self._metrics(body=False)

    def do_OPTIONS(self):
        self._answer(200, [("Allow", "GET, HEAD, OPTIONS")], b"", True)

    def _refuse(self):
        self._answer(405, [("Allow", "GET, HEAD, OPTIONS"), ("Content-Type", "text/plain")],
                     f"{self.command} is not served here; use GET or HEAD\n".encode(), True)

    do_POST = do_PUT = do_DELETE = do_PATCH = _refuse

    def _metrics(self, body):
        u = urlsplit(self.path)
        if u.path == "/favicon.ico":
            self._answer(200, [], b"", body)
            return
        try:
            headers, output = self.server.owner.render(
                self.headers.get("Accept"), self.headers.get("Accept-Encoding"),
                parse_qs(u.query).get("name[]"), self.arrived)
        except Exception as e:        # a collector failed: say so to the scraper, keep serving
            self._answer(500, [("Content-Type", "text/plain")],
                         f"collecting the metrics failed: {e}\n".encode(), body)
            return
        self._answer(200, headers, output, body)

    def _answer(self, code, headers, output, body):
        self.send_response(code)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(output)))
        self.send_header("Connection", "close")
        self.end_headers()
        if body:
            self.wfile.write(output)
        self.close_connection = True

    def log_message(self, *args):
        pass


class _Shim:
    """What BaseHTTPRequestHandler reads from its server: the owner."""
    def __init__(self, owner):
        self.owner = owner


class MetricsServer:
    """Serve ``registry`` on (host, port) until shutdown(); see the module docstring."""

    def __init__(self, registry, host: str, port: int, workers: int = WORKERS,
                 idle_s: float = IDLE_S, max_idle: int = MAX_IDLE_CONNECTIONS,
                 on_scrape=None):
        self.registry = registry
        self.idle_s = idle_s
        self.max_idle = max_idle
        self.on_scrape = on_scrape
        self.scrapes = 0               # answered GET/HEAD of the metrics
        self.renders = 0               # registry collections they took
        self.idle_closed = 0           # connections closed for sending nothing in idle_s
        try:
            family, _, _, _, addr = socket.getaddrinfo(
                host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
            self._sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError as e:
            raise ClockalignError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._sock.bind(addr)
            self._sock.listen(BACKLOG)
        except OSError as e:
            self._sock.close()
            raise ClockalignError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
        self._sock.setblocking(False)
        self.server_address = self._sock.getsockname()
        self._shim = _Shim(self)
        self._idle = {}                # socket -> (deadline, peer) while waiting for its request
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._sock, selectors.EVENT_READ)
        self._work = queue.SimpleQueue()
        self._stop = threading.Event()
        self._cond = threading.Condition()
        self._rendering = set()
        self._rendered = {}            # (content type, gzip) -> (render start ns, headers, bytes)
        self._threads = [threading.Thread(target=self._accept_loop, name="metrics-accept",
                                          daemon=True)]
        self._threads += [threading.Thread(target=self._worker, name=f"metrics-{i}",
                                           daemon=True) for i in range(workers)]
        for t in self._threads:
            t.start()

    # -- connections
    def _accept_loop(self):
        while not self._stop.is_set():
            for key, _ in self._sel.select(TICK_S):
                try:
                    if key.fileobj is self._sock:
                        self._accept()
                    else:
                        self._read_head(key.fileobj)
                except OSError:        # one connection's trouble never stops the serving
                    if key.fileobj is not self._sock and key.fileobj in self._idle:
                        self._close_idle(key.fileobj)
            now = time.monotonic()
            for conn in [c for c, (end, _, _) in self._idle.items() if end <= now]:
                self.idle_closed += 1      # counted before the client can see it closed
                self._close_idle(conn)

    def _accept(self):
        while True:
            try:
                conn, peer = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:            # out of descriptors, a connection reset in the queue
                return
            if len(self._idle) >= self.max_idle:      # the oldest idle one makes room
                self.idle_closed += 1
                self._close_idle(min(self._idle, key=lambda c: self._idle[c][0]))
            conn.setblocking(False)
            self._idle[conn] = (time.monotonic() + self.idle_s, peer, bytearray())
            self._sel.register(conn, selectors.EVENT_READ)

    def _read_head(self, conn):
        """Take what arrived; a complete head (or HEAD_BYTES of one) goes to a worker."""
        _, peer, head = self._idle[conn]
        try:
            got = conn.recv(HEAD_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            got = b""
        head += got
        if got and b"\r\n\r\n" not in head and b"\n\n" not in head and len(head) < HEAD_BYTES:
            return
        self._sel.unregister(conn)
        del self._idle[conn]
        if not head:                   # closed before it asked anything
            conn.close()
            return
        self._work.put((conn, peer, bytes(head), time.monotonic_ns()))

    def _close_idle(self, conn):
        self._sel.unregister(conn)
        del self._idle[conn]
        conn.close()

    def _worker(self):
        while True:
            item = self._work.get()
            if item is None:
                return
            conn, peer, head, arrived = item
            try:
                conn.settimeout(self.idle_s)
                _Handler((conn, head, arrived), peer, self._shim)
            except OSError:            # the client went away or stopped reading
                pass
            finally:
                try:
                    conn.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                conn.close()

    # -- rendering
    def render(self, accept, accept_encoding, names=None, arrived=None):
        """(headers, body) of one scrape whose request was complete at ``arrived`` (MONOTONIC
        ns; default now).  It is answered with the first rendering that started after that,
        shared by every scrape that waited for it."""
        arrived = time.monotonic_ns() if arrived is None else arrived
        encoder, content_type = choose_encoder(accept)
        zipped = gzip_accepted(accept_encoding)
        headers = [("Content-Type", content_type)] + (
            [("Content-Encoding", "gzip")] if zipped else [])
        if names:                      # a filtered scrape (name[]=...) is rendered alone
            out = encoder(self.registry.restricted_registry(names))
            return headers, self._counted(gzip.compress(out) if zipped else out, 1)
        key = (content_type, zipped)
        with self._cond:
            while True:
                done = self._rendered.get(key)
                if done is not None and done[0] >= arrived:
                    return headers, self._counted(done[1], 0)
                if key not in self._rendering:
                    break
                self._cond.wait()
            self._rendering.add(key)
        started = time.monotonic_ns()
        out = None
        try:
            out = encoder(self.registry)
            out = gzip.compress(out) if zipped else out
        finally:
            with self._cond:
                self._rendering.discard(key)
                if out is not None:
                    self._rendered[key] = (started, out)
                self._cond.notify_all()
        return headers, self._counted(out, 1)

    def _counted(self, out, renders):
        with self._cond:
            self.scrapes += 1
            self.renders += renders
            n = self.scrapes
        if self.on_scrape is not None:
            self.on_scrape(n)
        return out

    # -- the end
    def shutdown(self):
        """Stop accepting and serving; the connections waiting are closed."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._threads[0].join()
        for conn in list(self._idle):
            self._close_idle(conn)
        for _ in self._threads[1:]:
            self._work.put(None)
        for t in self._threads[1:]:
            t.join()

    def server_close(self):
        self.shutdown()
        try:
            self._sel.unregister(self._sock)
        except (KeyError, ValueError):
            pass
        self._sel.close()
        self._sock.close()


__all__ = ["MetricsServer", "BACKLOG", "IDLE_S", "WORKERS"]
