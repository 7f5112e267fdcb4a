"""How exactly each BPF event's timestamp is on MONOTONIC: the stamping uncertainty.

Every probe stamps with ``bpf_ktime_get_ns()``, which reads CLOCK_MONOTONIC itself, so the
clock read adds no error: STAMP_UNC_NS is 0 for every kind.  What a stamp does carry is
*latency*, which is not clock error and is not folded into ``unc_ns``: a uprobe fires
only after the breakpoint trap into the kernel, about 0.75 µs after the instruction on
the H200 host (about 9 µs on the nested-virtualisation development VM), and a uretprobe
stamps the return equally late; a tracepoint fires where the kernel placed it (the
nvidia_dev_xid tracepoint runs when the driver reports the Xid, after its interrupt
handling, not when the GPU faulted).  PROBE_LATENCY_NS keeps the measured figures for
readers that want to reason about it.

    unc = stamp_unc_ns(events["kind"])      # int64 array, one per event
"""
import numpy as np

from ..store.schema import Kind

# kind -> (probe type, stamping uncertainty of the clock read in ns)
STAMPS = {
    Kind.CUDA: ("uprobe", 0),             # entry uprobe; dur from the uretprobe
    Kind.CUDA_UNFINISHED: ("uprobe", 0),
    Kind.CUDA_ENTRY: ("uprobe", 0),       # entry uprobe only (--cuda-returns blocking)
    Kind.CONNECT: ("tracepoint", 0),      # syscalls:sys_enter_connect / sys_exit_connect
    Kind.SCHED: ("tracepoint", 0),        # sched:sched_switch
    Kind.XID: ("tracepoint", 0),          # nvidia:nvidia_dev_xid
    Kind.XID_MSG: ("tracepoint", 0),      # the same Xid's message, same stamp
    Kind.THREAD_NEW: ("tracepoint", 0),   # sched:sched_process_fork
    Kind.THREAD_NAME: ("tracepoint", 0),  # task:task_rename
    Kind.THREAD_EXIT: ("tracepoint", 0),  # sched:sched_process_exit
    Kind.PROC_EXIT: ("tracepoint", 0),    # syscalls:sys_enter_exit_group
    Kind.SIGNAL: ("tracepoint", 0),       # signal:signal_generate
    Kind.TCP: ("tracepoint", 0),          # tcp:tcp_send_reset / tcp_receive_reset / ...
}
STAMP_UNC_NS = {k: unc for k, (_, unc) in STAMPS.items()}

# Measured trap latency of a uprobe (time from the probed instruction to the stamp).
PROBE_LATENCY_NS = {"uprobe": {"H200 host": 750, "nested-virt dev VM": 9000}}

_TABLE = np.zeros(max(int(k) for k in Kind) + 1, dtype=np.int64)
for _k, _u in STAMP_UNC_NS.items():
    _TABLE[int(_k)] = _u


def probe_type(kind: int) -> str:
    """'uprobe' or 'tracepoint' (the source named in fault sightings)."""
    return STAMPS.get(int(kind), ("bpf", 0))[0]


def stamp_unc_ns(kinds) -> np.ndarray:
    """Stamping uncertainty (ns) of each event kind in ``kinds``; unknown kinds get 0."""
    kinds = np.asarray(kinds, dtype=np.int64)
    out = np.zeros(kinds.shape, dtype=np.int64)
    ok = (kinds >= 0) & (kinds < len(_TABLE))
    out[ok] = _TABLE[kinds[ok]]
    return out
