"""A two-GPU (or N-GPU) NCCL all-reduce loop, one process per GPU, each all-reduce bracketed
on its GPU by %globaltimer stamps, so a recording can place it on both GPUs' clocks.

Each rank runs on its own GPU (torch.distributed, NCCL, rank r on CUDA device r of its
process), all-reduces a buffer in a loop for ``--seconds``, and before and after every
all-reduce enqueues a one-thread kernel on the same stream that stores %globaltimer into
a device array: the two stamps bracket that rank's NCCL kernel on its GPU, in that GPU's
own clock (the domain clockalign aligns).  Each rank writes DIR/rank<r>.json: its pid,
device (PCI bus id, uuid), the host MONOTONIC marks of each iteration and the raw stamps.
The stamp kernel needs cupy (NVRTC); without it the ranks still run and say so.

NVLink SHARP / multicast stay off (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1,
NVSHMEM_DISABLE_NVLS=1 are set here unless the caller set them): the lent machines ask it.

    python3 scripts/workloads/allreduce_gpu.py --gpus 2 --seconds 310 --interval 0.01 --out DIR
"""
import argparse
import json
import os
import time

MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                 "NVSHMEM_DISABLE_NVLS": "1"}

STAMP_SRC = r"""
extern "C" __global__ void ca_globaltimer_at(unsigned long long *out, int i) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    out[i] = t;
}
"""


def mono():
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def _device_identity(torch, dev) -> dict:
    p = torch.cuda.get_device_properties(dev)
    out = {"cuda_device": dev, "name": p.name, "uuid": str(getattr(p, "uuid", "")) or None}
    if hasattr(p, "pci_bus_id"):
        out["bus_id"] = "%08X:%02X:%02X.0" % (getattr(p, "pci_domain_id", 0), p.pci_bus_id,
                                              getattr(p, "pci_device_id", 0))
    return out


class Stamps:
    """%globaltimer stamps enqueued on torch's current stream into one device array."""

    def __init__(self, torch, n: int):
        import cupy
        self.kernel = cupy.RawKernel(STAMP_SRC, "ca_globaltimer_at")
        self.buf = torch.zeros(n, dtype=torch.int64, device="cuda")
        self.view = cupy.asarray(self.buf)          # the same memory, by __cuda_array_interface__
        self.torch, self.cupy, self.n = torch, cupy, n

    def stamp(self, i: int):
        stream = self.cupy.cuda.ExternalStream(self.torch.cuda.current_stream().cuda_stream)
        with stream:
            self.kernel((1,), (1,), (self.view, self.cupy.int32(i)))

    def values(self, k: int) -> list:
        return self.buf[:k].cpu().tolist()


def rank_main(rank: int, world: int, seconds: float, mib: float, out: str, port: int,
              interval_s: float):
    import torch
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    x = torch.ones(int(mib * (1 << 20)) // 4, dtype=torch.float32, device="cuda")
    max_iter = 1 << 20
    why = None
    try:
        stamps = Stamps(torch, 2 * (int(seconds / max(interval_s, 1e-4)) + 1024))
    except Exception as e:      # no cupy / NVRTC: the loop still runs, without GPU stamps
        stamps, why = None, f"no %globaltimer stamps ({type(e).__name__}: {e})"
    dist.barrier()
    torch.cuda.synchronize()
    marks = []
    t_end = mono() + int(seconds * 1e9)
    i = 0
    while i < max_iter:
        # every rank runs the same number of all-reduces: rank 0 decides when to stop
        go = torch.tensor([1 if mono() < t_end else 0], device="cuda")
        dist.broadcast(go, 0)
        if not int(go.item()):
            break
        h0 = mono()
        if stamps is not None and 2 * i + 1 < stamps.n:
            stamps.stamp(2 * i)
        dist.all_reduce(x)
        if stamps is not None and 2 * i + 1 < stamps.n:
            stamps.stamp(2 * i + 1)
        torch.cuda.synchronize()
        marks.append([h0, mono()])
        i += 1
        time.sleep(interval_s)      # a paced loop: every all-reduce stands alone on the timeline
    k = min(2 * i, stamps.n) if stamps is not None else 0
    rec = {"rank": rank, "world": world, "pid": os.getpid(), "iterations": i,
           "bytes": x.numel() * 4, "device": _device_identity(torch, rank),
           "env": {k2: os.environ.get(k2) for k2 in MULTICAST_OFF},
           "host_marks_ns": marks,
           "gpu_stamps": stamps.values(k) if stamps is not None else [],
           "stamps_note": why}
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(rec, f)
    dist.destroy_process_group()
    print(f"rank {rank} pid {os.getpid()} {rec['device'].get('bus_id')}: {i} all-reduces"
          + (f"; {why}" if why else ""), flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=310.0)
    ap.add_argument("--mib", type=float, default=64.0, help="all-reduce buffer, MiB")
    ap.add_argument("--interval", type=float, default=0.01,
                    help="seconds between all-reduces (keeps the recording small)")
    ap.add_argument("--port", type=int, default=29517)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    for k, v in MULTICAST_OFF.items():
        os.environ.setdefault(k, v)
    os.makedirs(a.out, exist_ok=True)
    import torch.multiprocessing as mp
    mp.spawn(rank_main, args=(a.gpus, a.seconds, a.mib, a.out, a.port, a.interval), nprocs=a.gpus, join=True)


if __name__ == "__main__":
    main()
