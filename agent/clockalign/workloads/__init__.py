"""Workloads clockalign runs to check itself, and their checks: the reference GPU workload
(reference_gpu.py, checked by check.py against what a recording saw) and the stand-in libcuda
with its known-count target (standin/), for tests and benchmarks with no GPU; and the loads
the measurement scripts run: a bf16 matmul loop (matmul_loop.py), a ResNet-18 inference loop
(resnet_loop.py) and a kernel that stamps its own %globaltimer (selfstamp.py).

Fault injection into inference services is clockalign.inject."""
