"""Short real workloads whose recordings decide timeline/benign.py's rules (issue 27): what
every healthy PyTorch / ONNX Runtime process does that could look like a fault.  No
failure is provoked: whatever fails, the libraries did it themselves.

    python3 scripts/workloads/benign.py eager --out eager.json
    modes: eager, compile (torch.compile mode="reduce-overhead": CUDA graphs), gpt2
    (transformers GPT-2 from a 2-layer config, no weights downloaded), ort (ONNX Runtime,
    whatever build is installed: the CPU one on the H200 host)

Writes {"mode", "ok", "seconds", "libcuda_mapped", "providers"?, ...} as JSON.
"""
import argparse
import json
import os
import sys
import time


def libcuda_mapped() -> bool:
    with open("/proc/self/maps") as fh:
        return any("libcuda.so" in line for line in fh)


def eager(steps=200):
    import torch
    m = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(),
                            torch.nn.Linear(1024, 512)).cuda()
    x = torch.randn(64, 512, device="cuda")
    with torch.no_grad():
        for _ in range(steps):
            y = m(x)
    torch.cuda.synchronize()
    return {"checksum": float(y.sum())}


def compiled(steps=200):
    import torch
    m = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.GELU(),
                            torch.nn.Linear(1024, 512)).cuda()
    f = torch.compile(m, mode="reduce-overhead")
    x = torch.randn(64, 512, device="cuda")
    with torch.no_grad():
        for _ in range(steps):
            y = f(x)
    torch.cuda.synchronize()
    return {"checksum": float(y.sum())}


def gpt2(tokens=32):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(n_layer=2, n_head=4, n_embd=256, vocab_size=5000, n_positions=256)
    m = GPT2LMHeadModel(cfg).cuda().eval()
    ids = torch.randint(0, cfg.vocab_size, (1, 8), device="cuda")
    with torch.no_grad():
        out = m.generate(ids, max_new_tokens=tokens, do_sample=False, pad_token_id=0)
    torch.cuda.synchronize()
    return {"generated": int(out.shape[1])}


def _onnx_model() -> bytes:
    """A MatMul + Relu model, built with onnx's helper (no export, no download)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((256, 256))
                                .astype(np.float32), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["h"]),
                           helper.make_node("Relu", ["h"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 256])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 256])],
                          [w])
    # IR version 8 (what opset 17 needs): the onnx package's default follows its own release
    # and may be newer than the installed onnxruntime reads (the H200's onnx wrote 14, its
    # onnxruntime 1.30 reads up to 13)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)],
                             ir_version=8).SerializeToString()


def ort(steps=200):
    import numpy as np
    import onnxruntime as rt
    avail = rt.get_available_providers()
    want = [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in avail]
    s = rt.InferenceSession(_onnx_model(), providers=want)
    x = np.random.default_rng(1).standard_normal((64, 256)).astype(np.float32)
    for _ in range(steps):
        y = s.run(None, {"x": x})[0]
    return {"providers": s.get_providers(), "available": avail, "checksum": float(y.sum())}


MODES = {"eager": eager, "compile": compiled, "gpt2": gpt2, "ort": ort}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=sorted(MODES))
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    t = time.monotonic()
    res = {"mode": a.mode, "pid": os.getpid()}
    try:
        res.update(MODES[a.mode]())
        res["ok"] = True
    except Exception as e:                      # the summary says what failed and why
        res.update(ok=False, error=f"{type(e).__name__}: {e}")
    res["seconds"] = round(time.monotonic() - t, 3)
    res["libcuda_mapped"] = libcuda_mapped()
    with open(a.out, "w") as fh:
        json.dump(res, fh)
    print(json.dumps(res), flush=True)
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
