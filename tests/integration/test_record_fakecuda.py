"""Record the known-count target with real BPF and check every count, argument, code, tid."""
import collections
import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from clockalign.workloads.check import cuda_counts
from clockalign.workloads.standin import EXPECTED_CALLS, SWEEP_CALLS, expected_call, sweep_faults
from clockalign.store import cuda_api
from clockalign.store.event_text import cstring
from clockalign.store.kinds import event_dicts
from clockalign.store.reader import RunReader
from clockalign.store.schema import CUDA_FN_BY_NAME, Kind

from .conftest import clockalign_cmd, run_clockalign, wait_for_file

BASE = ["--counters", "none", "--no-gpu-clock", "--quiet"]


def env_for(fakecuda):
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = str(fakecuda)
    return env


@pytest.fixture
def listener():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(4)
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    closed_port = closed.getsockname()[1]
    closed.close()            # nothing listens there now: ECONNREFUSED
    yield s.getsockname()[1], closed_port
    s.close()


def check_workload(ev, info, burst=0):
    expected = dict(EXPECTED_CALLS)
    expected["cuLaunchKernel"] += burst
    assert cuda_counts(ev) == expected
    cuda = ev[ev["kind"] == Kind.CUDA]
    assert set(cuda["pid"]) == {info["pid"]}
    lk = cuda[cuda["code"] == CUDA_FN_BY_NAME["cuLaunchKernel"]]
    lk_a = lk[lk["tid"] == info["tid_a"]]
    assert len(lk_a) == 12 and set(lk_a["a0"]) == {0x1000}
    ds = [d for d in event_dicts(lk_a)]
    assert sorted(d["grid"][0] for d in ds) == list(range(64, 76))
    assert all(d["grid"][1:] == [2, 1] and d["block"] == [256, 1, 1] and d["shared_mem"] == 1024
               and d["stream"] == 0x5000 and d["ret"] == 0 for d in ds)
    ex = [d for d in event_dicts(cuda[cuda["code"] == CUDA_FN_BY_NAME["cuLaunchKernelEx"]])]
    assert len(ex) == 11 and {d["tid"] for d in ex} == {info["tid_b"]}
    assert all(d["grid"] == [7, 3, 2] and d["block"] == [128, 2, 1] and d["shared_mem"] == 2048
               and d["stream"] == 0x6000 and d["func"] == 0x2000 for d in ex)
    allocs = [d for d in event_dicts(cuda[cuda["code"] == CUDA_FN_BY_NAME["cuMemAlloc_v2"]])]
    assert sorted(d["bytes"] for d in allocs) == sorted([1 << 20, 2 << 40, 4096, 3 << 40, 65536])
    assert sorted(d["ret"] for d in allocs) == [0, 0, 0, 2, 2]
    assert {d["bytes"] for d in allocs if d["ret"] == 2} == {2 << 40, 3 << 40}
    assert all(d["dptr"] >= 0x7f0000000000 for d in allocs if d["ret"] == 0)
    assert info["oom"] == 2
    htod = [d for d in event_dicts(cuda[cuda["code"] == CUDA_FN_BY_NAME["cuMemcpyHtoD_v2"]])]
    assert sorted(d["bytes"] for d in htod) == [100, 4096]
    syncs = cuda[np.isin(cuda["code"], cuda_api.ids("sync"))]
    assert len(syncs) and np.all(syncs["dur"] >= 2_000_000)           # the fake sleeps 2 ms
    assert np.all(cuda["dur"] > 0)
    check_sweep(cuda, info)


def check_sweep(cuda, info):
    """Every other table function: its exact count, and per call its arguments, return code
    and kept string, as standin.expected_call predicts."""
    assert set(SWEEP_CALLS) | set(EXPECTED_CALLS) == set(cuda_api.BY_SYMBOL)
    wrong = []
    for sym, n in SWEEP_CALLS.items():
        f = cuda_api.BY_SYMBOL[sym]
        calls = cuda[cuda["code"] == f.id]
        calls = calls[np.argsort(calls["ts"], kind="stable")]
        if len(calls) != n:
            wrong.append((sym, "count", n, len(calls)))
            continue
        if set(calls["tid"].tolist()) != {info["tid_main"]}:
            wrong.append((sym, "tid", info["tid_main"], sorted(set(calls["tid"].tolist()))))
        for i in range(n):
            c, exp = calls[i], expected_call(f, i)
            if int(c["ret"]) != exp["ret"]:
                wrong.append((sym, i, "ret", exp["ret"], int(c["ret"])))
            for k, v in exp["args"].items():
                if int(c[f"a{k}"]) != v:
                    wrong.append((sym, i, f.arg_names[k], hex(v), hex(int(c[f"a{k}"]))))
            if exp["name"] is not None and cstring(c["data"]) != exp["name"]:
                wrong.append((sym, i, "data", exp["name"], cstring(c["data"])))
    assert not wrong, wrong[:20]
    # every failing return code the sweep chose was seen
    rets = set(cuda["ret"].tolist())
    assert {1, 2, 218, 301, 400, 500} <= rets


