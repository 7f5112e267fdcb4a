#!/usr/bin/env python3
"""A CUDA workload with known faults at known times, to be recorded by clockalign.

    sudo clockalign record -o DIR/faults.ca -- \
        python scripts/workloads/known_faults.py --out DIR/faults.json
    clockalign faults DIR/faults.ca          # compare with DIR/faults.json

What it does, in order, a --gap-ms pause between steps (every time is
time.clock_gettime_ns(CLOCK_MONOTONIC), the recorder's reference clock):

1. warm-up: 23 small torch launches (x.add_(1)) and a synchronize;
2. oom: torch.empty of 10 TB -> the caching allocator's cudaMalloc -> cuMemAlloc_v2 returns
   2 (CUDA_ERROR_OUT_OF_MEMORY), once per allocator attempt (memory_stats counts them);
3. retry: torch.empty of 1 GiB after empty_cache -> cuMemAlloc_v2 returns 0 (the recovery);
4. connect: a blocking connect() to a closed 127.0.0.1 port twice (ECONNREFUSED), then
   the same port after a listener opened on it (success);
5. illegal address: a one-thread PTX kernel stores to address 0x10 (never mapped), launched
   with cuLaunchKernel through cuda-bindings on torch's primary context; cuCtxSynchronize
   returns 700 (CUDA_ERROR_ILLEGAL_ADDRESS).  This is a fault of this process's context
   only: the driver logs an Xid (31, MMU fault, often with 43) and tears down the channel;
   the GPU is not reset and other processes are not affected;
6. sticky: --sticky-calls pairs of cuCtxSynchronize and cuMemAlloc(1 MiB), each of which
   returns 700 again, then torch.cuda.synchronize() (raises);
7. the JSON goes to --out (fsync'ed), then the process leaves with os._exit(--exit-code)
   so no CUDA teardown runs in the broken context.

The allocator is forced to expandable_segments:False (set before torch is imported): with
expandable segments torch allocates through cuMemCreate/cuMemMap, which are not traced.
"""
import argparse
import ctypes
import json
import os
import socket
import sys
import threading
import time

PTX = b"""
.version 7.0
.target sm_50
.address_size 64

.visible .entry ca_bad_store(.param .u64 ca_bad_store_param_0)
{
    .reg .b32 %r<2>;
    .reg .b64 %rd<3>;
    ld.param.u64 %rd1, [ca_bad_store_param_0];
    cvta.to.global.u64 %rd2, %rd1;
    mov.u32 %r1, 1;
    st.global.u32 [%rd2], %r1;
    ret;
}
\0"""

BAD_ADDRESS = 0x10
OOM_BYTES = 10 * 10**12
RETRY_BYTES = 1 << 30


def now() -> int:
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


class Log:
    def __init__(self, gap_ms):
        self.steps = []
        self.gap_s = gap_ms / 1e3

    def step(self, name, **kw):
        rec = {"step": name, "t_start_ns": now(), "tid": threading.get_native_id()}
        rec.update(kw)
        self.steps.append(rec)
        return rec

    @staticmethod
    def done(rec, **kw):
        rec["t_end_ns"] = now()
        rec.update(kw)

    def pause(self):
        time.sleep(self.gap_s)


def driver_api():
    try:
        from cuda.bindings import driver as cu
    except ImportError:
        from cuda import cuda as cu          # cuda-python < 12.6
    return cu


def code(res) -> int:
    """cuda-bindings returns (CUresult, ...) tuples; the CUresult as an int."""
    err = res[0] if isinstance(res, tuple) else res
    return int(err)


def warmup(torch, log, dev, n):
    rec = log.step("warmup", launches=n,
                   expect=f"{n} kernel launches -> 0 (cuLaunchKernel* where the runtime "
                          "calls the exported symbol)")
    x = torch.ones(1 << 16, device=dev)
    torch.cuda.synchronize(dev)
    rec["t_launch_start_ns"] = now()
    for _ in range(n):
        x.add_(1)
    torch.cuda.synchronize(dev)
    log.done(rec, value=float(x[0].item()))
    return x


def oom(torch, log, dev):
    rec = log.step("oom", bytes=OOM_BYTES,
                   expect="cuMemAlloc_v2 -> 2 (CUDA_ERROR_OUT_OF_MEMORY), once per attempt")
    try:
        torch.empty(OOM_BYTES, dtype=torch.uint8, device=dev)
        log.done(rec, raised=None)
    except torch.cuda.OutOfMemoryError as e:
        log.done(rec, raised=type(e).__name__, message=str(e).splitlines()[0][:300])
    rec["memory_stats"] = {k: int(v) for k, v in torch.cuda.memory_stats(dev).items()
                           if k in ("num_ooms", "num_alloc_retries")}


def retry(torch, log, dev):
    torch.cuda.empty_cache()
    rec = log.step("retry", bytes=RETRY_BYTES, expect="cuMemAlloc_v2 -> 0 (recovery)")
    y = torch.empty(RETRY_BYTES, dtype=torch.uint8, device=dev)
    y[:1] = 1
    torch.cuda.synchronize(dev)
    log.done(rec, ok=True)
    return y


