"""Choosing the counter backend for ``--counters nvml|dcgm|auto|none``.

    backend = open_backend("auto", gpus=[0, 1], interval_s=0.1)   # DCGM if it works, else NVML
    available()   # {"nvml": (True, "NVML works: ..."), "dcgm": (False, "DCGM is not usable: ...")}
"""
from ....errors import ClockalignError

KINDS = ("nvml", "dcgm", "auto", "none")


def open_backend(kind, gpus=None, interval_s=0.1):
    """An open backend for ``kind`` (None for "none"); ClockalignError if it cannot be used.

    "auto" takes DCGM when its bindings import and a host engine answers, NVML otherwise;
    it fails only when neither works, naming both reasons.
    """
    if kind == "none":
        return None
    if kind == "nvml":
        from .nvml import NvmlBackend
        return NvmlBackend(gpus=gpus, interval_s=interval_s)
    if kind == "dcgm":
        from .dcgm import DcgmBackend
        return DcgmBackend(gpus=gpus, interval_s=interval_s)
    if kind == "auto":
        try:
            return open_backend("dcgm", gpus, interval_s)
        except ClockalignError as dcgm_error:
            try:
                return open_backend("nvml", gpus, interval_s)
            except ClockalignError as nvml_error:
                raise ClockalignError(f"no GPU counter backend is usable: "
                                      f"{_lower(dcgm_error)}; {_lower(nvml_error)}") from None
    raise ClockalignError(f"unknown counter backend {kind!r}; choose one of {', '.join(KINDS)}")


def _lower(e):
    return str(e).rstrip(".")


def available() -> dict:
    """{"nvml": (usable, reason), "dcgm": (usable, reason)} for `clockalign doctor`."""
    from .dcgm import dcgm_status
    from .nvml import nvml_status
    return {"nvml": nvml_status(), "dcgm": dcgm_status()}
