"""The CUDA function table against what is derived from it: BPF stubs, schema, role lists,
the stand-in libcuda."""
import re
import shutil
import subprocess

import pytest

from clockalign.capture.probes import cflags, cuda_stubs
from clockalign.workloads import check, standin
from clockalign.report import analysis, anomaly
from clockalign.store import cuda_api, schema

# the ids of the first recordings: file format, never to change
FIRST_IDS = {1: "cuLaunchKernel", 2: "cuLaunchKernelEx", 3: "cuMemAlloc_v2",
             4: "cuMemAllocAsync", 5: "cuMemFree_v2", 6: "cuMemcpyHtoD_v2",
             7: "cuMemcpyDtoH_v2", 8: "cuMemcpyAsync", 9: "cuStreamSynchronize",
             10: "cuCtxSynchronize", 11: "cuEventSynchronize", 12: "cuLaunchKernel_ptsz",
             13: "cuLaunchKernelEx_ptsz", 14: "cuMemcpyHtoD_v2_ptds", 15: "cuMemcpyDtoH_v2_ptds",
             16: "cuMemcpyAsync_ptsz", 17: "cuStreamSynchronize_ptsz",
             18: "cuMemAllocAsync_ptsz", 19: "cuCtxSynchronize_v2"}

STUB = re.compile(r"^int (enter|return)_(\w+)\(struct pt_regs \*ctx\) \{ return (\w+)\((.*)\); \}$",
                  re.M)


# added after the H200 coverage run (results/coverage.md)
COVERAGE_IDS = {78: "cuModuleUnload", 79: "cuLibraryUnload", 80: "cuMemSetAccess",
                81: "cuMemAddressFree", 82: "cuModuleLoad", 83: "cuLibraryLoadFromFile"}


def test_first_ids_kept():
    assert {i: cuda_api.FUNCTIONS[i].symbol for i in FIRST_IDS} == FIRST_IDS
    assert {i: cuda_api.FUNCTIONS[i].symbol for i in COVERAGE_IDS} == COVERAGE_IDS


def test_unloads_file_loads_and_vmm_additions():
    assert cuda_api.names("module_unload") == ("cuModuleUnload", "cuLibraryUnload")
    assert {"cuModuleLoad", "cuLibraryLoadFromFile"} <= set(cuda_api.names("module"))
    assert {"cuMemSetAccess", "cuMemAddressFree"} <= set(cuda_api.names("vmm"))
    assert "module_unload" in cuda_api.ROLES
    f = cuda_api.BY_SYMBOL["cuModuleLoad"]
    assert f.arg_names[:2] == ("module", "fname") and f.deref_a0 and f.string_slot == 1
    assert cuda_stubs.enter_body(f) == "cuda_enter(82, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx), 0, 0, 0)"
    assert cuda_stubs.return_body(f) == "cuda_return_str(ctx, 82, 1, 1)"
    assert cuda_stubs.cookie(f) == 82 | 1 << 16 | 2 << 24
    f = cuda_api.BY_SYMBOL["cuLibraryLoadFromFile"]
    assert cuda_stubs.enter_body(f) == ("cuda_enter(83, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx), "
                                        "(u32)PT_REGS_PARM5(ctx), (u32)stack_arg(ctx, 8), 0)")
    assert cuda_stubs.enter_body(cuda_api.BY_SYMBOL["cuMemSetAccess"]) == \
        "cuda_enter(80, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx), PT_REGS_PARM4(ctx), 0, 0)"
    assert cuda_stubs.return_body(cuda_api.BY_SYMBOL["cuModuleUnload"]) == \
        "cuda_return(ctx, 78, 0)"
    assert not any(cuda_api.BY_SYMBOL[s].allocates for s in COVERAGE_IDS.values())


def test_schema_is_a_view_of_the_table():
    assert set(schema.CUDA_FUNCTIONS) == set(cuda_api.FUNCTIONS)
    for fid, (name, args) in schema.CUDA_FUNCTIONS.items():
        f = cuda_api.FUNCTIONS[fid]
        assert name == f.symbol and args == f.arg_names and len(args) == 5
        assert schema.CUDA_FN_BY_NAME[name] == fid


