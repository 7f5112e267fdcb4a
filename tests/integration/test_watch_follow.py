"""clockalign watch --follow across a restart, with real BPF and the stand-in libcuda.

watch is started before any target exists, following the known-count target by its path
(a comm like "target" could match another engineer's test running at the same time).
Target A runs its known calls (plus a burst of launches) and exits; watch must stay up,
say so, and attach to target B, started after; /metrics must then hold both processes'
exact counts under their own pid labels, and each process's series must exist at 0 from
its attachment, before its first call (so rate() sees its first burst).
"""
import collections
import json
import os
import signal
import subprocess
import time
import urllib.request

from clockalign.store import cuda_api
from clockalign.workloads.standin import EXPECTED_CALLS

from ..unit.test_watch_server import BURST, BURST_LIMIT_S, _burst, _scrape
from .conftest import clockalign_cmd
from .test_watch_prometheus import expected_results, free_port, samples


def scrape(url):
    return samples(urllib.request.urlopen(url, timeout=5).read().decode())


def wait_metrics(url, watch, what, ok, timeout=60):
    """Scrape until ok(samples) holds; fail saying what was awaited."""
    deadline = time.monotonic() + timeout
    m = {}
    while time.monotonic() < deadline:
        assert watch.poll() is None, f"watch exited: {watch.communicate()[1]}"
        try:
            m = scrape(url)
            if ok(m):
                return m
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"/metrics never showed {what}; last: "
                         f"{ {k: v for k, v in m.items() if 'target' in k[0]} }")


def value(m, name, **labels):
    return m.get((name, tuple(sorted(labels.items()))))


def run_target(target, env, burst, url, watch):
    """Start one target held at --wait, wait until watch has attached to it (its zero
    series are there), release it, and return (pid, the metrics seen before release)."""
    p = subprocess.Popen([target, "--wait", "--burst", str(burst)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, env=env)
    ready = p.stdout.readline().split()
    assert ready[0] == "ready", ready
    pid = ready[1]
    before = wait_metrics(
        url, watch, f"process {pid} attached",
        lambda m: value(m, "clockalign_alloc_failures_total", pid=pid,
                        function="cuMemAlloc_v2") is not None)
    p.stdin.write("go\n")
    p.stdin.flush()
    info = json.loads(p.stdout.readline())
    assert str(info["pid"]) == pid
    assert p.wait(timeout=30) == 0
    return pid, before


def calls_of(m, pid):
    out = collections.Counter()
    for (name, labels), v in m.items():
        d = dict(labels)
        if name == "clockalign_cuda_calls_total" and d["pid"] == pid:
            out[(d["function"], d["result"])] += v
    return out


def expected(burst):
    out = collections.Counter({k: v for k, v in expected_results().items() if v})
    out[("cuLaunchKernel", "CUDA_SUCCESS")] += burst
    return out


def test_follow_attaches_to_the_successor_and_counts_both(fakecuda):
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    target = str(fakecuda / "target")
    env = dict(os.environ, LD_LIBRARY_PATH=str(fakecuda))
    watch = subprocess.Popen(clockalign_cmd(
        "watch", "--listen", f"127.0.0.1:{port}", "--counters", "none", "--no-gpu-clock",
        "--quiet", "--follow", target), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=env)
    try:
        m = wait_metrics(url, watch, "probes armed",
                         lambda m: value(m, "clockalign_probes_armed") == 1)
        assert value(m, "clockalign_targets") == 0          # nothing runs it yet

        pid_a, before_a = run_target(target, env, 5, url, watch)
        # every series known at attachment is there at 0 before the first call
        assert value(before_a, "clockalign_offcpu_in_cuda_seconds_total", pid=pid_a,
                     state="preempted") == 0
        assert value(before_a, "clockalign_tcp_resets_total", pid=pid_a,
                     direction="received") == 0
        assert all(value(before_a, "clockalign_alloc_failures_total", pid=pid_a,
                         function=cuda_api.function_name(f)) == 0 for f in cuda_api.ALLOC_IDS)
        assert not calls_of(before_a, pid_a)
        m = wait_metrics(url, watch, "target A's exit",
                         lambda m: value(m, "clockalign_target_exits_total") == 1)
        assert value(m, "clockalign_targets") == 0
        assert calls_of(m, pid_a) == expected(5)

        pid_b, _ = run_target(target, env, 9, url, watch)
        assert pid_b != pid_a
        m = wait_metrics(url, watch, "target B's exit",
                         lambda m: value(m, "clockalign_target_exits_total") == 2)
        assert calls_of(m, pid_a) == expected(5)         # A's counts stay as they were
        assert calls_of(m, pid_b) == expected(9)
        per_fn = collections.Counter()
        for (name, labels), v in m.items():
            if name == "clockalign_cuda_call_duration_seconds_count":
                per_fn[dict(labels)["function"]] += v
        want = collections.Counter(EXPECTED_CALLS)
        want.update(EXPECTED_CALLS)
        want["cuLaunchKernel"] += 5 + 9
        assert per_fn == want
        assert value(m, "clockalign_alloc_failures_total", pid=pid_b,
                     function="cuMemAlloc_v2") == value(m, "clockalign_alloc_failures_total",
                                                        pid=pid_a, function="cuMemAlloc_v2") > 0
        assert value(m, "clockalign_targets_attached_total") == 2
        assert value(m, "clockalign_probes_armed") == 1
        assert not any(n == "clockalign_events_dropped_total" and v for (n, _), v in m.items())
        assert watch.poll() is None                       # still serving after both exits
        wall, got, errors = _burst(port)                  # the recorder's own server, busy
        assert not errors and len(got) == BURST and wall < BURST_LIMIT_S, (wall, errors[:3])
        for status, _, body in got:
            assert status == 200 and calls_of(samples(body.decode()), pid_b) == expected(9)
        status, headers, body = _scrape(port, "HEAD")
        assert status == 200 and body == b"" and int(headers["Content-Length"]) > 1000
    finally:
        if watch.poll() is None:
            os.kill(watch.pid, signal.SIGTERM)
        out, err = watch.communicate(timeout=60)
    assert watch.returncode == 0, err
    assert f"following {target}: attached to process {pid_a}" in err
    assert f"process {pid_a} exited; still following {target}" in err
    assert f"following {target}: attached to process {pid_b}" in err
    assert "2 processes attached, 2 exited" in err
    assert "stopped by SIGTERM" in err and "Traceback" not in err
