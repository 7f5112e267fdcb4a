"""scripts/workloads/progress_log.py: the load loops' "MONOTONIC_ns done" log and the rate over
a window."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "workloads"))
import progress_log  # noqa: E402


def test_rate_over_a_window(tmp_path):
    log = tmp_path / "w.log"
    # 20 matmuls every 10 ms, then a 100 ms stall
    lines = [(1_000_000_000 + k * 10_000_000, 20 * (k + 1)) for k in range(11)]
    lines.append((lines[-1][0] + 100_000_000, lines[-1][1] + 20))
    log.write_text("".join(f"{t} {n}\n" for t, n in lines))
    samples = progress_log.read(log)
    assert samples == lines
    assert progress_log.rate(samples, 1_000_000_000, 1_100_000_000) == 2000.0
    whole = progress_log.rate(samples, 0, 2_000_000_000)
    assert abs(whole - 220 / 0.2) < 1e-9          # (240 - 20) over 200 ms
    assert progress_log.rate(samples, 1_105_000_000, 1_150_000_000) is None


def test_cpu_per_item_from_the_third_column(tmp_path):
    log = tmp_path / "r.log"
    # 10 iterations a line, 2 ms of thread CPU each iteration, then a line with 30 ms more
    lines = [(10**9 + k * 25_000_000, 10 * (k + 1), 3_000_000 + k * 20_000_000) for k in range(5)]
    lines.append((lines[-1][0] + 25_000_000, lines[-1][1] + 10, lines[-1][2] + 50_000_000))
    log.write_text("".join(f"{t} {n} {c}\n" for t, n, c in lines))
    samples = progress_log.read(log)
    assert progress_log.rate(samples, 0, lines[4][0]) == 400.0   # 40 over 100 ms
    assert progress_log.cpu_per_item(samples, 0, lines[4][0]) == 2_000_000
    assert progress_log.cpu_per_item(samples, 0, 10**10) == (80_000_000 + 50_000_000) / 50
    assert progress_log.cpu_per_item([(0, 0), (10**9, 5)], 0, 10**9) is None   # no CPU column
