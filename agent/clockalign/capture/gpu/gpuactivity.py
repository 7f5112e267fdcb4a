"""``record --gpu-activity``: inject CUPTI into a spawned command and stream its records.

Before the command is forked, ``GpuActivity.prepare(env)`` finds CUPTI (capture/gpu/cupti.py)
and the injection library (native/ca_cupti.c) built for it at install, makes a FIFO in a private
directory and puts CUDA_INJECTION64_PATH and the library's settings into the command's
environment.  libcuda loads the library at cuInit in every process of the command that
uses CUDA; each writes packets of fixed-size records into the FIFO (capture/gpu/gpuwire.py).
The reader thread turns each read into one GPU_ACTIVITY chunk (numpy columns) and the
names it completed into GPU_NAMES rows.

The recorder holds a write end of the FIFO itself, so a read never sees end-of-file while
targets come and go, and a target's write never fails while the recorder lives.

With --pid (``prepare_live``), the library is loaded into each running target through
ptrace once the reader runs (``attach_live``, capture/gpu/cupti_attach.py), one FIFO per target
(a container's is in its own root), and detached first thing at ``stop``.  With a duty
(--gpu-activity-duty, capture/probes/duty.py) a thread detaches and attaches again every period, so
CUPTI's cost is paid for that share of the time only; the windows go into the trailer
(``stats()["duty"]``) and every kernel recorded lies inside one.

    act = GpuActivity(raw=True); act.prepare(env)   # CuptiMissing
    act.start(writer) ... act.stop(); act.stats()
"""
import fcntl
import os
import select
import shutil
import tempfile
import threading
import time

import numpy as np

from ...errors import ClockalignError
from ...store.schema import GPU_RAW_STATES, Chunk, GpuKind
from .cupti import find_cupti, injection_library
from ..probes.duty import Duty
from .gpuwire import WireParser

F_SETPIPE_SZ = 1031
PIPE_BYTES = 1 << 20
READ_BYTES = 1 << 20
CHUNK_ROWS = 1 << 16
CHUNK_S = 0.25
COUNT_KEYS = {GpuKind.KERNEL: "gpu_kernel", GpuKind.MEMCPY: "gpu_copy",
              GpuKind.MEMSET: "gpu_memset", GpuKind.API: "gpu_launch_call"}


def cannot_record(env: dict, driver) -> str:
    """Why no process of a command started with ``env`` can load CUPTI, as far as can be
    known before it runs (driver: the NVIDIA driver's version line, None when none is
    loaded); None when it may."""
    from ..probes.libcuda import resolve_like_loader
    if driver is None:
        return ("no NVIDIA driver is loaded on this host (/proc/driver/nvidia/version is "
                "absent), so no process of the command can start CUDA")
    if resolve_like_loader(env)[0] is None:
        return ("the command's loader finds no libcuda.so.1 (LD_LIBRARY_PATH, ld.so.cache, "
                "default directories), so it cannot start CUDA")
    return None


