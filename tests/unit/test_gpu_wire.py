"""The CUPTI injection library (clockalign/native/ca_cupti.c) and its wire format, with no GPU.

The library is built against the CUPTI headers of the nvidia-cuda-cupti wheel (installed
by scripts/setup.sh) and driven through a stand-in libcupti (fakecupti.c, same headers):
what reaches the FIFO is parsed as the recorder parses it.
"""
import ctypes
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from clockalign.capture.gpu import gpuwire
from clockalign import native
from clockalign.capture.gpu.cupti import (CuptiMissing, build_injection, find_cupti,
                                          injection_library)
from clockalign.capture.gpu.gpuactivity import GpuActivity
from clockalign.native import HERE as SOURCE_DIR
from clockalign.native.build import build
from clockalign.store.schema import GPU_REC_DTYPE, Chunk, GpuKind

HERE = Path(__file__).parent


def _cupti():
    try:
        return find_cupti()
    except CuptiMissing as e:
        pytest.skip(f"no CUPTI headers here ({e}); scripts/setup.sh installs the wheel")


def test_header_layout_matches_numpy(tmp_path):
    fields = GPU_REC_DTYPE.names
    src = tmp_path / "layout.c"
    src.write_text("#include <stdio.h>\n#include <stddef.h>\n#include \"ca_gpu_wire.h\"\n"
                   "int main(void){\n"
                   + "".join(f'printf("{f} %zu %zu\\n", offsetof(struct ca_gpu_rec, {f}), '
                             f'sizeof(((struct ca_gpu_rec*)0)->{f}));\n' for f in fields)
                   + 'printf("size %zu\\nper_pkt %zu\\npkt %zu\\nname_hdr %zu\\nmagic %u\\n", '
                     'sizeof(struct ca_gpu_rec), (size_t)CA_RECS_PER_PKT, sizeof(struct ca_pkt), '
                     'sizeof(struct ca_name_hdr), CA_PKT_MAGIC);\n'
                   + "".join(f'printf("kind_{k.name} %d\\n", CA_GK_{k.name});\n'
                             for k in GpuKind)
                   + "return 0;}\n")
    exe = tmp_path / "layout"
    subprocess.run(["gcc", f"-I{SOURCE_DIR}", str(src), "-o", str(exe)], check=True)
    out = dict(line.split(" ", 1) for line in subprocess.run(
        [str(exe)], capture_output=True, text=True, check=True).stdout.splitlines())
    for f in fields:
        off, size = map(int, out[f].split())
        assert off == GPU_REC_DTYPE.fields[f][1], f
        assert size == GPU_REC_DTYPE[f].itemsize, f
    assert int(out["size"]) == GPU_REC_DTYPE.itemsize
    assert int(out["per_pkt"]) == gpuwire.RECS_PER_PKT
    assert int(out["pkt"]) == gpuwire.PKT.size and int(out["name_hdr"]) == gpuwire.NAME_HDR.size
    assert int(out["magic"]) == gpuwire.MAGIC
    for k in GpuKind:
        assert int(out[f"kind_{k.name}"]) == int(k)


def _recs(n, pid=7):
    r = np.zeros(n, dtype=GPU_REC_DTYPE)
    r["kind"] = GpuKind.KERNEL
    r["pid"] = pid
    r["corr"] = np.arange(1, n + 1)
    r["start"] = np.arange(n) * 1000
    return r


def test_parser_packets_cut_anywhere_names_in_pieces_and_garbage_counted():
    long_name = "void k<" + "T" * 9000 + ">()"
    blob = (gpuwire.records_packets(_recs(120), 7) + gpuwire.name_packets(7, 1, 5, long_name)
            + gpuwire.name_packets(7, 2, 13, "cuLaunchKernel") + gpuwire.name_packets(7, 1, 6, ""))
    bad = b"\x00garbage!" * 3
    blob = blob[:4096] + bad + blob[4096:]
    p = gpuwire.WireParser()
    recs, names = [], []
    for a in range(0, len(blob), 777):
        r, nm = p.feed(blob[a:a + 777])
        recs.append(r)
        names += nm
    recs = np.concatenate(recs)
    assert len(recs) == 120 and (recs["corr"] == np.arange(1, 121)).all()
    assert sorted(names) == sorted([(7, 1, 5, long_name), (7, 2, 13, "cuLaunchKernel"),
                                    (7, 1, 6, "")])
    assert p.bad_bytes == len(bad) and p.leftover == 0 and p.pending_names == 0


def test_parser_keeps_a_cut_packet_and_a_cut_mark():
    blob = gpuwire.records_packets(_recs(3), 9)
    p = gpuwire.WireParser()
    r, _ = p.feed(b"\x01\x02" + blob[:2])        # two junk bytes, then half a mark
    assert len(r) == 0
    r, _ = p.feed(blob[2:-5])
    assert len(r) == 0 and p.leftover == len(blob) - 5 and p.bad_bytes == 2
    r, _ = p.feed(blob[-5:])
    assert len(r) == 3 and p.leftover == 0 and p.bad_bytes == 2


def test_injection_library_builds_against_the_cupti_headers(tmp_path, monkeypatch):
    """Built against the headers found (what installing does), named by their content: the
    build setup made is the one record loads; where none was made, one sentence says so."""
    inst = _cupti()
    so = build_injection(inst, into=tmp_path)
    lib = ctypes.CDLL(so)
    assert lib.InitializeInjection
    assert build_injection(inst, into=tmp_path) == so          # kept by content
    assert Path(injection_library(inst)).name == Path(so).name
    monkeypatch.setattr(native, "BUILT", tmp_path / "nothing")
    with pytest.raises(CuptiMissing, match="is not built for .*native.build"):
        injection_library(inst)


