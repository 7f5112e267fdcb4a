"""The CUDA driver functions clockalign traces: the one table every id, role, argument name
and BPF read comes from.

Each entry names the symbol libcuda exports, what the call does (its *role*), the up to
five arguments a record keeps (``a0..a4``) and how BPF reads each at the call's entry: a
register or stack parameter, a field of a struct an argument points to (CUlaunchConfig,
CUDA_MEMCPY2D/3D, CUmemAllocationProp), an out-parameter dereferenced when the call
succeeds, or a C string copied into the record's 56-byte ``data`` (cuModuleGetFunction's
kernel name, so a report can name the kernels a launch's func pointer refers to; the file
name of cuModuleLoad / cuLibraryLoadFromFile).

Ids are file format: a number, once used, always means the same symbol and is never reused.
``capture/probes/cuda_stubs.py`` generates the ``enter_X``/``return_X`` BPF stubs from this
table (``c_text()``); schema.CUDA_FUNCTIONS and every role list of the readers derive from it.

    from clockalign.store import cuda_api
    cuda_api.BY_SYMBOL["cuGraphLaunch"].role          # 'graph_launch'
    cuda_api.ids("copy", "memset")                    # ids of every copy and memset
"""
import dataclasses
from typing import Optional

ROLES = ("launch", "graph_launch", "copy", "memset", "alloc", "free", "vmm", "sync",
         "module", "module_unload", "function", "event", "stream_wait", "context")
# roles that put work on a stream (a launch, a copy, a memset): the exporters' stream tracks
STREAM_WORK = ("launch", "graph_launch", "copy", "memset")
# CU_STREAM_LEGACY and CU_STREAM_PER_THREAD: special stream handles of cuda.h
STREAM_LEGACY, STREAM_PER_THREAD = 0x1, 0x2


@dataclasses.dataclass(frozen=True)
class Read:
    """How BPF reads one recorded argument at the call's entry.

    how: "arg" (parameter ``param``, 1-based: PARM1..6 in registers, 7.. on the stack),
    "field" (``size`` bytes at ``offset`` of the struct ``struct`` that parameter ``param``
    points to), "out" (parameter ``param`` is a pointer the call writes its result to: the
    record keeps the result when the call returns 0), "string" (parameter ``param`` is a C
    string: its first 55 bytes go into ``data`` when the call returns), "helper" (the
    entry helper of the function computes it; ``struct`` says from what).
    """

    how: str
    param: int = 0
    offset: int = 0
    size: int = 8
    struct: str = ""

    def describe(self) -> str:
        if self.how == "arg":
            return f"PARM{self.param}" if self.param <= 6 else f"stack arg {self.param}"
        if self.how == "field":
            return f"{self.struct}+{self.offset} ({self.size} B) via arg {self.param}"
        if self.how == "out":
            return f"*arg {self.param} on success"
        if self.how == "string":
            return f"string at arg {self.param} -> data"
        return f"helper: {self.struct}"


def arg(n, size=8):
    """Parameter n; size < 8 for a narrower C type (the register's upper bits are junk)."""
    return Read("arg", n, size=size)


def field(n, struct, offset, size=8):
    return Read("field", n, offset, size, struct)


def out(n):
    return Read("out", n)


def string(n):
    return Read("string", n)


def helper(what):
    return Read("helper", struct=what)


@dataclasses.dataclass(frozen=True)
class CudaFunction:
    id: int
    symbol: str
    role: str
    args: tuple            # ((name, Read), ...), at most 5: a0, a1, ...
    entry: str = "args"    # BPF entry helper: args, launch, launch_ex, memcpy2d, memcpy3d
    allocates: bool = False   # its failure is an allocation failure (OOM of an allocator)

    @property
    def arg_names(self) -> tuple:
        """Names of a0..a4, "" where unused (schema.CUDA_FUNCTIONS' second field)."""
        names = [a for a, _ in self.args]
        return tuple(names + [""] * (5 - len(names)))

    @property
    def per_thread(self) -> bool:
        """The per-thread-default-stream twin (_ptsz/_ptds): stream 0 is the thread's own."""
        return self.symbol.endswith(("_ptsz", "_ptds"))

    def slot(self, name) -> Optional[int]:
        """Index (0..4) of the argument called name, or None."""
        names = self.arg_names
        return names.index(name) if name in names else None

    @property
    def enqueues(self) -> bool:
        """The call only puts work on a stream (a launch, an async copy or memset, an event
        record, a stream wait) and returns: what `record --cuda-returns blocking` records
        at entry only.  Its return code reports argument errors; the work's own errors
        surface at the next synchronizing call, which keeps its return probe."""
        if self.role in ("launch", "graph_launch", "event", "stream_wait"):
            return True
        return self.role in ("copy", "memset") and "Async" in self.symbol

    @property
    def deref_a0(self) -> bool:
        return bool(self.args) and self.args[0][1].how == "out"

    @property
    def string_slot(self) -> Optional[int]:
        for i, (_, r) in enumerate(self.args):
            if r.how == "string":
                return i
        return None