class GpuActivity(threading.Thread):
    def __init__(self, raw: bool = True, duty=None):
        super().__init__(name="clockalign-gpuactivity", daemon=True)
        self.raw = raw
        self.duty = duty if duty is not None and duty.active else None   # --pid only
        self._duty_thread = None
        self._duty_stop = threading.Event()
        self._attached = False        # the --pid targets' CUPTI is on now
        self.writer = None
        self.cupti = None
        self.library = None
        self._dir = None
        self._fifos = []              # [read fd, write fd, WireParser] per FIFO
        self._live = []               # LiveCupti per attached --pid target
        self._parsers = []            # kept after close, for stats
        self.live_mode = False
        self._stop_ev = threading.Event()
        self._lock = threading.Lock()
        self._error = None
        self._stats = {"records": 0, "packets": 0, "chunks": 0, "names": 0,
                       "cupti_dropped": 0, "processes": set(), "raw": {}, "cupti_version": {},
                       "attached": {}, "reattach_failed": {},
                       **{v: 0 for v in COUNT_KEYS.values()}}

    # -- before the fork -------------------------------------------------------------
    def prepare(self, env: dict) -> dict:
        """Find CUPTI and its injection library, make the FIFO; adds the command's variables
        to env."""
        if env.get("CUDA_INJECTION64_PATH"):
            from .cupti import CuptiMissing
            raise CuptiMissing("the command's environment already sets CUDA_INJECTION64_PATH "
                               f"({env['CUDA_INJECTION64_PATH']}): another tool injects into "
                               "CUDA, and only one can")
        self._find(env)
        path = os.path.join(self._dir, "activity.fifo")
        os.mkfifo(path, 0o600)
        self._open_fifo(path)
        env.update({"CUDA_INJECTION64_PATH": self.library, "CLOCKALIGN_CUPTI_FIFO": path,
                    "CLOCKALIGN_CUPTI_LIB": self.cupti.lib,
                    "CLOCKALIGN_CUPTI_RAW": "1" if self.raw else "0"})
        return env

    def _find(self, env):
        self.cupti = find_cupti(env)
        self.library = injection_library(self.cupti)
        self._dir = tempfile.mkdtemp(prefix="clockalign-cupti-")

    def _open_fifo(self, path):
        rfd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        wfd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        try:
            fcntl.fcntl(rfd, F_SETPIPE_SZ, PIPE_BYTES)
        except OSError:
            pass        # the default 64 KiB pipe: the reader thread only has to keep up
        self._fifos.append([rfd, wfd, WireParser()])
        self._parsers.append(self._fifos[-1][2])

    def prepare_live(self, pids, env) -> list:
        """--pid: find CUPTI and its injection library and make each target's FIFO; returns one
        sentence per target that gets no GPU activity (the others are attached by
        ``attach_live``, once the reader runs).  CuptiMissing when none can be had."""
        from .cupti_attach import CuptiAttachError, LiveCupti, refusal
        notes = []
        self.live_mode = True
        self._find(env)
        for pid in pids:
            why = refusal(pid)
            if why:
                notes.append(f"GPU activity of process {pid} is off: {why}")
                continue
            live = LiveCupti(pid, self.library, self.cupti.lib, raw=self.raw)
            try:
                self._open_fifo(live.stage(self._dir))
            except (CuptiAttachError, OSError) as e:
                live.cleanup()
                notes.append(f"GPU activity of process {pid} is off: {e}")
                continue
            self._live.append(live)
        return notes

    @property
    def attaching(self) -> bool:
        return bool(self._live)

    def attach_live(self) -> list:
        """Load and start the library in each --pid target: (level, sentence) per target."""
        from .cupti_attach import CuptiAttachError
        out = []
        for live in list(self._live):
            t0 = time.monotonic()
            try:
                got = live.attach()
            except CuptiAttachError as e:
                self._live.remove(live)
                live.cleanup()
                out.append(("warning", f"GPU activity of process {live.pid} is off: {e}"))
                continue
            ms = (time.monotonic() - t0) * 1e3
            with self._lock:
                self._stats["attached"][str(live.pid)] = {"attach_ms": round(ms, 1)}
            out += [("info", h) for h in live.how]
            out.append(("info", f"GPU activity of process {live.pid}: CUPTI "
                        f"{got['cupti_version']} ({live.cupti_in_target}) started in the "
                        f"running process through ptrace and dlopen of {live.lib_in_target} "
                        f"in {ms:.0f} ms; {self.meta()['timestamps']} timestamps"))
        self._attached = bool(self._live)
        if self.duty is not None and self._live:
            d = self.duty
            out.append(("warning", f"GPU activity sampled (--gpu-activity-duty): CUPTI on "
                        f"{d.share * d.period_ns / 1e9:g} s of every {d.period_ns / 1e9:g} s "
                        f"({d.share:.0%}); kernels, copies and memsets are recorded only "
                        "inside those windows (listed in the run file)"))
            d.start()
            self._duty_thread = threading.Thread(target=self._duty_loop, daemon=True,
                                                 name="clockalign-gpuactivity-duty")
            self._duty_thread.start()
        return out

    def _duty_loop(self):
        while self._live and not self._duty_stop.wait(0.05):
            self.duty.step(self._pause_live, self._resume_live)

    def _pause_live(self):
        for live in self._live:
            got = live.detach()
            with self._lock:
                self._stats["attached"].setdefault(str(live.pid), {}).update(got)
        self._attached = False

    def _resume_live(self):
        """Attach each target again; one that refuses now (it exited, a profiler took
        CUPTI) is left off for the rest of the recording, said at the end."""
        from .cupti_attach import CuptiAttachError
        for live in list(self._live):
            try:
                live.attach()
            except CuptiAttachError as e:
                self._live.remove(live)
                live.cleanup()
                with self._lock:
                    self._stats["reattach_failed"][str(live.pid)] = str(e)
        self._attached = bool(self._live)

    def detach_live(self):
        if self._duty_thread is not None:
            self._duty_stop.set()
            self._duty_thread.join()
            self.duty.close()
        for live in self._live:
            got = live.detach() if self._attached else {}
            live.cleanup()
            with self._lock:
                self._stats["attached"].setdefault(str(live.pid), {}).update(got)
        self._live = []
        self._attached = False

    def meta(self) -> dict:
        return {"library": self.library, "libcupti": self.cupti.lib if self.cupti else None,
                "cupti_from": self.cupti.where if self.cupti else None,
                "timestamps": "raw" if self.raw else "converted",
                **({"duty": self.duty.meta()} if self.duty is not None else {})}

    # -- thread ----------------------------------------------------------------------
    def start_writing(self, writer):
        self.writer = writer
        self.start()

    def run(self):
        pend, rows, last = [], 0, time.monotonic()
        try:
            while True:
                stopping = self._stop_ev.is_set()
                r, _, _ = select.select([f[0] for f in self._fifos], [], [],
                                        0 if stopping else CHUNK_S)
                got = self._read_ready(r)
                if got is not None and len(got):
                    pend.append(got)
                    rows += len(got)
                now = time.monotonic()
                if pend and (rows >= CHUNK_ROWS or now - last >= CHUNK_S or
                             (stopping and got is None)):
                    self._write(np.concatenate(pend))
                    pend, rows, last = [], 0, now
                if stopping and got is None:
                    break
        except BaseException as e:      # reported by stop(); the recording goes on
            self._error = e
            self.close()    # the targets' next write fails (EPIPE) instead of blocking

    def _read_ready(self, ready):
        """Records of one read of each ready FIFO (None when all were empty)."""
        got = [r for r in (self._read(f) for f in self._fifos if f[0] in ready) if r is not None]
        return np.concatenate(got) if got else None

    def _read(self, fifo):
        """Records of one read (None when the FIFO is empty); names written as they complete."""
        try:
            data = os.read(fifo[0], READ_BYTES)
        except BlockingIOError:
            return None
        if not data:
            return None
        recs, names = fifo[2].feed(data)
        if names:
            self.writer.write_rows(Chunk.GPU_NAMES, [
                {"pid": p, "space": s, "id": i, "name": n} for p, s, i, n in names])
        with self._lock:
            st = self._stats
            st["packets"] = sum(p.packets for p in self._parsers)
            st["names"] += len(names)
            st["records"] += len(recs)
            if len(recs):
                kinds = np.bincount(recs["kind"], minlength=16)
                for k, key in COUNT_KEYS.items():
                    st[key] += int(kinds[k])
                st["processes"].update(np.unique(recs["pid"]).tolist())
                d = recs["kind"] == GpuKind.DROPPED
                st["cupti_dropped"] += int(recs["value"][d].sum())
                for rec in recs[recs["kind"] == GpuKind.INFO]:
                    st["raw"][str(int(rec["pid"]))] = GPU_RAW_STATES.get(int(rec["aux"]), "?")
                    st["cupti_version"][str(int(rec["pid"]))] = int(rec["value"])
        return recs

    def _write(self, recs):
        self.writer.write_columns(Chunk.GPU_ACTIVITY, {n: recs[n] for n in recs.dtype.names})
        with self._lock:
            self._stats["chunks"] += 1

    def stop(self, timeout: float = 10.0):
        """Detach from --pid targets, drain what the targets wrote, close and remove the
        FIFOs."""
        self.detach_live()
        self._stop_ev.set()
        if self.is_alive():
            self.join(timeout)
        self.close()
        if self._error is not None:
            err, self._error = self._error, None
            raise err

    def close(self):
        for fd in [fd for f in self._fifos for fd in f[:2]]:
            try:
                os.close(fd)
            except OSError:
                pass
        self._fifos = []
        for live in self._live:        # never attached (a failure before the reader ran)
            live.cleanup()
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def stats(self) -> dict:
        with self._lock:
            s = dict(self._stats)
        s["processes"] = sorted(s["processes"])
        parsers = self._parsers
        s["bad_bytes"] = sum(p.bad_bytes for p in parsers)
        s["incomplete_bytes"] = sum(p.leftover for p in parsers)
        s["incomplete_names"] = sum(p.pending_names for p in parsers)
        if self.duty is not None:
            s["duty"] = self.duty.trailer()
        return s

    def drops(self) -> dict:
        """What was lost, for the trailer: CUPTI's own drops and unreadable bytes."""
        s = self.stats()
        out = {"cupti_dropped": s["cupti_dropped"], "gpu_wire_bad_bytes": s["bad_bytes"],
               "gpu_wire_incomplete_bytes": s["incomplete_bytes"]}
        return {k: v for k, v in out.items() if v}

    def summary_notes(self) -> list:
        """One sentence per target process whose timestamps are not raw, and on no records."""
        s = self.stats()
        notes = [f"GPU activity of process {pid}: CUPTI's converted timestamps ({why}); "
                 "they carry no stated bound" for pid, why in s["raw"].items()
                 if why != GPU_RAW_STATES[0]]
        if self.live_mode:
            notes += [_detach_note(int(pid), a) for pid, a in s["attached"].items()
                      if "state" in a]
            notes += [f"GPU activity of process {pid} is off after its last window: it "
                      f"could not be attached again ({why})"
                      for pid, why in s["reattach_failed"].items()]
        if "duty" in s:
            d = s["duty"]
            notes.append(f"GPU activity sampled: {len(d['windows'])} windows of CUPTI on, "
                         f"{d['armed_ns'] / 1e9:.1f} s in all ({d['share']:.0%} of every "
                         f"{d['period_s']:g} s); nothing the GPU ran between them is recorded")
        elif not s["raw"]:
            notes.append("GPU activity: no process of the command loaded the CUPTI library "
                         "(it used no CUDA, or CUPTI failed to start: see its stderr)")
        return notes


