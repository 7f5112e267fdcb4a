"""timeline/benign.py's rules on synthetic events: each known benign pattern is a note with
a count, not a fault; the same failure without the pattern's context, and every real fault
in the same process, stays a fault."""
import errno
import json
import socket
import struct

from click.testing import CliRunner

from clockalign.cli.faults import command as faults_command
from clockalign.store.schema import Kind
from clockalign.timeline import Timeline, benign

from .test_faults import MS, T0, OffsetModel, cuda, ev, run


def unix_connect(t_ms, path, err, pid=100, tid=100):
    addr = struct.pack("<H", socket.AF_UNIX) + path.encode() + b"\0"
    return ev(Kind.CONNECT, T0 + int(t_ms * MS), pid, tid, 20_000, ret=-err,
              a=(3, 110), data=addr)


def tcp_connect(t_ms, port, err, pid=100, tid=100):
    addr = struct.pack("<H", socket.AF_INET) + struct.pack(">H", port) + bytes([127, 0, 0, 1])
    return ev(Kind.CONNECT, T0 + int(t_ms * MS), pid, tid, 20_000, ret=-err,
              a=(3, 16), data=addr.ljust(16, b"\0"))


def notes_of(tmp_path):
    tl = Timeline.open(tmp_path / "edge.ca", models={"REALTIME": OffsetModel()})
    tl.faults()
    return {d["rule"]: d["count"] for d in tl.benign}


def test_the_table_has_a_reason_for_every_rule():
    names = [r.name for r in benign.RULES]
    assert len(set(names)) == len(names)
    assert {"nscd probe", "MPS probe", "driver shut down at exit",
            "lookup not found"} <= set(names)
    for r in benign.RULES:
        assert len(r.reason) > 30 and r.source in ("connect", "cuda")
        assert (r.peer and r.errno) if r.source == "connect" else (r.code and r.when)


def test_socket_probes_are_notes_an_inference_socket_is_a_fault(tmp_path):
    f = run(tmp_path, [unix_connect(1, "/var/run/nscd/socket", errno.ENOENT),
                       unix_connect(2, "/var/run/nscd/socket", errno.ENOENT),
                       unix_connect(3, "/tmp/nvidia-mps/control", errno.ENOENT),
                       unix_connect(4, "/run/triton/infer.sock", errno.ENOENT),
                       unix_connect(5, "/var/run/nscd/socket", errno.EACCES),
                       tcp_connect(6, 8001, errno.ECONNREFUSED)])
    assert [(x.kind, x.target, x.name) for x in f] == [
        ("connect_error", "unix:/run/triton/infer.sock", "ENOENT"),
        ("connect_error", "unix:/var/run/nscd/socket", "EACCES"),
        ("connect_error", "127.0.0.1:8001", "ECONNREFUSED")]
    assert notes_of(tmp_path) == {"nscd probe": 2, "MPS probe": 1}


def test_deinitialized_at_exit_is_a_note_before_more_work_a_fault(tmp_path):
    f = run(tmp_path, [
        cuda(1, "cuMemAlloc_v2", 2), cuda(2, "cuMemAlloc_v2", 0),
        cuda(3, "cuModuleUnload", 4),                 # the driver went away, work followed
        cuda(4, "cuLaunchKernel", 0),
        cuda(10, "cuLibraryUnload", 4), cuda(11, "cuModuleUnload", 4),   # no work after
        ev(Kind.PROC_EXIT, T0 + 12 * MS, 100, 100, ret=0),
        cuda(1, "cuLaunchKernel", 0, pid=200, tid=200),
        ev(Kind.PROC_EXIT, T0 + 2 * MS, 200, 200, ret=0),
        cuda(3, "cuMemFree_v2", 4, pid=200, tid=201),  # another thread, after exit_group
        cuda(4, "cuLaunchKernel", 0, pid=200, tid=202)])
    assert [(x.pid, x.function, x.name) for x in f] == [
        (100, "cuMemAlloc_v2", "CUDA_ERROR_OUT_OF_MEMORY"),
        (100, "cuModuleUnload", "CUDA_ERROR_DEINITIALIZED")]
    assert notes_of(tmp_path) == {"driver shut down at exit": 3}


def test_lookup_not_found_then_normal_work_is_a_note(tmp_path):
    f = run(tmp_path, [
        cuda(1, "cuModuleGetFunction", 500), cuda(2, "cuLibraryGetKernel", 500),
        cuda(3, "cuModuleGetFunction", 0), cuda(4, "cuLaunchKernel", 0),   # tid 100: fine
        cuda(1, "cuModuleGetFunction", 500, tid=101),
        cuda(2, "cuLaunchKernel", 400, tid=101),      # its next call failed: a fault
        cuda(3, "cuLaunchKernel", 0, tid=101),
        cuda(1, "cuLibraryGetKernel", 500, tid=102),  # nothing more on that thread
        cuda(5, "cuLaunchKernel", 0, tid=103),
        cuda(6, "cuMemAlloc_v2", 500, tid=100),       # not a lookup: a fault
        cuda(7, "cuMemAlloc_v2", 0, tid=100)])
    assert [(x.tid, x.function, x.code) for x in f] == [
        (101, "cuModuleGetFunction", 500), (102, "cuLibraryGetKernel", 500),
        (101, "cuLaunchKernel", 400), (100, "cuMemAlloc_v2", 500)]
    assert notes_of(tmp_path) == {"lookup not found": 2}


def test_benign_failures_stay_out_of_a_real_faults_chain(tmp_path):
    """An OOM's chain of allocation errors does not take in the lookups or the shutdown."""
    f = run(tmp_path, [cuda(1, "cuMemAlloc_v2", 2), cuda(2, "cuModuleGetFunction", 500),
                       cuda(2.5, "cuLaunchKernel", 0), cuda(3, "cuMemAlloc_v2", 2),
                       cuda(4, "cuMemAlloc_v2", 0),
                       cuda(9, "cuModuleUnload", 4),
                       ev(Kind.PROC_EXIT, T0 + 10 * MS, 100, 100, ret=0)])
    assert len(f) == 1 and f[0].name == "CUDA_ERROR_OUT_OF_MEMORY"
    assert [e["what"] for e in f[0].chain] == ["retry", "success"]
    assert notes_of(tmp_path) == {"lookup not found": 1, "driver shut down at exit": 1}


def test_faults_command_counts_the_notes(tmp_path):
    run(tmp_path, [unix_connect(1, "/var/run/nscd/socket", errno.ENOENT),
                   cuda(2, "cuModuleGetFunction", 500), cuda(3, "cuLaunchKernel", 0),
                   cuda(4, "cuMemAlloc_v2", 2)])
    r = CliRunner().invoke(faults_command, [str(tmp_path / "edge.ca"), "--json"])
    doc = json.loads(r.output)
    assert [f["name"] for f in doc["faults"]] == ["CUDA_ERROR_OUT_OF_MEMORY"]
    assert {d["rule"]: (d["count"], d["pids"]) for d in doc["benign"]} == {
        "nscd probe": (1, [100]), "lookup not found": (1, [100])}
    r = CliRunner().invoke(faults_command, [str(tmp_path / "edge.ca")])
    assert "2 known benign failures left out (notes, not faults): 1 nscd probe, " \
           "1 lookup not found" in r.output
    assert "note: 1 x nscd probe (connect(unix:/var/run/nscd/socket) -> ENOENT)" in r.output