class _Writer:
    def __init__(self):
        self.cols, self.rows = [], []

    def write_columns(self, ctype, cols):
        assert ctype == Chunk.GPU_ACTIVITY
        self.cols.append(cols)

    def write_rows(self, ctype, rows):
        assert ctype == Chunk.GPU_NAMES
        self.rows += rows


CHILD = textwrap.dedent("""
    import ctypes, os, sys, threading, time
    fake = ctypes.CDLL(os.environ["CLOCKALIGN_CUPTI_LIB"], ctypes.RTLD_GLOBAL)
    inj = ctypes.CDLL(os.environ["CUDA_INJECTION64_PATH"])
    assert inj.InitializeInjection() == 1
    time.sleep(float(sys.argv[2]))
    assert fake.fake_run(int(sys.argv[1])) == 0, "a sync callback was enabled"
    print(threading.get_native_id(), flush=True)
""")


def _fake(no_raw=False):
    inst = _cupti()
    return build("fakecupti" + ("_noraw" if no_raw else ""), [str(HERE / "fakecupti.c")],
                 include_dirs=[inst.include, *inst.extra_includes],
                 defines=["NO_RAW"] if no_raw else (), cflags=["-fvisibility=hidden"])


def _run_child(act, fake, n, delay=0.0, close_after=None):
    env = dict(os.environ)
    act.prepare(env)
    env["CLOCKALIGN_CUPTI_LIB"] = fake
    w = _Writer()
    act.start_writing(w)
    p = subprocess.Popen([sys.executable, "-c", CHILD, str(n), str(delay)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if close_after is not None:
        time.sleep(close_after)
        act.stop()
    out, err = p.communicate(timeout=60)
    act.stop()
    cols = w.cols
    recs = np.zeros(sum(len(c["kind"]) for c in cols), dtype=GPU_REC_DTYPE)
    at = 0
    for c in cols:
        for f in GPU_REC_DTYPE.names:
            recs[f][at:at + len(c["kind"])] = c[f]
        at += len(c["kind"])
    return p.returncode, out, err, recs, w.rows


def test_injection_streams_activity_launch_callbacks_and_names():
    act = GpuActivity(raw=True)
    rc, out, err, recs, names = _run_child(act, _fake(), 23)
    assert rc == 0, err
    tid = int(out.split()[0])
    k = recs[recs["kind"] == GpuKind.KERNEL]
    assert len(k) == 23 and (np.sort(k["corr"]) == np.arange(1, 24)).all()
    assert (k["flags"] == 1).all()                       # raw timestamps asked and got
    assert (k["grid"] & 0xFFFFFFFF).tolist() == [2 + i for i in range(23)]
    assert (k["shmem"] == 48).all() and (k["stream"] == 7).all()
    order = np.argsort(k["corr"])          # the last four launches came from one graph
    assert k["aux"][order].tolist() == [0] * 19 + [77] * 4
    assert k["value"][order].tolist() == [0] * 19 + [(1 << 32) + i % 2 for i in range(19, 23)]
    assert ((k["end"] - k["start"]) == 1000 + np.arange(23)).all()
    api = recs[recs["kind"] == GpuKind.API]
    assert len(api) == 25 and (api["tid"] == tid).all()
    assert (api["start"] <= api["end"]).all() and (api["start"] > 0).all()
    assert sorted(api["corr"].tolist()) == list(range(1, 26))
    c = recs[recs["kind"] == GpuKind.MEMCPY]
    s = recs[recs["kind"] == GpuKind.MEMSET]
    assert c["value"].tolist() == [4096] and c["aux"].tolist() == [1]
    assert s["value"].tolist() == [65536] and s["aux"].tolist() == [7]
    info = recs[recs["kind"] == GpuKind.INFO]
    assert info["aux"].tolist() == [0]
    clock = recs[recs["kind"] == GpuKind.CLOCK]
    assert len(clock) >= 2 and (clock["start"] <= clock["end"]).all()
    assert len(recs[recs["kind"] == GpuKind.DEVICE]) == 1
    by = {(r["space"], r["id"]): r["name"] for r in names}
    kernel_names = {by[(1, int(i))] for i in k["name"]}
    assert kernel_names == {"k_fake0", "k_fake1", "k_fake2"}
    assert {by[(2, int(i))] for i in api["name"]} == {"cuLaunchKernel", "cuMemcpyHtoD_v2",
                                                      "cuMemsetD8Async"}
    st = act.stats()
    assert st["gpu_kernel"] == 23 and st["gpu_launch_call"] == 25 and st["bad_bytes"] == 0
    assert act.drops() == {}


def test_injection_without_raw_timestamps_marks_them_converted():
    act = GpuActivity(raw=True)
    rc, out, err, recs, names = _run_child(act, _fake(no_raw=True), 5)
    assert rc == 0, err
    k = recs[recs["kind"] == GpuKind.KERNEL]
    assert len(k) == 5 and (k["flags"] == 2).all()
    assert recs[recs["kind"] == GpuKind.INFO]["aux"].tolist() == [1]
    assert any("converted" in n and "no stated bound" in n for n in act.summary_notes())


def test_target_survives_the_recorder_closing_the_fifo():
    act = GpuActivity(raw=True)
    rc, out, err, recs, names = _run_child(act, _fake(), 2000, delay=1.0, close_after=0.5)
    assert rc == 0, err                      # no SIGPIPE death
