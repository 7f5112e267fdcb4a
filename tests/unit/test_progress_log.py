"""workloads/progress_log: the load loops' "MONOTONIC_ns done" log and the rate over a window."""
from clockalign.workloads import progress_log


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