def _detach_note(pid, a) -> str:
    if a["state"] == "exited":
        return f"GPU activity of process {pid}: the process exited while attached"
    if a["state"] == "stopped" and not a.get("thread_left"):
        return (f"GPU activity of process {pid} detached: activity and callbacks off, CUPTI "
                "unsubscribed, the library's thread gone (the library stays loaded, inert); "
                f"the {a.get('traps', 0)} SIGSEGV signals of its main thread at the attach and "
                "the detach were clockalign's (the return of each call made through ptrace), "
                "never delivered")
    return (f"GPU activity of process {pid}: the detach did not complete (state "
            f"{a['state']}{', its thread still runs' if a.get('thread_left') else ''}"
            f"{': ' + a['error'] if a.get('error') else ''})")


def prepare_activity(opts, env, notice, driver_version):
    """--gpu-activity: the GpuActivity that offers CUPTI to the command (env gets
    CUDA_INJECTION64_PATH and the library's settings) or loads it into the --pid targets
    once the probes are armed (capture/helpers.py); or None after one notice saying why GPU
    activity will not be recorded (no driver, no libcuda for the command, no CUPTI): the
    rest is recorded either way."""
    why = cannot_record(env, driver_version) if opts.command else None
    act = None
    try:
        if why is None:
            act = GpuActivity(raw=opts.gpu_activity_timestamps != "converted",
                              duty=Duty(opts.gpu_activity_duty, opts.gpu_activity_duty_period,
                                        "--gpu-activity-duty", min_period_s=2.0))
            if not opts.command:
                for text in act.prepare_live(opts.pids, env):
                    notice(text, "warning")
                if not act.attaching:
                    act.close()
                    return None
            else:
                act.prepare(env)
    except ClockalignError as e:
        if act is not None:
            act.close()
        why = str(e)
    if why is not None:
        notice(f"GPU activity will not be recorded: {why}; recording the rest", "warning")
        return None
    if opts.command:
        notice(f"GPU activity: each process of the command that starts CUDA is to "
               f"load CUPTI {act.cupti.lib} (from {act.cupti.where}) through "
               f"CUDA_INJECTION64_PATH, {act.meta()['timestamps']} timestamps")
    return act
