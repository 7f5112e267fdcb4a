"""The pure parts of scripts/gpu/cupti_coverage.py and scripts/gpu/cuda_entrypoints.py: family
mapping, window counting from clockalign's dump and from a torch.profiler chrome trace, the
comparison, the ELF symbol listing and IP -> symbol resolution.  No root, no GPU."""
import json
import os
import shutil
import subprocess
import sys

import pytest

SCRIPTS = os.path.join(os.path.dirname(__file__), "..", "..", "scripts")
sys.path.insert(0, os.path.abspath(os.path.join(SCRIPTS, "gpu")))
sys.path.insert(0, os.path.abspath(os.path.join(SCRIPTS, "workloads")))

import cuda_entrypoints as ge    # noqa: E402
import cupti_coverage as gc      # noqa: E402


# ------------------------------------------------------------------ families

@pytest.mark.parametrize("name,fam", [
    ("cuLaunchKernel", "kernel_launch"), ("cuLaunchKernel_ptsz", "kernel_launch"),
    ("cuLaunchKernelEx", "kernel_launch"), ("cuLaunchKernelEx_ptsz", "kernel_launch"),
    ("cudaLaunchKernel", "kernel_launch"), ("cudaLaunchKernelExC_v11060", "kernel_launch"),
    ("cudaLaunchKernel_ptsz", "kernel_launch"),
    ("cuGraphLaunch", "graph_launch"), ("cuGraphLaunch_ptsz", "graph_launch"),
    ("cudaGraphLaunch", "graph_launch"),
    ("cuMemcpyHtoDAsync_v2", "copy_async"), ("cuMemcpyHtoDAsync_v2_ptsz", "copy_async"),
    ("cuMemcpyDtoHAsync_v2", "copy_async"), ("cuMemcpyAsync", "copy_async"),
    ("cuMemcpyAsync_ptsz", "copy_async"), ("cuMemcpyPeerAsync", "copy_async"),
    ("cudaMemcpyAsync", "copy_async"), ("cudaMemcpyAsync_ptsz", "copy_async"),
    ("cuMemcpyHtoD_v2", "copy_sync"), ("cuMemcpyDtoH_v2_ptds", "copy_sync"),
    ("cuMemcpy", "copy_sync"), ("cudaMemcpy", "copy_sync"),
    ("cuMemsetD8_v2", "memset"), ("cuMemsetD32Async", "memset"),
    ("cuMemsetD16Async_ptsz", "memset"), ("cuMemsetD2D32_v2", "memset"),
    ("cudaMemsetAsync", "memset"),
    ("cuMemCreate", "vmm"), ("cuMemMap", "vmm"), ("cuMemUnmap", "vmm"), ("cuMemRelease", "vmm"),
    ("cuMemAddressReserve", "vmm"), ("cuMemAddressFree", "vmm"), ("cuMemSetAccess", "vmm"),
    ("cuModuleLoadData", "module_load"), ("cuModuleLoadDataEx", "module_load"),
    ("cuLibraryLoadData", "module_load"), ("cuModuleGetFunction", "module_get_function"),
    ("cuModuleUnload", "module_unload"), ("cuLibraryUnload", "module_unload"),
    ("cuStreamWaitEvent", "stream_wait"), ("cuStreamWaitEvent_ptsz", "stream_wait"),
    ("cudaStreamWaitEvent", "stream_wait"), ("cuEventRecord", "event_record"),
    ("cuEventRecord_ptsz", "event_record"), ("cudaEventRecord", "event_record"),
    ("cuCtxSynchronize", "sync"), ("cuCtxSynchronize_v2", "sync"),
    ("cuStreamSynchronize_ptsz", "sync"), ("cudaDeviceSynchronize", "sync"),
    ("cuMemAlloc_v2", "alloc"), ("cuMemAllocAsync_ptsz", "alloc"),
    ("cuMemAllocFromPoolAsync", "alloc"), ("cuMemFree_v2", "free"), ("cuMemFreeAsync", "free"),
    ("cuGetProcAddress_v2", None), ("cudaGetDevice", None), ("cuCtxGetCurrent", None),
])
def test_family_of(name, fam):
    assert gc.family_of(name) == fam


