"""The CUDA driver API through cuda-bindings, for the clock probe's own context: the module,
imported lazily (``from cuda.bindings import driver``, 12.8 and later, 13.x; ``from cuda
import cuda`` before), cuInit once, and every CUresult turned into a GpuClockError with one
sentence.

    cu = driver(); n = init_driver()
    dev = check(cu.cuDeviceGet(0), "cuDeviceGet")
"""
from ...errors import ClockalignError


class GpuClockError(ClockalignError):
    """CUDA is missing or failed while probing a GPU clock (one sentence)."""


_driver = None


def driver():
    """The cuda-bindings driver module, new layout or old; GpuClockError if absent."""
    global _driver
    if _driver is None:
        try:
            from cuda.bindings import driver as cu
        except ImportError:
            try:
                from cuda import cuda as cu
            except ImportError:
                raise GpuClockError("cuda-bindings is not installed "
                                    "(pip install 'clockalign[gpu]' or pip install cuda-bindings)"
                                    ) from None
        _driver = cu
    return _driver


def bindings_version() -> str:
    try:
        import cuda.bindings
        return cuda.bindings.__version__
    except Exception:
        try:
            import cuda
            return getattr(cuda, "__version__", "unknown")
        except Exception:
            return "unknown"


def err_text(err) -> str:
    cu = driver()
    name = getattr(err, "name", str(err))
    try:
        res, desc = cu.cuGetErrorString(err)
        if int(res) == 0 and desc:
            return f"{name} ({desc.decode(errors='replace')})"
    except Exception:
        pass
    return name


def check(result, what: str):
    """Unpack a cuda-bindings result tuple; raise GpuClockError on a CUresult != 0."""
    err = result[0]
    if int(err) != 0:
        raise GpuClockError(f"{what} failed with {err_text(err)}")
    rest = result[1:]
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else rest


_inited = False


def init_driver() -> int:
    """cuInit once per process; returns the number of GPUs CUDA sees."""
    global _inited
    cu = driver()
    if not _inited:
        try:
            res = cu.cuInit(0)
        except Exception as e:
            # cuda-bindings raises (not returns) when libcuda.so.1 itself cannot be loaded.
            raise GpuClockError(
                "the NVIDIA driver library libcuda.so.1 could not be loaded "
                f"({type(e).__name__}); is the NVIDIA driver installed?") from None
        err = res[0]
        if int(err) == 100:  # CUDA_ERROR_NO_DEVICE
            raise GpuClockError("no NVIDIA GPU is visible to CUDA (cuInit: CUDA_ERROR_NO_DEVICE)")
        if int(err) == 35:  # CUDA_ERROR_INSUFFICIENT_DRIVER
            raise GpuClockError(
                f"the NVIDIA driver is older than cuda-bindings {bindings_version()} needs "
                "(CUDA_ERROR_INSUFFICIENT_DRIVER); install a matching cuda-bindings")
        check(res, "cuInit")
        _inited = True
    return int(check(cu.cuDeviceGetCount(), "cuDeviceGetCount"))


def decode(raw) -> str:
    if isinstance(raw, bytes):
        return raw.split(b"\0", 1)[0].decode(errors="replace")
    return str(raw)


def uuid_text(uuid) -> str:
    raw = getattr(uuid, "bytes", b"")
    if isinstance(raw, str):
        raw = raw.encode("latin-1")
    h = bytes(raw).hex()
    if len(h) != 32:
        return ""
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