def test_spawn_mode_counts_args_codes_tids(fakecuda, listener, tmp_path):
    open_port, closed_port = listener
    out = tmp_path / "spawn.ca"
    p = run_clockalign("record", "-o", str(out), *BASE, "--", str(fakecuda / "target"),
                       "--sleep-ms", "300", "--connect", str(open_port), str(closed_port),
                       env=env_for(fakecuda))
    assert p.returncode == 0, p.stderr
    info = json.loads(p.stdout.strip().splitlines()[-1])
    r = RunReader(out)
    assert r.clean and r.trailer["reason"] == "target exited"
    assert r.trailer["child_exit"] == {"exit_code": 0}
    ev = r.events()
    check_workload(ev, info)
    conns = [d for d in event_dicts(ev[ev["kind"] == Kind.CONNECT])]
    assert len(conns) == 2
    ok = [c for c in conns if c["ret"] == 0]
    refused = [c for c in conns if c["ret"] != 0]
    assert ok[0]["peer"] == f"127.0.0.1:{open_port}" and ok[0]["errno"] is None
    assert refused[0]["peer"] == f"127.0.0.1:{closed_port}"
    assert refused[0]["errno"] == "ECONNREFUSED" and refused[0]["ret"] == -111
    # the main thread slept 300 ms: one blocked off-CPU interval of at least that long
    sched = [d for d in event_dicts(ev[ev["kind"] == Kind.SCHED]) if d["tid"] == info["tid_main"]]
    long_off = [d for d in sched if d["off_cpu_ns"] >= 300_000_000]
    assert len(long_off) == 1, sched
    assert long_off[0]["off_cpu_ns"] < 1_000_000_000
    assert long_off[0]["prev_state"] == "S" and not long_off[0]["preempted"]
    assert long_off[0]["wakeup_to_run_ns"] > 0
    # threads: both workers born and named, process exit with its code
    new = ev[ev["kind"] == Kind.THREAD_NEW]
    assert {info["tid_a"], info["tid_b"]} <= set(new["tid"].tolist())
    exits = [d for d in event_dicts(ev[ev["kind"] == Kind.PROC_EXIT])]
    assert [d["exit_code"] for d in exits] == [0]
    assert r.trailer["drops"] == {}


def start_waiting_target(fakecuda, *extra):
    t = subprocess.Popen([str(fakecuda / "target"), "--wait", *extra], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, env=env_for(fakecuda))
    line = t.stdout.readline()
    assert line.startswith("ready"), line
    return t


def record_pid(fakecuda, out, pid, *extra):
    return subprocess.Popen(clockalign_cmd("record", "--pid", str(pid), "-o", str(out), *BASE,
                                           *extra), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env_for(fakecuda))


def release_and_finish(target, rec, out, target_s=30, rec_s=60):
    """Once the recording is armed (its file exists), tell the waiting target to go; wait for
    both: (the target's counts line, the recorder's stderr).  Both are killed on a failure."""
    try:
        wait_for_file(out)
        target.stdin.write("go\n")
        target.stdin.flush()
        info = json.loads(target.stdout.readline())
        target.wait(timeout=target_s)
        _, err = rec.communicate(timeout=rec_s)
    finally:
        for p in (target, rec):
            if p.poll() is None:
                p.kill()
    assert rec.returncode == 0, err
    return info, err


@pytest.mark.parametrize("late", [False, True], ids=["loaded", "dlopen-late"])
def test_pid_mode_including_late_dlopen(fakecuda, tmp_path, late):
    target = start_waiting_target(fakecuda, *(["--dlopen"] if late else []))
    out = tmp_path / "pid.ca"
    info, err = release_and_finish(target, record_pid(fakecuda, out, target.pid), out)
    if late:
        assert "has not loaded libcuda yet" in err
    r = RunReader(out)
    assert r.clean
    check_workload(r.events(), info)


