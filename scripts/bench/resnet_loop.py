"""ResNet-18 inference loop for the probe-cost benchmark (scripts/bench_probe_cost.py): after
every 10 iterations it logs "MONOTONIC_ns iterations thread_CPU_ns" to LOG (clockalign/workloads/resnet_loop.py
says what it runs).

    python3 scripts/bench/resnet_loop.py --seconds 120 --log /tmp/resnet.log
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "agent"))
from clockalign.workloads.resnet_loop import main  # noqa: E402

if __name__ == "__main__":
    main()
