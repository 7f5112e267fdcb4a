"""The workloads `clockalign demo` records and checks: the reference GPU workload
(reference_gpu.py, checked by check.py against what a recording saw) and, where no GPU is, the
stand-in libcuda with its known-count target (standin/, which the tests build too).

The loads the benchmarks and GPU runbooks run (matmul and ResNet-18 loops, self-stamping
kernels, an all-reduce, a decode loop, an event storm) are in scripts/workloads/, outside the
product; fault injection into inference services is clockalign.inject."""
