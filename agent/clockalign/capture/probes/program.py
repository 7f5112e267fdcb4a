"""Load bpf/probes.c with BCC and attach it: the event buffers opened, the targets map
filled, the CUDA links made (two uprobe_multi links, or per-function uprobes before Linux
6.6), added and closed as targets come and go, paused and resumed for --cuda-duty.

    opts = ProbeOptions(cuda_lib="/usr/lib/x86_64-linux-gnu/libcuda.so.1")   # cflags.py
    with Probes(opts, tgids=[1234]) as p:
        batch = p.ring.read()
"""
import ctypes
import errno
import os
import time

import numpy as np

from ...errors import ClockalignError
from ...store import cuda_api
from ...store.schema import EVENT_DTYPE
from ..transport.perfbuf import PerfBuffers
from ..transport.slotring import SlotRings
from . import cuda_stubs, prologue
from .cflags import (ProbeOptions, bpf_source_dir, bpf_text, buffer_bytes, buffer_cpus,
                     build_cflags, entry_only_ids, import_bcc)
from .maps import SLOT_DTYPE, ProbeMaps
from .uprobe_multi import BPF_TRACE_UPROBE_MULTI, link_uprobe_multi


class Probes(ProbeMaps):
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
        t = self._bpf["targets"]
        for tgid in tgids:
            t[ctypes.c_uint32(int(tgid))] = ctypes.c_uint8(1)
        if "-DCA_TCP" in self.cflags:     # listeners opened before the probes were loaded
            from ..targets.process import listening_ports
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
                    self._bpf.attach_uretprobe(name=lib, sym=sym.encode(),
                                               fn_name=f"return_{sym}")
                except Exception as e:
                    raise ClockalignError(f"could not attach the return probe of {sym} in "
                                          f"{lib} ({e})") from None
            self._bpf.attach_uprobe(name=lib, sym=sym.encode(), fn_name=f"enter_{sym}")

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
    from ..targets.process import alive
    return e.errno == errno.ESRCH and not alive(pid)
