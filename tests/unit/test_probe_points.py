"""Where the CUDA probes go (capture/probes/prologue.py) and which returns are probed
(--cuda-returns): no root, no BPF."""
import re
import subprocess

import pytest

from clockalign.capture.probes import prologue
from clockalign.capture.probes.cflags import ProbeOptions, build_cflags, entry_only_ids
from clockalign.store import cuda_api


@pytest.mark.parametrize("code,first,emulated,skip", [
    (bytes.fromhex("554889e5415448"), "push %rbp", True, 0),        # the H200's libcuda
    (bytes.fromhex("4157415641"), "push %r15", True, 0),
    (bytes.fromhex("f30f1efa554889e5"), "endbr64", False, 4),       # -fcf-protection
    (bytes.fromhex("f30f1efa4883ec08"), "endbr64", False, 0),       # next one not emulated
    (bytes.fromhex("4883ec08"), "sub $imm8,%rsp", False, 0),
    (bytes.fromhex("e9000000"), "jmp", True, 0),
    (b"", "?", False, 0),
])
def test_first_instruction_and_skip(code, first, emulated, skip):
    assert prologue.first_instruction(code) == (first, emulated)
    assert prologue.entry_skip(code) == skip


def test_gcc_endbr64_functions_are_probed_past_it(tmp_path):
    """A real function built with -fcf-protection: the probe goes to the push after it."""
    src = tmp_path / "f.c"
    src.write_text("int g(int); int f(int x) { return g(x) + 1; }\n")
    obj = tmp_path / "f.o"
    subprocess.run(["gcc", "-O0", "-fcf-protection=full", "-c", str(src), "-o", str(obj)],
                   check=True)
    data = obj.read_bytes()
    at = data.find(prologue.ENDBR64)
    assert at > 0
    code = data[at:at + 16]
    assert prologue.first_instruction(code) == ("endbr64", False)
    assert prologue.entry_skip(code) == 4
    assert prologue.first_instruction(code[4:]) == ("push %rbp", True)


def test_blocking_masks_match_the_enqueue_functions():
    """The BPF program's entry-only masks hold exactly the ids whose returns Python leaves
    unprobed: one side without the other would leave entries that never pop."""
    assert max(cuda_api.FUNCTIONS) < 128              # the masks are two 64-bit words
    ids = entry_only_ids(ProbeOptions(cuda_lib="x", cuda_returns="blocking"))
    assert ids == {f.id for f in cuda_api.FUNCTIONS.values() if f.enqueues}
    assert {cuda_api.FUNCTIONS[i].symbol for i in ids} >= {
        "cuLaunchKernel", "cuGraphLaunch", "cuEventRecord", "cuMemcpyDtoDAsync_v2"}
    assert not {cuda_api.FUNCTIONS[i].symbol for i in ids} & {
        "cuStreamSynchronize", "cuCtxSynchronize", "cuMemAlloc_v2", "cuMemcpyHtoD_v2"}
    flags, _ = build_cflags(ProbeOptions(cuda_lib="x", cuda_returns="blocking"), "slots")
    lo = int(re.search(r"-DCA_ENTRY_ONLY_LO=(0x[0-9a-f]+)ULL", " ".join(flags)).group(1), 16)
    hi = int(re.search(r"-DCA_ENTRY_ONLY_HI=(0x[0-9a-f]+)ULL", " ".join(flags)).group(1), 16)
    assert {i for i in range(128) if (lo | hi << 64) >> i & 1} == ids
    flags, notes = build_cflags(ProbeOptions(cuda_lib="x", cuda_returns="blocking"), "perf")
    assert not any("ENTRY_ONLY" in f for f in flags) and any("slot rings" in n for n in notes)
    assert entry_only_ids(ProbeOptions(cuda_lib="x")) == set()


def test_info_says_what_the_cuda_probes_left_out():
    from clockalign.report.run_info import cuda_probe_lines
    assert cuda_probe_lines({}, {}) == []
    lines = cuda_probe_lines({"cuda_entry_only": ["cuLaunchKernel", "cuEventRecord"]},
                             {"cuda_duty": {"share": 0.25, "period_s": 1.0, "armed_ns": 500_000_000,
                                            "windows": [[0, 2.5e8], [1e9, 1.25e9]]}})
    assert "2 enqueue functions recorded at entry only" in lines[0]
    assert "attached 25% of each 1.0 s" in lines[1] and "inside 2 windows" in lines[1]
    assert "500,000,000 ns" in lines[1]
