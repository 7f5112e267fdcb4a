"""The client of a fault's life cycle: per repetition, inject the fault through a real
request and stamp, on CLOCK_MONOTONIC (time.monotonic_ns, the recording's clock), the
request's send, the first (error) answer and the first ready answer, polling
/v2/health/ready every 50 ms.  It speaks plain KServe V2 over HTTP, so it drives the
reference service and any other V2 server (Triton, MLServer) alike.

    d = Driver("http://127.0.0.1:8000", "pointset"); meta = d.metadata()
    rep = d.repetition(body)     # {"t_send_ns", "t_sent_ns", "t_answer_ns", "status", ...}
"""
import http.client
import json
import time
import urllib.parse

from ..errors import ClockalignError

POLL_NS = 50_000_000
READY_TIMEOUT_S = 300
ANSWER_TIMEOUT_S = 300


def split_url(url: str):
    """(host, port) of an http://HOST:PORT URL; anything else is one sentence."""
    try:
        u = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
        host, port = u.hostname, u.port
    except ValueError as e:               # a port out of range, an unclosed [IPv6 address
        raise ClockalignError(f"--url {url}: {e}; give http://HOST:PORT") from None
    if u.scheme != "http" or not host or port == 0:
        raise ClockalignError(f"--url {url}: give http://HOST:PORT")
    return host, port or 80


class Driver:
    def __init__(self, url: str, model: str = None):
        self.url = url
        self.host, self.port = split_url(url)
        self.model = model
        self._health = None

    def _conn(self, timeout=ANSWER_TIMEOUT_S):
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def get(self, path, timeout=10.0, method="GET", body=None):
        """(status, body bytes) of one request on its own connection; no answer, or one
        that is not HTTP, is one sentence."""
        c = self._conn(timeout)
        try:
            c.request(method, path, body=body, headers={"Content-Type": "application/json"}
                      if body is not None else {})
            r = c.getresponse()
            return r.status, r.read()
        except (OSError, http.client.HTTPException) as e:
            why = getattr(e, "strerror", None) or str(e) or type(e).__name__
            raise ClockalignError(f"no V2 server answers at {self.url} ({why})") from None
        finally:
            c.close()

    def _json(self, path, status, body):
        """The JSON answer of ``path``; a server that answers something else is one sentence."""
        try:
            return json.loads(body)
        except ValueError:
            text = body[:60].decode(errors="replace")
            raise ClockalignError(f"{self.url}{path} answered {status} with {text!r}, not "
                                  "JSON: is this a KServe V2 server?") from None

    def check_live(self):
        status, _ = self.get("/v2/health/live", timeout=5)
        if status != 200:
            raise ClockalignError(f"{self.url}/v2/health/live answered {status}: not live")

    def pick_model(self) -> str:
        """--model, or the first READY model of the repository index (Triton, MLServer)."""
        if self.model:
            return self.model
        status, body = self.get("/v2/repository/index", method="POST", body=b"{}")
        models = self._json("/v2/repository/index", status, body) if status == 200 else []
        ready = [m["name"] for m in models if isinstance(m, dict) and "name" in m
                 and str(m.get("state", "READY")).upper() == "READY"] \
            if isinstance(models, list) else []
        if not ready:
            raise ClockalignError(f"{self.url} lists no ready model; name one with --model")
        self.model = ready[0]
        return self.model

    def metadata(self) -> dict:
        """The model's V2 metadata: an object whose inputs each have a name."""
        path = f"/v2/models/{self.pick_model()}"
        status, body = self.get(path)
        if status != 200:
            raise ClockalignError(f"{self.url} has no model {self.model!r} "
                                  f"(metadata answered {status})")
        meta = self._json(path, status, body)
        inputs = meta.get("inputs") if isinstance(meta, dict) else None
        if not inputs or not isinstance(inputs, list) or not all(
                isinstance(t, dict) and "name" in t and isinstance(t.get("shape", []), list)
                and all(isinstance(n, int) for n in t.get("shape", [])) for t in inputs):
            raise ClockalignError(f"{self.url}{path} is not V2 model metadata (no inputs "
                                  "with a name and an integer shape)")
        return meta

    def ready_once(self) -> bool:
        """One readiness poll on a kept-alive connection; a refused connection is not ready."""
        try:
            if self._health is None:
                self._health = self._conn(5)
            self._health.request("GET", "/v2/health/ready")
            r = self._health.getresponse()
            r.read()
            return r.status == 200
        except (OSError, http.client.HTTPException):
            if self._health is not None:
                self._health.close()
            self._health = None
            return False

    def wait_ready(self, timeout_s=READY_TIMEOUT_S):
        """Poll every 50 ms -> (MONOTONIC ns of the first ready answer, polls)."""
        return _poll(self.ready_once, timeout_s)

    def standby_ready(self) -> int:
        """How many standby workers the reference service says are ready (-1: no answer)."""
        try:
            status, body = self.get(f"/v2/models/{self.model}")
            return json.loads(body)["parameters"].get("standby_ready", 0) if status == 200 \
                else -1
        except (OSError, http.client.HTTPException, ValueError, KeyError, TypeError):
            return -1

    def wait_standby(self, n: int, timeout_s=READY_TIMEOUT_S):
        """Poll the model metadata every 50 ms until ``n`` standby workers are ready ->
        MONOTONIC ns of that answer (None: not within timeout_s)."""
        return _poll(lambda: self.standby_ready() >= n, timeout_s)[0]

    def infer(self, body: bytes):
        """One request on a fresh connection (its connect() is in the recording) ->
        (t_send, t_sent, t_answer, status, answer text)."""
        c = self._conn()
        try:
            c.connect()
            t_send = time.monotonic_ns()
            c.request("POST", f"/v2/models/{self.model}/infer", body=body,
                      headers={"Content-Type": "application/json"})
            t_sent = time.monotonic_ns()
            r = c.getresponse()
            t_answer = time.monotonic_ns()
            text = r.read()
            return t_send, t_sent, t_answer, r.status, text
        finally:
            c.close()

    def repetition(self, body: bytes) -> dict:
        try:
            t_send, t_sent, t_answer, status, text = self.infer(body)
        except (OSError, http.client.HTTPException) as e:
            t_answer = time.monotonic_ns()
            return {"t_send_ns": None, "t_answer_ns": t_answer, "status": None,
                    "error": f"request failed: {e}", "t_ready_ns": None, "polls": 0}
        try:
            err = json.loads(text).get("error") if status >= 400 else None
        except (ValueError, AttributeError):
            err = text[:200].decode(errors="replace")
        t_ready, polls = self.wait_ready()
        return {"t_send_ns": t_send, "t_sent_ns": t_sent, "t_answer_ns": t_answer,
                "status": status, "error": err, "t_ready_ns": t_ready, "polls": polls}

    def close(self):
        if self._health is not None:
            self._health.close()
            self._health = None


def _poll(check, timeout_s):
    """Call ``check`` every 50 ms until it is true -> (MONOTONIC ns after the true answer,
    calls); (None, calls) after timeout_s."""
    polls = 0
    end = time.monotonic_ns() + int(timeout_s * 1e9)
    while True:
        t0 = time.monotonic_ns()
        polls += 1
        if check():
            return time.monotonic_ns(), polls
        if t0 > end:
            return None, polls
        left = t0 + POLL_NS - time.monotonic_ns()
        if left > 0:
            time.sleep(left / 1e9)
