"""The bundled reference CUDA workload: a launch loop, an out-of-memory attempt and its
retry, synchronizes, and two connect()s, each phase bracketed by CLOCK_MONOTONIC marks so a
recording can be checked against what the workload itself says it did.

    python3 -m clockalign.workloads.reference_gpu --launches 1000 --out workload.json
"""
import argparse
import json
import os
import socket
import time


def mono():
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def connect_pair():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    closed_port = closed.getsockname()[1]
    closed.close()
    results = {}
    for name, port in (("open", srv.getsockname()[1]), ("closed", closed_port)):
        s = socket.socket()
        try:
            s.connect(("127.0.0.1", port))
            results[name] = {"port": port, "errno": 0}
        except OSError as e:
            results[name] = {"port": port, "errno": e.errno}
        finally:
            s.close()
    srv.close()
    return results


def run(launches: int, syncs: int, device: int = 0) -> dict:
    import torch
    out = {"pid": os.getpid(), "torch": torch.__version__, "phases": {}}
    dev = torch.device("cuda", device)
    x = torch.zeros(1024, device=dev)
    torch.cuda.synchronize()
    t0 = mono()
    for _ in range(launches):
        x.add_(1.0)           # one elementwise kernel per call
    t1 = mono()
    torch.cuda.synchronize()
    out["phases"]["launch"] = [t0, t1]
    out["launches"] = launches
    out["x_check"] = float(x[0].item())

    t0 = mono()
    try:
        torch.empty(10 * (1 << 40), dtype=torch.uint8, device=dev)   # 10 TiB: must fail
        out["oom_raised"] = False
    except torch.cuda.OutOfMemoryError:
        out["oom_raised"] = True
    y = torch.empty(1 << 28, dtype=torch.uint8, device=dev)           # the retry that fits
    t1 = mono()
    out["phases"]["oom"] = [t0, t1]
    out["retry_bytes"] = int(y.numel())
    stats = torch.cuda.memory_stats(dev)
    out["torch_num_ooms"] = int(stats.get("num_ooms", -1))
    out["torch_num_alloc_retries"] = int(stats.get("num_alloc_retries", -1))

    t0 = mono()
    for _ in range(syncs):
        torch.cuda.synchronize()
    t1 = mono()
    out["phases"]["sync"] = [t0, t1]
    out["syncs"] = syncs

    t0 = mono()
    out["connect"] = connect_pair()
    out["phases"]["connect"] = [t0, mono()]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--launches", type=int, default=1000)
    ap.add_argument("--syncs", type=int, default=10)
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--out", help="write the JSON here too")
    a = ap.parse_args()
    res = run(a.launches, a.syncs, a.device)
    text = json.dumps(res)
    print(text, flush=True)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
