"""Record schema shared by the BPF programs, the recorder and every reader.

The BPF side emits one fixed-size C struct (bpf/clockalign.h, ``struct ca_event``) for
every kind of event; EVENT_DTYPE is its numpy twin, so a batch from the per-CPU perf
buffers (capture/transport/perfbuf.py) is decoded with one numpy view.  Kind, chunk-type and CUDA
function numbers are part of the file format: a retired number is never reused.

    ev = np.frombuffer(raw, dtype=EVENT_DTYPE)
    cuda = ev[ev["kind"] == Kind.CUDA]
"""
import enum

import numpy as np

from . import cuda_api

MAGIC = b"CLKALIGN"
FORMAT_VERSION = 2   # 1: msgpack columns, read still; 2: store/codec.py, checksummed header and chunk types


class Kind(enum.IntEnum):
    """``ca_event.kind``: what one BPF record describes (values mirror bpf/clockalign.h)."""

    CUDA = 1            # a driver call that returned: ts=entry, dur, ret=CUresult, a0..a4 args
    CUDA_UNFINISHED = 2  # a driver call still in flight when the recording stopped
    CONNECT = 3         # connect(): ts=enter, dur, ret=0 or -errno, a0=fd, a1=addrlen, data=sockaddr
    SCHED = 4           # one off-CPU interval: ts=switch-out, dur=off-CPU ns, ret=prev_state,
                        # code=1 preempted / 0 blocked, a0=wakeup-to-run ns, a1=cpu out, a2=cpu in,
                        # a3=id of the CUDA call it was switched out inside (0: none)
    XID = 5             # nvidia_dev_xid: ret=error_code, data=dev[16] + msg[40] (its first 39
                        # bytes), a0=message length, a1=XID_MSG parts sent before it
    THREAD_NEW = 6      # clone by a target: tid=child, a0=parent tid, data=comm
    THREAD_NAME = 7     # task_rename: data=new comm
    THREAD_EXIT = 8     # a target thread exited: code=group_dead
    PROC_EXIT = 9       # exit_group(): ret=exit code
    SIGNAL = 10         # a signal sent to a target: ret=signal, a0=sender tgid, code=result,
                        # data=sender comm
    TCP = 11            # a TCP reset or retransmit on a target's socket: code=TcpCode, pid=owner,
                        # tid=0 unless in the owner's context, ret=TCP state (0 for a received
                        # reset), a0=reset reason / retransmit error, data=local + remote
                        # sockaddr (28 bytes each)
    XID_MSG = 12        # one XID_PART_LEN piece of an Xid's whole message, sent before the XID
                        # (same ts, pid, tid): code=part index, ret=message length, bytes in
                        # a0..a4 + data.  Readers join them (store/event_text.XidMessages).
    CUDA_ENTRY = 13     # a driver call recorded at its entry only, its return not probed
                        # (record --cuda-returns blocking): ts=entry, dur=0, ret=0 (unknown),
                        # code and a0..a4 as CUDA


class TcpCode(enum.IntEnum):
    """``ca_event.code`` of a TCP event (bpf/clockalign.h CA_TCP_*)."""

    RESET_SENT = 1
    RESET_RECEIVED = 2
    RETRANSMIT = 3


KIND_NAMES = {k: k.name.lower() for k in Kind}

XID_PART_LEN = 96   # bpf/clockalign.h CA_XID_PART_LEN: the bytes of a record from a0 on

# ca_event, 128 bytes, little endian, no implicit padding (see bpf/clockalign.h).
EVENT_DTYPE = np.dtype([
    ("ts", "<u8"),
    ("dur", "<u8"),
    ("pid", "<u4"),
    ("tid", "<u4"),
    ("kind", "<u2"),
    ("code", "<u2"),
    ("ret", "<i4"),
    ("a0", "<u8"),
    ("a1", "<u8"),
    ("a2", "<u8"),
    ("a3", "<u8"),
    ("a4", "<u8"),
    ("data", "V56"),
])
assert EVENT_DTYPE.itemsize == 128

# CUDA driver functions traced: id -> (symbol, names of a0..a4), a view of the one table in
# store/cuda_api.py (roles, BPF reads, the generated probes).  Ids are file format.
CUDA_FUNCTIONS = {fid: (f.symbol, f.arg_names) for fid, f in cuda_api.FUNCTIONS.items()}
CUDA_FN_BY_NAME = {name: fid for fid, (name, _) in CUDA_FUNCTIONS.items()}

# Launch dims are packed into one u64 as x | y << 32 | z << 48 (CUDA limits: x < 2^31,
# y and z < 2^16), the same packing bpf/clockalign.h uses.
def unpack_dims(packed):
    """Split packed grid/block dims into (x, y, z) uint64 arrays."""
    packed = np.asarray(packed, dtype=np.uint64)
    return (packed & np.uint64(0xFFFFFFFF), (packed >> np.uint64(32)) & np.uint64(0xFFFF),
            packed >> np.uint64(48))


