#!/usr/bin/env python3
"""The coverage workload (issue 9 item 2): a marked window of known CUDA operations, with
torch.profiler (CUPTI) over exactly that window.  Run by scripts/gpu/cupti_coverage.py under
`clockalign record`; on its own:

    python3 scripts/workloads/coverage_window.py --out OUT/coverage-workload.json \
        --trace OUT/coverage-trace.json [--no-profiler]

Parts (each warmed up first by running its window body once; a part that cannot run is
skipped with the reason, the others still run):
  eager      N x.add_(1)                         -> cudaLaunchKernel
  cublas     N fp16 matmuls                      -> cuBLAS (cuLaunchKernelEx)
  cudnn      N conv2d                            -> cuDNN (cudaLaunchKernelExC / driver)
  cupy_raw   N CuPy RawKernel launches           -> cuLaunchKernel
  triton     N calls of a torch.compile'd fn     -> Triton's launcher (driver)
  graph      N replays of a CUDA graph of K kernels -> cudaGraphLaunch
  copies     N H2D + N D2H copies, pinned, non_blocking -> cudaMemcpyAsync
  memsets    N cupy memsetAsync, N cuMemsetD32Async (cuda-bindings), N torch zero_()
  events     N event records + N stream waits
  vmm        N explicit reserve/create/map/setaccess/unmap/release/free (cuda-bindings), and a
             torch allocation that grows an expandable segment (cuMemCreate/cuMemMap) then
             empty_cache (cuMemUnmap/cuMemRelease)
  modules    N cuModuleLoadData+GetFunction+Unload, N cuLibraryLoadData+Unload, 1 CuPy
             RawModule get_function (the module is loaded in setup: no load in the window)
  sync       N torch.cuda.synchronize()

Window marker: a connect() to a closed 127.0.0.1 port (CLOCKALIGN_MARKER_PORT, or a free one)
right after the window opens and right before it closes; clockalign records both.  Inside the
profiler the window is also a record_function("clockalign_window") range.
"""
import argparse
import json
import os
import socket
import sys
import threading
import time
import traceback

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")

WINDOW = "clockalign_window"
PTX = b"""
.version 7.0
.target sm_50
.address_size 64
.visible .entry ca_nop(.param .u64 p)
{
    ret;
}
\0"""
CUPY_SRC = r'''
extern "C" __global__ void ca_add(float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1.0f;
}
'''


def now():
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def closed_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def mark(port):
    """A connect() clockalign sees (refused: nothing listens there)."""
    t = now()
    s = socket.socket()
    try:
        s.connect(("127.0.0.1", port))
    except OSError:
        pass
    finally:
        s.close()
    return t


def expect(family, n, exact=True, note=""):
    return {"family": family, "n": n, "exact": exact, "note": note}


def cu_check(res, what):
    err = res[0] if isinstance(res, tuple) else res
    if int(err) != 0:
        raise RuntimeError(f"{what} -> {err}")
    return res[1] if isinstance(res, tuple) and len(res) == 2 else res


