"""The PyTorch engine of the reference service on a GPU: the same numbers as the numpy model,
an oversized batch is an out-of-memory the worker can recover from, and a far-out point is
an illegal address in the unchecked gather kernel (run in a child: the context is lost)."""
import subprocess
import sys

import numpy as np
import pytest

from clockalign.inject import faults, model

torch = pytest.importorskip("torch", reason="torch is not installed")


@pytest.fixture(scope="module")
def engine():
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA GPU")
    from clockalign.inject.engines import TorchEngine
    return TorchEngine("cuda")


def test_torch_cuda_matches_numpy(engine):
    x = np.random.default_rng(5).random((2, 50, 2), dtype=np.float32)
    for steps in (1, 3):
        np.testing.assert_allclose(engine.infer(x, steps),
                                   model.forward_numpy(model.weights(), x, steps), atol=1e-4)


def test_torch_cpu_matches_numpy_and_checks_indices():
    from clockalign.inject.engines import EngineError, TorchEngine
    eng = TorchEngine("cpu")
    x = np.random.default_rng(6).random((1, 20, 2), dtype=np.float32)
    np.testing.assert_allclose(eng.infer(x), model.forward_numpy(model.weights(), x), atol=1e-4)
    x[0, 0] = faults.FAR_POINT
    with pytest.raises(EngineError) as e:
        eng.infer(x)
    assert e.value.kind == "error"


def test_oversized_batch_is_an_oom_then_the_engine_works(engine):
    from clockalign.inject.engines import EngineError
    x = np.random.default_rng(7).random((faults.OOM_BATCH, faults.OOM_POINTS, 2),
                                        dtype=np.float32)
    with pytest.raises(EngineError) as e:
        engine.infer(x)
    assert e.value.kind == "oom"
    engine.free()
    assert engine.infer(x[:1, :64]).shape == (1, model.CLASSES)


CHILD = """
import numpy as np
from clockalign.inject.engines import EngineError, TorchEngine
from clockalign.inject import faults
eng = TorchEngine("cuda")
x = np.random.default_rng(8).random((1, 64, 2), dtype=np.float32)
eng.infer(x)
x[0, 0] = faults.FAR_POINT
try:
    eng.infer(x)
    print("no error")
except EngineError as e:
    print("kind", e.kind, str(e)[:200])
"""


def test_far_point_is_a_sticky_illegal_address(engine):
    r = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                       timeout=120)
    assert "kind sticky" in r.stdout, (r.stdout, r.stderr[-2000:])
    assert "illegal memory access" in r.stdout.lower(), r.stdout
