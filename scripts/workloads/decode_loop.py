#!/usr/bin/env python3
"""A serving-style decode loop, the workload of scripts/bench/serving_loop.py (issue 23).

GPU (default): Hugging Face transformers GPT-2 (12 layers, random weights from GPT2Config,
fp16, batch 1), `generation_config.cache_implementation = "static"`, so generate() compiles
the decode step and replays it as a CUDA graph; 64 new tokens a request, back to back.

Host-only (--standin LIB, the development VM): the same shape of driver traffic without a
GPU: per token, the mix of driver calls the GPU loop makes (counted from a recording of it:
cuLaunchKernel, cuMemcpyDtoDAsync_v2, cuGraphLaunch, cuStreamSynchronize, cuEventRecord ...)
against the stand-in libcuda, with Python work between them.

After every request it appends "MONOTONIC_ns tokens_so_far loop_thread_CPU_ns" to --log, so
the driver can cut the log into windows while it attaches and detaches configurations on this
one warm process (scripts/workloads/progress_log.py reads it).  SIGUSR1 starts
torch.profiler (CPU + CUDA activities, what a user would pick) before the next request,
SIGUSR2 stops it (its trace is discarded); the log line after each start/stop is marked by a
4th column: 1 while the profiler runs.  Prints one JSON line {"ready": true, ...} once warm.

    python3 scripts/workloads/decode_loop.py --seconds 300 --log /tmp/decode.log
    python3 scripts/workloads/decode_loop.py --standin /tmp/fake/libcuda.so.1 --seconds 60 --log /tmp/d.log
"""
import argparse
import ctypes
import json
import signal
import sys
import time

NEW_TOKENS = 64
# per token, counted from a clockalign recording of the GPU loop on the H200
# (results/serving-loop/): the GPU loop's driver-call mix, replayed by the host-only loop
STANDIN_MIX = [("cuLaunchKernel", 52), ("cuMemcpyDtoDAsync_v2", 8), ("cuGraphLaunch", 1),
               ("cuEventRecord", 4), ("cuStreamWaitEvent", 4), ("cuMemcpyDtoHAsync_v2", 1),
               ("cuStreamSynchronize", 2)]


class Control:
    """What the signal handlers ask of the loop between two requests."""

    def __init__(self):
        self.want_profiler = False
        self.stop = False
        signal.signal(signal.SIGUSR1, lambda *_: setattr(self, "want_profiler", True))
        signal.signal(signal.SIGUSR2, lambda *_: setattr(self, "want_profiler", False))
        signal.signal(signal.SIGTERM, lambda *_: setattr(self, "stop", True))


def gpu_request_fn():
    import torch
    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=12)
    model = GPT2LMHeadModel(cfg).to("cuda", torch.float16).eval()
    model.generation_config.cache_implementation = "static"
    model.generation_config.pad_token_id = 0
    ids = torch.randint(0, cfg.vocab_size, (1, 16), device="cuda")
    attn = torch.ones_like(ids)

    def request():
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=attn, max_new_tokens=NEW_TOKENS,
                                 min_new_tokens=NEW_TOKENS, do_sample=False)
        return int(out.shape[1] - ids.shape[1])

    info = {"torch": torch.__version__, "transformers": transformers.__version__,
            "device": torch.cuda.get_device_name(), "model": "gpt2-12l-fp16-static-cache"}
    return request, info


def standin_request_fn(lib_path):
    lib = ctypes.CDLL(lib_path)
    calls = []
    for name, n in STANDIN_MIX:
        f = getattr(lib, name)
        f.restype = ctypes.c_int
        calls += [f] * n
    args = [ctypes.c_uint64(1)] * 11
    work = list(range(64))

    def token():
        for f in calls:
            f(*args)
            sum(work)           # the framework's Python work between two driver calls

    def request():
        for _ in range(NEW_TOKENS):
            token()
        return NEW_TOKENS

    return request, {"model": "standin-mix", "calls_per_token": len(calls), "lib": lib_path}


def main(argv=None):
    ap = argparse.ArgumentParser(description="serving-style decode loop (module doc)")
    ap.add_argument("--seconds", type=float, required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--standin", help="host-only: the stand-in libcuda to call")
    ap.add_argument("--warmup", type=int, default=3, help="requests before 'ready'")
    a = ap.parse_args(argv)
    ctl = Control()
    request, info = standin_request_fn(a.standin) if a.standin else gpu_request_fn()
    t0 = time.monotonic()
    for _ in range(a.warmup):
        request()
    info.update(ready=True, warmup_s=round(time.monotonic() - t0, 1))
    print(json.dumps(info), flush=True)
    prof = None
    done = 0
    end = time.monotonic() + a.seconds
    with open(a.log, "w", buffering=1) as log:
        while not ctl.stop and time.monotonic() < end:
            if ctl.want_profiler and prof is None:
                from torch.profiler import ProfilerActivity, profile
                prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
                prof.start()
            elif not ctl.want_profiler and prof is not None:
                prof.stop()
                prof = None
            done += request()
            log.write(f"{time.monotonic_ns()} {done} {time.thread_time_ns()} "
                      f"{int(prof is not None)}\n")
    if prof is not None:
        prof.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
