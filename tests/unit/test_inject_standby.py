"""The reference service with a warm standby worker, for real on loopback (no root): a fault
switches to the standby at once (readiness stays 200), a new worker replenishes it, and
with no standby ready the service is not ready until a worker is."""
import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest

from clockalign.inject import faults
from clockalign.inject.driver import Driver
from clockalign.inject.eventlog import read_events
from clockalign.inject.run import free_port


@contextlib.contextmanager
def running_service(tmp_path, engine="onnxruntime", deadline_ms=300, device="auto",
                    start_s=90):
    """The reference service with one standby, started and its standby ready ->
    (Driver, event log path); stopped at the end."""
    port = free_port(0)
    events = str(tmp_path / "events.jsonl")
    proc = subprocess.Popen([sys.executable, "-m", "clockalign.inject.service", "--engine",
                             engine, "--device", device, "--port", str(port), "--deadline-ms",
                             str(deadline_ms), "--standby", "1", "--events", events])
    try:
        d = Driver(f"http://127.0.0.1:{port}", "pointset")
        t_end = time.monotonic() + start_s
        while not d.ready_once():
            assert proc.poll() is None and time.monotonic() < t_end, "service did not start"
            time.sleep(0.05)
        assert d.wait_standby(1, start_s) is not None, "the standby never got ready"
        yield d, events
    finally:
        proc.terminate()
        proc.wait(20)


@pytest.fixture
def standby_service(tmp_path, request):
    """The service with one standby; the watchdog's deadline 300 ms (or the test's param:
    an oversized batch takes longer than that to fail)."""
    pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")
    with running_service(tmp_path, deadline_ms=getattr(request, "param", 300)) as s:
        yield s


def _ev(events, name, after=0):
    return [r for r in read_events(events) if r["ev"] == name and r["t_ns"] > after]


def _wait_for(events, name, after, timeout_s=30):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        found = _ev(events, name, after)
        if found:
            return found
        time.sleep(0.01)
    pytest.fail(f"no {name} event within {timeout_s} s")


def test_a_fault_switches_to_the_standby_and_a_new_one_replenishes(standby_service):
    d, events = standby_service
    meta = d.metadata()
    assert meta["parameters"]["standby"] == 1 and meta["parameters"]["standby_ready"] == 1
    first, standby = [r["worker"] for r in read_events(events)
                      if r["ev"] in ("ready", "standby_ready")]
    rep = d.repetition(faults.FAULTS["timeout"].request(meta, 0))
    assert rep["status"] == 504 and rep["t_answer_ns"] - rep["t_send_ns"] >= 300_000_000
    assert rep["polls"] == 1                     # ready at the first poll: no restart awaited
    switch, = _ev(events, "switch")
    assert (switch["old"], switch["worker"], switch["why"]) == (first, standby, "watchdog")
    fired, = _ev(events, "watchdog_fired")
    kill, = _ev(events, "kill_sent")
    assert fired["t_ns"] <= switch["t_ns"] <= kill["t_ns"] < rep["t_answer_ns"]
    assert not _ev(events, "not_ready")
    status = d.infer(faults.normal_request(meta))[3]
    assert status == 200                         # the standby serves
    t_full = d.wait_standby(1, 60)
    assert t_full is not None
    spawn = _ev(events, "worker_spawn", switch["t_ns"])[0]
    back, = _ev(events, "standby_ready", switch["t_ns"])
    assert back["worker"] == spawn["worker"] not in (first, standby)
    assert back["t_ns"] < t_full


def test_with_no_standby_ready_the_service_is_not_ready(standby_service):
    d, events = standby_service
    meta = d.metadata()
    t0 = time.monotonic_ns()
    rep = d.repetition(faults.FAULTS["timeout"].request(meta, 0))
    assert rep["polls"] == 1
    spawn = _wait_for(events, "worker_spawn", t0)[0]["worker"]
    os.kill(spawn, signal.SIGSTOP)               # the replacement cannot get ready
    try:
        assert not [r for r in _ev(events, "standby_ready", t0) if r["worker"] == spawn], \
            "the replacement was ready before it could be stopped"
        t1 = time.monotonic_ns()
        status = d.infer(faults.FAULTS["timeout"].request(meta, 1))[3]
        assert status == 504
        assert d.ready_once() is False           # no healthy worker serves
        assert d.infer(faults.normal_request(meta))[3] == 503
        not_ready, = _ev(events, "not_ready", t1)
        assert not_ready["why"] == "watchdog" and not _ev(events, "switch", t1)
    finally:
        os.kill(spawn, signal.SIGCONT)
    t_ready, _ = d.wait_ready(60)
    assert t_ready is not None
    assert d.wait_standby(1, 60) is not None
    second, = [r["worker"] for r in _ev(events, "worker_spawn", t1)]
    serves, = [r["worker"] for r in _ev(events, "ready", t1)]
    stands, = [r["worker"] for r in _ev(events, "standby_ready", t1)]
    # the first of the two replacements ready serves, the other stands by
    assert {serves, stands} == {spawn, second}


@pytest.mark.parametrize("standby_service", [5000], indirect=True)
def test_out_of_memory_switches_and_the_worker_comes_back_as_the_standby(standby_service):
    d, events = standby_service
    meta = d.metadata()
    first = _ev(events, "ready")[0]["worker"]
    t0 = time.monotonic_ns()
    rep = d.repetition(faults.FAULTS["oom"].request(meta, 0))
    assert rep["status"] == 507 and rep["polls"] == 1
    switch, = _ev(events, "switch", t0)
    assert switch["old"] == first and switch["why"] == "oom"
    assert d.wait_standby(1, 60) is not None
    back, = _ev(events, "standby_ready", t0)
    assert back["worker"] == first               # freed, canary: a standby again
    assert not _ev(events, "worker_spawn", t0)


def test_standby_is_for_the_reference_service(tmp_path):
    from click.testing import CliRunner

    from clockalign.cli.inject import command
    from clockalign.errors import ClockalignError
    from clockalign.inject.run import Plan, check, made_by
    with pytest.raises(ClockalignError, match="--standby is the reference service's"):
        check(Plan(engines=["v2"], faults=["oom"], url="http://127.0.0.1:1", standby=1,
                   out_dir=str(tmp_path / "o")))
    r = CliRunner().invoke(command, ["--engine", "onnxruntime", "--fault", "oom",
                                     "--standby", "-1", "-o", str(tmp_path / "o")])
    assert r.exit_code == 2 and "--standby" in r.output
    plan = Plan(engines=["onnxruntime"], faults=["timeout"], out_dir="o", standby=2)
    assert "--standby 2" in made_by(plan)
    assert "--standby" not in made_by(Plan(engines=["onnxruntime"], faults=["timeout"],
                                           out_dir="o"))
