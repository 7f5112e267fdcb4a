"""Build, load and attach the BPF program (bpf/probes.c) with BCC.

Parameters go in as -D cflags, decided from what this kernel's tracefs says (field layouts
change between kernels: sched_process_fork's comm became __data_loc in 6.x).

    opts = ProbeOptions(cuda_lib="/usr/lib/x86_64-linux-gnu/libcuda.so.1")
    with Probes(opts, tgids=[1234]) as p:
        batch = p.ring.read()
"""
import dataclasses
import errno
import os
import time
from importlib import resources

import numpy as np

from ..errors import ClockalignError
from ..store import cuda_api
from ..store.schema import EVENT_DTYPE, Kind
from . import cuda_stubs, prologue
from .perfbuf import PerfBuffers, online_cpus, per_cpu_size
from .slotring import SlotRings, possible_cpus
from .uprobe_multi import BPF_TRACE_UPROBE_MULTI, link_uprobe_multi
from .tracefs import tracepoint_exists, tracepoint_field_is_dataloc, tracepoint_fields

CA_NEST = 2       # bpf/clockalign.h: probed calls one thread can be inside at once
CA_NKINDS = 32    # bpf/clockalign.h: drop counters a CPU (indexed by kind, CA_DROP_*)


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

# struct ca_call / ca_slot (bpf/clockalign.h): the calls in flight of one thread, mapped at stop
CALL_DTYPE = np.dtype([("ts", "<u8"), ("fn", "<u4"), ("pad", "<u4"), ("a", "<u8", 5)])
SLOT_DTYPE = np.dtype([("tid", "<u4"), ("depth", "<u4"), ("c", CALL_DTYPE, CA_NEST)])

# drops[] indices that are not record kinds (bpf/clockalign.h CA_DROP_*)
DROP_NAMES = {0: "state_map_full", 29: "cuda_unpaired", 30: "cuda_nested",
              31: "cuda_slot_busy"}


def use_pid_links(opts: ProbeOptions) -> bool:
    """Per-process links let the kernel skip other processes before any program runs (no
    target lookup per call); followed children appear later, so they need the map."""
    return not opts.follow_children if opts.pid_links is None else opts.pid_links


def build_cflags(opts: ProbeOptions, buffers: str = "slots"):
    """The -D flags for bpf/probes.c, and notes on what was switched off and why; buffers:
    the event transport, "slots" (slotring.py) or "perf" (perfbuf.py, where the slot rings
    do not load)."""
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


