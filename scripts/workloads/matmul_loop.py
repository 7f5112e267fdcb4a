"""A torch bf16 matmul loop on one GPU, the load the probe-cost measurements run beside.

As its own process (scripts/bench/clock_probe_cost.py starts it by this file's path):
C = A @ B, N x N, synchronised every BATCH matmuls, each batch logged as "MONOTONIC_ns
matmuls_done" to LOG; prints "ready" once warm and a JSON summary at the end; stops on
SIGTERM or after SECONDS.

    python3 scripts/workloads/matmul_loop.py DEV SECONDS LOG N BATCH

As a thread's load (scripts/workloads/stamp_kernels.py --matmul): ``load_until(stop_event)``.
"""
import json
import signal
import sys
import time


def logged(dev: int, seconds: float, log_path: str, n: int, batch: int) -> dict:
    """The logged loop (module doc); returns its summary."""
    import torch
    stop = []
    signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
    torch.cuda.set_device(dev)
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3 * batch):
        torch.matmul(a, b, out=c)
    torch.cuda.synchronize()
    count = 0
    with open(log_path, "w") as log:
        print("ready", flush=True)
        end = time.monotonic_ns() + int(seconds * 1e9)
        while not stop:
            for _ in range(batch):
                torch.matmul(a, b, out=c)
            torch.cuda.synchronize()
            count += batch
            t = time.monotonic_ns()
            log.write(f"{t} {count}\n")
            if t > end:
                break
    return {"torch": torch.__version__, "device": torch.cuda.get_device_name(dev),
            "matmuls": count, "n": n, "dtype": "bfloat16"}


def load_until(stop, n: int = 4096, per_sync: int = 20):
    """A @ A in bf16 on the current GPU, synchronised every per_sync, until stop is set."""
    import torch
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    while not stop.is_set():
        for _ in range(per_sync):
            a @ a
        torch.cuda.synchronize()


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 5:
        sys.exit("usage: matmul_loop.py DEV SECONDS LOG N BATCH (module doc)")
    dev, seconds, log_path, n, batch = argv
    print(json.dumps(logged(int(dev), float(seconds), log_path, int(n), int(batch))), flush=True)


if __name__ == "__main__":
    main()
