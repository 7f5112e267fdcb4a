"""clockalign watch scraped by a real Prometheus, alerting through a real Alertmanager.

The stand-in libcuda's known-count target runs under `clockalign watch` (real BPF); a
Prometheus server (Debian package prometheus) scrapes it every second with the shipped
rules (their `for:` shortened to 1 s so the test is short), an Alertmanager (Debian
prometheus-alertmanager) routes to a webhook receiver in this test.  The target's refused
allocations must reach the receiver as ClockalignAllocationFailures, and /metrics must
count exactly the calls, results, connects and resets the target made.
"""
import collections
import http.server
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from clockalign.workloads.standin import EXPECTED_CALLS, EXPECTED_OOM, MAIN_CALLS, SWEEP_CALLS, \
    expected_call
from clockalign.store import cuda_api
from clockalign.timeline.codes import cuda_result_name
from clockalign.watch.rules import rules_text

from .conftest import clockalign_cmd

PROMETHEUS = shutil.which("prometheus")
ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")


def need_servers():
    if PROMETHEUS and ALERTMANAGER:
        return
    why = ("prometheus and prometheus-alertmanager (Debian packages) are needed; "
           "scripts/setup.sh installs them")
    if os.environ.get("CI"):
        pytest.fail(why)
    pytest.skip(why)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url, timeout, proc=None, contains=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"{proc.args[0]} exited with {proc.returncode}: "
                                 f"{proc.stderr.read() if proc.stderr else ''}")
        try:
            body = urllib.request.urlopen(url, timeout=2).read().decode()
            if contains is None or contains in body:
                return body
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{url} did not answer{' with ' + contains if contains else ''} "
                         f"within {timeout} s")


