"""Faults, their merging and chains, and `clockalign faults`, on known synthetic runs."""
import json
import os

import numpy as np
import pytest
from click.testing import CliRunner

from clockalign.cli.faults import command as faults_command
from clockalign.cli.main import main as cli_main
from clockalign.store.counter_fields import FIELD_BY_NAME
from clockalign.store.schema import CUDA_FN_BY_NAME, EVENT_DTYPE, Chunk, Kind
from clockalign.store.writer import RunWriter
from clockalign.timeline import Timeline

DATA = os.path.join(os.path.dirname(__file__), "..", "data", "synthetic")
FAULTS = os.path.join(DATA, "faults.ca")
TRUNC = os.path.join(DATA, "faults_truncated.ca")
T0 = 5_000_000_000_000
MS = 1_000_000
US = 1_000
REAL_OFFSET = 1_700_000_000_000_000_000 - T0


class OffsetModel:
    def map(self, remote_ns, stamp_unc_ns=None):
        r = np.asarray(remote_ns, dtype=np.int64)
        s = 0 if stamp_unc_ns is None else np.asarray(stamp_unc_ns, dtype=np.int64)
        return r - REAL_OFFSET, np.zeros_like(r) + 7 + s


@pytest.fixture(scope="module")
def faults():
    return Timeline.open(FAULTS, models={"REALTIME": OffsetModel()}).faults()


def by_id(faults, i):
    return next(f for f in faults if f.id == i)


# ------------------------------------------------------------------ the synthetic run
def test_fault_list_in_time_order(faults):
    got = [(f.id, f.kind, f.name, f.t_ns - T0) for f in faults]
    assert got == [
        (1, "cuda_error", "CUDA_ERROR_OUT_OF_MEMORY", 100 * MS),
        (2, "connect_error", "ECONNREFUSED", 300 * MS),
        (3, "xid", "Xid 31 (GPU memory page fault)", 499_500_000),
        (4, "cuda_error", "CUDA_ERROR_ILLEGAL_ADDRESS", 500 * MS),
        (5, "cuda_sticky_error", "CUDA_ERROR_ILLEGAL_ADDRESS", 503 * MS),
        (6, "cuda_sticky_error", "CUDA_ERROR_ILLEGAL_ADDRESS", 504 * MS),
        (7, "cuda_sticky_error", "CUDA_ERROR_ILLEGAL_ADDRESS", 505 * MS),
        (8, "cuda_sticky_error", "CUDA_ERROR_ILLEGAL_ADDRESS", 506 * MS),
        (9, "cuda_sticky_error", "CUDA_ERROR_ILLEGAL_ADDRESS", 507 * MS),
        (10, "throttle", "sw_power_cap", 650 * MS),
        (11, "signal", "SIGKILL", 800 * MS),
        (12, "xid", "Xid 43 (GPU stopped processing)", 1000 * MS),
        (13, "exit", "exit status 1", 1100 * MS),
    ]


def test_oom_chain_retry_recovery_and_healthy(faults):
    f = by_id(faults, 1)
    assert (f.code, f.function, f.pid, f.tid, f.thread, f.unc_ns, f.dur_ns) == (
        2, "cuMemAlloc_v2", 4242, 4242, "python", 0, 50 * US)
    assert f.sightings == [{"source": "uprobe", "t_ns": T0 + 100 * MS, "unc_ns": 0,
                            "domain": "MONOTONIC"}]
    assert [(e["what"], e["dt_ns"], e.get("code")) for e in f.chain] == [
        ("retry", 1 * MS, 2), ("success", 50 * MS, 0)]
    assert f.chain[0]["fault"] is None                 # a retry is not a fault of its own
    assert f.recovery_ns == 50 * MS + 100 * US         # to the return of the good retry
    assert f.recovery_unc_ns == 0
    assert f.healthy_ns == 2 * MS + 5 * US             # the launch at +102 ms returned
    assert f.message == "cuMemAlloc_v2 returned CUDA_ERROR_OUT_OF_MEMORY (2)"