def connects(log, tries):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()                                  # nothing listens there now
    for i in range(tries):
        rec = log.step("connect_refused", target=f"127.0.0.1:{port}", attempt=i + 1,
                       expect="connect -> -111 (ECONNREFUSED)")
        c = socket.socket()
        try:
            c.connect(("127.0.0.1", port))
            log.done(rec, errno=0)
        except OSError as e:
            log.done(rec, errno=e.errno)
        finally:
            c.close()
        log.pause()
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", port))
    srv.listen(1)
    rec = log.step("connect_ok", target=f"127.0.0.1:{port}", expect="connect -> 0 (recovery)")
    c = socket.socket()
    try:
        c.connect(("127.0.0.1", port))
        log.done(rec, errno=0)
    except OSError as e:
        log.done(rec, errno=e.errno)
    finally:
        c.close()
        srv.close()


def illegal_address(torch, log, dev, sticky_calls):
    cu = driver_api()
    torch.cuda.synchronize(dev)
    assert code(cu.cuInit(0)) == 0
    res = cu.cuDeviceGet(dev)
    assert code(res) == 0, res
    res = cu.cuDevicePrimaryCtxRetain(res[1])     # the context torch already uses
    assert code(res) == 0, res
    ctx = res[1]
    assert code(cu.cuCtxSetCurrent(ctx)) == 0
    res = cu.cuModuleLoadData(PTX)
    assert code(res) == 0, res
    res = cu.cuModuleGetFunction(res[1], b"ca_bad_store")
    assert code(res) == 0, res
    func = res[1]
    arg = ctypes.c_uint64(BAD_ADDRESS)
    params = (ctypes.c_void_p * 1)(ctypes.addressof(arg))
    rec = log.step("illegal_address", address=hex(BAD_ADDRESS),
                   expect="cuLaunchKernel -> 0, then cuCtxSynchronize -> 700; Xid 31 (and 43)")
    launch = code(cu.cuLaunchKernel(func, 1, 1, 1, 1, 1, 1, 0, 0, ctypes.addressof(params), 0))
    rec["launch_ret"] = launch
    rec["t_sync_start_ns"] = now()
    sync = code(cu.cuCtxSynchronize())
    log.done(rec, sync_ret=sync)
    log.pause()
    rec = log.step("sticky", expect="every call -> 700 (sticky)")
    calls = []
    for _ in range(sticky_calls):
        t0 = now()
        r = code(cu.cuCtxSynchronize())
        calls.append({"fn": "cuCtxSynchronize", "ret": r, "t_start_ns": t0, "t_end_ns": now()})
        t0 = now()
        r = code(cu.cuMemAlloc(1 << 20))
        calls.append({"fn": "cuMemAlloc_v2", "ret": r, "t_start_ns": t0, "t_end_ns": now()})
    log.done(rec, calls=calls)
    rec = log.step("torch_after_fault", expect="torch.cuda.synchronize raises")
    try:
        torch.cuda.synchronize(dev)
        log.done(rec, raised=None)
    except Exception as e:     # noqa: BLE001 - what torch raises is what we report
        log.done(rec, raised=type(e).__name__, message=str(e).splitlines()[0][:300])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="where to write the JSON report")
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--warmup", type=int, default=23, help="warm-up launches (default 23)")
    ap.add_argument("--gap-ms", type=float, default=100.0, help="pause between steps")
    ap.add_argument("--connect-tries", type=int, default=2, help="refused connects before success")
    ap.add_argument("--sticky-calls", type=int, default=3,
                    help="cuCtxSynchronize + cuMemAlloc pairs after the fault")
    ap.add_argument("--no-illegal", action="store_true", help="skip the illegal address step")
    ap.add_argument("--exit-code", type=int, default=0, help="exit status at the end")
    a = ap.parse_args(argv)

    env_before = {k: os.environ.get(k) for k in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")}
    os.environ.pop("PYTORCH_ALLOC_CONF", None)
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:False"
    log = Log(a.gap_ms)
    report = {"clock": "CLOCK_MONOTONIC", "pid": os.getpid(), "tid": threading.get_native_id(),
              "python": sys.version.split()[0], "argv": sys.argv, "alloc_conf_before": env_before,
              "t_start_ns": now(), "steps": log.steps, "error": None}
    try:
        rec = log.step("init")
        import torch
        torch.cuda.init()
        dev = a.device
        torch.cuda.set_device(dev)
        log.done(rec, torch=torch.__version__, cuda=torch.version.cuda,
                 device=torch.cuda.get_device_name(dev))
        log.pause()
        x = warmup(torch, log, dev, a.warmup)
        log.pause()
        oom(torch, log, dev)
        log.pause()
        y = retry(torch, log, dev)
        log.pause()
        connects(log, a.connect_tries)
        log.pause()
        if not a.no_illegal:
            illegal_address(torch, log, dev, a.sticky_calls)
        del x, y
    except Exception as e:     # noqa: BLE001 - the report says what broke, then exit 1
        import traceback
        report["error"] = traceback.format_exc()
        a.exit_code = a.exit_code or 1
        print(f"known_faults: {type(e).__name__}: {e}", file=sys.stderr)
    report["t_end_ns"] = now()
    report["exit_code"] = a.exit_code
    with open(a.out, "w") as f:
        json.dump(report, f, indent=1)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    print(json.dumps({"out": a.out, "steps": [s["step"] for s in log.steps],
                      "error": report["error"] is not None}))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(a.exit_code)


if __name__ == "__main__":
    main()
