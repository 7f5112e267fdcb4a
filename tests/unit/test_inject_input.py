"""inject's bad input is one sentence and exit 2, never a traceback (issue 24): URLs that do
not parse, an output directory that cannot be written, a server on loopback that answers
something other than KServe V2 JSON — in the command and in the recorded child session."""
import http.server
import os
import subprocess
import sys
import threading

import pytest

from clockalign.errors import ClockalignError
from clockalign.inject.driver import Driver, split_url

CMD = [sys.executable, "-m", "clockalign.cli.main", "inject"]


class _Text(http.server.BaseHTTPRequestHandler):
    """A web server that is not a V2 server: every path answers 200 with plain text."""
    answer = b"hello, this is not JSON\n"

    def _send(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(self.answer)))
        self.end_headers()
        self.wfile.write(self.answer)

    do_GET = do_POST = _send

    def log_message(self, *a):
        pass


class _Json(_Text):
    """Answers JSON that is not V2 model metadata: a model list, then a bare string."""
    def _send(self):
        self.answer = (b'[{"name": "m", "state": "READY"}]' if self.path.endswith("index")
                       else b'"just a string"')
        super()._send()

    do_GET = do_POST = _send


@pytest.fixture(params=[_Text, _Json], ids=["plain-text", "json-not-v2"])
def not_v2(request):
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), request.param)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def _env():
    env = dict(os.environ)
    agent = os.path.join(os.path.dirname(__file__), "..", "..", "agent")
    env["PYTHONPATH"] = os.path.abspath(agent) + ":" + env.get("PYTHONPATH", "")
    return env


def _one_sentence(p, says):
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert "Traceback" not in p.stderr and len(lines) == 1, p.stderr
    assert says in lines[0], lines[0]


@pytest.mark.parametrize("url,says", [
    ("http://127.0.0.1:99999", "Port out of range"),
    ("http://[::1", "Invalid IPv6 URL"),
    ("http://127.0.0.1:0", "give http://HOST:PORT"),
    ("ftp://127.0.0.1:21", "give http://HOST:PORT"),
    ("http://127.0.0.1:x", "give http://HOST:PORT"),
])
def test_url_that_does_not_parse(url, says, tmp_path):
    with pytest.raises(ClockalignError, match="give http://HOST:PORT"):
        split_url(url)
    p = subprocess.run(CMD + ["--engine", "v2", "--fault", "invalid-input", "--url", url,
                              "-o", str(tmp_path / "o")], capture_output=True, text=True,
                       env=_env(), timeout=60)
    _one_sentence(p, says)


def test_server_that_is_not_v2_is_refused_before_recording(not_v2, tmp_path):
    with pytest.raises(ClockalignError, match="not JSON|not V2 model metadata"):
        Driver(not_v2).metadata()
    p = subprocess.run(CMD + ["--engine", "v2", "--fault", "invalid-input", "--url", not_v2,
                              "-o", str(tmp_path / "o")], capture_output=True, text=True,
                       env=_env(), timeout=60)
    _one_sentence(p, not_v2)
    assert not os.path.exists(tmp_path / "o" / "lifecycle.json")


def test_child_session_against_a_server_that_is_not_v2(not_v2, tmp_path):
    """The recorded session meets the same server (it may have changed since the check)."""
    p = subprocess.run([sys.executable, "-m", "clockalign.inject.session", "--engine", "v2",
                        "--url", not_v2, "--fault", "invalid-input", "-n", "1",
                        "--work", str(tmp_path / "w")], capture_output=True, text=True,
                       env=_env(), timeout=60)
    _one_sentence(p, not_v2)


def test_output_that_is_a_file(tmp_path):
    f = tmp_path / "taken"
    f.write_text("x")
    for out in (f, f / "below"):
        p = subprocess.run(CMD + ["--engine", "v2", "--fault", "invalid-input", "--url",
                                  "http://127.0.0.1:1", "-o", str(out)],
                           capture_output=True, text=True, env=_env(), timeout=60)
        _one_sentence(p, f"-o {out}: cannot write there")