def test_copy_direction():
    assert gc.copy_direction("cuMemcpyHtoDAsync_v2_ptsz") == "h2d"
    assert gc.copy_direction("cuMemcpyDtoHAsync_v2") == "d2h"
    assert gc.copy_direction("Memcpy DtoD (Device -> Device)") == "d2d"
    assert gc.copy_direction("cuMemcpyAsync") is None


# ------------------------------------------------------------------ clockalign window

PEER = "127.0.0.1:40001"


def _cuda(t, fn, tid=100, ret=0, pid=100):
    return {"kind": "cuda", "t_ns": t, "pid": pid, "tid": tid, "fn": fn, "ret": ret,
            "dur_ns": 5}


def _connect(t, peer=PEER, pid=100):
    return {"kind": "connect", "t_ns": t, "pid": pid, "tid": 100, "peer": peer, "ret": -111,
            "errno": "ECONNREFUSED", "dur_ns": 3, "fd": 5}


def dump_lines():
    evs = [_cuda(5, "cuLaunchKernel"),                   # before the window
           _connect(10, "127.0.0.1:9"),                  # some other connect
           _connect(20),
           *[_cuda(30 + i, "cuLaunchKernel") for i in range(3)],
           *[_cuda(40 + i, "cuLaunchKernel_ptsz") for i in range(2)],
           _cuda(50, "cuLaunchKernelEx_ptsz", tid=101),
           _cuda(51, "cuGraphLaunch_ptsz"), _cuda(52, "cuGraphLaunch"),
           _cuda(53, "cuMemcpyHtoDAsync_v2"), _cuda(54, "cuMemcpyAsync_ptsz"),
           _cuda(55, "cuMemsetD32Async", ret=1),
           _cuda(56, "cuCtxGetCurrent"),
           _cuda(57, "cuLaunchKernel", pid=999),        # another process
           {"kind": "cuda_unfinished", "t_ns": 58, "pid": 100, "tid": 100,
            "fn": "cuStreamSynchronize", "ret": None, "unfinished": True},
           {"kind": "sched", "t_ns": 59, "pid": 100, "tid": 100},
           _connect(60),
           _cuda(70, "cuLaunchKernel")]                  # after
    return [json.dumps(e) for e in evs]


def test_clockalign_window_counts():
    ca = gc.clockalign_window(dump_lines(), PEER, pid=100, main_tid=100)
    assert ca["markers"] == 2 and ca["window"] == [20, 60]
    f = ca["families"]
    assert f["kernel_launch"] == 6
    assert f["graph_launch"] == 2
    assert f["copy_async"] == 2 and f["copy_async_h2d"] == 1 and f["copy_async_unknown"] == 1
    assert f["memset"] == 1 and f["sync"] == 1
    assert ca["unfinished"] == {"cuStreamSynchronize": 1}
    assert ca["other_threads"] == {"cuLaunchKernelEx_ptsz": 1}
    assert ca["errors"] == {"cuMemsetD32Async -> 1": 1}
    assert ca["unclassified"] == {"cuCtxGetCurrent": 1}
    assert ca["symbols"]["cuLaunchKernel_ptsz"] == 2


def test_clockalign_window_without_markers():
    ca = gc.clockalign_window(dump_lines()[:3], PEER, pid=100)
    assert ca["window"] is None and ca["families"] == {}


# ------------------------------------------------------------------ CUPTI window

def _x(cat, name, ts, corr, dur=1.0):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": 1,
            "args": {"correlation": corr}}


