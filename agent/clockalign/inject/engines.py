"""Engine adapters of the reference service: ONNX Runtime and PyTorch, the same model
(model.py) on each, and the errors they raise sorted into what the service does about them.

    eng = open_engine("onnxruntime")       # or "torch"; device "auto": CUDA where present
    logits = eng.infer(points, steps=1)    # EngineError(kind="oom" | "sticky" | "error")

ONNX Runtime runs the CPU execution provider, or CUDA where onnxruntime-gpu provides it.
PyTorch runs on CUDA where torch sees a GPU (its caching allocator forced to plain
cudaMalloc segments, so allocations are cuMemAlloc_v2 calls the probes see) and otherwise on
the CPU; on CUDA the grid lookup is an unchecked gather kernel (PTX, loaded and launched
with the driver API) on torch's stream, so a far-out cell id is an illegal address.
"""
import ctypes
import os
import sys

import numpy as np

from ..errors import ClockalignError
from . import model

ENGINES = ("torch", "onnxruntime")


class EngineError(Exception):
    """kind: 'oom' (free and retry, or reject), 'sticky' (the context is lost: exit),
    'error' (reject this request)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def available(engine: str):
    """None if ``engine`` can run here, else why not (one sentence)."""
    import importlib.util
    mod = {"torch": "torch", "onnxruntime": "onnxruntime"}.get(engine)
    if mod is None:
        return f"unknown engine {engine!r}"
    if importlib.util.find_spec(mod) is None:
        return f"{engine} is not installed for {os.path.basename(sys.executable)}"
    return None


def open_engine(name: str, device: str = "auto"):
    if name == "onnxruntime":
        return OrtEngine(device)
    if name == "torch":
        return TorchEngine(device)
    raise ClockalignError(f"unknown engine {name!r}; choose one of {', '.join(ENGINES)}")


class OrtEngine:
    name = "onnxruntime"

    def __init__(self, device="auto"):
        import onnxruntime as ort
        providers = ort.get_available_providers()
        want = ["CUDAExecutionProvider"] if device in ("auto", "cuda") else []
        use = [p for p in want if p in providers] + ["CPUExecutionProvider"]
        if device == "cuda" and use[0] != "CUDAExecutionProvider":
            raise ClockalignError("onnxruntime has no CUDAExecutionProvider here "
                                  "(onnxruntime-gpu is not installed)")
        so = ort.SessionOptions()
        so.log_severity_level = 4      # errors come back as exceptions; no log lines
        self.session = ort.InferenceSession(model.onnx_model(model.weights()), so,
                                            providers=use)
        self.device = "cuda" if self.session.get_providers()[0].startswith("CUDA") else "cpu"
        self.version = ort.__version__

    def infer(self, points: np.ndarray, steps: int = 1) -> np.ndarray:
        try:
            return self.session.run(None, {model.INPUT: points,
                                           model.STEPS: np.array([steps], dtype=np.int64)})[0]
        except Exception as e:    # onnxruntime's own exception types are not importable API
            text = str(e)
            low = text.lower()
            if "failed to allocate" in low or "bad_alloc" in low or "out of memory" in low:
                raise EngineError("oom", _first_line(text)) from None
            if "cuda" in low and ("illegal" in low or "launch failure" in low):
                raise EngineError("sticky", _first_line(text)) from None
            raise EngineError("error", _first_line(text)) from None

    def free(self):
        """ONNX Runtime returns a failed allocation's memory itself; nothing is cached."""


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0][:300] if text.strip() else "engine error"


# An unchecked gather: out[e] = table[idx[e / dim] * dim + e % dim] (the cell id is trusted).
GATHER_PTX = b"""
.version 7.0
.target sm_50
.address_size 64

.visible .entry ca_gather(.param .u64 p_table, .param .u64 p_idx, .param .u64 p_out,
                          .param .u32 p_n, .param .u32 p_dim)
{
    .reg .pred %p<2>;
    .reg .b32 %r<9>;
    .reg .b64 %rd<14>;
    .reg .f32 %f<2>;
    ld.param.u64 %rd1, [p_table];
    ld.param.u64 %rd2, [p_idx];
    ld.param.u64 %rd3, [p_out];
    ld.param.u32 %r1, [p_n];
    ld.param.u32 %r6, [p_dim];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.s32 %r5, %r2, %r3, %r4;
    setp.ge.u32 %p1, %r5, %r1;
    @%p1 bra DONE;
    div.u32 %r7, %r5, %r6;
    rem.u32 %r8, %r5, %r6;
    cvta.to.global.u64 %rd4, %rd2;
    mul.wide.u32 %rd5, %r7, 8;
    add.s64 %rd6, %rd4, %rd5;
    ld.global.u64 %rd7, [%rd6];
    cvt.u64.u32 %rd8, %r6;
    mul.lo.s64 %rd9, %rd7, %rd8;
    cvt.u64.u32 %rd10, %r8;
    add.s64 %rd9, %rd9, %rd10;
    shl.b64 %rd9, %rd9, 2;
    cvta.to.global.u64 %rd11, %rd1;
    add.s64 %rd12, %rd11, %rd9;
    ld.global.f32 %f1, [%rd12];
    cvta.to.global.u64 %rd13, %rd3;
    mul.wide.u32 %rd5, %r5, 4;
    add.s64 %rd13, %rd13, %rd5;
    st.global.f32 [%rd13], %f1;
DONE:
    ret;
}
\0"""


