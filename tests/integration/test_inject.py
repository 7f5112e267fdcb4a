"""`clockalign inject` for real: root, real BPF recording the session, the reference
service on loopback with ONNX Runtime (CPU), Locust load, small N; bad input; Ctrl-C; the
V2 driver against MLServer (a V2 server clockalign did not write)."""
import json
import os
import shutil
import signal
import subprocess
import time

import pytest

from clockalign.inject.run import free_port
from clockalign.timeline import Timeline

from .conftest import clockalign_cmd, run_clockalign

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MLSERVER = os.path.join(REPO, ".venv-mlserver", "bin", "mlserver")
MODEL_DIR = os.path.join(os.path.dirname(__file__), "mlserver_model")
ROW_KEYS = {"engine", "fault", "n", "detect_ms", "recover_ms", "total_ms", "deadline_ms",
            "pass", "segments"}


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(REPO, "agent") + (
        ":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _rows(out):
    with open(os.path.join(out, "lifecycle.json")) as f:
        doc = json.load(f)
    assert list(doc) == ["rows"]
    return {(r["engine"], r["fault"]): r for r in doc["rows"]}


def test_onnxruntime_faults_recorded(tmp_path):
    out = str(tmp_path / "out")
    r = run_clockalign("inject", "--engine", "onnxruntime", "--fault", "invalid-input",
                       "--fault", "timeout", "--fault", "oom", "-n", "3", "--load", "2",
                       "--deadline-ms", "500", "-o", out, env=_env(), timeout=280)
    assert r.returncode == 0, r.stderr
    rows = _rows(out)
    assert set(rows) == {("onnxruntime", f) for f in ("invalid-input", "timeout", "oom")}
    for (engine, fault), row in rows.items():
        assert set(row) == ROW_KEYS
        assert row["n"] == 3, row
        assert row["detect_ms"]["p50"] <= row["detect_ms"]["p99"]
        assert row["pass"] == (row["total_ms"]["p99"] <= 2800)   # the oom one parses 8 MB
        run = os.path.join(out, f"{engine}-{fault}.ca")
        tl = Timeline.open(run)
        assert tl.truncated is None and tl.reader.trailer["reason"] == "target exited"
        assert os.path.getsize(os.path.join(out, f"{engine}-{fault}.pftrace")) > 1000
        with open(os.path.join(out, f"{engine}-{fault}", "load.json")) as f:
            load = json.load(f)
        assert load["generator"] == "locust" and load["requests"] > 0
    t = rows[("onnxruntime", "timeout")]
    names = [s["name"] for s in t["segments"]]
    assert "request sent -> request accepted" in names
    assert any(n.startswith("watchdog wakeup -> ") for n in names)
    dog = next(s for s in t["segments"] if s["name"].endswith("-> watchdog wakeup"))
    assert dog["p50_ms"] >= 500                       # the watchdog's own deadline
    assert t["detect_ms"]["p50"] >= 500
    with open(os.path.join(out, "lifecycle-detail.json")) as f:
        detail = json.load(f)["onnxruntime/timeout"]
    assert detail["sources"]["worker exit"] == ["sched_process_exit tracepoint"]
    assert detail["sources"]["kill sent"] == ["signal_generate tracepoint"]
    assert rows[("onnxruntime", "invalid-input")]["pass"] is True
    assert rows[("onnxruntime", "invalid-input")]["recover_ms"]["p99"] < 1000
    md = open(os.path.join(out, "lifecycle.md")).read()
    assert "| onnxruntime | timeout | 3 |" in md


@pytest.mark.parametrize("args,says", [
    (["--engine", "tensorrt", "--fault", "oom"], "Invalid value for '--engine'"),
    (["--engine", "onnxruntime", "--fault", "segfault"], "Invalid value for '--fault'"),
    (["--engine", "v2", "--fault", "oom"], "give its --url"),
    (["--engine", "onnxruntime", "--fault", "illegal-address"], "needs a GPU engine"),
    (["--engine", "onnxruntime", "--fault", "oom", "--device", "cuda"], "needs a GPU engine"),
    (["--engine", "v2", "--url", "http://127.0.0.1:{closed}", "--fault", "oom"],
     "no V2 server answers at http://127.0.0.1:"),
    (["--engine", "v2", "--url", "http://127.0.0.1:{closed}", "--fault", "timeout"],
     "needs the reference service"),
    (["--engine", "onnxruntime", "--url", "http://127.0.0.1:1", "--fault", "oom"],
     "--url is for --engine v2"),
    (["--engine", "onnxruntime", "--fault", "oom", "--port", "{busy}"], "is in use"),
    (["--engine", "onnxruntime", "--fault", "oom", "-n", "0"], "-n must be at least 1"),
])
def test_bad_input_is_one_sentence(tmp_path, args, says):
    import socket
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    closed = free_port(0)
    args = [a.format(busy=busy.getsockname()[1], closed=closed) for a in args]
    try:
        r = run_clockalign("inject", *args, "-o", str(tmp_path / "o"), env=_env(), timeout=60)
    finally:
        busy.close()
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert says in r.stderr and "Traceback" not in r.stderr
    assert not os.path.exists(tmp_path / "o" / "lifecycle.json")


def test_output_on_a_read_only_mount_is_one_sentence(tmp_path):
    """-o an existing directory (and one below it) on a tmpfs mounted read-only."""
    ro = tmp_path / "ro"
    ro.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)], check=True)
    try:
        for out in (ro, ro / "below"):
            r = run_clockalign("inject", "--engine", "onnxruntime", "--fault", "invalid-input",
                               "-o", str(out), env=_env(), timeout=60)
            lines = r.stderr.strip().splitlines()
            assert r.returncode == 2 and len(lines) == 1, r.stderr
            assert lines[0] == f"clockalign: -o {out}: cannot write there (Read-only file system)"
    finally:
        subprocess.run(["umount", str(ro)], check=True)