def test_sticky_errors_grouped_under_the_first(faults):
    first = by_id(faults, 4)
    assert first.function == "cuCtxSynchronize" and first.dur_ns == 2 * MS
    sticky = [f for f in faults if f.kind == "cuda_sticky_error"]
    assert len(sticky) == 5
    assert all(f.parent == 4 and f.code == 700 for f in sticky)
    assert [f.function for f in sticky] == ["cuLaunchKernel", "cuMemAlloc_v2", "cuCtxSynchronize",
                                            "cuMemFree_v2", "cuStreamSynchronize"]
    assert sticky[3].tid == 4250 and sticky[3].thread == "pt_worker"
    whats = [(e["what"], e.get("fault")) for e in first.chain]
    assert whats == [("sticky_error", 5), ("sticky_error", 6), ("sticky_error", 7),
                     ("sticky_error", 8), ("sticky_error", 9), ("exit", 13)]
    assert first.chain[-1]["dt_ns"] == 600 * MS and first.chain[-1]["code"] == 1
    assert first.recovery_ns is None and first.healthy_ns is None
    assert first.related == [3]


def test_xid_seen_twice_is_one_fault(faults):
    x = by_id(faults, 3)
    assert (x.code, x.gpu, x.pid, x.unc_ns) == (31, 0, 4242, 0)
    assert [(s["source"], s["t_ns"] - T0, s["unc_ns"], s["domain"]) for s in x.sightings] == [
        ("tracepoint", 499_500_000, 0, "MONOTONIC"), ("nvml", 799_500_000, 50 * US, "MONOTONIC")]
    assert x.delays == [{"from": "tracepoint", "to": "nvml", "delay_ns": 300 * MS,
                         "unc_ns": 50 * US}]
    assert x.message.startswith("PCI 0000:18:00.0: pid=4242, name=python")
    assert [(e["what"], e["fault"], e["dt_ns"]) for e in x.chain] == [
        ("error", 4, 500 * US), ("exit", 13, 600_500_000)]
    assert x.related == [4]
    only_nvml = by_id(faults, 12)
    assert [s["source"] for s in only_nvml.sightings] == ["nvml"]
    assert (only_nvml.unc_ns, only_nvml.gpu, only_nvml.pid) == (50 * US, 0, None)
    assert only_nvml.chain == []


def test_connect_refused_retry_then_success(faults):
    c = [f for f in faults if f.kind == "connect_error"]
    assert len(c) == 1                        # the EINPROGRESS connect and the retry are not faults
    f = c[0]
    assert (f.code, f.target, f.tid, f.thread) == (111, "127.0.0.1:8000", 4250, "pt_worker")
    assert f.message == "connect(127.0.0.1:8000) failed: Connection refused"
    assert [(e["what"], e["dt_ns"]) for e in f.chain] == [("retry", 50 * MS), ("success", 100 * MS)]
    assert f.recovery_ns == 100 * MS + 30 * US


def test_throttle_on_and_cleared(faults):
    f = by_id(faults, 10)
    assert (f.code, f.gpu, f.pid) == (0x4, 0, None)
    assert f.unc_ns == 50 * MS + 20 * US + 7          # half the gap + sample uncertainty
    assert f.sightings[0]["domain"] == "REALTIME"
    assert [(e["what"], e["dt_ns"]) for e in f.chain] == [("cleared", 300 * MS)]
    assert f.recovery_ns == 300 * MS
    assert f.recovery_unc_ns == 2 * (50 * MS + 20 * US + 7)
    assert not any(f.name == "gpu_idle" for f in faults)   # idle is not capping


def test_signal_and_exit(faults):
    s = by_id(faults, 11)
    assert (s.pid, s.code, s.message) == (5000, 9, "killed by SIGKILL, sent by pid 1 (systemd)")
    assert [(e["what"], e["dt_ns"]) for e in s.chain] == [("exit", 200 * US)]
    e = by_id(faults, 13)
    assert (e.pid, e.tid, e.code, e.message) == (4242, 4242, 1, "exit_group(1)")
    assert not any(f.kind == "signal" and f.pid == 4242 for f in faults)   # SIGCHLD


def test_kinds_filter_and_dict():
    tl = Timeline.open(FAULTS, models={"REALTIME": OffsetModel()})
    assert [f.id for f in tl.faults(kinds="xid")] == [3, 12]
    assert [f.id for f in tl.faults(kinds=["exit", "signal"])] == [11, 13]
    d = tl.faults()[0].to_dict()
    json.dumps(d)
    assert d["kind"] == "cuda_error" and d["chain"][1]["what"] == "success"


def test_no_clock_model_still_finds_faults():
    f = Timeline.open(FAULTS, models={}).faults()
    t = next(x for x in f if x.kind == "throttle")
    assert t.t_ns == T0 + 650 * MS + 30 * US and t.sightings[0]["domain"] == "receipt"
    assert len(f) == 13


