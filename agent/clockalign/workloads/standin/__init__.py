"""A stand-in libcuda.so.1 and a known-count target, compiled with gcc on demand.

Used by the integration tests and by `clockalign demo` on a host without a GPU: every
driver API symbol clockalign traces (store/cuda_api.py) with the real signatures and known
results (an allocation of more than 1 TiB returns 2 = OUT_OF_MEMORY, a load of a file under
missing/ 301, an unload of NULL 400, cuMemSetAccess of 0 descriptors 1), so the real probes
have something exact to trace.  The target calls each traced function a known number of
times (EXPECTED_CALLS), and ``expected_call(f, i)`` says what call i of f must show.

    libdir, target = build(tmpdir)
"""
import os
import shutil
import subprocess

from ...errors import ClockalignError
from ...store import cuda_api

HERE = os.path.dirname(__file__)

# what target.c's two threads and main part call (without --burst)
MAIN_CALLS = {"cuLaunchKernel": 12, "cuLaunchKernelEx": 11, "cuMemAlloc_v2": 5,
              "cuMemFree_v2": 3, "cuMemcpyHtoD_v2": 2, "cuMemcpyDtoH_v2": 2,
              "cuMemcpyAsync": 1, "cuStreamSynchronize": 2, "cuCtxSynchronize": 1,
              "cuEventSynchronize": 1}
EXPECTED_OOM = 2          # of the main part's cuMemAlloc_v2


def _primes(start):
    n = start
    while True:
        if n > 1 and all(n % d for d in range(2, int(n ** 0.5) + 1)):
            yield n
        n += 1


def _sweep_counts() -> dict:
    """A distinct prime per function of the sweep (every table function the main part does
    not call), none equal to a count of the main part."""
    primes = (p for p in _primes(7) if p not in MAIN_CALLS.values())
    return {f.symbol: next(primes) for f in sorted(cuda_api.FUNCTIONS.values(),
                                                   key=lambda f: f.id)
            if f.symbol not in MAIN_CALLS}


SWEEP_CALLS = _sweep_counts()
EXPECTED_CALLS = {**MAIN_CALLS, **SWEEP_CALLS}
TIB = 1 << 40
LOOKUP_HANDLES = {"vector_add": 0x1000, "gemm_tile": 0x2000}   # the launches' func pointers
_MASK = {1: 0xFF, 2: 0xFFFF, 4: 0xFFFFFFFF, 8: (1 << 64) - 1}


def V(f, n, i) -> int:
    """The value the sweep passes as parameter n of call i of f (target.c's V)."""
    return (f.id << 20) | (n << 12) | i


def _dims(x, y, z):
    return x | (y & 0xFFFF) << 32 | (z & 0xFFFF) << 48


def _side(t, host, dev, array):
    return host if t == 1 else array if t == 3 else dev


