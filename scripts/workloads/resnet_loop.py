"""ResNet-18 inference loop, the model workload of the probe-cost benchmarks: torchvision's
resnet18 with random weights, fp16, batch 1, eager, inference_mode, 50 warm-up iterations,
torch.cuda.synchronize() every 10 iterations.

Logged (scripts/workloads/resnet_loop.py, for scripts/bench/probe_cost.py): after each
synchronize it logs "MONOTONIC_ns iterations thread_CPU_ns" to LOG (the CPU time of the
thread that makes every driver call), until --seconds or SIGTERM, so the
driver can cut the log into windows while it attaches and detaches probe configurations on
this one warm process.  Throughput (scripts/bench/gpu_activity_cost.py): iterations per
second over --seconds, optionally under torch.profiler, printed as "RESULT {json}".

    python3 scripts/workloads/resnet_loop.py --seconds 120 --log /tmp/resnet.log
    python3 scripts/workloads/resnet_loop.py --seconds 8 --throughput [--profiler]
"""
import argparse
import json
import signal
import sys
import time


def _model():
    import torch
    import torchvision
    model = torchvision.models.resnet18(weights=None).cuda().half().eval()
    x = torch.randn(1, 3, 224, 224, device="cuda", dtype=torch.half)
    return torch, torchvision, model, x


def logged(seconds: float, log_path: str, stop: list) -> int:
    """The logged loop; stop: a list that a SIGTERM handler appends to."""
    torch, torchvision, model, x = _model()
    with torch.inference_mode():
        for _ in range(50):
            model(x)
        torch.cuda.synchronize()
        print(json.dumps({"ready": True, "torch": torch.__version__,
                          "torchvision": torchvision.__version__,
                          "device": torch.cuda.get_device_name()}), flush=True)
        n = 0
        end = time.monotonic() + seconds
        with open(log_path, "w", buffering=1) as log:
            while not stop and time.monotonic() < end:
                for _ in range(10):
                    model(x)
                torch.cuda.synchronize()
                n += 10
                log.write(f"{time.monotonic_ns()} {n} {time.thread_time_ns()}\n")
    return n


def throughput(seconds: float, profiler: bool) -> float:
    """Iterations per second over ``seconds`` after the warm-up."""
    torch, _, model, x = _model()

    def run():
        n = 0
        for _ in range(50):
            model(x)
        torch.cuda.synchronize()
        t0 = time.monotonic()
        while time.monotonic() - t0 < seconds:
            for _ in range(10):
                model(x)
            torch.cuda.synchronize()
            n += 10
        return n / (time.monotonic() - t0)

    with torch.inference_mode():
        if profiler:
            from torch.profiler import ProfilerActivity, profile
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]):
                return run()
        return run()


def main(argv=None):
    ap = argparse.ArgumentParser(description="ResNet-18 fp16 inference loop (module doc)")
    ap.add_argument("--seconds", type=float, required=True)
    ap.add_argument("--log", help="log 'MONOTONIC_ns iterations' here (the logged loop)")
    ap.add_argument("--throughput", action="store_true",
                    help="print RESULT {\"it_per_s\": ...} instead of logging")
    ap.add_argument("--profiler", action="store_true", help="--throughput under torch.profiler")
    a = ap.parse_args(argv)
    if a.throughput:
        rate = throughput(a.seconds, a.profiler)
        print("RESULT " + json.dumps({"it_per_s": rate}), flush=True)
        return
    if not a.log:
        ap.error("give --log LOG, or --throughput")
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    n = logged(a.seconds, a.log, stop)
    print(json.dumps({"iterations": n}), flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