class Probes:
    """Loaded and attached probes; a with-block detaches everything on exit."""

    def __init__(self, opts: ProbeOptions, tgids):
        self.opts = opts
        self.notes = []
        self.attached_cuda = []
        self.missing_cuda = []
        self.cuda_attach_s = 0.0
        self.timings = {}             # seconds each arming step took (recorder's "armed in")
        self.gone = set()             # targets that exited before their CUDA links were made
        self.aliases = {}
        self.attach_mode = None
        self._links = []
        self._pid_links = {}      # tgid -> its own link fds (per-process links)
        self._link_specs = []     # how each uprobe_multi link was made, to make it again
        self.cuda_paused = False
        self._lib_offsets = {}
        self.prologues = {}           # symbol: its first instruction and where it is probed
        self._lib_linked = set()  # files with one link for every process
        self.cuda_libraries = {}
        self._bpf = None
        self.ring = None
        self.buffers = None           # the event transport: "slots" or "perf"
        self._drops_mm = None         # the drops array, mapped
        flags, notes = build_cflags(opts)
        self.notes.extend(notes)
        self.cflags = flags
        try:
            BPF = import_bcc().BPF
        except ImportError:
            raise ClockalignError("BCC is not importable: install the OS package python3-bpfcc "
                                  "(scripts/setup.sh does); the PyPI package 'bcc' is unrelated")
        t0 = time.monotonic()
        self._compile_or_fall_back(BPF, opts, flags)
        t1 = time.monotonic()
        self.set_targets(tgids)
        self.tgids = list(tgids)
        t2 = time.monotonic()
        if opts.cuda_lib:                 # {} (follow, no target yet): add_targets links
            self._attach_cuda(opts.cuda_lib)
        t3 = time.monotonic()
        self.timings = {"bpf_compile_load_s": t1 - t0, "targets_s": t2 - t1,
                        "cuda_links_s": t3 - t2}
        flags = self.cflags
        try:
            self.buffers = "perf" if "-DCA_PERF_BUFFERS" in flags else "slots"
            if self.buffers == "perf":
                self.ring = PerfBuffers(self._bpf["events"], buffer_bytes(opts, "perf"),
                                        EVENT_DTYPE)
                import ctypes
                self._bpf["armed"][ctypes.c_int(0)] = ctypes.c_uint32(1)  # failures count now
            else:
                self.ring = SlotRings(self._bpf["ring_ctl"], self._bpf["ring"],
                                      buffer_cpus("slots"),
                                      buffer_bytes(opts) // EVENT_DTYPE.itemsize, EVENT_DTYPE)
        except OSError as e:
            self.close()
            raise ClockalignError(f"could not open the per-CPU event buffers ({e}); "
                                  "lower --ring-mb") from None
        self.timings["event_buffers_s"] = time.monotonic() - t3

    def _compile_or_fall_back(self, BPF, opts, flags):
        """Load with the slot rings; where they do not load (they need BPF compare-and-swap
        and mmapable arrays, Linux 5.12), with the perf buffers, which are older and cost
        70-210 ns a call more.  The first try's compiler and verifier output (BCC writes it
        to fd 2) is kept back, and its first error line goes into the note."""
        import tempfile
        with tempfile.TemporaryFile(mode="w+") as log:
            saved = os.dup(2)
            try:
                os.dup2(log.fileno(), 2)
                self._compile(BPF, flags)
                return
            except ClockalignError:
                pass
            finally:
                os.dup2(saved, 2)
                os.close(saved)
            log.seek(0)
            lines = [ln.strip() for ln in log if ln.strip()]
        first = next((ln for ln in lines if "error" in ln.lower()), lines[0] if lines else "")
        self.cflags, more = build_cflags(opts, "perf")
        self.notes.extend(n for n in more if n not in self.notes)
        self._compile(BPF, self.cflags)
        self.notes.append("the slot rings did not load on this kernel (they need BPF "
                          "compare-and-swap and mmapable arrays, Linux 5.12): records go "
                          "through per-CPU perf buffers instead, at 70-210 ns a call more"
                          + (f" ({first[:160]})" if first else ""))

    def _compile(self, BPF, flags):
        try:
            self._bpf = BPF(text=bpf_text(), cflags=flags + [f"-I{bpf_source_dir()}"])
        except Exception as e:
            raise ClockalignError(f"the BPF program failed to compile or load ({e}); run "
                                  "'clockalign doctor' to check kernel headers") from None

    def set_targets(self, tgids):
        import ctypes
        t = self._bpf["targets"]
        for tgid in tgids:
            t[ctypes.c_uint32(int(tgid))] = ctypes.c_uint8(1)
        if "-DCA_TCP" in self.cflags:     # listeners opened before the probes were loaded
            from .targets import listening_ports
            ports = self._bpf["tcp_ports"]
            for tgid in tgids:
                for port in listening_ports(int(tgid)):
                    ports[ctypes.c_uint16(port)] = ctypes.c_uint32(int(tgid))

    def targets(self):
        return sorted(int(k.value) for k in self._bpf["targets"].keys())

    def _attach_cuda(self, lib):
        """Entry and return probes on every table function lib exports; the rest are
        listed in missing_cuda (a libcuda of another version lacks some), never an error.
        lib is a path, or {path: [tgids]} where targets (in containers) map different
        library files: each file gets its own offsets and links, for its own processes.
        Two uprobe_multi links where the kernel has them (fast to attach and to detach),
        else two perf-event uprobes per function.  A symbol at the same address as one
        already probed (an alias) is probed once, under the first table id."""
        t0 = time.monotonic()
        libs = lib if isinstance(lib, dict) else {lib: list(self.tgids)}
        per_lib = {}
        for one, pids in libs.items():
            path, at = self._offsets(one)
            per_lib[one] = (path, at, list(pids))
            self.cuda_libraries[one]["pids"] = list(pids)
        try:
            for path, at, pids in per_lib.values():
                self._attach_multi(path, at, pids)
            self.attach_mode = "uprobe_multi"
        except OSError as e:
            for fd in self._links:
                os.close(fd)
            self._links = []
            self._pid_links = {}
            self._link_specs = []
            self.notes.append(f"uprobe_multi links unavailable ({e.strerror}): one perf-event "
                              "uprobe per CUDA function (slower to attach and to detach)")
            if "-DCA_PID_LINKS" in self.cflags:   # the per-function programs must filter
                self._bpf.cleanup()
                self.cflags = [f for f in self.cflags if f != "-DCA_PID_LINKS"]
                self._compile(type(self._bpf), self.cflags)
                self.set_targets(self.tgids)
            for one, (path, at, pids) in per_lib.items():
                self._attach_each(one, at)
            self.attach_mode = "perf_event"
        attached = {f.symbol for _, at, _ in per_lib.values() for f in at.values()}
        self.attached_cuda = [f.symbol for f in cuda_api.FUNCTIONS.values()
                              if f.symbol in attached]
        self.missing_cuda = [f.symbol for f in cuda_api.FUNCTIONS.values()
                             if f.symbol not in attached and f.symbol not in self.aliases]
        self.cuda_attach_s = time.monotonic() - t0

    def _offsets(self, one):
        """(path to give the kernel, {file offset: table function}) of a libcuda file, its
        symbols looked up once; a file that exports none of them is refused."""
        if one in self._lib_offsets:
            return self._lib_offsets[one]
        BPF = type(self._bpf)
        at, missing, path = {}, [], one
        for f in cuda_api.FUNCTIONS.values():
            try:
                path, off = BPF._check_path_symbol(one, f.symbol, 0, -1)
            except Exception:
                missing.append(f.symbol)
                continue
            if off in at:
                self.aliases.setdefault(f.symbol, at[off].symbol)
                continue
            at[off] = f
        if not at:
            raise ClockalignError(f"{one} exports none of the CUDA driver functions "
                                  "clockalign traces; is it really libcuda?")
        path = path.decode() if isinstance(path, bytes) else path
        if one.startswith("/"):      # /proc/PID/root/...: the kernel must walk it, not us
            path = one
        at = self._probe_points(path, at)
        self._lib_offsets[one] = (path, at)
        self.cuda_libraries[one] = {"pids": [], "attached": len(at), "missing": missing}
        return path, at

    def _probe_points(self, path, at):
        """{offset to probe: function}: each function's own offset, or past a leading
        endbr64 where the next instruction is one the kernel emulates (prologue.py: one
        trap per call instead of two).  What each starts with is kept in prologues."""
        out = {}
        for off, f in at.items():
            try:
                code = prologue.read_code(path, off)
            except OSError:
                code = b""
            skip = prologue.entry_skip(code)
            desc, emulated = prologue.first_instruction(code[skip:])
            self.prologues[f.symbol] = {"first": prologue.first_instruction(code)[0],
                                        "probed": desc, "skip": skip, "emulated": emulated}
            out[off + skip] = f
        return out

    def add_targets(self, tgids, lib=None):
        """Processes that appeared after the probes were armed (watch --follow): into the
        targets map, and where CUDA is probed, links on lib (a libcuda path) for them.  The
        loaded programs stay; only links are added: one per process where the program is
        built for per-process links, else one for every process on a file not yet probed
        (the map filters).  Returns why their CUDA calls are not traced, or None."""
        tgids = [int(t) for t in tgids]
        self.set_targets(tgids)
        self.tgids.extend(t for t in tgids if t not in self.tgids)
        if not (lib and self.opts.cuda_lib is not None):
            return None if lib or self.opts.cuda_lib is None else "no libcuda found for it"
        try:
            path, at = self._offsets(lib)
        except ClockalignError as e:
            return str(e)
        self.cuda_libraries[lib]["pids"].extend(tgids)
        per_pid = "-DCA_PID_LINKS" in self.cflags
        if not per_pid and lib in self._lib_linked:
            return None
        try:
            if self.attach_mode == "perf_event":
                self._attach_each(lib, at)
            else:
                self._attach_multi(path, at, tgids)
                self.attach_mode = "uprobe_multi"
        except (OSError, ClockalignError) as e:
            return f"CUDA probes could not be attached ({getattr(e, 'strerror', None) or e})"
        if self.gone.intersection(tgids):
            return "it exited before its CUDA probes were attached"
        if not per_pid:
            self._lib_linked.add(lib)
        self.attached_cuda = sorted(set(self.attached_cuda) | {f.symbol for f in at.values()},
                                    key=lambda s: cuda_api.BY_SYMBOL[s].id)
        return None

    def remove_targets(self, tgids):
        """Processes that exited: out of the targets map (a reused pid is no target) and
        their per-process CUDA links closed."""
        import ctypes
        t = self._bpf["targets"]
        for tgid in tgids:
            try:
                del t[ctypes.c_uint32(int(tgid))]
            except KeyError:
                pass
            for fd in reversed(self._pid_links.pop(int(tgid), [])):   # entry link first
                self._links.remove(fd)
                os.close(fd)
            self._link_specs = [sp for sp in self._link_specs if sp[5] != int(tgid)]
            if int(tgid) in self.tgids:
                self.tgids.remove(int(tgid))

    @property
    def entry_only(self) -> set:
        """Ids of the functions whose returns are not probed in the program as built."""
        if not any(f.startswith("-DCA_ENTRY_ONLY_") for f in self.cflags):
            return set()
        return entry_only_ids(self.opts)

    def _attach_multi(self, path, at, pids=None):
        """One return and one entry link on path; per target process (pids, default all
        targets) where the program is built for per-process links, else one for all.  The
        return link is armed first and closed last: a call that enters between the two
        then has its return probed too, so no entry is left without its return (a busy
        process attached entry-first left some, counted as cuda_nested drops).  A target
        that exited meanwhile (its link refused with ESRCH) goes into gone and out of the
        targets: the kernel has the links, so no fallback."""
        BPF = type(self._bpf)
        skip = self.entry_only
        entries = sorted(at)
        returns = [o for o in entries if at[o].id not in skip]
        pids = list(self.tgids if pids is None else pids) if "-DCA_PID_LINKS" in self.cflags \
            else [0]
        for prog, ret, offsets in (("return_any", True, returns),
                                   ("enter_any", False, entries)):
            if not offsets:
                continue
            cookies = [cuda_stubs.cookie(at[o]) for o in offsets]
            fn = self._bpf.load_func(prog, BPF.KPROBE, attach_type=BPF_TRACE_UPROBE_MULTI)
            for pid in pids:
                if pid in self.gone:
                    continue
                spec = (fn.fd, path, offsets, cookies, ret, pid)
                self._link_specs.append(spec)
                if not self.cuda_paused:
                    self._link(spec)

    def _link(self, spec):
        """Make one link; a per-process one refused because that process is gone (ESRCH)
        puts it into gone and out of the targets instead: the kernel has the links, so no
        fallback."""
        try:
            fd = link_uprobe_multi(*spec[:5], pid=spec[5])
        except OSError as e:
            if not (spec[5] and exited_meanwhile(e, spec[5])):
                raise
            self.gone.add(spec[5])
            self.remove_targets([spec[5]])
            return
        self._links.append(fd)
        if spec[5]:                       # closed when that process exits (remove_targets)
            self._pid_links.setdefault(spec[5], []).append(fd)

    def pause_cuda(self):
        """Detach the CUDA probes for a while (--cuda-duty): entry links closed before their
        return links, so a call entered before the pause still pairs if it returns in
        between.  The programs and maps stay; resume_cuda() links them again."""
        if self.attach_mode != "uprobe_multi":
            raise ClockalignError("CUDA probes can be paused only on uprobe_multi links "
                                  f"(these are {self.attach_mode or 'not attached'})")
        for fd in reversed(self._links):
            os.close(fd)
        self._links, self._pid_links = [], {}
        self.cuda_paused = True

    def resume_cuda(self):
        """Link the CUDA probes again, return links first.  Entries whose returns came while
        paused are forgotten first: the per-thread call slots start empty."""
        import numpy as np
        with self._call_slots(write=True) as mm:
            arr = np.frombuffer(mm, dtype=SLOT_DTYPE, count=self.opts.call_slots)
            arr["depth"] = 0
            del arr                       # no view left, so the mapping can close
        self.cuda_paused = False
        for spec in list(self._link_specs):     # a gone process's specs leave as we go
            if spec[5] not in self.gone:
                self._link(spec)

    def _attach_each(self, lib, at):
        skip = self.entry_only
        for f in at.values():
            sym = f.symbol
            if f.id not in skip:
                try:
                    self._bpf.attach_uretprobe(name=lib, sym=sym, fn_name=f"return_{sym}")
                except Exception as e:
                    raise ClockalignError(f"could not attach the return probe of {sym} in "
                                          f"{lib} ({e})") from None
            self._bpf.attach_uprobe(name=lib, sym=sym, fn_name=f"enter_{sym}")

    def drops(self) -> dict:
        """Records that could not be sent, per kind name (summed over CPUs), plus the
        state-map and CUDA-pairing failures (DROP_NAMES), plus records the kernel itself
        reported lost from a full buffer (perf_lost: a cross-check, not added twice)."""
        out = {}
        for idx, n in enumerate(self._drop_counts()):
            if n:
                out[DROP_NAMES.get(idx) or Kind(idx).name.lower()] = int(n)
        if self.ring is not None and self.ring.malformed:
            out["malformed"] = self.ring.malformed     # sent, but not of the record's size
        return out

    def _drop_counts(self):
        """The drops array summed over CPUs, per index (bpf/clockalign.h), read through its
        mapping: no map syscall while the probes run (probes.c says why)."""
        import mmap
        if self._drops_mm is None:
            self._drop_slots = possible_cpus() * CA_NKINDS      # the CA_CPU_IDS it was built with
            size = -(-self._drop_slots * 8 // mmap.PAGESIZE) * mmap.PAGESIZE
            self._drops_mm = mmap.mmap(self._bpf["drops"].map_fd, size, mmap.MAP_SHARED,
                                       mmap.PROT_READ)
        counts = np.frombuffer(self._drops_mm, np.uint64, count=self._drop_slots)
        out = counts.reshape(-1, CA_NKINDS).sum(axis=0).tolist()
        del counts                    # no view left, so the mapping can close
        return out

    def skipped_runs(self) -> int:
        """Runs of these programs that the kernel skipped because another BPF program was
        running on that CPU (their recursion misses, bpfinfo.py).  Not drops: most runs of
        the host-wide tracepoints are other processes' (sched_switch runs for every context
        switch), so a skip may have lost a target's record or nothing; the recorder reports
        them beside the drops."""
        from .bpfinfo import prog_info
        total = 0
        for fn in (self._bpf.funcs.values() if self._bpf is not None else ()):
            info = prog_info(fn.fd)
            total += info["recursion_misses"] if info else 0
        return total

    def _call_slots(self, write=False):
        """The call-slot array (bpf/probes.c inflight, struct ca_slot in clockalign.h), mapped."""
        import mmap
        size = self.opts.call_slots * SLOT_DTYPE.itemsize
        size = -(-size // mmap.PAGESIZE) * mmap.PAGESIZE
        return mmap.mmap(self._bpf["inflight"].map_fd, size, mmap.MAP_SHARED,
                         mmap.PROT_READ | (mmap.PROT_WRITE if write else 0))

    def unfinished_cuda(self, now_ns: int):
        """CUDA calls entered but not returned (still in flight at stop), as events: the
        call-slot array, mapped and read with numpy in one go."""
        if self.opts.cuda_lib is None or self.cuda_paused:   # paused: slots are stale
            return np.empty(0, dtype=EVENT_DTYPE)
        with self._call_slots() as mm:
            arr = np.frombuffer(mm, dtype=SLOT_DTYPE, count=self.opts.call_slots).copy()
        busy = arr[arr["depth"] > 0]
        rows = [(int(s["tid"]), s["c"][i]) for s in busy for i in range(min(int(s["depth"]),
                                                                                CA_NEST))]
        out = np.zeros(len(rows), dtype=EVENT_DTYPE)
        for i, (tid, c) in enumerate(rows):
            out[i]["ts"] = c["ts"]
            out[i]["dur"] = max(0, now_ns - int(c["ts"]))
            out[i]["tid"] = tid
            out[i]["pid"] = _tgid_of(tid)
            out[i]["kind"] = Kind.CUDA_UNFINISHED
            out[i]["code"] = c["fn"]
            for j in range(5):
                out[i][f"a{j}"] = c["a"][j]
        return out

    def close(self):
        if self._drops_mm is not None:
            self._drops_mm.close()
            self._drops_mm = None
        for fd in reversed(self._links):      # entry links before their return links
            os.close(fd)
        self._links = []
        self._pid_links = {}
        if self.ring is not None:
            self.ring.close()
            self.ring = None
        if self._bpf is not None:
            self._bpf.cleanup()
            self._bpf = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def exited_meanwhile(e: OSError, pid: int) -> bool:
    """A per-process link refused because the process is gone (ESRCH, no /proc entry or
    a zombie), not because this kernel cannot make the link."""
    from .targets import alive
    return e.errno == errno.ESRCH and not alive(pid)


def _tgid_of(tid: int) -> int:
    try:
        with open(f"/proc/{tid}/status") as f:
            for line in f:
                if line.startswith("Tgid:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0