def test_every_function_has_both_stubs_with_its_id():
    text = cflags.bpf_text()
    stubs = {}
    for kind, sym, helper, args in STUB.findall(text):
        assert (kind, sym) not in stubs, f"{kind}_{sym} defined twice"
        stubs[(kind, sym)] = (helper, args)
    assert {s for _, s in stubs} == set(cuda_api.BY_SYMBOL)
    for f in cuda_api.FUNCTIONS.values():
        helper, args = stubs[("enter", f.symbol)]
        first = args.split(", ")
        fid = int(first[0] if helper == "cuda_enter" else first[1])
        assert fid == f.id, f.symbol
        assert helper == {"args": "cuda_enter"}.get(f.entry, f"{f.entry}_enter")
        helper, args = stubs[("return", f.symbol)]
        rargs = args.split(", ")
        assert rargs[:3] == ["ctx", str(f.id), str(int(f.deref_a0))], f.symbol
        assert helper == ("cuda_return_str" if f.string_slot is not None else "cuda_return")
    # probes.c itself keeps helpers only: no hand-written stub can drift from the table
    src = (cflags.bpf_source_dir() / "probes.c").read_text()
    assert not STUB.search(src)


def test_stub_arguments_follow_the_reads():
    f = cuda_api.BY_SYMBOL["cuLibraryLoadData"]
    assert cuda_stubs.enter_body(f) == ("cuda_enter(65, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx), "
                                        "(u32)PT_REGS_PARM5(ctx), (u32)stack_arg(ctx, 8), 0)")
    f = cuda_api.BY_SYMBOL["cuMemCreate"]
    assert "user_u32(PT_REGS_PARM3(ctx), 12)" in cuda_stubs.enter_body(f)
    f = cuda_api.BY_SYMBOL["cuModuleGetFunction"]
    assert cuda_stubs.return_body(f) == "cuda_return_str(ctx, 66, 1, 2)"
    assert cuda_stubs.enter_body(cuda_api.BY_SYMBOL["cuMemcpy2D_v2"]) == \
        "memcpy2d_enter(ctx, 38, 0)"
    assert cuda_stubs.enter_body(cuda_api.BY_SYMBOL["cuMemcpy3DAsync_v2_ptsz"]) == \
        "memcpy3d_enter(ctx, 37, PT_REGS_PARM2(ctx))"


def test_twins_share_role_and_arguments():
    for f in cuda_api.FUNCTIONS.values():
        if f.per_thread:
            base = cuda_api.BY_SYMBOL[f.symbol.rsplit("_", 1)[0]]
            assert (base.role, base.args, base.entry, base.allocates) == \
                (f.role, f.args, f.entry, f.allocates)


def test_role_lists_come_from_the_table():
    assert set(anomaly.SYNC_FNS) == set(cuda_api.ids("sync"))
    assert schema.CUDA_FN_BY_NAME["cuCtxSynchronize_v2"] in anomaly.SYNC_FNS
    assert set(analysis.LAUNCH_FNS) == set(cuda_api.ids("launch"))
    assert {"cuMemCreate", "cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync_ptsz",
            "cuMemAlloc_v2"} <= set(check.ALLOC_FNS)
    assert check.CTX_SYNC_FNS == ("cuCtxSynchronize", "cuCtxSynchronize_v2")


def test_standin_calls_every_function_a_distinct_prime_in_the_sweep():
    assert set(standin.EXPECTED_CALLS) == set(cuda_api.BY_SYMBOL)
    counts = list(standin.SWEEP_CALLS.values())
    assert len(set(counts)) == len(counts)
    assert not set(counts) & set(standin.MAIN_CALLS.values())
    for sym, n in standin.SWEEP_CALLS.items():
        f = cuda_api.BY_SYMBOL[sym]
        rets = {standin.expected_call(f, i)["ret"] for i in range(n)}
        if f.allocates:
            assert 2 in rets and 0 in rets
        if f.role in ("module", "module_unload") or f.symbol == "cuMemSetAccess":
            assert 0 in rets and len(rets) > 1, sym         # some fail, with a chosen code
        if f.role == "module":
            assert (301 if f.string_slot is not None else 218) in rets


@pytest.mark.skipif(not shutil.which("gcc") or not shutil.which("nm"),
                    reason="gcc and nm are needed to build and list the stand-in libcuda")
def test_standin_exports_every_table_symbol(tmp_path):
    standin.build(str(tmp_path))
    out = subprocess.run(["nm", "-D", "--defined-only", str(tmp_path / "libcuda.so.1")],
                         capture_output=True, text=True, check=True).stdout
    exported = {line.split()[-1] for line in out.splitlines() if " T " in line}
    assert set(cuda_api.BY_SYMBOL) <= exported