# ------------------------------------------------------------------ the CLI
def test_cli_text():
    r = CliRunner().invoke(faults_command, [FAULTS])
    assert r.exit_code == 0, r.output
    out = r.output
    assert "13 faults (5 sticky repeats listed under their first error)" in out
    assert "cuMemAlloc_v2 -> CUDA_ERROR_OUT_OF_MEMORY (2)" in out
    assert "recovery 50.100 ms; healthy after 2.005 ms" in out
    assert "nvml saw it 300.000 ms ± 50.0 µs after tracepoint" in out
    assert "sticky_error  cuMemFree_v2 -> CUDA_ERROR_ILLEGAL_ADDRESS" in out
    assert "4242/4250 (pt_worker)" in out
    lines = [ln for ln in out.splitlines() if "cuda_sticky_error" in ln]
    assert lines == []                         # shown only under their first error


def test_cli_json():
    r = CliRunner().invoke(faults_command, [FAULTS, "--json"])
    assert r.exit_code == 0
    doc = json.loads(r.output)
    assert doc["truncated"] is None and doc["start_ns"] == T0
    assert [f["kind"] for f in doc["faults"]].count("cuda_sticky_error") == 5


def test_cli_truncated_lists_then_exits_3(capsys):
    with pytest.raises(SystemExit) as e:
        cli_main(["faults", TRUNC])
    assert e.value.code == 3
    out, err = capsys.readouterr()
    assert "13 faults" in out
    assert err.startswith("clockalign: ") and "truncated at byte" in err
    assert err.count("\n") == 1