@pytest.mark.parametrize("buffers", ["slots", "fallback"])
def test_drops_are_counted_not_silent(fakecuda, tmp_path, buffers):
    """A one-page buffer cannot hold a burst of 3000 launches: what is missing is counted,
    with either transport: the slot rings, or, where they do not load (as on a kernel before
    5.12), the perf buffers the recording falls back to, saying so."""
    out = tmp_path / "drops.ca"
    burst = 3000
    env = env_for(fakecuda)
    if buffers == "fallback":
        env["CLOCKALIGN_TEST_NO_SLOT_RINGS"] = "1"
    p = run_clockalign("record", "-o", str(out), *BASE, "--ring-mb", "0.004", "--",
                       str(fakecuda / "target"), "--burst", str(burst), env=env)
    assert p.returncode == 0, p.stderr
    r = RunReader(out)
    assert r.trailer["event_buffers"] == ("slots" if buffers == "slots" else "perf")
    assert ("the slot rings did not load" in p.stderr) == (buffers == "fallback")
    ev = r.events()
    got = int(np.sum(ev["kind"] == Kind.CUDA))
    dropped = r.trailer["drops"].get("cuda", 0)
    assert dropped > 0
    assert got + dropped == sum(EXPECTED_CALLS.values()) + burst
    assert "events lost" in p.stderr


def test_sigterm_leaves_clean_file_and_sigkill_a_readable_one(fakecuda, tmp_path):
    target = start_waiting_target(fakecuda)
    try:
        clean = tmp_path / "term.ca"
        rec = record_pid(fakecuda, clean, target.pid)
        wait_for_file(clean)
        time.sleep(0.5)
        rec.send_signal(signal.SIGTERM)
        rec.communicate(timeout=30)
        assert rec.returncode == 0
        r = RunReader(clean)
        assert r.clean and r.trailer["reason"] == "SIGTERM"

        killed = tmp_path / "kill.ca"
        rec = record_pid(fakecuda, killed, target.pid)
        wait_for_file(killed)
        time.sleep(1.0)      # > 4 flush intervals: header and clock chunks reach the file
        rec.send_signal(signal.SIGKILL)
        rec.communicate(timeout=30)
        r = RunReader(killed)
        assert not r.clean
        assert r.truncated.startswith("truncated at byte ")
        assert r.chunk_count >= 1
        p = run_clockalign("info", str(killed))
        assert p.returncode == 3
        assert "truncated at byte" in p.stderr and "Traceback" not in p.stderr
    finally:
        target.kill()
        target.wait()


PACER = """
import ctypes, sys, time
lib = ctypes.CDLL(sys.argv[1])
print("ready", flush=True)
sys.stdin.readline()
period, t = 1.0 / float(sys.argv[2]), time.monotonic()
while True:
    lib.cuLaunchKernel(ctypes.c_void_p(0x3000), 1, 1, 1, 32, 1, 1, 0, None, None, None)
    t += period
    time.sleep(max(0.0, t - time.monotonic()))
"""
SIGKILL_LOSS_S = 0.15      # README: the last 14-63 ms on the VM (results/sigkill)


