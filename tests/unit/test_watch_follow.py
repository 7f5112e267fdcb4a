"""watch --follow's process selection (capture/targets/follow.py) and the aggregator's view of
targets coming and going (no root: real processes, no probes)."""
import os
import shutil
import subprocess
import time

import pytest

from clockalign.capture.targets.follow import Follower, check_names, matches
from clockalign.errors import ClockalignError
from clockalign.store import cuda_api
from clockalign.store.schema import Chunk
from clockalign.watch.aggregate import Aggregator

from .test_watch_aggregate import cuda, events, scrape


@pytest.fixture
def sleeper(tmp_path):
    """A copy of sleep under a name no other process has (its comm is that name)."""
    exe = tmp_path / f"caf{os.getpid() % 100000}-{time.monotonic_ns() % 1000}"
    shutil.copy(shutil.which("sleep"), exe)
    procs = []

    def start():
        p = subprocess.Popen([str(exe), "30"])
        procs.append(p)
        deadline = time.monotonic() + 5     # until exec has happened (comm changes)
        while matches(p.pid, [exe.name]) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        return p
    yield exe, start
    for p in procs:
        p.kill()
        p.wait()


def test_a_name_matches_the_comm_and_a_path_the_executable_or_script(sleeper, tmp_path):
    exe, start = sleeper
    p = start()
    assert matches(p.pid, [exe.name]) == exe.name
    assert matches(p.pid, [exe.name + "x"]) is None
    assert matches(p.pid, ["/nonexistent/" + exe.name, str(exe)]) == str(exe)
    assert matches(p.pid, [str(tmp_path / "other")]) is None
    long_name = "a" * 20
    long_exe = tmp_path / long_name
    shutil.copy(shutil.which("sleep"), long_exe)
    q = subprocess.Popen([str(long_exe), "30"])
    script = tmp_path / "serve.sh"
    script.write_text("sleep 30\n")
    r = subprocess.Popen(["sh", "-e", "serve.sh"], cwd=tmp_path)
    try:
        deadline = time.monotonic() + 5     # until both have exec'd (sh has read its args)
        while (matches(q.pid, [long_name]) is None or matches(r.pid, [str(script)]) is None) \
                and time.monotonic() < deadline:
            time.sleep(0.01)
        assert matches(q.pid, [long_name]) == long_name          # cut to 15, as the kernel
        assert matches(r.pid, [str(script)]) == str(script)      # relative to its cwd
        assert matches(r.pid, ["sh"]) == "sh"
    finally:
        for x in (q, r):
            x.kill()
            x.wait()


def test_a_scan_finds_new_processes_and_counts_exits(sleeper):
    exe, start = sleeper
    f = Follower([exe.name])
    assert f.scan([]) == ([], [])
    a = start()
    new, gone = f.scan([])
    assert new == [(a.pid, exe.name)] and gone == []
    f.attach(a.pid, exe.name)
    assert f.scan([a.pid]) == ([], [])                 # attached already: not new again
    a.kill()
    a.wait()
    b = start()
    new, gone = f.scan([a.pid])
    assert gone == [a.pid] and new == [(b.pid, exe.name)]
    assert f.exited == 1 and f.attached == 1 and a.pid not in f.matched


def test_watch_never_follows_itself_and_bad_names_are_one_sentence(tmp_path):
    own = open(f"/proc/{os.getpid()}/comm").read().strip()
    new, _ = Follower([own]).scan([])
    assert os.getpid() not in [p for p, _ in new]
    with pytest.raises(ClockalignError, match="no such file"):
        check_names([str(tmp_path / "missing")])
    with pytest.raises(ClockalignError, match="needs a process name"):
        check_names([" "])


def test_attached_processes_get_their_known_series_at_zero_and_exits_are_counted():
    agg = Aggregator()
    agg.open({"gpus": [{"index": 0}, {"index": 1}], "targets": [{"pid": 100}],
              "cflags": ["-DCA_CUDA", "-DCA_SCHED", "-DCA_TCP"]})
    snap = agg.snapshot()
    assert snap["offcpu_in_cuda_ns"] == {("100", "preempted"): 0, ("100", "blocked"): 0}
    assert snap["tcp_resets"] == {("100", "sent"): 0, ("100", "received"): 0}
    assert snap["tcp_retransmits"] == {("100",): 0}
    assert snap["alloc_failures"] == {("100", cuda_api.function_name(f)): 0
                                      for f in cuda_api.ALLOC_IDS}
    assert snap["fragmentation"] == {("100", "0"): 0, ("100", "1"): 0}
    assert (snap["targets"], snap["targets_attached"], snap["target_exits"]) == (1, 1, 0)
    agg.write_columns(Chunk.EVENTS, events(cuda("cuMemAlloc_v2", pid=100, ret=2)))
    # 100 exits, 200 (its successor) is attached: the recorder's STATUS rows say so
    agg.write_rows(Chunk.STATUS, [{"drops": {}, "targets": [200]}])
    agg.write_rows(Chunk.STATUS, [{"drops": {}, "targets": [200]}])
    m, _ = scrape(agg)
    assert m[("clockalign_targets", ())] == 1
    assert m[("clockalign_targets_attached_total", ())] == 2
    assert m[("clockalign_target_exits_total", ())] == 1
    assert m[("clockalign_alloc_failures_total", (("function", "cuMemAlloc_v2"),
                                                  ("pid", "100")))] == 1
    assert m[("clockalign_alloc_failures_total", (("function", "cuMemAlloc_v2"),
                                                  ("pid", "200")))] == 0
    assert m[("clockalign_offcpu_in_cuda_seconds_total", (("pid", "200"),
                                                          ("state", "preempted")))] == 0