def test_cli_bad_file(tmp_path, capsys):
    p = tmp_path / "x.ca"
    p.write_bytes(b"nope")
    with pytest.raises(SystemExit) as e:
        cli_main(["faults", str(p)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err == f"clockalign: {p} is not a clockalign run (no CLKALIGN header)\n"


# ------------------------------------------------------------------ edge cases, built inline
def ev(kind, t, pid=100, tid=100, dur=0, code=0, ret=0, a=(0, 0), data=b""):
    e = np.zeros(1, dtype=EVENT_DTYPE)
    e["ts"], e["dur"], e["pid"], e["tid"] = t, dur, pid, tid
    e["kind"], e["code"], e["ret"], e["a0"], e["a1"] = kind, code, ret, a[0], a[1]
    e["data"] = np.void(data.ljust(56, b"\0")[:56])
    return e


def cuda(t_ms, name, ret, pid=100, tid=100, dur=10 * US):
    return ev(Kind.CUDA, T0 + int(t_ms * MS), pid, tid, dur, CUDA_FN_BY_NAME[name], ret)


def run(tmp_path, events, rows=None, counters=None, meta=None):
    p = tmp_path / "edge.ca"
    with RunWriter(p, meta or {"gpus": [{"index": 0, "pci_bus_id": "00000000:18:00.0"}]}) as w:
        if events:
            evs = np.concatenate(events)
            w.write_columns(Chunk.EVENTS, {n: evs[n] for n in EVENT_DTYPE.names})
        if rows:
            w.write_rows(Chunk.GPU_EVENTS, rows)
        if counters:
            w.write_columns(Chunk.COUNTERS, counters)
    return Timeline.open(p, models={"REALTIME": OffsetModel()}).faults()


def test_no_faults(tmp_path):
    assert run(tmp_path, [cuda(1, "cuLaunchKernel", 0)]) == []
    r = CliRunner().invoke(faults_command, [str(tmp_path / "edge.ca")])
    assert r.exit_code == 0 and "0 faults" in r.output


def test_sticky_storm_chain_is_capped(tmp_path):
    evs = [cuda(1, "cuCtxSynchronize", 719)]
    evs += [cuda(2 + i * 0.01, "cuLaunchKernel", 719) for i in range(300)]
    f = run(tmp_path, evs)
    assert len(f) == 301 and f[0].name == "CUDA_ERROR_LAUNCH_FAILED"
    assert len(f[0].chain) == 201
    assert f[0].chain[-1]["what"] == "more" and f[0].chain[-1]["count"] == 100


def test_unrecovered_error_does_not_swallow_later_ones(tmp_path):
    evs = [cuda(1, "cuMemAlloc_v2", 2), cuda(2, "cuLaunchKernel", 0),
           cuda(50, "cuMemcpyHtoD_v2", 1), cuda(51, "cuMemcpyHtoD_v2", 0)]
    f = run(tmp_path, evs)
    assert [(x.kind, x.function) for x in f] == [("cuda_error", "cuMemAlloc_v2"),
                                                  ("cuda_error", "cuMemcpyHtoD_v2")]
    assert f[0].chain == [] and f[0].recovery_ns is None
    assert f[0].healthy_ns == 1 * MS + 10 * US
    assert f[1].recovery_ns == 1 * MS + 10 * US


def test_errors_before_healthy_are_in_the_chain(tmp_path):
    """Another call of the same family (an allocation) failing before the process is healthy
    again follows from the fault; a launch failing then does not (issue 16 item 7)."""
    evs = [cuda(1, "cuMemAlloc_v2", 2), cuda(2, "cuMemAllocAsync", 2),
           cuda(3, "cuLaunchKernel", 1), cuda(4, "cuMemAlloc_v2", 0)]
    f = run(tmp_path, evs)
    assert [(e["what"], e["fault"]) for e in f[0].chain] == [("error", 2), ("success", None)]
    assert f[1].function == "cuMemAllocAsync" and f[1].recovery_ns is None
    assert f[2].function == "cuLaunchKernel" and f[2].chain == []


def test_chain_ends_where_a_sticky_error_starts_its_own(tmp_path):
    evs = [cuda(1, "cuMemAlloc_v2", 2), cuda(2, "cuMemAlloc_v2", 700),
           cuda(3, "cuMemAlloc_v2", 700), cuda(4, "cuLaunchKernel", 700),
           ev(Kind.PROC_EXIT, T0 + 5 * MS, 100, 100, ret=0)]
    f = run(tmp_path, evs)
    assert [(x.id, x.kind, x.code, x.parent) for x in f] == [
        (1, "cuda_error", 2, None), (2, "cuda_error", 700, None),
        (3, "cuda_sticky_error", 700, 2), (4, "cuda_sticky_error", 700, 2)]
    assert [(e["what"], e["fault"]) for e in f[0].chain] == [("retry", 2)]
    assert [(e["what"], e["fault"], e["name"]) for e in f[1].chain] == [
        ("sticky_error", 3, "CUDA_ERROR_ILLEGAL_ADDRESS"),
        ("sticky_error", 4, "CUDA_ERROR_ILLEGAL_ADDRESS"), ("exit", None, "exit status 0")]


def test_retry_with_another_code_is_a_new_fault_in_the_chain(tmp_path):
    evs = [cuda(1, "cuMemAlloc_v2", 2), cuda(2, "cuMemAlloc_v2", 1), cuda(3, "cuMemAlloc_v2", 0)]
    f = run(tmp_path, evs)
    assert [x.code for x in f] == [2, 1]
    assert [(e["what"], e.get("code"), e["fault"]) for e in f[0].chain] == [
        ("retry", 1, 2), ("success", 0, None)]
    assert f[0].recovery_ns == 2 * MS + 10 * US and f[1].recovery_ns == 1 * MS + 10 * US


def test_recovery_needs_a_call_after_the_failure_in_the_same_process(tmp_path):
    evs = [cuda(1, "cuMemAlloc_v2", 2, dur=5 * MS),          # fails at +6 ms
           cuda(2, "cuMemAlloc_v2", 0, tid=101),              # concurrent, started before
           cuda(7, "cuMemAlloc_v2", 0, pid=200, tid=200),     # another process
           cuda(9, "cuMemAlloc_v2", 0, tid=101)]
    f = run(tmp_path, evs)
    assert len(f) == 1 and f[0].recovery_ns == 8 * MS + 10 * US
    assert f[0].chain[-1]["tid"] == 101


def test_signals(tmp_path):
    # pid 100: SIGTERM handled, then exit_group(0): nothing.  pid 200: SIGSEGV, died.
    # pid 300: SIGKILL, death not recorded.  pid 400: SIGCHLD then normal death.
    # pid 500: exit_group(256): status 0, no fault.
    evs = [ev(Kind.SIGNAL, T0 + 1 * MS, 100, 100, ret=15, a=(1, 0)),
           ev(Kind.PROC_EXIT, T0 + 2 * MS, 100, 100, ret=0),
           ev(Kind.THREAD_EXIT, T0 + 3 * MS, 100, 100, code=1),
           ev(Kind.SIGNAL, T0 + 4 * MS, 200, 200, ret=11, a=(200, 0)),
           ev(Kind.THREAD_EXIT, T0 + 5 * MS, 200, 200, code=1),
           ev(Kind.SIGNAL, T0 + 6 * MS, 300, 300, ret=9, a=(1, 0), data=b"kill"),
           ev(Kind.SIGNAL, T0 + 7 * MS, 400, 400, ret=17, a=(1, 0)),
           ev(Kind.THREAD_EXIT, T0 + 8 * MS, 400, 400, code=1),
           ev(Kind.SIGNAL, T0 + 9 * MS, 600, 600, ret=15, code=1, a=(1, 0)),   # ignored
           ev(Kind.THREAD_EXIT, T0 + 9_500_000, 600, 600, code=1),
           ev(Kind.PROC_EXIT, T0 + 10 * MS, 500, 500, ret=256)]
    f = run(tmp_path, evs)
    assert [(x.kind, x.pid, x.name) for x in f] == [("signal", 200, "SIGSEGV"),
                                                     ("signal", 300, "SIGKILL")]
    assert f[0].message == "killed by SIGSEGV, raised by the process itself"
    assert f[1].message.endswith("its exit was not recorded") and f[1].chain == []


def test_xid_merge_tolerance_and_pairing(tmp_path):
    def xid(t, code=31):
        return ev(Kind.XID, t, 0, 0, ret=code, data=b"0000:18:00.0".ljust(16, b"\0") + b"pid=7")

    def nvml(t, code=31, unc=50 * US, gpu=0):
        return {"source": "nvml", "gpu": gpu, "type": "xid", "code": code, "t_mono_ns": t,
                "t_real_ns": t + REAL_OFFSET, "unc_ns": unc}
    evs = [xid(T0), xid(T0 + 1 * MS),                          # two Xid 31 back to back
           xid(T0 + 100 * MS, 43), xid(T0 + 200 * MS, 13), xid(T0 + 300 * MS, 79)]
    rows = [nvml(T0 + 150 * MS), nvml(T0 + 151 * MS),          # pair with them in order
            nvml(T0 + 100 * MS + 3_000 * MS, 43),              # 3 s late: beyond tolerance
            nvml(T0 + 200 * MS - 10 * US, 13),                 # 10 us early, within 50 us
            nvml(T0 + 300 * MS - 1 * MS, 79),                  # 1 ms early: not the same
            nvml(T0 + 300 * MS + 5 * MS, 79, gpu=1)]           # another GPU
    f = run(tmp_path, evs, rows)
    got = [(x.code, (x.t_ns - T0) // US, [s["source"] for s in x.sightings]) for x in f]
    assert got == [
        (31, 0, ["tracepoint", "nvml"]), (31, 1000, ["tracepoint", "nvml"]),
        (43, 100_000, ["tracepoint"]), (13, 200_000, ["nvml", "tracepoint"]),
        (79, 299_000, ["nvml"]), (79, 300_000, ["tracepoint"]), (79, 305_000, ["nvml"]),
        (43, 3_100_000, ["nvml"])]
    assert [d["delay_ns"] for d in f[0].delays] == [150 * MS]
    assert [d["delay_ns"] for d in f[1].delays] == [150 * MS]
    assert f[3].t_ns == T0 + 200 * MS and f[3].delays[0]["delay_ns"] == -10 * US
    assert all(x.pid == 7 for x in f if x.sightings[0]["source"] == "tracepoint"
               or len(x.sightings) == 2)


def test_throttle_on_at_first_sample(tmp_path):
    t = T0 + np.arange(0, 500, 100, dtype=np.int64) * MS
    n = len(t)
    cols = {"gpu": np.ones(n, dtype=np.uint8),
            "field": np.full(n, FIELD_BY_NAME["clock_event_reasons"], dtype="<u2"),
            "t_real_ns": t + REAL_OFFSET, "latency_ns": np.full(n, 1000, dtype=np.int64),
            "recv_mono_ns": t + 5000,
            "value": np.array([0x40, 0x40, 0x60, 0x0, 0x8], dtype=np.float64),
            "window_ns": np.zeros(n, dtype=np.int64)}
    f = run(tmp_path, [], counters=cols)
    got = [(x.name, x.gpu, x.t_ns - T0, x.unc_ns, x.recovery_ns) for x in f]
    assert got == [("hw_thermal", 1, 0, 1007, 300 * MS - 50 * MS),
                   ("sw_thermal", 1, 150 * MS, 50 * MS + 1007, 100 * MS),
                   ("hw_slowdown", 1, 350 * MS, 50 * MS + 1007, None)]
    assert "first sample" in f[0].message