def test_sigkill_loses_only_the_last_batch(fakecuda, tmp_path):
    """A target calling cuLaunchKernel 500 times a second, recorded and the recorder killed
    with SIGKILL: the truncated file keeps every call up to within SIGKILL_LOSS_S of the
    kill (a recorder that flushed every 250 ms lost up to 300 ms; one that never flushed
    would keep none of these calls: they fit in the file's 8 KiB buffer)."""
    for _ in range(2):
        pacer = subprocess.Popen([sys.executable, "-c", PACER, str(fakecuda / "libcuda.so.1"),
                                  "500"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 text=True)
        out = tmp_path / "killed.ca"
        try:
            assert pacer.stdout.readline().strip() == "ready"
            rec = record_pid(fakecuda, out, pacer.pid)
            wait_for_file(out)
            pacer.stdin.write("go\n")
            pacer.stdin.flush()
            t_go = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
            time.sleep(1.5)
            t_kill = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
            rec.send_signal(signal.SIGKILL)
            rec.communicate(timeout=30)
        finally:
            pacer.kill()
            pacer.wait()
        r = RunReader(out)
        assert not r.clean and r.truncated
        ev = r.events()
        calls = ev[(ev["kind"] == Kind.CUDA) & (ev["pid"] == pacer.pid) & (ev["ts"] >= t_go)]
        assert len(calls) > 300, len(calls)                     # 1.5 s at 500/s, kept
        lost_s = (t_kill - int((calls["ts"] + calls["dur"]).max())) / 1e9
        assert lost_s < SIGKILL_LOSS_S, f"the last {lost_s * 1000:.0f} ms were lost"
        out.unlink()


def test_bad_input_one_sentence_each(fakecuda, tmp_path):
    p = run_clockalign("record", "--pid", "999999", "-o", str(tmp_path / "x.ca"), *BASE)
    assert p.returncode != 0
    assert p.stderr.strip() == "clockalign: process 999999 does not exist"

    p = subprocess.run(clockalign_cmd("record", "--pid", "1", "-o", str(tmp_path / "y.ca")),
                       capture_output=True, text=True, preexec_fn=lambda: os.setuid(65534))
    assert p.returncode != 0 and "Traceback" not in p.stderr
    assert "not root" in p.stderr and len(p.stderr.strip().splitlines()) == 1

    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
        p = run_clockalign("record", "--pid", str(sleeper.pid), "-o", str(tmp_path / "z.ca"),
                           *BASE, "--duration", "0.5", env=env)
        from clockalign.capture.probes.libcuda import resolve_like_loader
        if resolve_like_loader(env)[0] is None:
            assert p.returncode != 0 and "Traceback" not in p.stderr
            assert f"process {sleeper.pid} has not loaded libcuda" in p.stderr
            assert len(p.stderr.strip().splitlines()) == 1
        else:   # a host with a driver: armed on the library it would load, with a notice
            assert p.returncode == 0 and "has not loaded libcuda yet" in p.stderr
    finally:
        sleeper.kill()
        sleeper.wait()

    p = run_clockalign("record", "-o", str(tmp_path / "w.ca"), *BASE, "--",
                       "/nonexistent/cmd")
    assert p.returncode != 0
    assert p.stderr.strip() == "clockalign: command not found or not executable: /nonexistent/cmd"


def test_two_pids_in_one_recording(fakecuda, tmp_path):
    a = start_waiting_target(fakecuda)
    b = start_waiting_target(fakecuda)
    out = tmp_path / "two.ca"
    rec = subprocess.Popen(clockalign_cmd("record", "--pid", str(a.pid), "--pid", str(b.pid),
                                          "-o", str(out), *BASE),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=env_for(fakecuda))
    wait_for_file(out)
    infos = []
    for t in (a, b):
        t.stdin.write("go\n")
        t.stdin.flush()
        infos.append(json.loads(t.stdout.readline()))
        t.wait(timeout=30)
    _, err = rec.communicate(timeout=60)
    assert rec.returncode == 0, err
    r = RunReader(out)
    ev = r.events()
    assert {t["pid"] for t in r.meta["targets"]} == {a.pid, b.pid}
    for info in infos:
        check_workload(ev[ev["pid"] == info["pid"]], info)


def kill_once_loading(rec, target, timeout=120):
    """Kill ``target`` once the recorder has created its first BPF map: it is compiling
    and loading the program, so the target ends before any probe of it is armed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert rec.poll() is None, rec.communicate()
        try:
            fds = os.listdir(f"/proc/{rec.pid}/fd")
        except OSError:
            fds = []
        for fd in fds:
            try:
                if os.readlink(f"/proc/{rec.pid}/fd/{fd}") == "anon_inode:bpf-map":
                    target.kill()
                    target.wait()
                    return
            except OSError:
                pass
        time.sleep(0.002)
    raise AssertionError("the recorder created no BPF map")


def test_target_that_ends_while_the_probes_are_armed(fakecuda, tmp_path):
    """One sentence, exit 1, no perf-event fallback (its per-process link was refused with
    ESRCH because the process is gone, not because the kernel lacks uprobe_multi)."""
    target = start_waiting_target(fakecuda)
    out = tmp_path / "gone.ca"
    rec = record_pid(fakecuda, out, target.pid)
    try:
        kill_once_loading(rec, target)
        _, err = rec.communicate(timeout=120)
    finally:
        for p in (target, rec):
            if p.poll() is None:
                p.kill()
    assert rec.returncode == 1, err
    assert "Traceback" not in err and "uprobe_multi links unavailable" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"clockalign: process {target.pid} ended before the probes were "
                           "armed (arming took ") and last.endswith(
        f" s): nothing of it was recorded ({out} holds no event)"), err
    assert sum(f"process {target.pid} ended" in ln for ln in err.splitlines()) == 1
    r = RunReader(out)
    assert r.clean and r.trailer["reason"] == "target ended before the probes were armed"
    assert not any(r.trailer["counts"].values())
    arming = r.trailer["arming"]
    assert 0 < arming["probes_armed_s"] <= arming["total_s"]
    assert arming["bpf_compile_load_s"] > 0 and "cuda_links_s" in arming


def test_one_of_two_targets_ends_while_arming(fakecuda, tmp_path):
    """The other is recorded whole; the one that ended is named once; exit 0."""
    gone, stays = start_waiting_target(fakecuda), start_waiting_target(fakecuda)
    out = tmp_path / "one.ca"
    rec = subprocess.Popen(clockalign_cmd("record", "--pid", str(gone.pid), "--pid",
                                          str(stays.pid), "-o", str(out), *BASE),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=env_for(fakecuda))
    kill_once_loading(rec, gone)
    info, err = release_and_finish(stays, rec, out)
    assert f"clockalign: process {gone.pid} ended before the probes were armed" in err
    assert "uprobe_multi links unavailable" not in err
    armed = [ln for ln in err.splitlines() if ln.startswith("clockalign: probes armed in ")]
    assert len(armed) == 1 and "BPF compile and load" in armed[0], err
    r = RunReader(out)
    assert r.clean and r.trailer["reason"] == "target exited"
    ev = r.events()
    assert gone.pid not in set(ev["pid"].tolist())
    check_workload(ev[ev["pid"] == stays.pid], info)


def test_faults_of_a_recording(fakecuda, listener, tmp_path):
    """The stand-in's failing calls and a refused connect come out of `clockalign faults`."""
    open_port, closed_port = listener
    out = tmp_path / "f.ca"
    p = run_clockalign("record", "-o", str(out), *BASE, "--", str(fakecuda / "target"),
                       "--connect", str(open_port), str(closed_port), "--exit", "3",
                       env=env_for(fakecuda))
    assert p.returncode == 0, p.stderr
    p = run_clockalign("faults", str(out), "--json")
    assert p.returncode == 0, p.stderr
    faults = json.loads(p.stdout)
    faults = faults["faults"] if isinstance(faults, dict) else faults
    # every failing call of the stand-in is a fault of its own (a success of the same
    # function comes between two failures): 2 OOMs of cuMemAlloc_v2, and the sweep's OOMs
    # of every other allocator (cuMemCreate, cuMemAllocFromPoolAsync, ...), bad images and
    # missing kernel names
    # The kernel lookups that return NOT_FOUND before normal work are notes, not faults
    # (timeline/benign.py).
    want = {("cuMemAlloc_v2", 2): 2, **sweep_faults()}
    assert {cuda_api.FUNCTIONS[i].symbol for i in cuda_api.ALLOC_IDS} <= {s for s, r in want}
    errors = [f for f in faults if f["kind"] == "cuda_error"]
    got = {}
    for f in errors:
        got[(f["function"], f["code"])] = got.get((f["function"], f["code"]), 0) + 1
    assert got == want
    oom = [f for f in errors if f["code"] == 2]
    assert all(f["name"] == "CUDA_ERROR_OUT_OF_MEMORY" for f in oom)
    # recovered by the next successful call of the function: all but a function's last call
    last_fails = {sym for sym, n in SWEEP_CALLS.items()
                  if expected_call(cuda_api.BY_SYMBOL[sym], n - 1)["ret"] == 2}
    unrecovered = [f for f in oom if f["recovery_ns"] is None]
    assert sorted(f["function"] for f in unrecovered) == sorted(last_fails)
    assert all(f["recovery_ns"] > 0 for f in oom if f["recovery_ns"] is not None)
    refused = [f for f in faults if f["kind"] == "connect_error"]
    assert len(refused) == 1 and refused[0]["name"] == "ECONNREFUSED"
    assert refused[0]["target"] == f"127.0.0.1:{closed_port}"
    exits = [f for f in faults if f["kind"] == "exit"]
    assert len(exits) == 1 and exits[0]["code"] == 3


def lookups_not_found() -> int:
    """The sweep's kernel lookups of a missing name (each followed by normal work)."""
    return sum(expected_call(cuda_api.BY_SYMBOL[s], i)["ret"] == 500
               for s, n in SWEEP_CALLS.items() if cuda_api.BY_SYMBOL[s].role == "function"
               for i in range(n))


def test_benign_patterns_are_notes_the_real_faults_stay(fakecuda, tmp_path):
    """glibc's passwd lookup (nscd probe), a driver answering DEINITIALIZED after exit
    began, kernel lookups not found before normal work: notes with counts.  The main part's
    two OOMs and a connect() to a missing inference socket: the only faults."""
    out = tmp_path / "b.ca"
    sock = f"/tmp/ca-infer-{os.getpid()}.sock"   # none there; short: the probe keeps 54 bytes
    assert not os.path.exists(sock)
    p = run_clockalign("record", "-o", str(out), *BASE, "--", str(fakecuda / "target"),
                       "--no-sweep", "--getpwuid", "--deinit", "3", "--connect-unix", sock,
                       env=env_for(fakecuda))
    assert p.returncode == 0, p.stderr
    info = json.loads(p.stdout.strip().splitlines()[-1])
    assert info["connect_unix"] == -1 and info["user"]
    p = run_clockalign("faults", str(out), "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert sorted((f["kind"], f.get("function"), f["name"], f.get("target"))
                  for f in doc["faults"]) == [
        ("connect_error", "connect", "ENOENT", f"unix:{sock}"),
        ("cuda_error", "cuMemAlloc_v2", "CUDA_ERROR_OUT_OF_MEMORY", None),
        ("cuda_error", "cuMemAlloc_v2", "CUDA_ERROR_OUT_OF_MEMORY", None)]
    notes = {d["rule"]: d for d in doc["benign"]}
    assert set(notes) == {"nscd probe", "driver shut down at exit", "lookup not found"}
    assert notes["nscd probe"]["count"] >= 1 and notes["nscd probe"]["examples"] == [
        "connect(unix:/var/run/nscd/socket) -> ENOENT"]
    assert notes["driver shut down at exit"]["count"] == 3 + 3 + 1
    assert notes["lookup not found"]["count"] == lookups_not_found()
    assert all(d["pids"] == [info["pid"]] for d in notes.values())
    p = run_clockalign("faults", str(out))
    assert p.stdout.splitlines()[1].startswith(
        f"{sum(d['count'] for d in notes.values())} known benign failures left out")


def test_status_line_on_a_tty(fakecuda, tmp_path):
    """On a terminal, record shows elapsed time, events by kind, drops and file size."""
    import pty
    out = tmp_path / "tty.ca"
    pid, fd = pty.fork()
    if pid == 0:
        os.environ["LD_LIBRARY_PATH"] = str(fakecuda)
        os.execv(sys.executable, clockalign_cmd("record", "-o", str(out), "--counters", "none",
                                                "--no-gpu-clock", "--", str(fakecuda / "target"),
                                                "--sleep-ms", "1500"))
    text = b""
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            break
        if not chunk:
            break
        text += chunk
    os.waitpid(pid, 0)
    screen = text.decode(errors="replace")
    total = sum(EXPECTED_CALLS.values())
    assert f"cuda={total:,}" in screen or f"cuda={total}" in screen, screen
    assert "drops=0" in screen and " MB" in screen, screen
    assert "\r" in screen


def test_bcc_missing_is_one_sentence(tmp_path):
    """With the bcc module unimportable, record stops at the preflight with what to do."""
    code = ("import sys; sys.modules['bcc'] = None\n"
            "from clockalign.cli.main import main\n"
            f"main(['record', '--pid', '1', '-o', {str(tmp_path / 'x.ca')!r}])")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.strip().splitlines() == [
        "clockalign: BCC: python module bcc not importable; run scripts/setup.sh (installs the OS "
        "package python3-bpfcc; never 'pip install bcc')"]


def test_report_and_export_name_kernels_and_module_loads(fakecuda, tmp_path):
    """Kernel names from cuModuleGetFunction reach the report and the trace; module loads
    are listed with their durations and results."""
    from clockalign.export import export_run
    from clockalign.report import build_report
    from clockalign.timeline import Timeline
    out = tmp_path / "k.ca"
    p = run_clockalign("record", "-o", str(out), *BASE, "--", str(fakecuda / "target"),
                       env=env_for(fakecuda))
    assert p.returncode == 0, p.stderr
    info = json.loads(p.stdout.strip().splitlines()[-1])
    rep = build_report(Timeline.open(str(out)), str(tmp_path / "rep"))
    kernels = {(k["pid"], k["func"]): k for k in rep.numbers["kernels"]}
    assert kernels[(info["pid"], 0x1000)]["kernel"] == "vector_add"
    assert kernels[(info["pid"], 0x1000)]["launches"] == 12
    assert kernels[(info["pid"], 0x2000)]["kernel"] == "gemm_tile"
    assert kernels[(info["pid"], 0x2000)]["launches"] == 11
    loads = rep.numbers["module_loads"]
    want = [(sym, expected_call(cuda_api.BY_SYMBOL[sym], i)["ret"])
            for sym in cuda_api.names("module") for i in range(SWEEP_CALLS[sym])]
    assert sorted((r["function"], r["ret"]) for r in loads) == sorted(want)
    assert all(r["dur_ns"] > 0 for r in loads)
    assert {r["result"] for r in loads} == {"CUDA_SUCCESS", "CUDA_ERROR_INVALID_PTX",
                                            "CUDA_ERROR_FILE_NOT_FOUND"}
    roles = {r["role"]: r for r in rep.numbers["cuda_roles"]}
    assert set(roles) == set(cuda_api.ROLES)
    for role in cuda_api.ROLES:
        want_n = sum(n for s, n in EXPECTED_CALLS.items() if cuda_api.BY_SYMBOL[s].role == role)
        assert roles[role]["calls"] == want_n, role
    assert "== CUDA work ==" in rep.text and "vector_add" in rep.text

    trace = tmp_path / "k.json"
    export_run(Timeline.open(str(out)), str(trace), fmt="chrome-json")
    evs = json.loads(trace.read_text())
    evs = evs["traceEvents"] if isinstance(evs, dict) else evs
    named = [e for e in evs if e.get("name") == "cuLaunchKernel" and e.get("ph") in ("X", "B")
             and e.get("cat") == "cuda"]
    assert len(named) == 12 and all(e["args"]["func"] == "vector_add @0x1000"
                                        for e in named if e["tid"] == info["tid_a"])
    # and again on their stream's track: thread A launched on 0x5000, B on 0x6000
    tracks = {(e["pid"], e["tid"]): e["args"]["name"] for e in evs
              if e.get("ph") == "M" and e.get("name") == "thread_name"}
    on_stream = collections.Counter(tracks[(e["pid"], e["tid"])].split(" overlapping")[0]
                                    for e in evs if e.get("cat") == "stream"
                                    and e.get("name") in ("cuLaunchKernel", "cuLaunchKernelEx"))
    assert on_stream["stream 0x5000"] == 12 and on_stream["stream 0x6000"] == 11
    lookups = [e["args"]["name"] for e in evs if e.get("ph") in ("X", "B")
               and str(e.get("name", "")).startswith("cuModuleGetFunction")]
    assert lookups[:2] == ["vector_add", "gemm_tile"]


SLOW_HELPERS = """
import sys, time
from clockalign.capture import recorder
start = recorder.Recorder._start_helpers
def slow_start(self, helpers):
    time.sleep(1.5)      # a GPU host's clock probe start (context, module, tick kernel)
    return start(self, helpers)
recorder.Recorder._start_helpers = slow_start
from clockalign.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def test_buffers_are_read_while_the_helpers_start(fakecuda, tmp_path):
    """Events that come while the helpers are starting are read as they come: a burst of
    200 000 launches (three times what one CPU's 8 MiB buffer holds) in that time loses
    none.  Before, the buffers were first read once the helpers ran, and the H200 storm lost
    its first events while the GPU clock probe was opening."""
    r, info = record_a_burst(fakecuda, tmp_path / "slowstart.ca", SLOW_HELPERS,
                             env_for(fakecuda))
    assert r.trailer["drops"] == {}, r.trailer["drops"]
    check_workload(r.events(), info, burst=200000)


def record_a_burst(fakecuda, out, wrapper, env, burst=200000):
    """`record --pid` (through a Python wrapper that patches the recorder) of a waiting
    target that makes `burst` extra launches once told: (RunReader, the target's counts)."""
    target = start_waiting_target(fakecuda, "--burst", str(burst))
    rec = subprocess.Popen([sys.executable, "-c", wrapper, "record", "--pid",
                            str(target.pid), "-o", str(out), "--ring-mb", "8", *BASE],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    info, _ = release_and_finish(target, rec, out, target_s=60, rec_s=120)
    return RunReader(out), info


GIL_HELD = """
import ctypes, sys
from clockalign.capture import recorder
usleep = ctypes.PyDLL(None).usleep      # PyDLL: the GIL stays held during the call
usleep.argtypes = [ctypes.c_uint]
record = recorder.Recorder._record_batch
held = []
def hold_once(self, batch):
    if batch is not None and len(batch) and not held:
        held.append(1)
        usleep(400000)   # an import / a long numpy step / a collection: 0.4 s without the GIL
    return record(self, batch)
recorder.Recorder._record_batch = hold_once
from clockalign.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def test_the_buffers_are_read_while_the_gil_is_held(fakecuda, tmp_path):
    """The recording thread holds the GIL for 0.4 s at its first batch, in the middle of a
    burst of 200 000 launches (three 8 MiB buffers' worth): the C reader thread
    (native/reader.c) keeps reading and loses none.  (A Python reader could not run
    meanwhile: scripts/bench/gil_stall.py measures what it loses.)"""
    r, _ = record_a_burst(fakecuda, tmp_path / "gil.ca", GIL_HELD, env_for(fakecuda))
    assert r.trailer["buffer_reader"] == "native"
    got = int(np.sum(r.events()["kind"] == Kind.CUDA))
    assert r.trailer["drops"] == {}, r.trailer["drops"]
    assert got == sum(EXPECTED_CALLS.values()) + 200000


BUSY = """
import ctypes, sys, threading
lib = ctypes.CDLL(sys.argv[1])
def run():
    while True:
        lib.cuLaunchKernel(ctypes.c_void_p(0x1000), 1, 1, 1, 1, 1, 1, 0, ctypes.c_void_p(0),
                           None, None)
        lib.cuEventRecord(ctypes.c_void_p(0x7000), ctypes.c_void_p(0))
for _ in range(3):
    threading.Thread(target=run, daemon=True).start()
print("ready", flush=True)
threading.Event().wait()
"""


@pytest.mark.parametrize("cuda_returns", ["all", "blocking"])
def test_attach_to_a_busy_process_drops_nothing(fakecuda, tmp_path, cuda_returns):
    """Issue 23 item 6: threads launching nonstop while the probes are armed.  The return
    link is armed before the entry link, so no call is left with an entry and no return
    (armed the other way round, each attach lost tens of calls as cuda_nested, and an entry
    left behind paired with a later return of the same function: a wrong duration)."""
    r = record_busy(fakecuda, tmp_path, "--cuda-returns", cuda_returns, "--duration", "3")
    assert r.trailer["drops"] == {}, r.trailer["drops"]
    ev = r.events()
    kind = Kind.CUDA if cuda_returns == "all" else Kind.CUDA_ENTRY
    launches = ev[(ev["kind"] == kind) & (ev["code"] == CUDA_FN_BY_NAME["cuLaunchKernel"])]
    assert len(launches) > 1000
    assert len(set(launches["tid"].tolist())) == 3
    assert "cuLaunchKernel" in r.meta["cuda_entry_only"] or cuda_returns == "all"


def record_busy(fakecuda, tmp_path, *args):
    """`record --pid` of a process whose threads launch nonstop, with args; its run."""
    busy = subprocess.Popen([sys.executable, "-c", BUSY, str(fakecuda / "libcuda.so.1")],
                            stdout=subprocess.PIPE, text=True, env=env_for(fakecuda))
    try:
        assert busy.stdout.readline().strip() == "ready"
        out = tmp_path / "busy.ca"
        rec = run_clockalign("record", "--pid", str(busy.pid), "-o", str(out), *BASE, *args,
                             env=env_for(fakecuda), timeout=180)
        assert rec.returncode == 0, rec.stderr
    finally:
        busy.kill()
        busy.wait()
    return RunReader(out)


def test_cuda_duty_records_only_inside_its_armed_windows(fakecuda, tmp_path):
    """--cuda-duty 0.5: the CUDA links are detached half of every period and armed again,
    with nothing lost at the switches; every call recorded lies in a window the trailer
    lists, and the windows cover about half the time."""
    r = record_busy(fakecuda, tmp_path, "--cuda-duty", "0.5", "--cuda-duty-period", "0.5",
                    "--duration", "4")
    assert r.trailer["drops"] == {}, r.trailer["drops"]
    assert r.meta["cuda_duty"] == {"share": 0.5, "period_s": 0.5}
    duty = r.trailer["cuda_duty"]
    windows = np.array(duty["windows"], dtype=np.int64)
    assert len(windows) >= 5
    gaps = windows[1:, 0] - windows[:-1, 1]
    assert np.all(gaps >= 0.25e9) and np.all(gaps < 2e9)    # detached 0.25 s (+ a late tick)
    lengths = windows[1:-1, 1] - windows[1:-1, 0]
    assert np.all(lengths >= 0.25e9)                         # armed 0.25 s (+ a late tick)
    ev = r.events()
    cuda = ev[ev["kind"] == Kind.CUDA]
    assert len(cuda) > 1000
    i = np.searchsorted(windows[:, 0], cuda["ts"], side="right") - 1
    assert np.all(i >= 0)
    assert np.all(cuda["ts"] + cuda["dur"] <= windows[i, 1])     # entered and returned inside
    per_window = np.bincount(i, minlength=len(windows))
    assert np.all(per_window[1:-1] > 0)                           # re-armed every time
    assert r.trailer["unfinished_cuda"] == 0 or len(ev[ev["kind"] == Kind.CUDA_UNFINISHED])


def test_cuda_duty_bad_values_one_sentence(fakecuda, tmp_path):
    for args in (["--cuda-duty", "0"], ["--cuda-duty", "1.5"], ["--cuda-duty-period", "0.01"]):
        p = run_clockalign("record", "-o", str(tmp_path / "x.ca"), *BASE, *args, "--", "true",
                           env=env_for(fakecuda))
        assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
        assert "--cuda-duty" in p.stderr
