"""The one record every fault source gives (Fault), a chain entry, and the rules' constants.

    f = Fault(0, t_ns, unc_ns, "cuda_error", 2, "CUDA_ERROR_OUT_OF_MEMORY", pid=623)
    f.chain.append(entry(f, t_next, 0, "retry", name="CUDA_ERROR_OUT_OF_MEMORY"))
"""
import dataclasses
from dataclasses import dataclass, field
from typing import Optional

KINDS = ("xid", "throttle", "cuda_error", "cuda_sticky_error", "connect_error", "signal", "exit")
CHAIN_LIMIT = 200                       # chain entries kept; the rest are counted
XID_RECEIPT_TOLERANCE_NS = 2_000_000_000  # NVML/DCGM hand an Xid over up to ~2 s late
XID_LINK_NS = 10_000_000_000            # an Xid's process error must follow within 10 s
KERNEL_SOURCES = ("tracepoint",)        # sightings stamped where the event happened
SIGNAL_DELIVERED = (0, 2, 4)            # signal_generate result: delivered/pending/lose-info


@dataclass
class Fault:
    """One fault, whatever saw it.  Times are MONOTONIC ns; ``unc_ns`` is ± around t_ns."""

    id: int
    t_ns: int
    unc_ns: int
    kind: str
    code: int
    name: str
    message: str = ""
    pid: Optional[int] = None
    tid: Optional[int] = None
    gpu: Optional[int] = None
    sightings: list = field(default_factory=list)   # [{source, t_ns, unc_ns, domain}]
    chain: list = field(default_factory=list)       # [{t_ns, dt_ns, what, ...}]
    recovery_ns: Optional[int] = None
    # additions to the contract
    thread: Optional[str] = None       # thread name at t_ns
    function: Optional[str] = None     # CUDA function, or "connect"
    target: Optional[str] = None       # connect() peer
    dur_ns: int = 0                    # duration of the failing call
    parent: Optional[int] = None       # cuda_sticky_error: id of the first sticky error
    related: list = field(default_factory=list)     # ids of the same problem seen elsewhere
    recovery_unc_ns: Optional[int] = None
    healthy_ns: Optional[int] = None
    delays: list = field(default_factory=list)      # [{from, to, delay_ns, unc_ns}]

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def entry(f: Fault, t, unc, what, **kw) -> dict:
    """One chain entry of fault f: at t ± unc, what it was (retry, error, success, ...)."""
    e = {"t_ns": int(t), "unc_ns": int(unc), "dt_ns": int(t) - f.t_ns, "what": what,
         "fault": None}
    e.update(kw)
    return e