class Receiver(http.server.BaseHTTPRequestHandler):
    posts = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        Receiver.posts.append(json.loads(body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *a):
        pass


def expected_results():
    """{(function, result name): calls} the target makes (stand-in's known counts)."""
    out = collections.Counter()
    for sym, n in MAIN_CALLS.items():
        out[(sym, "CUDA_SUCCESS")] += n
    out[("cuMemAlloc_v2", "CUDA_SUCCESS")] -= EXPECTED_OOM
    out[("cuMemAlloc_v2", "CUDA_ERROR_OUT_OF_MEMORY")] += EXPECTED_OOM
    for sym, n in SWEEP_CALLS.items():
        f = cuda_api.BY_SYMBOL[sym]
        for i in range(n):
            out[(sym, cuda_result_name(expected_call(f, i)["ret"]))] += 1
    return out


def samples(text):
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def wait_for_alert(name, timeout=45):
    """The firing alerts called name that reached the webhook receiver (asserts some did)."""
    deadline = time.monotonic() + timeout
    firing = []
    while time.monotonic() < deadline and not firing:
        firing = [a for post in Receiver.posts for a in post["alerts"]
                  if a["labels"]["alertname"] == name and a["status"] == "firing"]
        time.sleep(0.25)
    assert firing, f"no {name} at the receiver: {Receiver.posts}"
    return firing


@pytest.fixture
def servers(tmp_path):
    need_servers()
    ports = {k: free_port() for k in ("watch", "prom", "am", "hook")}
    Receiver.posts = []
    hook = http.server.ThreadingHTTPServer(("127.0.0.1", ports["hook"]), Receiver)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    (tmp_path / "am.yml").write_text(f"""
route: {{receiver: hook, group_wait: 1s, group_interval: 1s, repeat_interval: 1h,
         group_by: [alertname]}}
receivers:
  - name: hook
    webhook_configs: [{{url: "http://127.0.0.1:{ports['hook']}/", send_resolved: false}}]
""")
    rules = re.sub(r"for: \d+[smh]", "for: 1s", rules_text())
    (tmp_path / "rules.yml").write_text(rules)
    (tmp_path / "prom.yml").write_text(f"""
global: {{scrape_interval: 1s, evaluation_interval: 1s}}
rule_files: ["{tmp_path / 'rules.yml'}"]
alerting:
  alertmanagers: [{{static_configs: [{{targets: ["127.0.0.1:{ports['am']}"]}}]}}]
scrape_configs:
  - job_name: clockalign
    static_configs: [{{targets: ["127.0.0.1:{ports['watch']}"]}}]
""")
    procs = [
        subprocess.Popen([ALERTMANAGER, f"--config.file={tmp_path / 'am.yml'}",
                          f"--storage.path={tmp_path / 'am'}",
                          f"--web.listen-address=127.0.0.1:{ports['am']}",
                          "--cluster.listen-address="],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True),
        subprocess.Popen([PROMETHEUS, f"--config.file={tmp_path / 'prom.yml'}",
                          f"--storage.tsdb.path={tmp_path / 'prom'}",
                          f"--web.listen-address=127.0.0.1:{ports['prom']}"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True),
    ]
    try:
        wait_http(f"http://127.0.0.1:{ports['am']}/-/ready", 30, procs[0])
        wait_http(f"http://127.0.0.1:{ports['prom']}/-/ready", 30, procs[1])
        yield ports
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        hook.shutdown()
        hook.server_close()


def test_allocation_failures_page_through_prometheus_and_alertmanager(fakecuda, servers):
    t_start = time.monotonic()
    lsn = socket.socket()
    lsn.bind(("127.0.0.1", 0))
    lsn.listen(4)
    closed = free_port()
    env = dict(os.environ, LD_LIBRARY_PATH=str(fakecuda))
    watch = subprocess.Popen(clockalign_cmd(
        "watch", "--listen", f"127.0.0.1:{servers['watch']}", "--counters", "none",
        "--no-gpu-clock", "--quiet", "--", str(fakecuda / "target"), "--connect",
        str(lsn.getsockname()[1]), str(closed), "--hang-ms", "60000"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        info = json.loads(watch.stdout.readline())      # the target printed its counts
        pid = str(info["pid"])
        url = f"http://127.0.0.1:{servers['watch']}/metrics"
        # the last calls have reached /metrics once the connects have
        text = wait_http(url, 30, watch, contains='result="ECONNREFUSED"')
        m = samples(text)
        got = {(dict(k)["function"], dict(k)["result"]): v for (name, k), v in m.items()
               if name == "clockalign_cuda_calls_total" and dict(k)["pid"] == pid}
        assert got == {k: v for k, v in expected_results().items() if v}
        per_fn = collections.Counter()
        for (fn, _), v in got.items():
            per_fn[fn] += v
        assert per_fn == EXPECTED_CALLS
        count = {dict(k)["function"]: v for (name, k), v in m.items()
                 if name == "clockalign_cuda_call_duration_seconds_count"}
        assert count == EXPECTED_CALLS
        fails = {dict(k)["function"]: v for (name, k), v in m.items()
                 if name == "clockalign_alloc_failures_total"}
        assert fails == {fn: v for (fn, r), v in got.items() if r != "CUDA_SUCCESS"
                         and cuda_api.BY_SYMBOL[fn].allocates}
        assert fails["cuMemAlloc_v2"] == EXPECTED_OOM
        peer_ok = f"127.0.0.1:{lsn.getsockname()[1]}"
        assert m[("clockalign_connect_total", (("peer", peer_ok), ("pid", pid),
                                               ("result", "ok")))] == 1
        assert m[("clockalign_connect_total", (("peer", f"127.0.0.1:{closed}"), ("pid", pid),
                                               ("result", "ECONNREFUSED")))] == 1
        # the refused connect is answered by a reset, received on the target's socket
        assert m[("clockalign_tcp_resets_total", (("direction", "received"),
                                                  ("pid", pid)))] == 1
        module_loads = sum(v for fn, v in EXPECTED_CALLS.items()
                           if cuda_api.BY_SYMBOL[fn].role == "module")
        assert m[("clockalign_module_load_duration_seconds_count", ())] == module_loads
        assert m[("clockalign_probes_armed", ())] == 1
        assert not any(n == "clockalign_events_dropped_total" and v for (n, _), v in m.items())

        # the alert: Prometheus scrapes, evaluates the shipped rule, Alertmanager posts
        firing = wait_for_alert("ClockalignAllocationFailures")
        fns = {a["labels"]["function"] for a in firing}
        assert "cuMemAlloc_v2" in fns and fns <= set(fails)
        a = firing[0]
        assert a["labels"]["pid"] == pid and a["labels"]["severity"] == "warning"
        assert a["labels"]["job"] == "clockalign"
        assert "Out of memory comes before an OOM crash" in a["annotations"]["description"]
        # nothing on this host should raise the others (no GPU: no fragmentation verdicts)
        others = {a["labels"]["alertname"] for post in Receiver.posts for a in post["alerts"]}
        assert others == {"ClockalignAllocationFailures"}, others
    finally:
        if watch.poll() is None:
            os.kill(watch.pid, signal.SIGTERM)
        out, err = watch.communicate(timeout=30)
        lsn.close()
    assert watch.returncode == 0, err
    assert "stopped by SIGTERM" in err and "Traceback" not in err
    assert time.monotonic() - t_start < 90


def test_a_sticky_cuda_error_pages_as_a_lost_context(fakecuda, servers):
    """The target's launches answer 700 (CUDA_ERROR_ILLEGAL_ADDRESS) three times: the shipped
    ClockalignCudaContextLost reaches the receiver with the pid and the result."""
    env = dict(os.environ, LD_LIBRARY_PATH=str(fakecuda))
    watch = subprocess.Popen(clockalign_cmd(
        "watch", "--listen", f"127.0.0.1:{servers['watch']}", "--counters", "none",
        "--no-gpu-clock", "--quiet", "--", str(fakecuda / "target"), "--sticky", "3",
        "--hang-ms", "60000"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=env)
    try:
        pid = str(json.loads(watch.stdout.readline())["pid"])
        url = f"http://127.0.0.1:{servers['watch']}/metrics"
        text = wait_http(url, 30, watch, contains='result="CUDA_ERROR_ILLEGAL_ADDRESS"')
        m = samples(text)
        assert m[("clockalign_cuda_calls_total", (("function", "cuLaunchKernel"), ("pid", pid),
                                                  ("result", "CUDA_ERROR_ILLEGAL_ADDRESS")))] == 3
        lost = wait_for_alert("ClockalignCudaContextLost")
        a = lost[0]
        assert (a["labels"]["pid"], a["labels"]["result"], a["labels"]["severity"]) == (
            pid, "CUDA_ERROR_ILLEGAL_ADDRESS", "critical")
        assert "context cannot be used any more" in a["annotations"]["description"]
    finally:
        if watch.poll() is None:
            os.kill(watch.pid, signal.SIGTERM)
        _, err = watch.communicate(timeout=30)
    assert watch.returncode == 0, err
