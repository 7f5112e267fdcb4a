"""The progress log the load loops write (matmul_loop.py, resnet_loop.py): one line a
synchronize, "MONOTONIC_ns done_so_far" (resnet_loop.py adds its loop thread's CPU ns), and
the rate over a window of it.

    samples = read("resnet.log")                # [(t_ns, done[, thread_cpu_ns]), ...]
    rate(samples, t0_ns, t1_ns)                 # done per second inside [t0, t1], or None
    cpu_per_item(samples, t0_ns, t1_ns)         # the loop thread's CPU ns per item, or None
"""


def read(path) -> list:
    with open(path) as f:
        return [tuple(map(int, ln.split())) for ln in f.read().splitlines()]


def rate(samples, start_ns, end_ns):
    """Work per second between the first and last log point inside [start, end] (None
    with fewer than two)."""
    inside = [s for s in samples if start_ns <= s[0] <= end_ns]
    if len(inside) < 2:
        return None
    (ta, na), (tb, nb) = inside[0][:2], inside[-1][:2]
    return (nb - na) / ((tb - ta) / 1e9)


def cpu_per_item(samples, start_ns, end_ns):
    """CPU ns the loop's thread used per item between the first and last log point inside
    [start, end] (None without a CPU column or with fewer than two points).  A probe's trap
    and BPF programs run in the calling thread and count there; time the host gave to other
    guests or processes does not, so this is much steadier than the rate on a shared VM."""
    inside = [s for s in samples if start_ns <= s[0] <= end_ns and len(s) > 2]
    if len(inside) < 2 or inside[-1][1] == inside[0][1]:
        return None
    return (inside[-1][2] - inside[0][2]) / (inside[-1][1] - inside[0][1])
