"""What the GPU side reports: GPU activity through CUPTI (cupti.py finds it, gpuactivity.py
injects and reads it, cupti_attach.py attaches to a running process, gpuwire.py parses its
records) and counters/ (NVML, DCGM, NVML Xid events)."""