def expected_call(f: cuda_api.CudaFunction, i: int) -> dict:
    """What call i of the sweep's f must record: {"ret", "args": {slot: value}, "name"}.
    A slot left out is not predictable (a pointer into the target's stack)."""
    ret = 0
    if f.allocates and i % 3 == 0:
        ret = 2                                      # CUDA_ERROR_OUT_OF_MEMORY
    name = None
    if f.role == "module" and f.string_slot is not None:      # a load from a file
        name = f"{'missing' if i % 4 == 1 else 'cache'}/{f.symbol}_{i}.cubin"
        if i % 4 == 1:
            ret = 301                                # CUDA_ERROR_FILE_NOT_FOUND
    elif f.role == "module" and i % 4 == 1:
        ret = 218                                    # CUDA_ERROR_INVALID_PTX
    null = f.role == "module_unload" and i % 4 == 3  # unloading a NULL handle
    if null:
        ret = 400                                    # CUDA_ERROR_INVALID_HANDLE
    no_count = f.symbol == "cuMemSetAccess" and i % 3 == 2
    if no_count:
        ret = 1                                      # CUDA_ERROR_INVALID_VALUE
    if f.role == "function":
        name = ("vector_add" if i == 0 else "gemm_tile" if i == 1 else
                "missing" if i % 5 == 4 else f"kernel_{f.id}_{i}")
        if name == "missing":
            ret = 500                                # CUDA_ERROR_NOT_FOUND
    args = {}
    d = lambda n: n * 7 + i          # noqa: E731  (target.c's D: small launch dims)
    if f.entry in ("launch", "launch_ex"):
        args = {0: V(f, 1 if f.entry == "launch" else 2, i), 1: _dims(d(2), d(3), d(4)),
                2: _dims(d(5), d(6), d(7)), 3: V(f, 8, i) & _MASK[4], 4: V(f, 9, i)}
    elif f.entry in ("memcpy2d", "memcpy3d"):
        st, dt = 1 + i % 4, 1 + (i + 1) % 4
        stream = f.args[3][1]
        args = {0: _side(dt, V(f, 23, i), V(f, 24, i), V(f, 25, i)),
                1: _side(st, V(f, 20, i), V(f, 21, i), V(f, 22, i)),
                2: (16 + i) * 3 * (2 if f.entry == "memcpy3d" else 1),
                3: V(f, 2, i) if stream.how == "arg" else 0, 4: st | dt << 8}
    else:
        for k, (argname, r) in enumerate(f.args):
            if r.how == "arg":
                v = V(f, r.param, i) & _MASK[r.size]
                if f.allocates and argname == "bytes" and i % 3 == 0:
                    v = 2 * TIB
                if null or (no_count and argname == "count"):
                    v = 0
                if argname != "image":               # a string in the target's memory
                    args[k] = v
            elif r.how == "field":
                args[k] = V(f, r.param, i) & _MASK[r.size]
            elif r.how == "out" and ret == 0:
                args[k] = LOOKUP_HANDLES.get(name, (f.id << 24) | i)
    return {"ret": ret, "args": args, "name": name}


def sweep_faults() -> dict:
    """{(symbol, CUresult): calls} of the sweep's chosen failures that are faults: all but
    the kernel lookups of the name "missing", each followed by normal work on its thread,
    which are notes (timeline/benign.py's "lookup not found")."""
    out = {}
    for sym, n in SWEEP_CALLS.items():
        f = cuda_api.BY_SYMBOL[sym]
        for i in range(n):
            ret = expected_call(f, i)["ret"]
            if ret and not (f.role == "function" and ret == 500):
                out[(sym, ret)] = out.get((sym, ret), 0) + 1
    return out


def write_ids(path):
    """cuda_ids.h: ID_<symbol> of every table function, N_<symbol> of the sweep's."""
    lines = ["/* generated by clockalign.workloads.standin from store/cuda_api.py */"]
    lines += [f"#define ID_{f.symbol} {f.id}" for f in cuda_api.FUNCTIONS.values()]
    lines += [f"#define N_{sym} {n}" for sym, n in SWEEP_CALLS.items()]
    with open(path, "w") as fh:
        fh.write("\n".join(lines) + "\n")


def build(out_dir):
    """Compile libcuda.so.1 and target into out_dir; returns (out_dir, path of target)."""
    if not shutil.which("gcc"):
        raise ClockalignError("gcc is needed to build the stand-in libcuda (apt-get install gcc)")
    os.makedirs(out_dir, exist_ok=True)
    write_ids(os.path.join(out_dir, "cuda_ids.h"))
    lib = os.path.join(out_dir, "libcuda.so.1")
    target = os.path.join(out_dir, "target")
    inc = f"-I{out_dir}"
    # frame pointers in every function, leaves too: each starts with `push %rbp`, as the
    # real libcuda's functions do, which the kernel emulates inside the uprobe's trap (a
    # first instruction it cannot emulate is single-stepped: a second trap a call)
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-fno-omit-frame-pointer",
                    "-mno-omit-leaf-frame-pointer", inc, "-Wl,-soname,libcuda.so.1", "-o", lib,
                    os.path.join(HERE, "libcuda.c")], check=True)
    subprocess.run(["gcc", "-O1", inc, "-o", target, os.path.join(HERE, "target.c"), "-ldl",
                    "-lpthread"], check=True)
    return out_dir, target
