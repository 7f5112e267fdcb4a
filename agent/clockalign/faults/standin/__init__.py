"""A stand-in libcuda.so.1 and a known-count target, compiled with gcc on demand.

Used by the integration tests and by `clockalign demo` on a host without a GPU: the real
driver API's symbols and calling conventions, with known results (cuMemAlloc_v2 of more
than 1 TiB returns 2 = OUT_OF_MEMORY), so the real probes have something exact to trace.

    libdir, target = build(tmpdir)
"""
import os
import shutil
import subprocess

from ...errors import ClockalignError

HERE = os.path.dirname(__file__)

# what target.c calls (without --burst): the counts every recording of it must show
EXPECTED_CALLS = {"cuLaunchKernel": 12, "cuLaunchKernelEx": 11, "cuMemAlloc_v2": 5,
                  "cuMemFree_v2": 3, "cuMemcpyHtoD_v2": 2, "cuMemcpyDtoH_v2": 2,
                  "cuMemcpyAsync": 1, "cuStreamSynchronize": 2, "cuCtxSynchronize": 1,
                  "cuEventSynchronize": 1}
EXPECTED_OOM = 2


def build(out_dir):
    """Compile libcuda.so.1 and target into out_dir; returns (out_dir, path of target)."""
    if not shutil.which("gcc"):
        raise ClockalignError("gcc is needed to build the stand-in libcuda (apt-get install gcc)")
    os.makedirs(out_dir, exist_ok=True)
    lib = os.path.join(out_dir, "libcuda.so.1")
    target = os.path.join(out_dir, "target")
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-Wl,-soname,libcuda.so.1", "-o", lib,
                    os.path.join(HERE, "libcuda.c")], check=True)
    subprocess.run(["gcc", "-O1", "-o", target, os.path.join(HERE, "target.c"), "-ldl",
                    "-lpthread"], check=True)
    return out_dir, target
