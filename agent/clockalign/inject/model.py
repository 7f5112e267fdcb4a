"""The reference model, defined once: weights from a seeded generator, the ONNX graph
(onnxproto.py) and a numpy forward that both engines are checked against.

A point-set classifier: points [B, L, 2] (FP32, meant to lie in [0, 1)) and steps [1]
(INT64, refinement iterations, default 1) -> logits [B, 10].

    h  = relu(points @ W1 + b1) + table[cell(points)]   # a learned 64x64 grid embedding
    a  = softmax((h Wq)(h Wk)^T / sqrt(D)) (h Wv)       # self-attention: B x L x L scores
    p  = mean over L of a;  steps times: p = tanh(p Wr)
    logits = p W2 + b2

What the faults use: attention needs B*L*L*4 bytes of scores, so an oversized batch of
points runs out of memory while its request stays a few MB (OOM); the refinement loop runs
as many iterations as ``steps`` asks, so a huge count hangs the engine (timeout); and the
grid lookup trusts its cell ids, so a finite point far outside [0, 1) indexes far out of
the table (on CUDA an unchecked gather kernel: illegal address; ONNX Runtime's Gather
checks and fails).

    w = weights(); data = onnx_model(w); logits = forward_numpy(w, points, 1)
"""
import numpy as np

from . import onnxproto as op

GRID = 64
DIM = 32
CLASSES = 10
INPUT, STEPS, OUTPUT = "points", "steps", "logits"


def weights(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)

    def w(*shape, scale=None):
        s = scale if scale is not None else 1.0 / np.sqrt(shape[0])
        return (rng.standard_normal(shape) * s).astype(np.float32)
    return {"W1": w(2, DIM), "b1": w(DIM, scale=0.1), "table": w(GRID * GRID, DIM, scale=0.1),
            "Wq": w(DIM, DIM), "Wk": w(DIM, DIM), "Wv": w(DIM, DIM), "Wr": w(DIM, DIM),
            "W2": w(DIM, CLASSES), "b2": w(CLASSES, scale=0.1)}


def cell_ids(points: np.ndarray) -> np.ndarray:
    """Grid cell of each point: floor(x*G) + G*floor(y*G), unchecked (int64)."""
    f = np.floor(points * np.float32(GRID)).astype(np.float32)
    return (f @ np.array([[1.0], [GRID]], dtype=np.float32))[..., 0].astype(np.int64)


def forward_numpy(w: dict, points: np.ndarray, steps: int = 1) -> np.ndarray:
    h = np.maximum(points @ w["W1"] + w["b1"], 0) + w["table"][cell_ids(points)]
    q, k, v = h @ w["Wq"], h @ w["Wk"], h @ w["Wv"]
    s = (q @ k.transpose(0, 2, 1)) * np.float32(1 / np.sqrt(DIM))
    s = np.exp(s - s.max(axis=-1, keepdims=True))
    a = (s / s.sum(axis=-1, keepdims=True)) @ v
    p = a.mean(axis=1)
    for _ in range(int(steps)):
        p = np.tanh(p @ w["Wr"])
    return p @ w["W2"] + w["b2"]


def onnx_model(w: dict) -> bytes:
    """The same model as ONNX (opset 13) bytes."""
    consts = {"grid": np.array(GRID, dtype=np.float32),
              "cellvec": np.array([[1.0], [GRID]], dtype=np.float32),
              "axis2": np.array([2], dtype=np.int64), "axis0": np.array([0], dtype=np.int64),
              "scale": np.array(1 / np.sqrt(DIM), dtype=np.float32)}
    inits = [op.tensor(k, v) for k, v in {**w, **consts}.items()]
    n = op.node
    body = op.graph("refine", nodes=[
        n("Identity", ["cond_in"], ["cond_out"]),
        n("MatMul", ["p_in", "Wr"], ["pr"]),
        n("Tanh", ["pr"], ["p_out"]),
    ], inputs=[op.value_info("iter", op.INT64, []), op.value_info("cond_in", op.BOOL, []),
               op.value_info("p_in", op.FLOAT, ["B", DIM])],
        outputs=[op.value_info("cond_out", op.BOOL, []),
                 op.value_info("p_out", op.FLOAT, ["B", DIM])], initializers=[])
    nodes = [
        n("MatMul", [INPUT, "W1"], ["h0"]), n("Add", ["h0", "b1"], ["h1"]),
        n("Relu", ["h1"], ["h2"]),
        n("Mul", [INPUT, "grid"], ["ps"]), n("Floor", ["ps"], ["pf"]),
        n("MatMul", ["pf", "cellvec"], ["cf"]), n("Cast", ["cf"], ["ci"], to=op.INT64),
        n("Squeeze", ["ci", "axis2"], ["cell"]),
        n("Gather", ["table", "cell"], ["emb"], axis=0),
        n("Add", ["h2", "emb"], ["h"]),
        n("MatMul", ["h", "Wq"], ["q"]), n("MatMul", ["h", "Wk"], ["k"]),
        n("MatMul", ["h", "Wv"], ["v"]), n("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
        n("MatMul", ["q", "kt"], ["s0"]), n("Mul", ["s0", "scale"], ["s"]),
        n("Softmax", ["s"], ["att"], axis=-1), n("MatMul", ["att", "v"], ["a"]),
        n("ReduceMean", ["a"], ["p"], axes=[1], keepdims=0),
        n("Squeeze", [STEPS, "axis0"], ["trip"]),
        n("Loop", ["trip", "", "p"], ["pl"], body=body),
        n("MatMul", ["pl", "W2"], ["l0"]), n("Add", ["l0", "b2"], [OUTPUT]),
    ]
    g = op.graph("pointset", nodes,
                 inputs=[op.value_info(INPUT, op.FLOAT, ["B", "L", 2]),
                         op.value_info(STEPS, op.INT64, [1])],
                 outputs=[op.value_info(OUTPUT, op.FLOAT, ["B", CLASSES])],
                 initializers=inits)
    return op.model(g)