def _ours(marker):
    """Processes whose command line or environment names ``marker``."""
    found = []
    for p in os.listdir("/proc"):
        if not p.isdigit() or int(p) == os.getpid():
            continue
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if marker.encode() in cmd:
            found.append((int(p), cmd.replace(b"\0", b" ")[:120]))
    return found


def test_ctrl_c_leaves_no_child(tmp_path):
    out = str(tmp_path / "interrupted")
    proc = subprocess.Popen(clockalign_cmd("inject", "--engine", "onnxruntime", "--fault",
                                           "timeout", "-n", "50", "--load", "2", "-o", out),
                            env=_env(), start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    events = os.path.join(out, "onnxruntime-timeout", "events.jsonl")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if os.path.exists(events) and '"watchdog_fired"' in open(events).read():
            break
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    else:
        pytest.fail("the session never reached a fault")
    assert len(_ours(out)) >= 4          # session, service, worker, load
    os.killpg(proc.pid, signal.SIGINT)   # what Ctrl-C in a terminal does
    stdout, stderr = proc.communicate(timeout=90)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    time.sleep(0.5)
    assert _ours(out) == []
    assert Timeline.open(os.path.join(out, "onnxruntime-timeout.ca")).reader.trailer is not None


@pytest.fixture
def mlserver(tmp_path):
    if not os.path.exists(MLSERVER):
        reason = f"MLServer is not installed at {MLSERVER} (scripts/setup.sh makes it)"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    d = tmp_path / "models"
    shutil.copytree(MODEL_DIR, d)
    port, grpc, metrics = free_port(0), free_port(0), free_port(0)
    (d / "settings.json").write_text(json.dumps({
        "host": "127.0.0.1", "http_port": port, "grpc_port": grpc, "metrics_port": metrics,
        "parallel_workers": 0, "debug": False}))
    log = open(tmp_path / "mlserver.log", "w")
    proc = subprocess.Popen([MLSERVER, "start", str(d)], cwd=str(d), stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    from clockalign.inject.driver import Driver
    drv = Driver(f"http://127.0.0.1:{port}")
    end = time.monotonic() + 120
    while not drv.ready_once():
        if proc.poll() is not None or time.monotonic() > end:
            log.close()
            pytest.fail("MLServer did not start: " + (tmp_path / "mlserver.log").read_text()[-2000:])
        time.sleep(0.2)
    drv.close()
    yield f"http://127.0.0.1:{port}"
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    log.close()


def test_v2_driver_against_mlserver(tmp_path, mlserver):
    out = str(tmp_path / "v2")
    r = run_clockalign("inject", "--engine", "v2", "--url", mlserver, "--fault",
                       "invalid-input", "-n", "3", "--load", "1", "-o", out, env=_env(),
                       timeout=200)
    assert r.returncode == 0, r.stderr
    rows = _rows(out)
    (engine, fault), row = next(iter(rows.items()))
    assert engine == "v2 (summer)" and fault == "invalid-input"
    assert row["n"] == 3 and row["pass"] is True
    with open(os.path.join(out, "v2-invalid-input", "client.json")) as f:
        client = json.load(f)
    assert client["model"] == "summer"                  # from MLServer's repository index
    statuses = [rep["status"] for rep in client["repetitions"]]
    assert all(s >= 400 for s in statuses), statuses
    seg = [s["name"] for s in row["segments"]]
    assert seg == ["request sent -> error answer", "error answer -> ready answer"]
    tl = Timeline.open(os.path.join(out, "v2-invalid-input.ca"))
    conns = tl.events(kinds=["connect"])
    assert len(conns) >= 3                               # the client's fresh connections