def trace():
    ev = [_x("cuda_runtime", "cudaLaunchKernel", 5.0, 1),          # outside the window
          _x("kernel", "k_out", 6.0, 1),
          {"ph": "X", "cat": "user_annotation", "name": gc.WINDOW, "ts": 10.0, "dur": 100.0,
           "pid": 1, "tid": 1, "args": {}},
          {"ph": "X", "cat": "gpu_user_annotation", "name": gc.WINDOW, "ts": 10.0, "dur": 300.0,
           "pid": 0, "tid": 7, "args": {}}]
    c = 10
    for i in range(3):
        ev += [_x("cuda_runtime", "cudaLaunchKernel", 11.0 + i, c), _x("kernel", "add", 50.0, c)]
        c += 1
    ev += [_x("cuda_driver", "cuLaunchKernelEx", 20.0, c), _x("kernel", "gemm", 51.0, c)]
    c += 1
    ev += [_x("cuda_runtime", "cudaLaunchKernelExC", 21.0, c), _x("kernel", "conv", 52.0, c),
           _x("kernel", "conv_bias", 53.0, c)]                   # one launch, 2 kernels
    c += 1
    for _ in range(2):                                           # 2 graph launches x 3 kernels
        ev.append(_x("cuda_runtime", "cudaGraphLaunch", 30.0, c))
        ev += [_x("kernel", "g", 60.0, c) for _ in range(3)]
        c += 1
    ev += [_x("cuda_runtime", "cudaMemcpyAsync", 40.0, c),
           _x("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 70.0, c)]
    c += 1
    ev += [_x("cuda_runtime", "cudaMemcpyAsync", 41.0, c),
           _x("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", 71.0, c)]
    c += 1
    ev += [_x("cuda_runtime", "cudaMemsetAsync", 42.0, c), _x("gpu_memset", "Memset (Device)", 72.0, c)]
    c += 1
    ev += [_x("gpu_memset", "Memset (Device)", 73.0, 999)]        # driver memset, record dropped
    ev += [_x("cuda_runtime", "cudaDeviceSynchronize", 100.0, c),
           _x("cuda_runtime", "cudaGetDevice", 101.0, c + 1)]
    ev += [_x("cuda_runtime", "cudaLaunchKernel", 200.0, c + 2)]  # after the window
    return {"traceEvents": ev}


def test_cupti_window_counts():
    u = gc.cupti_window(trace())
    assert u["window_found"]
    f = u["families"]
    assert f["kernel_launch"] == 5          # 3 runtime + 1 driver + 1 ExC
    assert f["graph_launch"] == 2 and f["graph_kernels"] == 6
    assert [g["kernels"] for g in u["graph_launches"]] == [3, 3]
    assert f["copy_async"] == 2 and f["copy_async_h2d"] == 1 and f["copy_async_d2h"] == 1
    assert f["memset"] == 1 and f["sync"] == 1
    assert u["gpu"]["memset"] == 2          # the linked one and the dropped driver one
    assert u["gpu"]["kernels"] == 6         # 3 + 1 + 2, graph kernels apart
    assert u["kernels_by_api"] == {"cudaLaunchKernel": 3, "cuLaunchKernelEx": 1,
                                   "cudaLaunchKernelExC": 2}
    assert u["unclassified_api"] == {"cudaGetDevice": 1}


def workload():
    return {"pid": 100, "main_tid": 100, "marker_peer": PEER, "n": 3, "torch": "x",
            "parts": {"eager": {"expect": [gc_expect("kernel_launch", 3)]},
                      "vmm": {"expect": [dict(gc_expect("vmm_explicit", 7),
                                              symbols={"cuMemCreate": 4, "cuMemMap": 3}),
                                         gc_expect("vmm_torch", 0, False)]},
                      "modules": {"expect": [gc_expect("module_load", 2),
                                             {"skipped": "x", "reason": "y"}]}},
            "skipped": {"triton": "RuntimeError: no compiler"}}


def gc_expect(fam, n, exact=True):
    return {"family": fam, "n": n, "exact": exact, "note": "t"}


def test_declared_counts():
    d = gc.declared_counts(workload())
    assert d["kernel_launch"] == {"n": 3, "exact": True, "notes": ["eager: t"]}
    assert d["vmm_torch"]["exact"] is False


def test_compare_rows_and_render():
    ca = gc.clockalign_window(dump_lines(), PEER, pid=100, main_tid=100)
    ca["families"]["vmm"] = 9
    ca["families"]["module_load"] = 2
    ca["symbols"].update({"cuMemCreate": 5, "cuMemMap": 4, "cuModuleLoadData": 2})
    u = gc.cupti_window(trace())
    rows = {r["family"]: r for r in gc.compare(ca, u, gc.declared_counts(workload()),
                                                probed=["cuLaunchKernel", "cuMemsetD32Async"])}
    assert rows["kernel_launch"]["cupti"] == 5 and rows["kernel_launch"]["clockalign"] == 6
    assert rows["kernel_launch"]["status"] == "DIFF" and rows["kernel_launch"]["diff"] == 1
    assert rows["graph_launch"]["status"] == "ok"
    assert rows["graph_kernels"]["status"] == "info" and rows["graph_kernels"]["reference"] == 6
    assert rows["copy_async"]["status"] == "ok"
    # one clockalign cuMemcpyAsync of unknown direction: per-direction rows may be short
    assert rows["copy_async_h2d"]["status"] == "ok"
    assert rows["memset"]["reference"] == 2 and rows["memset"]["basis"].startswith("CUPTI GPU")
    assert rows["memset"]["status"] == "DIFF"
    assert rows["vmm"]["reference"] == 7 and rows["vmm"]["status"] == "ok"
    assert "+2 calls against the explicit ones" in rows["vmm"]["note"]
    assert rows["module_load"]["reference"] == 2 and rows["module_load"]["status"] == "ok"
    assert rows["module_load"]["basis"].startswith("workload")
    assert rows["sync"]["status"] == "ok"
    assert "copy_async_unknown" not in rows
    md = gc.render_md(list(rows.values()), ca, u, workload(), {"host": "h"})
    assert "| kernel_launch | 5 | 6 |" in md
    assert "## Differences (2)" in md
    assert "triton: RuntimeError: no compiler" in md
    assert "modules: skipped x: y" in md


def test_declared_vmm_symbols_and_the_fallback_of_older_workloads():
    d = gc.declared_counts(workload())
    assert d["vmm_explicit"]["symbols"] == {"cuMemCreate": 4, "cuMemMap": 3}
    assert gc.vmm_explicit_symbols(d["vmm_explicit"]) == {"cuMemCreate": 4, "cuMemMap": 3}
    old = gc.vmm_explicit_symbols({"n": 140, "exact": True})      # 20 x the 7 calls
    assert old == {s: 20 for s in gc.VMM_EXPLICIT} and len(old) == 7


# the H200 run (results/coverage.md), reduced: what the entry-point counter saw in the window
EP = {"calls_by_phase": {
    "0": {"cuModuleLoad": 2, "cuLaunchKernel": 807},
    "1": {"cuLaunchKernel": 160, "cuLaunchKernelEx=cuLaunchKernelEx_alias": 40,
          "cuMemcpyHtoDAsync_v2": 20, "cuMemcpyDtoHAsync_v2": 20, "cuMemCreate": 33,
          "cuMemMap": 33, "cuMemUnmap": 33, "cuMemRelease": 33, "cuMemAddressReserve": 20,
          "cuMemSetAccess": 21, "cuMemAddressFree": 20, "cuModuleLoadData": 20,
          "cuLibraryLoadData": 20, "cuModuleGetFunction": 21, "cuModuleUnload": 20,
          "cuLibraryUnload": 20, "cuCtxGetDevice_v2": 1393, "cuStreamIsCapturing": 100,
          "cuDevicePrimaryCtxGetState": 382}}}
# what that recording probed: the table before ids 78-83
OLD_PROBED = ["cuLaunchKernel", "cuLaunchKernelEx", "cuMemcpyHtoDAsync_v2",
              "cuMemcpyDtoHAsync_v2", "cuMemCreate", "cuMemMap", "cuMemUnmap", "cuMemRelease",
              "cuMemAddressReserve", "cuModuleLoadData", "cuLibraryLoadData",
              "cuModuleGetFunction", "cuLibraryGetKernel"]


def test_entrypoint_window():
    ep = gc.entrypoint_window(EP)
    assert ep["window_found"]
    f = ep["families"]
    assert f["kernel_launch"] == 200            # the alias group counts once, by its first name
    assert f["copy_async"] == 40 and f["copy_async_h2d"] == 20 and f["copy_async_d2h"] == 20
    assert f["vmm"] == 193 and f["module_load"] == 40 and f["module_get_function"] == 21
    assert f["module_unload"] == 40
    assert "copy_async_unknown" not in f
    assert gc.entrypoint_window(EP, phase="0")["families"]["module_load"] == 2
    assert not gc.entrypoint_window({})["window_found"]
    assert gc.unprobed_calls(ep["symbols"], OLD_PROBED, "vmm") == {"cuMemSetAccess": 21,
                                                                   "cuMemAddressFree": 20}
    assert list(gc.unprobed_calls(ep["symbols"], OLD_PROBED, ""))[:2] == [
        "cuCtxGetDevice_v2", "cuDevicePrimaryCtxGetState"]
    assert gc.is_probed("cuLaunchKernelEx=cuLaunchKernelEx_alias", OLD_PROBED)


def test_compare_with_the_entry_point_counter():
    ca = {"markers": 2, "families": {"kernel_launch": 200, "vmm": 152, "module_load": 40,
                                     "module_get_function": 21},
          "symbols": {"cuLaunchKernel": 160, "cuLaunchKernelEx": 40, "cuMemCreate": 33,
                      "cuMemMap": 33, "cuMemUnmap": 33, "cuMemRelease": 33,
                      "cuMemAddressReserve": 20, "cuModuleLoadData": 20,
                      "cuLibraryLoadData": 20, "cuModuleGetFunction": 21}}
    u = {"window_found": True, "families": {"kernel_launch": 200},
         "api": {"cudaLaunchKernel": 160, "cuLaunchKernelEx": 40}, "gpu": {}}
    dec = gc.declared_counts({"parts": {"m": {"expect": [
        gc_expect("module_load", 41, False), gc_expect("module_get_function", 20),
        gc_expect("module_unload", 40), dict(gc_expect("vmm_explicit", 140))]}}})
    ep = gc.entrypoint_window(EP)
    rows = {r["family"]: r for r in gc.compare(ca, u, dec, OLD_PROBED, ep)}
    assert rows["kernel_launch"]["status"] == "ok" and rows["kernel_launch"]["entrypoints"] == 200
    for fam in ("module_load", "module_get_function"):     # the counter, not the declaration
        assert rows[fam]["status"] == "ok" and rows[fam]["basis"].startswith("entry-point")
    r = rows["module_unload"]
    assert (r["clockalign"], r["reference"], r["status"]) == (0, 40, "not probed")
    assert "not probed in this recording: cuLibraryUnload 20, cuModuleUnload 20" in r["note"]
    r = rows["vmm"]
    assert (r["reference"], r["diff"], r["status"]) == (193, -41, "not probed")
    assert r["unprobed"] == {"cuMemSetAccess": 21, "cuMemAddressFree": 20}
    # probing them now, the same counts would be a difference
    now = OLD_PROBED + ["cuMemSetAccess", "cuMemAddressFree", "cuModuleUnload", "cuLibraryUnload"]
    rows = {r["family"]: r for r in gc.compare(ca, u, dec, now, ep)}
    assert rows["vmm"]["status"] == "DIFF" and rows["module_unload"]["status"] == "DIFF"
    # without the counter: the explicit VMM calls, and the unprobed ones among them
    rows = {r["family"]: r for r in gc.compare(ca, u, dec, OLD_PROBED, None)}
    assert rows["vmm"]["reference"] == 140 and rows["vmm"]["status"] == "not probed"
    assert rows["vmm"]["unprobed"] == {"cuMemSetAccess": 20, "cuMemAddressFree": 20}
    assert rows["module_unload"]["status"] == "not probed"
    assert rows["module_load"]["status"] == "DIFF"     # 40 vs the old declaration 41+
    md = gc.render_md(list(gc.compare(ca, u, dec, OLD_PROBED, ep)), ca,
                      dict(u, api={"cudaLaunchKernel": 160}), {}, {}, ep, OLD_PROBED)
    assert "## Not probed in this recording (2)" in md
    assert "| cuCtxGetDevice_v2 | 1393 |" in md
    assert "| kernel_launch | cudaLaunchKernel 160 | cuLaunchKernel 160, " in md


def test_probed_symbols_default_to_the_table():
    syms = gc.probed_symbols(None)
    assert syms is None or {"cuModuleUnload", "cuMemSetAccess", "cuLaunchKernel"} <= set(syms)


def test_compare_explains_an_unprobed_family():
    ca = {"families": {}, "symbols": {}}
    u = {"families": {"graph_launch": 4}, "api": {"cudaGraphLaunch": 4}, "gpu": {}}
    rows = gc.compare(ca, u, {}, probed=["cuLaunchKernel"])
    r = [r for r in rows if r["family"] == "graph_launch"][0]
    assert r["status"] == "DIFF" and r["diff"] == -4
    assert "clockalign probes no symbol of this family" in r["note"]
    rows = gc.compare(ca, u, {}, probed=["cuGraphLaunch", "cuGraphLaunch_ptsz"])
    r = [r for r in rows if r["family"] == "graph_launch"][0]
    assert "cuGraphLaunch, cuGraphLaunch_ptsz (none called in the window)" in r["note"]


def test_analyze_writes_md_and_json(tmp_path):
    (tmp_path / "coverage-workload.json").write_text(json.dumps(workload()))
    (tmp_path / "coverage-dump.jsonl").write_text("\n".join(dump_lines()) + "\n")
    (tmp_path / "coverage-trace.json").write_text(json.dumps(trace()))
    res, md = gc.analyze(str(tmp_path), probed=None, meta={"host": "t"})
    assert (tmp_path / "coverage.md").read_text() == md
    j = json.loads((tmp_path / "coverage.json").read_text())
    assert {r["family"] for r in j["rows"]} >= {"kernel_launch", "graph_launch", "memset"}


# ------------------------------------------------------------------ entry points: ELF + IPs

LIBC = "/lib/x86_64-linux-gnu/libc.so.6"


@pytest.mark.skipif(not (os.path.exists(LIBC) and shutil.which("nm")), reason="needs libc + nm")
def test_elf_parser_matches_nm():
    mine = [(n, v) for n, v, _ in ge.elf_dynamic_functions(LIBC, "")]
    nm = [(n, v) for n, v, _ in ge.nm_dynamic_functions(LIBC, "")]
    assert len(mine) > 1000 and mine == nm


@pytest.mark.skipif(not shutil.which("gcc"), reason="needs gcc for the stand-in libcuda")
def test_elf_parser_on_standin(tmp_path):
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "agent"))
    from clockalign.workloads.standin import build
    d, _ = build(str(tmp_path))
    lib = os.path.join(d, "libcuda.so.1")
    funcs = ge.elf_dynamic_functions(lib)
    names = {n for n, _, _ in funcs}
    assert {"cuLaunchKernel", "cuLaunchKernelEx", "cuMemAlloc_v2", "cuInit"} <= names
    assert all(n.startswith("cu") for n in names)
    assert [(n, v) for n, v, _ in funcs] == [(n, v) for n, v, _ in ge.nm_dynamic_functions(lib)]
    segs = ge.elf_load_segments(lib)
    assert any(p_vaddr <= funcs[0][1] < p_vaddr + sz for _, p_vaddr, sz in segs)