def _twin(f: CudaFunction, fid: int, suffix: str) -> CudaFunction:
    return dataclasses.replace(f, id=fid, symbol=f.symbol + suffix)


def _pair(fid, symbol, role, args, suffix, **kw):
    """The function with id fid and its _ptsz/_ptds twin with id fid + 1."""
    f = CudaFunction(fid, symbol, role, args, **kw)
    return [f, _twin(f, fid + 1, suffix)]


_LAUNCH = (("func", arg(1)), ("grid", helper("PARM2..4 packed x|y<<32|z<<48")),
           ("block", helper("PARM5, PARM6, stack arg 7 packed")),
           ("shared_mem", arg(8)), ("stream", arg(9)))
_LAUNCH_EX = (("func", arg(2)), ("grid", helper("CUlaunchConfig gridDimX..Z")),
              ("block", helper("CUlaunchConfig blockDimX..Z")),
              ("shared_mem", field(1, "CUlaunchConfig", 24, 4)),
              ("stream", field(1, "CUlaunchConfig", 32)))
_ALLOC = (("dptr", out(1)), ("bytes", arg(2)))
_ALLOC_ASYNC = (("dptr", out(1)), ("bytes", arg(2)), ("stream", arg(3)))
_COPY = (("dst", arg(1)), ("src", arg(2)), ("bytes", arg(3)))
_COPY_ASYNC = _COPY + (("stream", arg(4)),)
_STREAM = (("stream", arg(1)),)
def _memset(size, stream):
    a = (("dst", arg(1)), ("value", arg(2, size)), ("count", arg(3)))
    return a + (("stream", arg(4)),) if stream else a
_EVENT_RECORD = (("event", arg(1)), ("stream", arg(2)))


def _copy2d(struct, stream):
    a = [("dst", helper(f"{struct} dstHost/dstDevice/dstArray by dstMemoryType")),
         ("src", helper(f"{struct} srcHost/srcDevice/srcArray by srcMemoryType")),
         ("bytes", helper(f"{struct} WidthInBytes * Height" + (" * Depth" if "3D" in struct
                                                               else "")))]
    a.append(("stream", arg(2)) if stream else ("stream", helper("none: the default stream")))
    a.append(("memtypes", helper(f"{struct} srcMemoryType | dstMemoryType << 8")))
    return tuple(a)


