"""What bpf/probes.c is built with: -D cflags chosen from the options and from what this
kernel's tracefs says (field layouts change between kernels: sched_process_fork's comm
became __data_loc in 6.x), and the text BCC compiles.

    flags, notes = build_cflags(ProbeOptions(cuda_lib="/usr/lib/x86_64-linux-gnu/libcuda.so.1"))
    print(dump_bpf(opts))            # record --dump-bpf
"""
import dataclasses
import os
from importlib import resources

from ...store import cuda_api
from ...store.schema import EVENT_DTYPE
from ..transport.perfbuf import online_cpus, per_cpu_size
from ..transport.slotring import possible_cpus
from . import cuda_stubs
from .tracefs import tracepoint_exists, tracepoint_field_is_dataloc, tracepoint_fields


@dataclasses.dataclass
class ProbeOptions:
    cuda_lib: str = None          # None: no CUDA probes
    connect: bool = True
    sched: bool = True
    xid: bool = True
    tcp: bool = True              # TCP resets and retransmits of the targets' sockets
    follow_children: bool = False
    ring_mb: float = None         # event buffers, all CPUs together (None: 8 MiB a CPU)
    max_threads: int = 65536
    call_slots: int = 65536       # CUDA calls in flight: one slot per tid modulo this
    cuda_args: str = "full"       # "registers": no user-memory reads in the CUDA probes
    pid_links: bool = None        # uprobe_multi links per target process (kernel-side
                                  # filter); default: when children are not followed
    cuda_returns: str = "all"     # "blocking": calls that only enqueue work are recorded
                                  # at entry (CUDA_ENTRY), their returns not probed


def entry_only_ids(opts: ProbeOptions) -> set:
    """Ids of the table functions probed at entry only under opts (cuda_api.enqueues)."""
    if opts.cuda_returns == "all":
        return set()
    if opts.cuda_returns != "blocking":
        raise ValueError(f"cuda_returns must be 'all' or 'blocking', not {opts.cuda_returns!r}")
    return {f.id for f in cuda_api.FUNCTIONS.values() if f.enqueues}


def import_bcc():
    """The bcc module (ImportError if absent), without the SyntaxWarnings that Debian's
    bcc (0.26) raises when first compiled under Python >= 3.12."""
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)
        import bcc
    return bcc


def bpf_source_dir():
    return resources.files("clockalign") / "bpf"


# Tests and the benchmark harness only: the slot rings fail to load (as on a kernel without
# BPF compare-and-swap, before 5.12), so the automatic fall-back to perf buffers runs.
NO_SLOTS_TEST_ENV = "CLOCKALIGN_TEST_NO_SLOT_RINGS"


def buffer_cpus(kind: str) -> int:
    """CPUs that get a buffer: the online ones for perf buffers; every possible CPU id for
    the slot rings, which the BPF side indexes by CPU id."""
    return possible_cpus() if kind == "slots" else len(online_cpus())