def test_elf_rejects_non_elf(tmp_path):
    p = tmp_path / "x"
    p.write_bytes(b"not an elf" * 10)
    with pytest.raises(ValueError):
        ge.elf_dynamic_functions(str(p))


def test_group_by_address_aliases():
    by = ge.group_by_address([("cuBar", 0x10, 1), ("cuBar_alias", 0x10, 1), ("cuX", 0x20, 1)])
    assert by == {0x10: ["cuBar", "cuBar_alias"], 0x20: ["cuX"]}


MAPS = """\
55d0c0000000-55d0c0001000 r--p 00000000 08:01 111 /usr/bin/python3
7f0000000000-7f0000001000 r--p 00000000 08:01 4242 /tmp/lib/libcuda.so.1
7f0000001000-7f0000002000 r-xp 00001000 08:01 4242 /tmp/lib/libcuda.so.1
7f0000002000-7f0000003000 r--p 00002000 08:01 4242 /tmp/lib/libcuda.so.1
7f0000ff0000-7f0000ff1000 rw-p 00000000 00:00 0
"""
SEGS = [(0, 0, 0x6b0), (0x1000, 0x1000, 0x229), (0x2000, 0x2000, 0x1f8)]


def test_parse_maps_and_resolve():
    m = ge.parse_maps(MAPS, inode=4242)
    assert m == [(0x7f0000000000, 0x7f0000001000, 0), (0x7f0000001000, 0x7f0000002000, 0x1000),
                 (0x7f0000002000, 0x7f0000003000, 0x2000)]
    assert ge.ip_to_vaddr(0x7f0000001132, m, SEGS) == 0x1132
    assert ge.ip_to_vaddr(0x55d0c0000010, m, SEGS) is None
    by = {0x1132: ["cuLaunchKernel"]}
    assert ge.resolve_ip(0x7f0000001132, m, SEGS, by) == (["cuLaunchKernel"], 0)
    assert ge.resolve_ip(0x7f0000001133, m, SEGS, by) == (["cuLaunchKernel"], 1)
    assert ge.resolve_ip(0x7f0000001140, m, SEGS, by) == (None, None)


