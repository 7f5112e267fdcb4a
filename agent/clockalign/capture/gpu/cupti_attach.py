"""``record --pid P --gpu-activity``: clockalign's CUPTI library in a process already running.

The library (native/ca_cupti.c) is dlopen'ed into the target through ptrace
(capture/targets/inject_so.py) and its ca_cupti_attach("fifo=...\\nlib=...\\nraw=1") is called on
the hijacked thread, which returns at once: the library's own thread loads libcupti,
subscribes and enables activity (that thread, not the hijacked one, makes the CUPTI calls,
so a CUDA lock the hijacked thread may hold cannot deadlock them).  The recorder follows the
exported ``struct ca_live`` (native/ca_gpu_wire.h) by reading the target's memory, with no
ptrace stop.  At the end ca_cupti_detach() is called the same way; the library's thread
turns activity and callbacks off, flushes, unsubscribes, closes the FIFO and exits, and the
recorder waits until its tid has left /proc/PID/task.  The library stays loaded, inert:
CUPTI keeps its buffer callbacks (there is no unregistering), so a dlclose would leave CUPTI
pointing into unmapped code.

What must be reachable inside the target's mount namespace is: the library, libcupti and
the FIFO.  A target with its own root (a container) gets a private directory under its
/tmp holding copies of both libraries and the FIFO.  A libcupti the target has mapped
already (PyTorch's) is the one used: two libcupti in one process would fight.

    live = LiveCupti(pid, library, libcupti, raw=True)
    live.stage()        # paths in the target; the FIFO's path as the recorder opens it
    live.attach()       # CuptiAttachError: one sentence
    ... live.detach()   # {"state": "stopped", "thread_left": False}
"""
import os
import shutil
import struct
import time

from ...errors import ClockalignError
from ..targets import container
from ..targets.inject_so import (InjectError, Tracee, find_dlopen, host_path, in_target, mapped,
                                 ptrace_refusal, read_memory, symbol_address)

LIVE = struct.Struct("<iiII240s")      # struct ca_live
STATES = {0: "idle", 1: "starting", 2: "running", 3: "stopping", 4: "stopped", 5: "failed"}
FAIL_SUBSCRIBED = 5
START_TIMEOUT_S = 60.0                 # libcupti's load and first enable, on a busy host
STOP_TIMEOUT_S = 20.0


class CuptiAttachError(ClockalignError):
    """GPU activity of a running process is off (one sentence)."""


def refusal(pid) -> str:
    """Why the library cannot be put into ``pid`` (known before any ptrace stop), or None."""
    why = ptrace_refusal(pid)
    if why:
        return why
    try:
        has_cuda = mapped(pid, lambda n: n.startswith("libcuda.so"))
    except OSError as e:
        return f"process {pid}'s memory map cannot be read ({e.strerror})"
    if not has_cuda:
        return (f"process {pid} has not loaded libcuda: CUPTI can start only in a process "
                "that uses CUDA (attach again once it does)")
    try:
        find_dlopen(pid)
    except InjectError as e:
        return str(e)
    return None


