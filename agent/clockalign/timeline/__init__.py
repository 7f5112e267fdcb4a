"""clockalign.timeline: every clock domain of a run on MONOTONIC; faults and their chains.

    from clockalign.timeline import Timeline
    tl = Timeline.open("run.ca")
    cuda = tl.events(kinds=["cuda"])          # TIMELINE_DTYPE, sorted by t_ns
    for f in tl.faults(): print(f.kind, f.name, f.t_ns, f.unc_ns, f.recovery_ns)

The contract is docs/timeline-api.md.
"""
from .codes import (CURESULT_NAMES, STICKY_CURESULTS, cuda_result_name, errno_name,
                    signal_name, xid_name)
from .core import COUNTER_DTYPE, Timeline
from .events import TIMELINE_DTYPE, decode_comm, decode_sockaddr, decode_xid
from .faults import KINDS as FAULT_KINDS
from .faults import Fault
from .stamps import PROBE_LATENCY_NS, STAMP_UNC_NS

__all__ = [
    "Timeline", "TIMELINE_DTYPE", "COUNTER_DTYPE", "Fault", "FAULT_KINDS",
    "CURESULT_NAMES", "STICKY_CURESULTS", "cuda_result_name", "errno_name", "signal_name",
    "xid_name", "decode_comm", "decode_sockaddr", "decode_xid", "STAMP_UNC_NS",
    "PROBE_LATENCY_NS",
]