_FUNCTIONS = [
    CudaFunction(1, "cuLaunchKernel", "launch", _LAUNCH, entry="launch"),
    CudaFunction(2, "cuLaunchKernelEx", "launch", _LAUNCH_EX, entry="launch_ex"),
    CudaFunction(3, "cuMemAlloc_v2", "alloc", _ALLOC, allocates=True),
    CudaFunction(4, "cuMemAllocAsync", "alloc", _ALLOC_ASYNC, allocates=True),
    CudaFunction(5, "cuMemFree_v2", "free", (("dptr", arg(1)),)),
    CudaFunction(6, "cuMemcpyHtoD_v2", "copy", _COPY),
    CudaFunction(7, "cuMemcpyDtoH_v2", "copy", _COPY),
    CudaFunction(8, "cuMemcpyAsync", "copy", _COPY_ASYNC),
    CudaFunction(9, "cuStreamSynchronize", "sync", _STREAM),
    CudaFunction(10, "cuCtxSynchronize", "sync", ()),
    CudaFunction(11, "cuEventSynchronize", "sync", (("event", arg(1)),)),
    # Per-thread-default-stream twins, exported by the real libcuda and used by the runtime.
    CudaFunction(12, "cuLaunchKernel_ptsz", "launch", _LAUNCH, entry="launch"),
    CudaFunction(13, "cuLaunchKernelEx_ptsz", "launch", _LAUNCH_EX, entry="launch_ex"),
    CudaFunction(14, "cuMemcpyHtoD_v2_ptds", "copy", _COPY),
    CudaFunction(15, "cuMemcpyDtoH_v2_ptds", "copy", _COPY),
    CudaFunction(16, "cuMemcpyAsync_ptsz", "copy", _COPY_ASYNC),
    CudaFunction(17, "cuStreamSynchronize_ptsz", "sync", _STREAM),
    CudaFunction(18, "cuMemAllocAsync_ptsz", "alloc", _ALLOC_ASYNC, allocates=True),
    # CUDA 12.9+/13: what the runtime's cudaDeviceSynchronize may reach instead of the v1
    CudaFunction(19, "cuCtxSynchronize_v2", "sync", (("ctx", arg(1)),)),
    # Issue 9: what serving stacks call besides eager launches.
    *_pair(20, "cuGraphLaunch", "graph_launch", (("graph_exec", arg(1)), ("stream", arg(2))),
           "_ptsz"),
    *_pair(22, "cuMemcpyHtoDAsync_v2", "copy", _COPY_ASYNC, "_ptsz"),
    *_pair(24, "cuMemcpyDtoHAsync_v2", "copy", _COPY_ASYNC, "_ptsz"),
    *_pair(26, "cuMemcpyDtoDAsync_v2", "copy", _COPY_ASYNC, "_ptsz"),
    *_pair(28, "cuMemcpyDtoD_v2", "copy", _COPY, "_ptds"),
    *_pair(30, "cuMemcpy", "copy", _COPY, "_ptds"),
    *_pair(32, "cuMemcpyPeerAsync", "copy",
           (("dst", arg(1)), ("src", arg(3)), ("bytes", arg(5)), ("stream", arg(6)),
            ("dst_ctx", arg(2))), "_ptsz"),
    *_pair(34, "cuMemcpy2DAsync_v2", "copy", _copy2d("CUDA_MEMCPY2D", True), "_ptsz",
           entry="memcpy2d"),
    *_pair(36, "cuMemcpy3DAsync_v2", "copy", _copy2d("CUDA_MEMCPY3D", True), "_ptsz",
           entry="memcpy3d"),
    *_pair(38, "cuMemcpy2D_v2", "copy", _copy2d("CUDA_MEMCPY2D", False), "_ptds",
           entry="memcpy2d"),
    *_pair(40, "cuMemcpy3D_v2", "copy", _copy2d("CUDA_MEMCPY3D", False), "_ptds",
           entry="memcpy3d"),
    *_pair(42, "cuMemsetD8_v2", "memset", _memset(1, False), "_ptds"),
    *_pair(44, "cuMemsetD16_v2", "memset", _memset(2, False), "_ptds"),
    *_pair(46, "cuMemsetD32_v2", "memset", _memset(4, False), "_ptds"),
    *_pair(48, "cuMemsetD8Async", "memset", _memset(1, True), "_ptsz"),
    *_pair(50, "cuMemsetD16Async", "memset", _memset(2, True), "_ptsz"),
    *_pair(52, "cuMemsetD32Async", "memset", _memset(4, True), "_ptsz"),
    *_pair(54, "cuMemAllocFromPoolAsync", "alloc",
           (("dptr", out(1)), ("bytes", arg(2)), ("stream", arg(4)), ("pool", arg(3))),
           "_ptsz", allocates=True),
    *_pair(56, "cuMemFreeAsync", "free", (("dptr", arg(1)), ("stream", arg(2))), "_ptsz"),
    # virtual memory management: PyTorch's expandable segments
    CudaFunction(58, "cuMemCreate", "vmm",
                 (("handle", out(1)), ("bytes", arg(2)),
                  ("device", field(3, "CUmemAllocationProp", 12, 4)),   # location.id
                  ("flags", arg(4))), allocates=True),
    CudaFunction(59, "cuMemMap", "vmm",
                 (("dptr", arg(1)), ("bytes", arg(2)), ("offset", arg(3)), ("handle", arg(4)),
                  ("flags", arg(5)))),
    CudaFunction(60, "cuMemUnmap", "vmm", (("dptr", arg(1)), ("bytes", arg(2)))),
    CudaFunction(61, "cuMemRelease", "vmm", (("handle", arg(1)),)),
    CudaFunction(62, "cuMemAddressReserve", "vmm",
                 (("dptr", out(1)), ("bytes", arg(2)), ("alignment", arg(3)), ("addr", arg(4)),
                  ("flags", arg(5)))),
    # module and library loading: model-load latency
    CudaFunction(63, "cuModuleLoadData", "module", (("module", out(1)), ("image", arg(2)))),
    CudaFunction(64, "cuModuleLoadDataEx", "module",
                 (("module", out(1)), ("image", arg(2)), ("num_options", arg(3, 4)))),
    CudaFunction(65, "cuLibraryLoadData", "module",
                 (("library", out(1)), ("image", arg(2)), ("num_jit_options", arg(5, 4)),
                  ("num_library_options", arg(8, 4)))),
    CudaFunction(66, "cuModuleGetFunction", "function",
                 (("func", out(1)), ("module", arg(2)), ("name", string(3)))),
    CudaFunction(67, "cuLibraryGetKernel", "function",
                 (("func", out(1)), ("library", arg(2)), ("name", string(3)))),
    # cross-stream ordering
    *_pair(68, "cuStreamWaitEvent", "stream_wait",
           (("stream", arg(1)), ("event", arg(2)), ("flags", arg(3, 4))), "_ptsz"),
    *_pair(70, "cuEventRecord", "event", _EVENT_RECORD, "_ptsz"),
    *_pair(72, "cuEventRecordWithFlags", "event", _EVENT_RECORD + (("flags", arg(3, 4)),),
           "_ptsz"),
    # context setup
    CudaFunction(74, "cuCtxCreate_v2", "context",
                 (("ctx", out(1)), ("flags", arg(2, 4)), ("device", arg(3, 4)))),
    CudaFunction(75, "cuCtxCreate_v3", "context",
                 (("ctx", out(1)), ("flags", arg(4, 4)), ("device", arg(5, 4)),
                  ("num_params", arg(3, 4)))),
    CudaFunction(76, "cuCtxCreate_v4", "context",
                 (("ctx", out(1)), ("flags", arg(3, 4)), ("device", arg(4, 4)))),
    CudaFunction(77, "cuDevicePrimaryCtxRetain", "context",
                 (("ctx", out(1)), ("device", arg(2, 4)))),
    # The H200 coverage run (results/coverage.md): unloads, and the VMM calls of torch's
    # expandable segments and of explicit VMM users that 58..62 left out
    CudaFunction(78, "cuModuleUnload", "module_unload", (("module", arg(1)),)),
    CudaFunction(79, "cuLibraryUnload", "module_unload", (("library", arg(1)),)),
    CudaFunction(80, "cuMemSetAccess", "vmm",
                 (("dptr", arg(1)), ("bytes", arg(2)), ("count", arg(4)))),
    CudaFunction(81, "cuMemAddressFree", "vmm", (("dptr", arg(1)), ("bytes", arg(2)))),
    # loads from a file (CuPy's kernel cache): the file name is kept in data
    CudaFunction(82, "cuModuleLoad", "module", (("module", out(1)), ("fname", string(2)))),
    CudaFunction(83, "cuLibraryLoadFromFile", "module",
                 (("library", out(1)), ("fname", string(2)), ("num_jit_options", arg(5, 4)),
                  ("num_library_options", arg(8, 4)))),
    # a process's driver start (seconds on some hosts): the H200 life-cycle run could not
    # tell a restarted worker's `import torch` from its driver start without it
    CudaFunction(84, "cuInit", "context", (("flags", arg(1, 4)),)),
]