class _CudaGather:
    """ca_gather loaded into the current (torch's primary) context with the driver API."""

    def __init__(self):
        self.cu = ctypes.CDLL("libcuda.so.1")
        self.mod, self.fn = ctypes.c_void_p(), ctypes.c_void_p()
        self.ptx = ctypes.create_string_buffer(GATHER_PTX)
        self._check(self.cu.cuModuleLoadData(ctypes.byref(self.mod), self.ptx),
                    "cuModuleLoadData")
        self._check(self.cu.cuModuleGetFunction(ctypes.byref(self.fn), self.mod, b"ca_gather"),
                    "cuModuleGetFunction")

    @staticmethod
    def _check(rc, what):
        if rc != 0:
            raise EngineError("sticky" if rc in (700, 719, 710, 999) else "error",
                              f"{what} returned CUresult {rc}")

    def __call__(self, table, idx, out, stream_handle):
        n = out.numel()
        args = [ctypes.c_uint64(table.data_ptr()), ctypes.c_uint64(idx.data_ptr()),
                ctypes.c_uint64(out.data_ptr()), ctypes.c_uint32(n),
                ctypes.c_uint32(table.shape[1])]
        params = (ctypes.c_void_p * len(args))(*[ctypes.addressof(a) for a in args])
        block = 256
        self._check(self.cu.cuLaunchKernel(self.fn, (n + block - 1) // block, 1, 1, block, 1, 1,
                                           0, ctypes.c_void_p(stream_handle), params, None),
                    "cuLaunchKernel(ca_gather)")


class TorchEngine:
    name = "torch"

    def __init__(self, device="auto"):
        os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False")
        import torch
        self.torch = torch
        cuda = torch.cuda.is_available()
        if device == "cuda" and not cuda:
            raise ClockalignError("torch sees no CUDA GPU here")
        self.device = "cuda" if cuda and device in ("auto", "cuda") else "cpu"
        self.version = torch.__version__
        dev = torch.device(self.device)
        self.w = {k: torch.from_numpy(v).to(dev) for k, v in model.weights().items()}
        self.cellvec = torch.tensor([[1.0], [float(model.GRID)]], device=dev)
        self.gather = _CudaGather() if self.device == "cuda" else None
        self.dev = dev

    def _lookup(self, ids):
        t = self.torch
        if self.gather is None:
            return self.w["table"][ids]          # CPU: indexing checks, IndexError
        ids = ids.contiguous()
        out = t.empty(ids.shape + (model.DIM,), device=self.dev, dtype=t.float32)
        self.gather(self.w["table"], ids, out, t.cuda.current_stream().cuda_stream)
        return out

    def infer(self, points: np.ndarray, steps: int = 1) -> np.ndarray:
        t, w = self.torch, self.w
        try:
            with t.no_grad():
                x = t.from_numpy(points).to(self.dev)
                ids = (t.floor(x * model.GRID) @ self.cellvec)[..., 0].to(t.int64)
                h = t.relu(x @ w["W1"] + w["b1"]) + self._lookup(ids)
                q, k, v = h @ w["Wq"], h @ w["Wk"], h @ w["Wv"]
                s = (q @ k.transpose(1, 2)) * (1.0 / model.DIM ** 0.5)
                p = (t.softmax(s, dim=-1) @ v).mean(dim=1)
                for _ in range(int(steps)):
                    p = t.tanh(p @ w["Wr"])
                return (p @ w["W2"] + w["b2"]).cpu().numpy()
        except t.cuda.OutOfMemoryError as e:
            raise EngineError("oom", _first_line(str(e))) from None
        except RuntimeError as e:
            text = str(e)
            if "out of memory" in text.lower():
                raise EngineError("oom", _first_line(text)) from None
            if "CUDA error" in text or "CUDA_ERROR" in text:
                raise EngineError("sticky", _first_line(text)) from None
            raise EngineError("error", _first_line(text)) from None
        except IndexError as e:
            raise EngineError("error", _first_line(str(e))) from None

    def free(self):
        """Give the caching allocator's free blocks back to the driver (cuMemFree calls)."""
        if self.device == "cuda":
            self.torch.cuda.empty_cache()
