"""The run file's header: what a recording says about the host, its targets and its
probes, once, before the first event.

    writer = open_writer(path, run_meta(recorder, tgids, cuda_lib, probes), sinks)
"""
import os
import socket
import sys
import time

from .. import __version__
from ..store.schema import CUDA_FUNCTIONS, EVENT_DTYPE, KIND_NAMES
from .targets import process as targets
from .targets.container import describe as describe_container


def read_clocks() -> dict:
    """Every clock the alignment names, read once (the run file's start and end stamps)."""
    return {name: time.clock_gettime_ns(getattr(time, f"CLOCK_{name}"))
            for name in ("MONOTONIC", "REALTIME", "BOOTTIME", "MONOTONIC_RAW")}


def nvidia_driver_version():
    try:
        with open("/proc/driver/nvidia/version") as f:
            return f.readline().strip()
    except OSError:
        return None


def gpu_inventory():
    """(GPUs as NVML sees them, why none) — [] where there is no NVML."""
    try:
        from .gpu.counters import gpu_inventory as nvml_inventory
    except ImportError as e:
        return [], f"counter backends not importable ({e})"
    return nvml_inventory()


def device_table(gpus, use_cuda):
    """The header's devices (NVML index -> bus id -> CUDA ordinal) and notes on gaps."""
    from .clocks.devices import device_table as table
    return table(gpus, use_cuda=use_cuda)


def run_meta(rec, tgids, cuda_lib, probes) -> dict:
    """The run file's header: host, kernel, driver, GPUs and devices, clocks, targets
    (with the libcuda each is probed on and its container), the CUDA table and what was
    attached, kinds, event layout, cflags, GPU activity and duty settings."""
    def lib_of(p):
        if isinstance(cuda_lib, dict):
            return next((path for path, ps in cuda_lib.items() if p in ps), None)
        return cuda_lib

    def target(p):
        t = {"pid": p, "cmdline": rec.opts.command if rec.child else targets.cmdline(p),
             "libcuda": lib_of(p)}
        loc = rec.libs.found.get(p)
        if loc:
            t.update(libcuda_in_target=loc["in_target"], libcuda_how=loc["how"],
                     libcuda_dev=loc.get("dev"), libcuda_ino=loc.get("ino"))
        t.update(describe_container(p))
        return t
    return {
        "tool": "clockalign", "version": __version__, "host": socket.gethostname(),
        "kernel": os.uname().release, "argv": sys.argv,
        "driver": nvidia_driver_version(), "gpus": rec.gpus,
        "devices": [d.row() for d in rec.devices],
        "clocks": read_clocks(),
        "mode": "spawn" if rec.child else "pid",
        **({"follow": list(rec.opts.follow)} if rec.opts.follow else {}),
        "targets": [target(p) for p in tgids],
        "cuda_functions": {str(k): v[0] for k, v in CUDA_FUNCTIONS.items()},
        "cuda_attached": probes.attached_cuda, "cuda_missing": probes.missing_cuda,
        "cuda_entry_only": sorted(CUDA_FUNCTIONS[i][0] for i in probes.entry_only),
        "cuda_libraries": getattr(probes, "cuda_libraries", {}),
        "cuda_prologues": getattr(probes, "prologues", {}),
        "kinds": {str(int(k)): v for k, v in KIND_NAMES.items()},
        "event_dtype": str(EVENT_DTYPE.descr), "cflags": probes.cflags,
        **({"gpu_activity": rec.activity.meta()} if rec.activity else {}),
        **({"cuda_duty": rec.duty.meta()} if rec.duty.active else {}),
    }