class Ctx:
    def __init__(self, a):
        self.a = a
        import torch
        self.torch = torch
        self.dev = torch.device("cuda", 0)
        torch.cuda.init()
        torch.ones(1, device=self.dev)
        torch.cuda.synchronize()
        self._cp = self._cu = None

    @property
    def cp(self):
        if self._cp is None:
            import cupy
            self._cp = cupy
        return self._cp

    @property
    def cu(self):
        if self._cu is None:
            try:
                from cuda.bindings import driver as cu
            except ImportError:
                from cuda import cuda as cu
            cu_check(cu.cuInit(0), "cuInit")
            dev = cu_check(cu.cuDeviceGet(0), "cuDeviceGet")
            ctx = cu_check(cu.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
            cu_check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
            self._cu = cu
        return self._cu


# Each part: setup(ctx) -> state; body(ctx, state, n) -> list of expectations.  The body runs
# once as warm-up, then once inside the window.

def eager_setup(c):
    return c.torch.ones(1 << 16, device=c.dev)


def eager_body(c, x, n):
    for _ in range(n):
        x.add_(1)
    return [expect("kernel_launch", n, note="x.add_(1): one elementwise kernel each")]


def cublas_setup(c):
    t = c.torch
    return (t.randn(512, 512, device=c.dev, dtype=t.float16),
            t.randn(512, 512, device=c.dev, dtype=t.float16))


def cublas_body(c, s, n):
    a, b = s
    for _ in range(n):
        a @ b
    return [expect("kernel_launch", n, exact=False, note="512x512 fp16 matmul: >= 1 kernel")]


def cudnn_setup(c):
    t = c.torch
    t.backends.cudnn.benchmark = False
    conv = t.nn.Conv2d(16, 32, 3, padding=1).to(c.dev, t.float16)
    x = t.randn(4, 16, 32, 32, device=c.dev, dtype=t.float16)
    if not t.backends.cudnn.is_available():
        raise RuntimeError("cuDNN not available")
    return conv, x


def cudnn_body(c, s, n):
    conv, x = s
    with c.torch.no_grad():
        for _ in range(n):
            conv(x)
    return [expect("kernel_launch", n, exact=False, note="conv2d: >= 1 cuDNN kernel (+bias)")]


def cupy_raw_setup(c):
    cp = c.cp
    k = cp.RawKernel(CUPY_SRC, "ca_add")
    x = cp.zeros(1 << 16, dtype=cp.float32)
    return k, x


def cupy_raw_body(c, s, n):
    import numpy as np
    k, x = s
    for _ in range(n):
        k(((x.size + 255) // 256,), (256,), (x, np.int32(x.size)))
    return [expect("kernel_launch", n, note="CuPy RawKernel: cuLaunchKernel each")]


def triton_setup(c):
    t = c.torch
    import torch._inductor.config as icfg
    icfg.compile_threads = 1
    f = t.compile(lambda x: (x * 2 + 1).relu(), dynamic=False)
    x = t.randn(1 << 16, device=c.dev)
    t0 = time.monotonic()
    f(x)
    t.cuda.synchronize()
    return f, x, time.monotonic() - t0


def triton_body(c, s, n):
    f, x, _ = s
    for _ in range(n):
        f(x)
    return [expect("kernel_launch", n, exact=False, note="one fused Triton kernel per call")]


def graph_setup(c):
    t = c.torch
    k = c.a.graph_kernels
    static = t.zeros(1 << 16, device=c.dev)
    side = t.cuda.Stream()
    side.wait_stream(t.cuda.current_stream())
    with t.cuda.stream(side):
        for _ in range(3):
            static.add_(1)
    t.cuda.current_stream().wait_stream(side)
    g = t.cuda.CUDAGraph()
    with t.cuda.graph(g):
        for _ in range(k):
            static.add_(1)
    g.replay()
    t.cuda.synchronize()
    return g, k


def graph_body(c, s, n):
    g, k = s
    for _ in range(n):
        g.replay()
    return [expect("graph_launch", n, note=f"CUDAGraph.replay(), {k} kernels each"),
            expect("graph_kernels", n * k, note=f"{n} launches x {k} kernels")]


def copies_setup(c):
    t = c.torch
    n = 1 << 20
    return (t.empty(n, dtype=t.uint8).pin_memory(), t.empty(n, dtype=t.uint8).pin_memory(),
            t.empty(n, dtype=t.uint8, device=c.dev))


def copies_body(c, s, n):
    h_in, h_out, d = s
    for _ in range(n):
        d.copy_(h_in, non_blocking=True)
        h_out.copy_(d, non_blocking=True)
    return [expect("copy_async", 2 * n, note="cudaMemcpyAsync each"),
            expect("copy_async_h2d", n, note="pinned -> device, non_blocking"),
            expect("copy_async_d2h", n, note="device -> pinned, non_blocking"),
            expect("event_record", 0, exact=False,
                   note="torch's pinned allocator records an event per copy")]


def memsets_setup(c):
    t = c.torch
    x = t.empty(1 << 20, dtype=t.float32, device=c.dev)
    have = {}
    errs = {}
    try:
        cx = c.cp.empty(1 << 20, dtype=c.cp.uint8)
        have["cupy"] = cx
    except Exception as e:
        errs["cupy"] = repr(e)[:200]
    try:
        have["driver"] = c.cu
    except Exception as e:
        errs["driver"] = repr(e)[:200]
    return x, have, errs


def memsets_body(c, s, n):
    x, have, errs = s
    out = []
    for _ in range(n):
        x.zero_()
    out.append(expect("memset_or_kernel", n, note="torch zero_(): a fill kernel or a memset"))
    if "cupy" in have:
        cx = have["cupy"]
        st = c.cp.cuda.get_current_stream().ptr
        for _ in range(n):
            c.cp.cuda.runtime.memsetAsync(cx.data.ptr, 0, cx.nbytes, st)
        out.append(expect("memset", n, note="cupy runtime.memsetAsync -> cudaMemsetAsync"))
    if "driver" in have:
        cu = have["driver"]
        stream = cu.CUstream(c.torch.cuda.current_stream().cuda_stream)
        for _ in range(n):
            cu_check(cu.cuMemsetD32Async(cu.CUdeviceptr(x.data_ptr()), 0, x.numel(), stream),
                     "cuMemsetD32Async")
        out.append(expect("memset", n, note="cuMemsetD32Async (driver, cuda-bindings)"))
    for k, e in errs.items():
        out.append({"skipped": f"memset via {k}", "reason": e})
    return out


def events_setup(c):
    t = c.torch
    side = t.cuda.Stream()
    evs = [t.cuda.Event() for _ in range(c.a.n)]
    for e in evs:
        e.record()
        side.wait_event(e)
    t.cuda.synchronize()
    return side, evs


def events_body(c, s, n):
    side, evs = s
    for e in evs[:n]:
        e.record()
        side.wait_event(e)
    return [expect("event_record", n, exact=False, note="Event.record() (+ any by copies)"),
            expect("stream_wait", n, note="Stream.wait_event()")]


def vmm_setup(c):
    cu = c.cu
    prop = cu.CUmemAllocationProp()
    prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = 0
    gran = cu_check(cu.cuMemGetAllocationGranularity(
        prop, cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM),
        "cuMemGetAllocationGranularity")
    desc = cu.CUmemAccessDesc()
    desc.location = prop.location
    desc.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    return prop, desc, int(gran), conf


def vmm_body(c, s, n):
    cu = c.cu
    t = c.torch
    prop, desc, size, conf = s
    for _ in range(n):
        ptr = cu_check(cu.cuMemAddressReserve(size, 0, 0, 0), "cuMemAddressReserve")
        h = cu_check(cu.cuMemCreate(size, prop, 0), "cuMemCreate")
        cu_check(cu.cuMemMap(ptr, size, 0, h, 0), "cuMemMap")
        cu_check(cu.cuMemSetAccess(ptr, size, [desc], 1), "cuMemSetAccess")
        cu_check(cu.cuMemUnmap(ptr, size), "cuMemUnmap")
        cu_check(cu.cuMemRelease(h), "cuMemRelease")
        cu_check(cu.cuMemAddressFree(ptr, size), "cuMemAddressFree")
    out = [expect("vmm_explicit", 7 * n, note=f"{n} x reserve/create/map/setaccess/unmap/"
                  f"release/free of {size} bytes")]
    out[0]["symbols"] = {s: n for s in ("cuMemAddressReserve", "cuMemCreate", "cuMemMap",
                                        "cuMemSetAccess", "cuMemUnmap", "cuMemRelease",
                                        "cuMemAddressFree")}
    r0 = t.cuda.memory_reserved(c.dev)
    big = t.empty(c.a.grow_mib << 20, dtype=t.uint8, device=c.dev)
    r1 = t.cuda.memory_reserved(c.dev)
    del big
    t.cuda.empty_cache()
    r2 = t.cuda.memory_reserved(c.dev)
    out.append(expect("vmm_torch", 0, exact=False,
                      note=f"torch {conf or 'default allocator'}: {c.a.grow_mib} MiB tensor, "
                           f"reserved {r0}->{r1}->{r2} bytes (grow then empty_cache)"))
    out[-1].update(reserved_bytes=[r0, r1, r2], alloc_conf=conf)
    return out


def modules_setup(c):
    """The CuPy RawModule is loaded here (its first use compiles or reads CuPy's kernel cache,
    cuModuleLoad / cuModuleLoadData), so the window only looks its function up."""
    try:
        mod = c.cp.RawModule(code=CUPY_SRC)
        mod.get_function("ca_add")
    except Exception as e:
        mod = e
    return c.cu, mod


def modules_body(c, s, n):
    cu, mod = s
    for _ in range(n):
        m = cu_check(cu.cuModuleLoadData(PTX), "cuModuleLoadData")
        cu_check(cu.cuModuleGetFunction(m, b"ca_nop"), "cuModuleGetFunction")
        cu_check(cu.cuModuleUnload(m), "cuModuleUnload")
    out = [expect("module_load", n, note="cuModuleLoadData(PTX)"),
           expect("module_get_function", n, note="cuModuleGetFunction"),
           expect("module_unload", n, note="cuModuleUnload")]
    try:
        for _ in range(n):
            lib = cu_check(cu.cuLibraryLoadData(PTX, None, None, 0, None, None, 0),
                           "cuLibraryLoadData")
            cu_check(cu.cuLibraryUnload(lib), "cuLibraryUnload")
        out += [expect("module_load", n, note="cuLibraryLoadData(PTX)"),
                expect("module_unload", n, note="cuLibraryUnload")]
    except Exception as e:
        out.append({"skipped": "cuLibraryLoadData", "reason": repr(e)[:200]})
    if isinstance(mod, Exception):
        out.append({"skipped": "cupy RawModule", "reason": repr(mod)[:200]})
    else:
        mod.get_function("ca_add")
        out.append(expect("module_get_function", 1,
                          note="CuPy RawModule.get_function (module loaded in setup, so no "
                               "load in the window)"))
    return out


def sync_setup(c):
    return None


def sync_body(c, s, n):
    for _ in range(n):
        c.torch.cuda.synchronize()
    return [expect("sync", n, exact=False, note="torch.cuda.synchronize(); + the closing one")]


PARTS = [
    ("eager", eager_setup, eager_body),
    ("cublas", cublas_setup, cublas_body),
    ("cudnn", cudnn_setup, cudnn_body),
    ("cupy_raw", cupy_raw_setup, cupy_raw_body),
    ("triton", triton_setup, triton_body),
    ("graph", graph_setup, graph_body),
    ("copies", copies_setup, copies_body),
    ("memsets", memsets_setup, memsets_body),
    ("events", events_setup, events_body),
    ("vmm", vmm_setup, vmm_body),
    ("modules", modules_setup, modules_body),
    ("sync", sync_setup, sync_body),
]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="JSON: declared counts, markers, timings")
    ap.add_argument("--trace", help="torch.profiler chrome trace of the window")
    ap.add_argument("--no-profiler", action="store_true")
    ap.add_argument("-n", type=int, default=20, help="repetitions per part")
    ap.add_argument("--graph-kernels", type=int, default=10)
    ap.add_argument("--grow-mib", type=int, default=256)
    ap.add_argument("--parts", default=",".join(p[0] for p in PARTS))
    ap.add_argument("--skip", default="", help="comma-separated parts to leave out")
    a = ap.parse_args(argv)
    port = int(os.environ.get("CLOCKALIGN_MARKER_PORT") or closed_port())
    res = {"pid": os.getpid(), "main_tid": threading.get_native_id(), "marker_port": port,
           "marker_peer": f"127.0.0.1:{port}", "n": a.n, "parts": {}, "skipped": {},
           "timings_s": {}, "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF")}
    t_all = time.monotonic()

    def save():
        res["timings_s"]["total"] = round(time.monotonic() - t_all, 2)
        tmp = a.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(res, f, indent=1)
        os.replace(tmp, a.out)

    try:
        c = Ctx(a)
        res["torch"] = c.torch.__version__
        res["torch_cuda"] = c.torch.version.cuda
    except Exception as e:
        res["skipped"]["all"] = f"torch/CUDA not usable: {e!r}"[:300]
        save()
        print(json.dumps(res["skipped"]), file=sys.stderr)
        return 2
    wanted = [p for p in PARTS if p[0] in a.parts.split(",") and p[0] not in a.skip.split(",")]
    ready = []
    for name, setup, body in wanted:               # setup + warm-up: the window body once
        t0 = time.monotonic()
        try:
            st = setup(c)
            body(c, st, a.n)
            c.torch.cuda.synchronize()
            ready.append((name, body, st))
        except Exception as e:
            res["skipped"][name] = f"{type(e).__name__}: {e}"[:300]
            traceback.print_exc()
        res["timings_s"][f"warmup_{name}"] = round(time.monotonic() - t0, 2)
        print(f"warm-up {name}: {res['timings_s'][f'warmup_{name}']} s"
              f"{' (skipped)' if name in res['skipped'] else ''}", file=sys.stderr, flush=True)
    c.torch.cuda.synchronize()
    time.sleep(0.2)

    prof = None
    if not a.no_profiler:
        try:
            from torch.profiler import ProfilerActivity, profile
            prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
        except Exception as e:
            res["skipped"]["profiler"] = repr(e)[:300]
    from torch.profiler import record_function
    if prof is not None:
        prof.__enter__()
    t0 = time.monotonic()
    with record_function(WINDOW):
        res["t_window_start_ns"] = mark(port)
        for name, body, st in ready:
            ts = now()
            try:
                exp = body(c, st, a.n)
                res["parts"][name] = {"t_start_ns": ts, "t_end_ns": now(), "expect": exp}
            except Exception as e:
                res["parts"][name] = {"t_start_ns": ts, "t_end_ns": now(),
                                      "failed_in_window": f"{type(e).__name__}: {e}"[:300]}
        c.torch.cuda.synchronize()
        res["t_window_end_ns"] = mark(port)
    res["timings_s"]["window"] = round(time.monotonic() - t0, 3)
    if prof is not None:
        prof.__exit__(None, None, None)
        if a.trace:
            t1 = time.monotonic()
            try:
                prof.export_chrome_trace(a.trace)
                res["trace"] = a.trace
            except Exception as e:
                res["skipped"]["trace_export"] = repr(e)[:300]
            res["timings_s"]["trace_export"] = round(time.monotonic() - t1, 2)
    save()
    print(f"window {res['timings_s']['window']} s, {len(ready)} parts, skipped "
          f"{sorted(res['skipped'])}; wrote {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
