"""The reference service for real, on loopback (no root needed): the model built in code,
its ONNX bytes checked by the onnx package, strict validation, the watchdog and the
supervisor's restart, the V2 driver's stamps."""
import json
import math
import subprocess
import sys
import time

import numpy as np
import pytest

from clockalign.inject import faults, model
from clockalign.inject.driver import Driver
from clockalign.inject.eventlog import read_events
from clockalign.inject.run import free_port
from clockalign.inject.service import Invalid, parse_request

ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")


def test_onnx_bytes_are_a_valid_model_and_match_numpy():
    onnx = pytest.importorskip("onnx", reason="the onnx package checks the hand-written bytes")
    w = model.weights()
    data = model.onnx_model(w)
    onnx.checker.check_model(onnx.load_from_string(data), full_check=True)
    s = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(3).random((2, 37, 2), dtype=np.float32)
    for steps in (1, 4):
        y = s.run(None, {"points": x, "steps": np.array([steps])})[0]
        np.testing.assert_allclose(y, model.forward_numpy(w, x, steps), atol=1e-5)


def _req(data, shape, datatype="FP32", rid="r1", extra=()):
    return json.dumps({"id": rid, "inputs": [{"name": "points", "datatype": datatype,
                                              "shape": shape, "data": data}, *extra]}).encode()


@pytest.mark.parametrize("body,why", [
    (_req([0.1, math.nan], [1, 1, 2]), "holds NaN"),
    (_req([0.1, math.inf], [1, 1, 2]), "holds Inf"),
    (_req([0.1, 0.2, 0.3], [1, 1, 3]), r"shape \[B, L, 2\]"),
    (_req([0.1, 0.2], [1, 2, 2]), "2 values for shape"),
    (_req([1, 2], [1, 1, 2], datatype="INT64"), "must be FP32"),
    (_req([0.1, 0.2], [1, 1, 2], extra=[{"name": "steps", "datatype": "INT64", "shape": [1],
                                         "data": [0]}]), "at least 1"),
    (b'{"inputs": [{"name": "other"}]}', "unknown input"),
    (b"{not json", "not JSON"),
])
def test_strict_validation(body, why):
    with pytest.raises(Invalid, match=why):
        parse_request(body)


def test_valid_request_parses():
    points, steps, rid = parse_request(faults.normal_request({"name": "pointset",
                                                              "inputs": _META_INPUTS}))
    assert points.shape == (1, faults.NORMAL_POINTS, 2) and steps == 1 and rid is None
    assert (points >= 0).all() and (points < 1).all()


_META_INPUTS = [{"name": "points", "datatype": "FP32", "shape": [-1, -1, 2]},
                {"name": "steps", "datatype": "INT64", "shape": [1]}]


