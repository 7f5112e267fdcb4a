"""ResNet-18 inference loop for the probe-cost benchmark (scripts/bench_probe_cost.py).

torchvision's resnet18 with random weights, fp16, batch 1, eager, inference_mode,
torch.cuda.synchronize() every 10 iterations; after each synchronize it logs
"MONOTONIC_ns iterations" to LOG, so the driver can cut the log into windows while it
attaches and detaches probe configurations on this one warm process.

    python3 scripts/bench/resnet_loop.py --seconds 120 --log /tmp/resnet.log
"""
import argparse
import json
import signal
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("--seconds", type=float, required=True)
ap.add_argument("--log", required=True)
a = ap.parse_args()
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))

import torch  # noqa: E402
import torchvision  # noqa: E402

model = torchvision.models.resnet18(weights=None).cuda().half().eval()
x = torch.randn(1, 3, 224, 224, device="cuda", dtype=torch.half)
with torch.inference_mode():
    for _ in range(50):
        model(x)
    torch.cuda.synchronize()
    print(json.dumps({"ready": True, "torch": torch.__version__,
                      "torchvision": torchvision.__version__,
                      "device": torch.cuda.get_device_name()}), flush=True)
    n = 0
    end = time.monotonic() + a.seconds
    with open(a.log, "w", buffering=1) as log:
        while not stop and time.monotonic() < end:
            for _ in range(10):
                model(x)
            torch.cuda.synchronize()
            n += 10
            log.write(f"{time.monotonic_ns()} {n}\n")
print(json.dumps({"iterations": n}), flush=True)
sys.exit(0)