class LiveCupti:
    def __init__(self, pid, library, libcupti, raw=True):
        self.pid, self.library, self.libcupti, self.raw = pid, library, libcupti, raw
        self.lib_in_target = None
        self.cupti_in_target = None
        self.fifo_in_target = None
        self.staged = None              # the private directory made in a container's root
        self.how = []                   # sentences for the recording's notices
        self.tid = None
        self.fifo = None
        self.traps = 0            # our calls' return traps: SIGSEGVs the target never gets

    def stage(self, fifo_dir) -> str:
        """Put what the target needs where it can see it; returns the FIFO's path for the
        recorder (made here).  ``fifo_dir``: the recorder's own directory, used when the
        target shares our root."""
        own = [in_target(self.pid, p) for p in
               mapped(self.pid, lambda n: n.startswith("libcupti.so"))]
        if container.own_mount_namespace(self.pid) and not _same_root(self.pid):
            tmp = host_path(self.pid, "/tmp")
            # one fixed place: a later attach dlopens the same path, so gets the same copy
            self.staged = os.path.join(tmp, "clockalign-cupti")
            inside = "/tmp/clockalign-cupti"
            try:
                os.makedirs(self.staged, mode=0o755, exist_ok=True)
                for lib in [self.library] + ([] if own else [self.libcupti]):
                    dest = os.path.join(self.staged, os.path.basename(lib))
                    if not os.path.exists(dest) or os.path.getsize(dest) != os.path.getsize(lib):
                        shutil.copy(lib, dest + ".part")
                        os.replace(dest + ".part", dest)
            except OSError as e:
                self.staged = None
                raise CuptiAttachError(f"process {self.pid}'s root has no writable /tmp to put "
                                       f"the CUPTI library in ({e.strerror})") from None
            self.lib_in_target = f"{inside}/{os.path.basename(self.library)}"
            if not own:
                self.cupti_in_target = f"{inside}/{os.path.basename(self.libcupti)}"
            name = f"activity-{os.getpid()}-{time.monotonic_ns()}.fifo"
            fifo = os.path.join(self.staged, name)
            self.fifo_in_target = f"{inside}/{name}"
            self.how.append(f"process {self.pid} has its own root: the CUPTI library, "
                            f"{'' if own else 'libcupti, '}and the FIFO were copied to {inside} "
                            "in it")
        else:
            self.lib_in_target = os.path.realpath(self.library)
            self.cupti_in_target = os.path.realpath(self.libcupti)
            fifo = os.path.join(fifo_dir, f"activity-{self.pid}.fifo")
            self.fifo_in_target = fifo
        if own:
            self.cupti_in_target = own[0]
            self.how.append(f"process {self.pid} has libcupti loaded already ({own[0]}): "
                            "that one is used")
        self.fifo = fifo
        os.mkfifo(fifo, 0o600)
        os.chmod(fifo, 0o666)       # a target running as another user opens it for writing
        return fifo

    def settings(self) -> bytes:
        return (f"fifo={self.fifo_in_target}\nlib={self.cupti_in_target}\n"
                f"raw={1 if self.raw else 0}\npid={self.pid}\n").encode() + b"\0"

    def _live(self) -> dict:
        addr = symbol_address(self.pid, self.lib_in_target, ["ca_cupti_live"])[1]
        st, fail, tid, version, err = LIVE.unpack(read_memory(self.pid, addr, LIVE.size))
        return {"state": STATES.get(st, str(st)), "failure": fail, "tid": tid,
                "cupti_version": version, "error": err.split(b"\0", 1)[0].decode(errors="replace")}

    def attach(self):
        why = refusal(self.pid)
        if why:
            raise CuptiAttachError(why)
        t = Tracee(self.pid)
        try:
            with t:
                try:
                    t.dlopen(self.lib_in_target)
                except InjectError as e:
                    if self.staged:
                        raise CuptiAttachError(f"process {self.pid}'s root lacks what the CUPTI "
                                               f"library needs ({e})") from None
                    raise
                rc = t.call(t.symbol(self.lib_in_target, "ca_cupti_attach"), self.settings())
        except InjectError as e:
            raise CuptiAttachError(str(e)) from None
        finally:
            self.traps += t.traps
        if rc & 0xFFFFFFFF:
            raise CuptiAttachError(self._failure(self._live()))
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            live = self._live()
            if live["state"] == "running":
                self.tid = live["tid"]
                return live
            if live["state"] != "starting":
                raise CuptiAttachError(self._failure(live))
            if time.monotonic() > deadline:
                raise CuptiAttachError(f"CUPTI did not start in process {self.pid} within "
                                       f"{START_TIMEOUT_S:.0f} s")
            time.sleep(0.01)

    def _failure(self, live) -> str:
        if live["failure"] == FAIL_SUBSCRIBED:
            return (f"process {self.pid} has a CUPTI subscriber already (a profiler such as "
                    f"Kineto or Nsight Systems; CUPTI allows one): {live['error']}")
        return f"CUPTI could not start in process {self.pid}: {live['error'] or live['state']}"

    def detach(self) -> dict:
        """Activity off and the library's thread gone; what was seen."""
        out = {"state": None, "thread_left": False}
        try:
            if not os.path.exists(f"/proc/{self.pid}"):
                out["state"] = "exited"
                return out
            t = Tracee(self.pid)
            try:
                with t:
                    t.call(t.symbol(self.lib_in_target, "ca_cupti_detach"))
            finally:
                self.traps += t.traps
            deadline = time.monotonic() + STOP_TIMEOUT_S
            live = self._live()
            while live["state"] in ("starting", "running", "stopping") and \
                    time.monotonic() < deadline:
                time.sleep(0.01)
                live = self._live()
            while self.tid and os.path.exists(f"/proc/{self.pid}/task/{self.tid}") and \
                    time.monotonic() < deadline:
                time.sleep(0.005)
            out["state"] = live["state"]
            out["traps"] = self.traps
            out["thread_left"] = bool(self.tid and os.path.exists(
                f"/proc/{self.pid}/task/{self.tid}"))
        except (InjectError, OSError) as e:
            out["state"] = "exited" if not os.path.exists(f"/proc/{self.pid}") else "unknown"
            out["error"] = str(e)
        return out

    def cleanup(self):
        """The FIFO made in a container's root (the libraries stay: still mapped there)."""
        if self.staged and self.fifo:
            try:
                os.unlink(self.fifo)
            except OSError:
                pass


def _same_root(pid) -> bool:
    try:
        a, b = os.stat(f"/proc/{pid}/root/"), os.stat("/")
    except OSError:
        return True
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)
