"""watch's fixed mmap threshold: memory a backlog took goes back to the kernel afterwards."""
import subprocess
import sys

import pytest

CHILD = r"""
import sys
import numpy as np
from clockalign.watch.session import fix_mmap_threshold

def rss_mib():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024

if sys.argv[1] == "fixed":
    assert fix_mmap_threshold()
big = np.ones(16 << 20, np.uint8)   # a large batch freed: glibc raises its mmap threshold
del big
base = rss_mib()
backlog, kept = [], []
for _ in range(200):                 # 200 MiB of 1 MiB batches, with what the aggregation
    backlog.append(np.ones(1 << 20, np.uint8))   # keeps between them
    kept.append(np.ones(4096, np.uint8))
del backlog
print(rss_mib() - base)
"""


def _kept_mib(mode):
    p = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    return float(p.stdout.strip())


def test_a_worked_off_backlog_is_given_back():
    try:
        import ctypes
        ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        pytest.skip("not glibc: no mallopt")
    default, fixed = _kept_mib("default"), _kept_mib("fixed")
    assert fixed < 20, fixed           # given back
    assert default > 100, default      # glibc's dynamic threshold keeps it (why watch fixes it)