class Chunk(enum.IntEnum):
    """Chunk record types in a run file; never reuse a number."""

    EVENTS = 1        # columns of EVENT_DTYPE
    CPU_CLOCK = 2     # columns: domain(u1: ClockDomain), t0, remote, t1 (int64 ns)
    GPU_CLOCK = 3     # columns: gpu(u1), method(u1: 1 ping-pong, 2 launch+sync), t0, remote, t1
    COUNTERS = 4      # columns: see capture/gpu/counters (REALTIME-stamped GPU samples)
    NOTICES = 5       # rows: {"t_ns", "level", "text"}
    THREADS = 6       # rows: {"pid", "tid", "comm", "t_ns"} read from /proc
    STATUS = 7        # rows: periodic {"t_ns", "events", "drops": {kind: n}}
    GPU_EVENTS = 8    # rows: NVML/DCGM Xid and other events stamped on receipt
    CLOCK_INFO = 9    # rows: {"domain": "GPU0", "tick_ns": 32, "method": ..., ...} per clock domain
    GPU_ACTIVITY = 10  # columns of GPU_REC_DTYPE: CUPTI activity and launch records (--gpu-activity)
    GPU_NAMES = 11    # rows: {"pid", "space": 1 kernel / 2 driver function, "id", "name"}
    TRAILER = 100     # rows: one {"t_ns", "counts", "drops", "chunks", "reason"}


class GpuKind(enum.IntEnum):
    """``GPU_REC_DTYPE.kind`` (values mirror native/ca_gpu_wire.h CA_GK_*)."""

    KERNEL = 1     # start/end on the GPU's clock (flags RAW) or CUPTI's (CONVERTED)
    MEMCPY = 2     # value=bytes, aux=copyKind | srcKind << 8 | dstKind << 16
    MEMSET = 3     # value=bytes, aux=byte value
    API = 4        # a driver call that starts GPU work: start/end MONOTONIC at CUPTI's
                   # entry/exit callbacks, tid, corr, value=CUresult, name=aux=cbid
    DEVICE = 5     # device=CUDA ordinal in the target, grid/block=its UUID bytes (aux=1)
    CLOCK = 6      # CUPTI clock sandwich: start MONOTONIC <= value (CUPTI time) <= end
    DROPPED = 7    # value=records CUPTI dropped
    INFO = 8       # value=CUPTI version, aux=GPU_RAW_* (raw timestamps on or why not)
    MODE = 9       # collection switched at start (MONOTONIC): value=GPU_MODE_* bits now on,
                   # aux=the bits asked for (CLOCKALIGN_CUPTI_MODE / the control file)
    GRAPH = 10     # one CUDA graph's execution (GPU time), corr=its cuGraphLaunch, aux=graph id


GPU_FLAG_RAW, GPU_FLAG_CONVERTED = 1, 2
# GpuKind.MODE value bits (native/ca_gpu_wire.h CA_MODE_*)
GPU_MODE_KERNEL, GPU_MODE_MEMCPY, GPU_MODE_MEMSET, GPU_MODE_API, GPU_MODE_GRAPH = 1, 2, 4, 8, 16
GPU_MODE_DEFAULT = GPU_MODE_KERNEL | GPU_MODE_MEMCPY | GPU_MODE_MEMSET | GPU_MODE_API
GPU_RAW_STATES = {0: "raw GPU timestamps", 1: "libcupti does not export "
                  "cuptiActivityEnableRawTimestamps", 2: "cuptiActivityEnableRawTimestamps failed",
                  3: "converted timestamps asked for"}
GPU_NAME_KERNEL, GPU_NAME_API = 1, 2

# ca_gpu_rec, 80 bytes (native/ca_gpu_wire.h); the GPU_ACTIVITY chunk's columns.
GPU_REC_DTYPE = np.dtype([
    ("kind", "<u2"), ("flags", "<u2"), ("pid", "<u4"),
    ("start", "<u8"), ("end", "<u8"), ("value", "<u8"), ("grid", "<u8"), ("block", "<u8"),
    ("corr", "<u4"), ("device", "<u4"), ("stream", "<u4"), ("name", "<u4"),
    ("tid", "<u4"), ("aux", "<u4"), ("context", "<u4"), ("shmem", "<u4"),
])
assert GPU_REC_DTYPE.itemsize == 80


class ClockDomain(enum.IntEnum):
    """CPU clocks sampled against MONOTONIC (CPU_CLOCK chunks)."""

    REALTIME = 1
    BOOTTIME = 2
    MONOTONIC_RAW = 3


# Linux TASK_* bits of sched_switch prev_state, for readable output.
TASK_STATES = {0: "R", 1: "S", 2: "D", 4: "T", 8: "t", 16: "X", 32: "Z", 64: "P", 128: "I"}


def task_state_name(prev_state: int) -> str:
    """sched_switch prev_state as ps letters; "R+" is a preemption (TASK_REPORT_MAX)."""
    if prev_state == 0:
        return "R"
    if prev_state >= 0x100:
        return "R+"
    letters = "".join(v for bit, v in TASK_STATES.items() if bit and prev_state & bit)
    return letters or str(prev_state)
