"""GPU hardware counters during `clockalign record`: NVML by default, DCGM when present.

Each value becomes one COUNTERS row stamped on CLOCK_REALTIME with a latency (see
store/counter_fields.py for the columns and field ids); Xid events go to GPU_EVENTS.
Sampling runs in its own thread so a slow driver call never stalls the event path.

    backend = open_backend("auto", gpus=None, interval_s=0.1)
    sampler = CounterSampler(writer, backend, interval_s=0.1)
    sampler.start(); ...; sampler.stop(); backend.close()
    sampler.stats()   # {"samples", "missed_deadlines", "fields_unsupported", ...}
"""
from .backends import KINDS, available, open_backend
from .nvml import gpu_inventory
from .rows import RowBuffer
from .sampler import CounterSampler

__all__ = ["KINDS", "CounterSampler", "RowBuffer", "available", "gpu_inventory",
           "open_backend"]