def test_fault_requests():
    meta = {"name": "pointset", "inputs": _META_INPUTS}
    kinds = []
    for i in range(3):
        with pytest.raises(Invalid) as e:
            parse_request(faults.FAULTS["invalid-input"].request(meta, i))
        kinds.append(str(e.value))
        assert e.value.rid == f"inject-{i}"
    assert "NaN" in kinds[0] and "Inf" in kinds[1] and "shape" in kinds[2]
    p, steps, rid = parse_request(faults.FAULTS["timeout"].request(meta, 0))
    assert steps == faults.HANG_STEPS
    p, steps, rid = parse_request(faults.FAULTS["oom"].request(meta, 0))
    assert p.shape == (faults.OOM_BATCH, faults.OOM_POINTS, 2)
    p, _, _ = parse_request(faults.FAULTS["illegal-address"].request(meta, 0))
    assert p.max() == faults.FAR_POINT and np.isfinite(p).all()
    # another V2 model: NaN in its float input, a wrong element count
    other = {"name": "m", "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]}
    bodies = [json.loads(faults.FAULTS["invalid-input"].request(other, i)) for i in range(3)]
    assert math.isnan(bodies[0]["inputs"][0]["data"][0])
    assert len(bodies[2]["inputs"][0]["data"]) == 5


@pytest.fixture
def service(tmp_path):
    port = free_port(0)
    events = str(tmp_path / "events.jsonl")
    proc = subprocess.Popen([sys.executable, "-m", "clockalign.inject.service", "--engine",
                             "onnxruntime", "--port", str(port), "--deadline-ms", "300",
                             "--events", events])
    d = Driver(f"http://127.0.0.1:{port}", "pointset")
    t_end = time.monotonic() + 60
    while not d.ready_once():
        assert proc.poll() is None and time.monotonic() < t_end, "service did not start"
        time.sleep(0.05)
    yield d, events
    proc.terminate()
    proc.wait(20)


def test_service_answers_faults_and_recovers(service):
    d, events = service
    meta = d.metadata()
    assert [i["name"] for i in meta["inputs"]] == ["points", "steps"]
    assert meta["parameters"]["device"] == "cpu"
    status, body = d.get("/v2/health/live")
    assert status == 200
    t_send, t_sent, t_answer, status, text = d.infer(faults.normal_request(meta))
    assert status == 200 and t_send <= t_sent <= t_answer
    pts = np.asarray(json.loads(faults.normal_request(meta))["inputs"][0]["data"],
                     dtype=np.float32).reshape(1, -1, 2)
    out = json.loads(text)["outputs"][0]
    np.testing.assert_allclose(np.asarray(out["data"]).reshape(out["shape"]),
                               model.forward_numpy(model.weights(), pts), atol=1e-5)
    rep = d.repetition(faults.FAULTS["invalid-input"].request(meta, 0))
    assert rep["status"] == 400 and "NaN" in rep["error"] and rep["polls"] == 1
    rep = d.repetition(faults.FAULTS["timeout"].request(meta, 1))
    assert rep["status"] == 504 and "deadline" in rep["error"]
    assert rep["t_answer_ns"] - rep["t_send_ns"] >= 300_000_000
    assert rep["t_ready_ns"] > rep["t_answer_ns"] and rep["polls"] > 1
    ev = [r["ev"] for r in read_events(events)]
    for e in ("accepted", "watchdog_fired", "kill_sent", "worker_exit", "restart"):
        assert e in ev
    assert ev.count("worker_spawn") == 2 and ev.count("ready") == 2
    status, _, _, status, _ = d.infer(faults.normal_request(meta))
    assert status == 200


def test_driver_says_when_no_server_answers():
    from clockalign.errors import ClockalignError
    port = free_port(0)
    with pytest.raises(ClockalignError, match="no V2 server answers"):
        Driver(f"http://127.0.0.1:{port}").check_live()


def test_thread_pool_load_is_bounded_and_counts(service, tmp_path):
    d, _ = service
    body = tmp_path / "req.json"
    body.write_bytes(faults.normal_request(d.metadata()))
    out = tmp_path / "load.json"
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "clockalign.inject.load", "--url", d.url,
                        "--model", "pointset", "--users", "2", "--body", str(body),
                        "--max-seconds", "1.5", "--generator", "threads", "--out", str(out)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert time.monotonic() - t0 < 20
    s = json.loads(out.read_text())
    assert s["generator"] == "threads" and s["users"] == 2
    assert s["requests"] == s["ok"] + sum(s["failures"].values()) and s["ok"] > 5
    # a user waits USER_WAIT_S between requests: at most 2 users x 1.5 s / 50 ms of them
    assert s["requests"] <= 2 * (1.5 / 0.05 + 1)


def test_load_goes_to_loopback_only(tmp_path):
    body = tmp_path / "req.json"
    body.write_bytes(b"{}")
    r = subprocess.run([sys.executable, "-m", "clockalign.inject.load", "--url",
                        "http://192.0.2.1:8000", "--model", "m", "--users", "1", "--body",
                        str(body), "--out", str(tmp_path / "l.json")],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "loopback only" in r.stderr
    assert not (tmp_path / "l.json").exists()


def test_a_worker_that_cannot_start_ends_the_service(tmp_path):
    events = str(tmp_path / "events.jsonl")
    proc = subprocess.run([sys.executable, "-m", "clockalign.inject.service", "--engine",
                           "onnxruntime", "--device", "cuda", "--port", str(free_port(0)),
                           "--events", events], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1      # after saying why in its log
    ev = {r["ev"]: r for r in read_events(events)}
    assert "CUDAExecutionProvider" in ev["worker_failed"]["message"]
    assert "CUDAExecutionProvider" in ev["service_gives_up"]["why"]
    assert ev["worker_spawn"] and "ready" not in ev