def test_no_zero_series_for_probes_that_are_off():
    agg = Aggregator()
    agg.open({"gpus": [], "targets": [{"pid": 100}], "cflags": ["-DCA_SCHED"]})
    snap = agg.snapshot()
    assert snap["tcp_resets"] == {} and snap["alloc_failures"] == {}
    assert snap["fragmentation"] == {} and len(snap["offcpu_in_cuda_ns"]) == 2


def test_old_processes_are_matched_only_in_sweeps_and_a_late_exec_is_found(sleeper, tmp_path):
    """A scan matches the processes it first saw less than YOUNG_S ago (a fork execs its
    program a moment later), and every process only in a sweep each SWEEP_S: a process that
    execs into a followed program after it is old is found by the next sweep."""
    from clockalign.capture.targets import follow
    exe, _ = sleeper
    t = [1000.0]
    f = Follower([exe.name], clock=lambda: t[0])
    # a shell that turns into the followed program only when told (exec in place, same pid)
    go = tmp_path / "go"
    sh = subprocess.Popen(["sh", "-c", f"while [ ! -e {go} ]; do sleep 0.02; done; "
                                       f"exec {exe} 30"])
    try:
        f.scan([])                                   # a sweep: every process matched
        n_all = f.checked
        t[0] += follow.YOUNG_S + 0.5
        f.scan([])                                   # all old now, no sweep: only the
        assert f.checked - n_all < n_all / 4         # few born since (the shell's sleeps)
        go.touch()
        deadline = time.monotonic() + 5
        while matches(sh.pid, [exe.name]) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        new, _ = f.scan([])
        assert (sh.pid, exe.name) not in new         # old, and no sweep yet
        t[0] += follow.SWEEP_S
        new, _ = f.scan([])
        assert (sh.pid, exe.name) in new             # the sweep finds it
    finally:
        sh.kill()
        sh.wait()


def test_an_exited_pid_keeps_its_series_for_a_while_then_frees_its_slot(monkeypatch):
    """A crash loop under --follow: every restart a new pid.  Each exited pid's series stay
    EXITED_KEEP_NS, then go (and its slot in the pid cap with them); the call total stays."""
    from clockalign.watch import aggregate
    monkeypatch.setattr(aggregate, "MAX_PIDS", 4)
    agg = Aggregator()
    agg.open({"gpus": [], "targets": [], "cflags": ["-DCA_SCHED"]})
    keep = aggregate.EXITED_KEEP_NS
    t = 0
    for pid in range(100, 110):        # ten restarts, each lives 0.4 of the keep time
        agg._set_targets([pid], now_ns=t)
        agg.write_columns(Chunk.EVENTS, events(cuda("cuLaunchKernel", pid=pid),
                                               cuda("cuMemAlloc_v2", pid=pid, ret=2)))
        t += int(keep * 0.4)
    agg._set_targets([110], now_ns=t)
    snap = agg.snapshot()
    pids = {k[0] for k in snap["cuda_calls"]}
    # exited 0, 0.4 and 0.8 of the keep time ago: still there; the others forgotten, and
    # with them their slots (a cap of 4, 11 pids, none folded into "other")
    assert pids == {"107", "108", "109"}
    assert {k[0] for k in snap["offcpu_in_cuda_ns"]} == {"107", "108", "109", "110"}
    assert snap["folded"]["pid"] == 0 and "other" not in pids
    assert snap["pids_forgotten"] == 7 and snap["target_exits"] == 10
    assert snap["cuda_calls_seen"] == 20
    assert "cuda calls 20" in agg.status_text()
    m, _ = scrape(agg)
    assert m[("clockalign_target_series_forgotten_total", ())] == 7
    assert m[("clockalign_cuda_calls_total", (("function", "cuLaunchKernel"), ("pid", "109"),
                                              ("result", "CUDA_SUCCESS")))] == 1
    # a pid that comes back before its series went continues them
    agg._set_targets([110, 109], now_ns=t + 1)
    agg._set_targets([110, 109], now_ns=t + keep)
    assert ("109", "cuLaunchKernel", "CUDA_SUCCESS") in agg.snapshot()["cuda_calls"]