def test_infer_bias():
    vaddrs = [0x1132, 0x1147, 0x115c, 0x11f0, 0x1208]
    base = 0x7fb4384ac000
    b, n, d = ge.infer_bias([base + v for v in vaddrs[:4]], vaddrs)
    assert (b, n, d) == (base, 4, 0)


def test_summarize_counts_phases_and_getprocaddress():
    m = ge.parse_maps(MAPS, inode=4242)
    by = {0x1132: ["cuLaunchKernel"], 0x1147: ["cuLaunchKernelEx", "cuLaunchKernelEx_alias"],
          0x1200: ["cuGetProcAddress_v2"]}
    raw = [(7, 0, 0x7f0000001132, 3), (7, 1, 0x7f0000001132, 5), (7, 1, 0x7f0000001147, 2),
           (7, 1, 0x7f0000001999, 1)]
    gpa = [("cuLaunchKernel", 13000, 7, 2, 0x7f0000001132, 0, 0),
           ("cuHidden", 13000, 7, 1, 0x7f0000001150, 0, 0),
           ("cuNope", 13000, 7, 1, 0, 500, 0)]
    r = ge.summarize(raw, gpa, SEGS, by, {7: m}, 7)
    assert r["calls"] == {"cuLaunchKernel": 8, "cuLaunchKernelEx=cuLaunchKernelEx_alias": 2}
    assert r["calls_by_phase"] == {"0": {"cuLaunchKernel": 3},
                                   "1": {"cuLaunchKernel": 5,
                                         "cuLaunchKernelEx=cuLaunchKernelEx_alias": 2}}
    assert r["unresolved_ips"] == {hex(0x7f0000001999): 1}
    assert r["ip_semantics"]["ip_is_probe_address"] == 10
    g = {x["name"]: x["resolves_to"] for x in r["getprocaddress"]}
    assert g["cuLaunchKernel"] == "cuLaunchKernel"
    assert g["cuHidden"].startswith("NOT EXPORTED (inside")
    assert g["cuNope"] is None
    # maps never read: the bias is inferred
    r2 = ge.summarize(raw[:3], [], SEGS, by, {}, 7)
    assert r2["calls"]["cuLaunchKernel"] == 8 and r2["bias_inferred"]["delta"] == 0


def test_table():
    t = ge.table([("cuA", 10), ("cuLonger", 2)], ("symbol", "calls"))
    lines = t.splitlines()
    assert lines[0].startswith("symbol") and lines[2].endswith("10") and len(lines) == 4


def test_workload_imports_without_torch():
    import coverage_window as w
    assert [p[0] for p in w.PARTS][:3] == ["eager", "cublas", "cudnn"]
    assert w.PTX.endswith(b"\0")