FUNCTIONS = {f.id: f for f in _FUNCTIONS}
BY_SYMBOL = {f.symbol: f for f in _FUNCTIONS}
ENTRIES = ("args", "launch", "launch_ex", "memcpy2d", "memcpy3d")


def _check():
    assert len(FUNCTIONS) == len(_FUNCTIONS) and len(BY_SYMBOL) == len(_FUNCTIONS)
    for f in _FUNCTIONS:
        assert 0 < f.id < 1 << 16 and f.role in ROLES and f.entry in ENTRIES, f
        assert len(f.args) <= 5, f
        assert all(r.how != "out" for _, r in f.args[1:]), f"{f.symbol}: out only in a0"
        assert sum(r.how == "string" for _, r in f.args) <= 1, f
        assert f.entry != "args" or all(r.how != "helper" for _, r in f.args), f


_check()


def ids(*roles) -> tuple:
    """Ids of the functions of these roles, ascending."""
    return tuple(sorted(f.id for f in _FUNCTIONS if f.role in roles))


def names(*roles) -> tuple:
    return tuple(FUNCTIONS[i].symbol for i in ids(*roles))


ALLOC_IDS = tuple(sorted(f.id for f in _FUNCTIONS if f.allocates))
STREAM_WORK_IDS = ids(*STREAM_WORK)


def function_name(fid: int) -> str:
    f = FUNCTIONS.get(int(fid))
    return f.symbol if f else f"cuda_fn_{int(fid)}"


def role_of(fid: int) -> str:
    f = FUNCTIONS.get(int(fid))
    return f.role if f else ""
