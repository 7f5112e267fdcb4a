"""Workloads clockalign runs to check itself, and their checks: the reference GPU workload
(reference_gpu.py, checked by check.py against what a recording saw) and the stand-in libcuda
with its known-count target (standin/), for tests and benchmarks with no GPU.

Fault injection into inference services is clockalign.inject."""
