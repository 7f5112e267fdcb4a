"""`clockalign inject --standby 1` for real (root, BPF recording): ONNX Runtime (CPU), the
timeout fault, n=5 under load, and the cold restart measured beside it in the same output
folder: with a standby the service is ready again within 120 ms (p99), below the cold
restart; the table tells the two recoveries apart."""
import json
import os

from .conftest import run_clockalign
from .test_inject import _env

N = "5"
COMMON = ["--engine", "onnxruntime", "--fault", "timeout", "-n", N, "--load", "1",
          "--deadline-ms", "300", "--no-export"]


def test_a_standby_recovers_a_timeout_faster_than_a_cold_restart(tmp_path):
    out = str(tmp_path / "out")
    for extra in ([], ["--standby", "1"]):
        r = run_clockalign("inject", *COMMON, *extra, "-o", out, env=_env(), timeout=240)
        assert r.returncode == 0, r.stderr
    with open(os.path.join(out, "lifecycle.json")) as f:
        rows = {r["engine"]: r for r in json.load(f)["rows"]}
    cold, warm = rows["onnxruntime"], rows["onnxruntime + 1 standby"]
    assert cold["n"] == warm["n"] == 5 and warm["standby"] == 1 and "standby" not in cold
    assert warm["recover_ms"]["p99"] <= 120, warm
    assert warm["recover_ms"]["p99"] < cold["recover_ms"]["p50"], (warm, cold)
    # the replenish (a new worker: start, model load, canary) is the cold restart's work,
    # done after the service is ready again
    assert warm["replenish_ms"]["p50"] > warm["total_ms"]["p99"]
    cold_seg = [s["name"] for s in cold["segments"]]
    warm_seg = [s["name"] for s in warm["segments"]]
    assert any(s.startswith("switched to standby -> ") for s in warm_seg)
    assert not any("standby" in s for s in cold_seg)
    assert any(s.endswith("-> ready (service)") for s in cold_seg)
    names = [s.split(" -> ")[1] for s in warm_seg]
    assert names.index("ready answer") < names.index("standby replenished")
    with open(os.path.join(out, "lifecycle-detail.json")) as f:
        detail = json.load(f)["onnxruntime + 1 standby/timeout"]
    assert detail["sources"]["switched to standby"] == ["service log"]
    assert detail["sources"]["worker restart"] == ["sched_process_fork tracepoint"]
    assert detail["sources"]["standby replenished"] == ["sched_wakeup tracepoint"]
    assert detail["sources"]["standby's first request"] == ["sched_wakeup tracepoint"]
    with open(os.path.join(out, "onnxruntime-timeout-standby1", "client.json")) as f:
        client = json.load(f)
    assert client["standby"] == 1
    assert all(rep["t_full_ns"] > rep["t_ready_ns"] for rep in client["repetitions"])