def buffer_bytes(opts: ProbeOptions, kind: str = "slots") -> int:
    """Each CPU's event buffer (a power of two pages).  Default: 8 MiB a CPU (65 536
    records: 55 ms of 1.2M events/s on that one CPU), at most 512 MiB in all; --ring-mb
    gives the total instead, spread over the CPUs."""
    ncpu = buffer_cpus(kind)
    if opts.ring_mb is None:
        return per_cpu_size(min(8 << 20, (512 << 20) // ncpu) * ncpu, ncpu)
    return per_cpu_size(int(opts.ring_mb * (1 << 20)), ncpu)


# Tests only: with no NVIDIA driver, kernel log lines a target writes (printk:console, a real
# __data_loc string) go through the Xid probe's code as this Xid.
XID_PRINTK_ENV = "CLOCKALIGN_TEST_XID_PRINTK"
XID_PRINTK_CODE = 31


def use_pid_links(opts: ProbeOptions) -> bool:
    """Per-process links let the kernel skip other processes before any program runs (no
    target lookup per call); followed children appear later, so they need the map."""
    return not opts.follow_children if opts.pid_links is None else opts.pid_links


def build_cflags(opts: ProbeOptions, buffers: str = "slots"):
    """The -D flags for bpf/probes.c, and notes on what was switched off and why; buffers:
    the event transport, "slots" (transport/slotring.py) or "perf" (transport/perfbuf.py,
    where the slot rings do not load)."""
    slots = opts.call_slots
    if slots & (slots - 1):
        raise ValueError("call_slots must be a power of two")
    flags = [f"-DCA_MAX_THREADS={opts.max_threads}", f"-DCA_CALL_SLOTS={slots}",
             f"-DCA_CPU_IDS={possible_cpus()}"]
    if buffers == "perf":
        flags.append("-DCA_PERF_BUFFERS")
    else:
        flags += [f"-DCA_RING_SLOTS={buffer_bytes(opts, buffers) // EVENT_DTYPE.itemsize}"]
        if os.environ.get(NO_SLOTS_TEST_ENV):
            flags.append("-DCA_TEST_NO_SLOT_RINGS")
    notes = []
    if opts.cuda_lib is not None:     # {}: targets found later bring their libcuda
        flags.append("-DCA_CUDA")
        if opts.cuda_args == "registers":
            flags.append("-DCA_REGS_ONLY")
        elif opts.cuda_args != "full":
            raise ValueError(f"cuda_args must be 'full' or 'registers', not {opts.cuda_args!r}")
        if use_pid_links(opts):
            flags.append("-DCA_PID_LINKS")
        ids = entry_only_ids(opts)
        if ids and buffers == "perf":
            notes.append("--cuda-returns blocking needs the slot rings: every CUDA return "
                         "is probed (perf buffers)")
        elif ids:
            lo = sum(1 << i for i in ids if i < 64)
            hi = sum(1 << (i - 64) for i in ids if 64 <= i < 128)
            flags += [f"-DCA_ENTRY_ONLY_LO={lo:#x}ULL", f"-DCA_ENTRY_ONLY_HI={hi:#x}ULL"]
    if opts.connect:
        flags.append("-DCA_CONNECT")
    if opts.sched:
        flags.append("-DCA_SCHED")
    if opts.follow_children:
        flags.append("-DCA_FOLLOW_CHILDREN")
    if tracepoint_field_is_dataloc("sched", "sched_process_fork", "child_comm"):
        flags.append("-DCA_FORK_COMM_DATALOC")
    if opts.tcp:
        flags_tcp, why = tcp_cflags()
        flags.extend(flags_tcp)
        if why:
            notes.append(why)
    if opts.xid:
        if tracepoint_exists("nvidia", "nvidia_dev_xid"):
            flags.append("-DCA_XID")
            if tracepoint_field_is_dataloc("nvidia", "nvidia_dev_xid", "msg"):
                flags.append("-DCA_XID_DATALOC")
        elif os.environ.get(XID_PRINTK_ENV):
            flags.append(f"-DCA_XID_PRINTK={XID_PRINTK_CODE}")
            notes.append(f"{XID_PRINTK_ENV} set: kernel log lines the targets write stand in "
                         f"for Xid {XID_PRINTK_CODE} (tests only)")
        else:
            notes.append("tracepoint nvidia:nvidia_dev_xid not present (NVIDIA driver not "
                         "loaded?): Xids come only from NVML/DCGM, stamped on receipt")
    return flags, notes


# what bpf/probes.c's CA_TCP part reads of each tracepoint (the 6.x layouts)
TCP_FIELDS = {
    ("sock", "inet_sock_set_state"): ("skaddr", "oldstate", "newstate", "sport", "protocol"),
    ("tcp", "tcp_receive_reset"): ("skaddr", "sport", "dport", "family", "saddr", "daddr",
                                   "saddr_v6", "daddr_v6"),
    ("tcp", "tcp_retransmit_skb"): ("skaddr", "state", "sport", "dport", "family", "saddr",
                                    "daddr", "saddr_v6", "daddr_v6"),
}


# bpf/probes.c struct ca_tcp_send_reset: (field, offset, size) as tracefs must show them
SEND_RESET_LAYOUT = (("skaddr", 16, 8), ("state", 24, 4), ("saddr", 32, 28), ("daddr", 60, 28))


def tcp_cflags():
    """(-D flags for the TCP probes, why they are off or None): on where every tracepoint
    has the fields read; the reset reason and retransmit error where the kernel has them."""
    for (cat, ev), need in TCP_FIELDS.items():
        have = tracepoint_fields(cat, ev)
        if not have:
            return [], f"tracepoint {cat}:{ev} not present: TCP resets/retransmits not traced"
        missing = [f for f in need if f not in have]
        if missing:
            return [], (f"tracepoint {cat}:{ev} lacks {', '.join(missing)} on this kernel: TCP "
                        "resets/retransmits not traced")
    send_reset = tracepoint_fields("tcp", "tcp_send_reset")
    if any(send_reset.get(name, ("",))[1:] != (off, size)
           for name, off, size in SEND_RESET_LAYOUT):
        return [], ("tcp:tcp_send_reset has another layout on this kernel (bpf/probes.c "
                    "struct ca_tcp_send_reset): TCP resets/retransmits not traced")
    flags = ["-DCA_TCP"]
    if "reason" in send_reset:
        flags.append("-DCA_TCP_RESET_REASON")
    if "err" in tracepoint_fields("tcp", "tcp_retransmit_skb"):
        flags.append("-DCA_TCP_RETRANSMIT_ERR")
    return flags, None


def bpf_text():
    """bpf/probes.c and, after it, the CUDA stubs generated from store/cuda_api.py."""
    return (bpf_source_dir() / "probes.c").read_text() + cuda_stubs.c_text()


def dump_bpf(opts: ProbeOptions) -> str:
    """The final C and cflags, for --dump-bpf."""
    flags, notes = build_cflags(opts)
    head = "/* cflags: " + " ".join(flags) + " */\n"
    return head + "".join(f"/* note: {n} */\n" for n in notes) + bpf_text()
