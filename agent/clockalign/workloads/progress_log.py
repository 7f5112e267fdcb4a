"""The progress log the load loops write (matmul_loop.py, resnet_loop.py): one line a
synchronize, "MONOTONIC_ns done_so_far", and the rate over a window of it.

    samples = read("resnet.log")                # [(t_ns, done), ...]
    rate(samples, t0_ns, t1_ns)                 # done per second inside [t0, t1], or None
"""


def read(path) -> list:
    with open(path) as f:
        return [tuple(map(int, ln.split())) for ln in f.read().splitlines()]


def rate(samples, start_ns, end_ns):
    """Work per second between the first and last log point inside [start, end] (None
    with fewer than two)."""
    inside = [(t, n) for t, n in samples if start_ns <= t <= end_ns]
    if len(inside) < 2:
        return None
    (ta, na), (tb, nb) = inside[0], inside[-1]
    return (nb - na) / ((tb - ta) / 1e9)
