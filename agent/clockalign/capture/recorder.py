"""One recording: arm the probes, stream events and clocks into the run file, end cleanly.

    rec = Recorder(RecordOptions(pids=[1234], duration=10, output="run.ca"))
    summary = rec.run()      # blocks until --duration, Ctrl-C/SIGTERM or the targets' exit

The event path stays bulk: the per-CPU slot rings (slotring.py; perf buffers, perfbuf.py, where
they do not load) are read by a C thread (drain.py) as numpy batches and each batch becomes
one columnar chunk; the clock probe and the counter sampler run in their own threads and
write their own chunks.
"""
import dataclasses
import os
import signal
import socket
import sys
import threading
import time

import numpy as np

from .. import __version__
from ..errors import ClockalignError, RunFileWriteError
from ..store.schema import CUDA_FUNCTIONS, EVENT_DTYPE, KIND_NAMES, Chunk, Kind
from ..store.writer import check_output
from . import preflight, targets
from .duty import CudaDuty
from .bpfprog import ProbeOptions, Probes
from .drain import start_drain
from .container import describe as describe_container, own_mount_namespace
from .libcuda import locate as locate_libcuda, resolve_like_loader
from .sinks import open_writer

POLL_S = 0.05
# The run file goes to the OS after every event batch (a batch gathers for at most POLL_S):
# a SIGKILL of the recorder loses the last 14-63 ms of events, not the up to 308 ms a
# 250 ms interval lost, at no measurable cost (about 15 more write() calls a second;
# scripts/bench_sigkill.py, results/sigkill/sigkill.md).
FLUSH_S = 0.0
STATUS_S = 1.0    # a STATUS row (event counts, drops so far) this often


@dataclasses.dataclass
class RecordOptions:
    output: str = "clockalign.ca"     # None: no run file (then sinks get everything)
    pids: list = dataclasses.field(default_factory=list)
    follow: list = None               # names: attach to matching processes as they appear
    command: list = None
    duration: float = None
    libcuda: str = None
    cuda: bool = True
    cuda_args: str = "full"           # "registers": no user-memory reads in CUDA probes
    cuda_returns: str = "all"         # "blocking": enqueue-only calls recorded at entry
    cuda_duty: float = 1.0            # share of each period the CUDA probes are armed
    cuda_duty_period: float = 1.0     # seconds (capture/duty.py)
    follow_children: bool = None      # default: on in spawn mode, off for --pid
    ring_mb: float = None             # None: 8 MiB of event buffer a CPU
    counters: str = "auto"
    counter_interval: float = 0.1
    gpu_clock: bool = True
    gpu_clock_period: float = 1.0
    gpu_clock_pings: int = 64
    gpu_activity: bool = False        # CUPTI kernels/copies/memsets of a spawned command
    gpu_activity_timestamps: str = "raw"   # "converted": CUPTI's own CPU-time conversion
    status: bool = None               # default: on when stderr is a TTY
    env: dict = None                  # environment of a spawned command (default: ours)
    force: bool = False               # -o may replace a file that is not a run, or a symlink
    sinks: list = dataclasses.field(default_factory=list)   # fed every chunk (capture/sinks.py)


def _now():
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def read_clocks() -> dict:
    """Every clock the alignment names, read once (the run file's start and end stamps)."""
    return {name: time.clock_gettime_ns(getattr(time, f"CLOCK_{name}"))
            for name in ("MONOTONIC", "REALTIME", "BOOTTIME", "MONOTONIC_RAW")}


def nvidia_driver_version():
    try:
        with open("/proc/driver/nvidia/version") as f:
            return f.readline().strip()
    except OSError:
        return None


def _gpu_inventory():
    """(GPUs as NVML sees them, why none) — [] where there is no NVML."""
    try:
        from .counters import gpu_inventory
    except ImportError as e:
        return [], f"counter backends not importable ({e})"
    return gpu_inventory()


def _device_table(gpus, use_cuda):
    """The header's devices (NVML index -> bus id -> CUDA ordinal) and notes on gaps."""
    from .devices import device_table
    return device_table(gpus, use_cuda=use_cuda)


class Recorder:
    def __init__(self, opts: RecordOptions):
        self.opts = opts
        self.notices = []
        self.counts = {name: 0 for name in KIND_NAMES.values()}
        self.stop_reason = None
        self._stop = threading.Event()
        self.child = None
        self.writer = None
        self.gpus = []
        self.devices = []
        self._closers = []
        self._activity = None
        self._duty = CudaDuty(opts.cuda_duty, opts.cuda_duty_period)
        self._follower = None
        self._drain = None           # reads the event buffers from arming until the stop
        self.arming = None           # seconds arming took, in all and by step (Arming)
        self._armed_s = None         # of which until the probes were attached
        self._ended_early = []       # --pid targets that ended before the probes were armed
        self._reader_kind = None     # the trailer's buffer_reader (drain.py)

    # ---------------------------------------------------------------- setup
    def notice(self, text, level="notice", echo=True):
        """Into the run file (NOTICES) and, unless echo is False, on stderr."""
        self.notices.append({"t_ns": _now(), "level": level, "text": text})
        if self.writer:
            self.writer.write_rows(Chunk.NOTICES, [self.notices[-1]])
        if echo:
            print(f"clockalign: {text}", file=sys.stderr)

    def _resolve_cuda(self, pids, env):
        """The libcuda to probe: a path (--libcuda, spawn mode), or in pid mode
        {path: [pids]}, one entry per library file — two targets in two containers may map
        two different files at one name, and each gets its own probes."""
        o = self.opts
        self._cuda_targets = {}
        if not o.cuda:
            return None
        if o.libcuda:
            if not os.path.exists(o.libcuda):
                raise ClockalignError(f"--libcuda {o.libcuda} does not exist")
            return os.path.realpath(o.libcuda)
        if self.child is not None:
            path, how = resolve_like_loader(env)
            if not path:
                raise ClockalignError(
                    "no libcuda.so.1 can be found the way the command's loader would look "
                    "(LD_LIBRARY_PATH, ld.so.cache, default directories); pass --libcuda "
                    "PATH or record without CUDA probes with --no-cuda")
            self.notice(f"CUDA probes armed on {path} (found via {how}) before the command starts")
            return path
        by_file = {}
        for pid in pids:
            path, key = self._libcuda_of(pid)
            by_file.setdefault(key, (path, []))[1].append(pid)
        return dict(by_file.values())

    def _libcuda_of(self, pid):
        """(path to probe, file key) of the libcuda process pid maps or would load; a
        notice where it is not loaded yet or in another mount namespace; ClockalignError
        where none can be probed."""
        loc = locate_libcuda(pid)
        where = (" inside its root (another mount namespace: a container?)"
                 if own_mount_namespace(pid) else "")
        if loc["unverified"]:
            raise ClockalignError(
                f"process {pid} maps libcuda {loc['in_target']} (device {loc['dev']}, inode "
                f"{loc['ino']}), but no path from here reaches that file; pass --libcuda "
                "PATH or record without CUDA probes with --no-cuda")
        path = loc["probe"]
        if not path:
            raise ClockalignError(
                f"process {pid} has not loaded libcuda and none can be found the way its "
                f"loader would look{where} (LD_LIBRARY_PATH, ld.so.cache, default "
                "directories); pass --libcuda PATH or record without CUDA probes with "
                "--no-cuda")
        if loc["how"] != "maps":
            self.notice(f"process {pid} has not loaded libcuda yet; probes armed on {path} "
                        f"(found via {loc['how']}{where}), so a later dlopen is traced")
        elif where:
            self.notice(f"process {pid} runs in another mount namespace: probes armed on the "
                        f"libcuda it maps, {loc['in_target']}, reached as {path}")
        try:
            st = os.stat(path)
            key = (st.st_dev, st.st_ino)
            loc = {**loc, "dev": f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}",
                   "ino": st.st_ino}
        except OSError:
            key = path
        self._cuda_targets[pid] = loc
        return path, key

    def _meta(self, tgids, cuda_lib, probes):
        def lib_of(p):
            if isinstance(cuda_lib, dict):
                return next((path for path, ps in cuda_lib.items() if p in ps), None)
            return cuda_lib

        def target(p):
            t = {"pid": p, "cmdline": self.opts.command if self.child else targets.cmdline(p),
                 "libcuda": lib_of(p)}
            loc = getattr(self, "_cuda_targets", {}).get(p)
            if loc:
                t.update(libcuda_in_target=loc["in_target"], libcuda_how=loc["how"],
                         libcuda_dev=loc.get("dev"), libcuda_ino=loc.get("ino"))
            t.update(describe_container(p))
            return t
        return {
            "tool": "clockalign", "version": __version__, "host": socket.gethostname(),
            "kernel": os.uname().release, "argv": sys.argv,
            "driver": nvidia_driver_version(), "gpus": self.gpus,
            "devices": [d.row() for d in self.devices],
            "clocks": read_clocks(),
            "mode": "spawn" if self.child else "pid",
            **({"follow": list(self.opts.follow)} if self.opts.follow else {}),
            "targets": [target(p) for p in tgids],
            "cuda_functions": {str(k): v[0] for k, v in CUDA_FUNCTIONS.items()},
            "cuda_attached": probes.attached_cuda, "cuda_missing": probes.missing_cuda,
            "cuda_entry_only": sorted(CUDA_FUNCTIONS[i][0] for i in probes.entry_only),
            "cuda_libraries": getattr(probes, "cuda_libraries", {}),
            "cuda_prologues": getattr(probes, "prologues", {}),
            "kinds": {str(int(k)): v for k, v in KIND_NAMES.items()},
            "event_dtype": str(EVENT_DTYPE.descr), "cflags": probes.cflags,
            **({"gpu_activity": self._activity.meta()} if self._activity else {}),
            **({"cuda_duty": self._duty.meta()} if self._duty.active else {}),
        }

    # ---------------------------------------------------------------- run
    def run(self) -> dict:
        o = self.opts
        if not o.pids and not o.command and not o.follow:
            raise ClockalignError("nothing to record: give --pid PID (one or more) or -- COMMAND")
        if o.follow and o.command:
            raise ClockalignError("--follow attaches to running processes by name: give it "
                                  "alone or with --pid, not with -- COMMAND")
        if o.pids and o.command:
            raise ClockalignError("give either --pid PID or -- COMMAND, not both")
        if o.duration is not None and not o.duration > 0:
            raise ClockalignError(f"--duration must be more than 0 seconds (got {o.duration})")
        if o.command:
            _check_command(o.command, o.env if o.env is not None else os.environ)
        for pid in o.pids:
            tgid = _tgid(pid)
            if tgid is not None and tgid != pid:
                raise ClockalignError(f"{pid} is a thread of process {tgid}, not a process: "
                                      f"record it with --pid {tgid}")
        self._follower = None
        if o.follow:
            from .follow import Follower
            self._follower = Follower(o.follow)
        if o.output is None and not o.sinks:
            raise ClockalignError("nothing to write to: give a run file")
        preflight.require(needs_cuda=o.cuda)
        if o.output is not None:
            check_output(o.output, force=o.force)
        self.gpus, self.gpu_why = _gpu_inventory()
        self.devices, dev_notes = _device_table(self.gpus, o.gpu_clock)
        for n in dev_notes:
            self.notice(n, "warning")
        env = dict(o.env if o.env is not None else os.environ)
        if o.gpu_activity:
            self._prepare_activity(env)
        if o.command:
            try:
                self.child = targets.HeldChild(o.command, env)
            except BaseException:
                self._close_activity()
                raise
            tgids = [self.child.pid]
        else:
            for pid in o.pids:
                targets.check_pid(pid)
            tgids = list(o.pids)
        follow = o.follow_children if o.follow_children is not None else bool(self.child)
        self._preload()
        arm = Arming()
        try:
            cuda_lib = self._resolve_cuda(tgids, env)
            arm.step("libcuda_lookup_s")
            self._duty.start()            # the first armed window opens as the links arm
            probes = Probes(ProbeOptions(cuda_lib=cuda_lib, follow_children=follow,
                                         cuda_args=o.cuda_args, cuda_returns=o.cuda_returns,
                                         ring_mb=o.ring_mb), tgids)
            if self._duty.active and probes.attach_mode != "uprobe_multi":
                probes.close()
                raise ClockalignError("--cuda-duty needs uprobe_multi links (Linux 6.6 or "
                                      "later) to detach and re-arm the CUDA probes cheaply; "
                                      f"this kernel gave {probes.attach_mode or 'none'}")
            arm.steps.update(probes.timings)
            arm.step()
        except BaseException:
            if self.child:
                self.child.cancel()
            self._close_activity()
            raise
        # from arming until the probes are detached, Ctrl-C / SIGTERM only ask for a stop: a
        # second one while finishing must cost neither the trailer nor a clean detach
        old = self._install_signals()
        try:
            with probes:
                # Read the buffers from the moment the probes fire: the writer, the thread
                # snapshot and the helpers' start (a GPU clock's module load and tick kernel)
                # take ~0.1 s, in which one busy thread fills its CPU's buffer.
                self._drain = start_drain(probes.ring)
                self._reader_kind = self._drain.kind
                self.arming = arm.done()
                self._armed_s = self.arming["probes_armed_s"] = self.arming["total_s"]
                self.notice(arm.text())
                self._gone_while_arming(probes, tgids)
                try:
                    self.writer = open_writer(o.output, self._meta(tgids, cuda_lib, probes),
                                              o.sinks)
                    self.writer.write_rows(Chunk.NOTICES, self.notices)
                    for n in probes.notes:
                        self.notice(n)
                    if probes.missing_cuda and cuda_lib:
                        self.writer.write_rows(Chunk.NOTICES, [{
                            "t_ns": _now(), "level": "info",
                            "text": "symbols not exported by libcuda: "
                                    + ", ".join(probes.missing_cuda)}])
                    self._snapshot_threads(tgids)
                    arm.step("run_file_and_threads_s")
                    helpers = []
                    try:
                        self._start_helpers(helpers)
                        arm.step("helpers_s")
                        self.arming = {"probes_armed_s": self._armed_s, **arm.done()}
                        if self.child:
                            self.child.release()
                        self._loop(probes, tgids)
                    except BaseException as e:    # the trailer says why; the error still shows
                        self.stop_reason = self.stop_reason or f"error: {type(e).__name__}: {e}"
                        raise
                    finally:
                        self._finish(probes, tgids, helpers)
                finally:
                    self._stop_drain()     # taken by the loop or _finish; else failing early
        finally:
            self._restore_signals(old)
        if self._ended_early and self._ended_early == tgids:
            n, it = self._target_events(), "it" if len(tgids) == 1 else "them"
            if not n:
                raise ClockalignError(f"{self._ended_text()}: nothing of {it} was recorded "
                                      f"({o.output or 'the run'} holds no event)", exit_code=1)
            print(f"clockalign: {self._ended_text()}: only {n} events of {it} (the end) were "
                  "recorded", file=sys.stderr)
        return self.summary

    def _gone_while_arming(self, probes, tgids) -> list:
        """The --pid targets that ended before the probes were armed, each named in a notice
        (on stderr too unless all of them did: then run() says it once, at the end); when
        all did, the recording stops at once."""
        if self.child is not None or self._follower is not None:
            return []
        gone = [p for p in tgids if p in probes.gone or not targets.alive(p)]
        if not gone:
            return []
        self._ended_early = gone
        everyone = gone == tgids
        for p in gone:
            self.notice(self._ended_text([p]), "warning", echo=not everyone)
        if everyone:
            self.stop_reason = (f"target{'s' if len(gone) > 1 else ''} ended before the "
                                "probes were armed")
            self._stop.set()
        return gone

    def _ended_text(self, pids=None) -> str:
        pids = pids or self._ended_early
        who = (f"process {pids[0]}" if len(pids) == 1
               else "processes " + ", ".join(map(str, pids)))
        return (f"{who} ended before the probes were armed (arming took "
                f"{self._armed_s:.1f} s)")

    def _target_events(self) -> int:
        """Events of the targets (not the host-wide Xids) in the recording so far."""
        return sum(n for k, n in self.counts.items() if k not in ("xid", "xid_msg"))

    def _prepare_activity(self, env):
        """--gpu-activity: CUPTI offered to the command (env gets CUDA_INJECTION64_PATH and
        the library's settings), or loaded into the --pid targets once the probes are armed
        (_start_helpers); or, first and once, one notice saying why GPU activity will not be
        recorded (no driver, no libcuda for the command, no CUPTI); the rest is recorded
        either way."""
        from .gpuactivity import GpuActivity, cannot_record
        why = cannot_record(env, nvidia_driver_version()) if self.opts.command else None
        act = None
        try:
            if why is None:
                act = GpuActivity(raw=self.opts.gpu_activity_timestamps != "converted")
                if not self.opts.command:
                    for text in act.prepare_live(self.opts.pids, env):
                        self.notice(text, "warning")
                    if not act.attaching:
                        act.close()
                        return
                else:
                    act.prepare(env)
        except ClockalignError as e:
            if act is not None:
                act.close()
            why = str(e)
        if why is not None:
            self.notice(f"GPU activity will not be recorded: {why}; recording the rest",
                        "warning")
            return
        self._activity = act
        if self.opts.command:
            self.notice(f"GPU activity: each process of the command that starts CUDA is to "
                        f"load CUPTI {act.cupti.lib} (from {act.cupti.where}) through "
                        f"CUDA_INJECTION64_PATH, {act.meta()['timestamps']} timestamps")

    def _close_activity(self):
        if self._activity is not None:
            self._activity.close()

    def _preload(self):
        """Import now what the helpers and sinks import on first use, before the probes
        fire: a module import holds the GIL in long stretches (an extension module's init
        is one C call; importing align, scipy.optimize, kept a sleeping thread from running
        for up to 26 ms on the VM).  The C reader thread does not need the GIL, but the
        recording thread takes no batch meanwhile.  Import errors are left for the helpers to
        report as they do now."""
        o = self.opts
        try:
            from . import clockprobe  # noqa: F401
            if o.gpu_clock and any(d.cuda_ordinal is not None for d in self.devices):
                from .gpuclock import driver
                driver()                              # cuda.bindings, a large extension
        except Exception:
            pass
        if o.counters != "none":
            try:
                from . import counters  # noqa: F401
            except ImportError:
                pass
        for sink in o.sinks:
            getattr(sink, "preload", lambda: None)()

    def _start_helpers(self, helpers):
        """Start the clock probe, counter sampler and GPU activity reader, each appended to
        helpers once it runs (so a failure part-way still stops the ones started)."""
        o = self.opts
        if self._activity is not None:
            self._activity.start_writing(self.writer)
            helpers.append(("gpu_activity", self._activity))
            for level, text in self._activity.attach_live():    # --pid: probes armed now
                self.notice(text, level)
        try:
            from .clockprobe import ClockProbeThread
            gpus = [d for d in self.devices if d.cuda_ordinal is not None] \
                if o.gpu_clock else []
            cp = ClockProbeThread(self.writer, gpus=gpus, gpu=bool(o.gpu_clock and gpus),
                                  gpu_period_s=o.gpu_clock_period, pings=o.gpu_clock_pings)
            cp.start()
            helpers.append(("clocks", cp))
        except ImportError as e:
            self.notice(f"clock probes unavailable ({e}); CPU/GPU clock domains not recorded",
                        "warning")
        if o.counters != "none":
            try:
                from .counters import CounterSampler, open_backend
                backend = open_backend(o.counters, interval_s=o.counter_interval)
                cs = CounterSampler(self.writer, backend, interval_s=o.counter_interval)
                cs.start()
                helpers.append(("counters", cs))
                self._closers.append(backend.close)
            except ClockalignError as e:
                if o.counters == "auto":
                    self.notice(f"GPU counters off: {e}")
                else:
                    raise
            except ImportError as e:
                self.notice(f"GPU counters off: backend not importable ({e})", "warning")

    def _install_signals(self):
        def handler(signum, frame):
            self.stop_reason = self.stop_reason or signal.Signals(signum).name
            self._stop.set()
        return {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}

    @staticmethod
    def _restore_signals(old):
        for s, h in old.items():
            signal.signal(s, h)

    def _record_batch(self, batch):
        """Count and write one batch of events (None or empty: nothing came)."""
        if batch is None or len(batch) == 0:
            return
        kinds = np.bincount(batch["kind"], minlength=16)
        for k, n in enumerate(kinds):
            if n and k in KIND_NAMES:
                self.counts[KIND_NAMES[k]] += int(n)
        try:
            self.writer.write_records(Chunk.EVENTS, batch)
        except RunFileWriteError as e:
            self._write_failed(e)

    def _targets_alive(self, tgids):
        if self._follower is not None:
            return True                  # following: targets come and go, watch stays
        if self.child:
            return self.child.poll() is None
        return any(targets.alive(p) for p in tgids)

    def _stop_drain(self) -> list:
        """Stop the drain thread once; the batches it read and nobody took (none the second
        time)."""
        drain, self._drain = self._drain, None
        return drain.stop() if drain is not None else []

    def _loop(self, probes, tgids):
        """Write what the drain thread reads until a stop; the buffers are read apart from the
        writing (drain.py), so a slow write costs no event."""
        try:
            self._write_until_stop(self._drain, tgids, probes)
        finally:
            for batch in self._stop_drain():
                self._record_batch(batch)

    def _write_until_stop(self, drain, tgids, probes):
        o = self.opts
        t_start = time.monotonic()
        last_flush = last_status = last_row = t_start
        last_scan = t_start - 1e9
        show = o.status if o.status is not None else sys.stderr.isatty()
        while not self._stop.is_set():
            self._record_batch(drain.get(timeout=POLL_S))
            self._duty.tick(probes)
            now = time.monotonic()
            if self._follower is not None and now - last_scan >= self._follower.scan_s:
                self._follow(probes, tgids)
                last_scan = now
            if now - last_flush >= FLUSH_S:
                self.writer.flush()
                last_flush = now
            if now - last_row >= STATUS_S:
                self._status_row(probes, tgids)
                last_row = now
            if show and now - last_status >= 0.5:
                self._status_line(now - t_start, probes)
                last_status = now
            if o.duration is not None and now - t_start >= o.duration:
                self.stop_reason = "duration"
                break
            if not self._targets_alive(tgids):
                self.stop_reason = "target exited"
                break
        if self.child and self.stop_reason == "SIGTERM" and self.child.poll() is None:
            os.kill(self.child.pid, signal.SIGTERM)
            deadline = time.monotonic() + 2
            while self.child.poll() is None and time.monotonic() < deadline:
                self._record_batch(drain.get(timeout=POLL_S))
        time.sleep(POLL_S)   # let the last events of an exiting target reach the ring
        if show:
            sys.stderr.write("\n")

    def _follow(self, probes, tgids):
        """One scan of --follow: detach the targets that exited, attach the new matches
        (each with its own libcuda's links), say both."""
        f = self._follower
        new, gone = f.scan(tgids)
        if gone:
            probes.remove_targets(gone)
            for p in gone:
                tgids.remove(p)
                self.notice(f"process {p} exited; still following {', '.join(f.names)}")
        for pid, name in new:
            lib, why = None, None
            if self.opts.cuda:
                try:
                    lib = (os.path.realpath(self.opts.libcuda) if self.opts.libcuda
                           else self._libcuda_of(pid)[0])
                except ClockalignError as e:
                    why = str(e)
            why = probes.add_targets([pid], lib) or why
            tgids.append(pid)
            f.attach(pid, name)
            self._snapshot_threads([pid])
            cmd = " ".join(targets.cmdline(pid))
            self.notice(f"following {name}: attached to process {pid} "
                        f"({cmd[:100] + ('...' if len(cmd) > 100 else '')})"
                        + (f"; its CUDA calls are not traced: {why}" if why else ""))
        if new or gone:             # the metrics learn the targets now, not in a second
            self._status_row(probes, tgids)

    def _status_row(self, probes, tgids=()):
        row = {"t_ns": _now(), "events": dict(self.counts), "drops": probes.drops(),
               "targets": sorted(int(p) for p in tgids)}
        try:
            self.writer.write_rows(Chunk.STATUS, [row])
        except RunFileWriteError as e:
            self._write_failed(e)

    def _status_line(self, elapsed, probes):
        kinds = " ".join(f"{k}={v}" for k, v in self.counts.items() if v)
        drops = sum(probes.drops().values())
        where = (f"{self.writer.size / 1e6:.1f} MB" if self.opts.output is not None else "")
        extra = getattr(self.writer, "status_text", lambda: "")()
        if self._follower is not None:
            f = self._follower
            extra = (f"following: {len(f.matched)} attached, {f.exited} exited" +
                     (f"  {extra}" if extra else ""))
        sys.stderr.write(f"\r{elapsed:7.1f}s  {kinds or 'no events yet'}  drops={drops}  "
                         f"{'  '.join(t for t in (where, extra) if t)}\033[K")
        sys.stderr.flush()

    def _snapshot_threads(self, tgids):
        rows = []
        t = _now()
        for p in tgids:
            for tid, comm in targets.threads(p):
                rows.append({"pid": p, "tid": tid, "comm": comm, "t_ns": t})
        self.writer.write_rows(Chunk.THREADS, rows)

    def _finish(self, probes, tgids, helpers):
        stats = {}
        for name, h in helpers:
            try:
                h.stop()
                stats[name] = h.stats()
            except Exception as e:    # a helper's failure must not cost the recording
                stats[name] = {"error": str(e)}
                self.notice(f"{name} helper failed at stop: {e}", "warning")
        for close in self._closers:
            try:
                close()
            except Exception as e:
                self.notice(f"closing a counter backend failed: {e}", "warning")
        self._close_activity()
        act = stats.get("gpu_activity")
        if self._activity is not None and "error" not in (act or {}):
            for k in ("gpu_kernel", "gpu_copy", "gpu_memset", "gpu_launch_call"):
                self.counts[k] = act[k]
            for text in self._activity.summary_notes():
                self.notice(text, "warning")
        for batch in self._stop_drain():     # the loop never ran: a helper failed to start
            self._record_batch(batch)
        self._record_batch(probes.ring.read())
        self._duty.close()
        unfinished = probes.unfinished_cuda(_now())
        self._record_batch(unfinished)
        self._snapshot_threads([p for p in tgids if targets.alive(p)])
        drops = probes.drops()
        if self._activity is not None:
            drops.update(self._activity.drops())
        peak = probes.ring.peak_fill if probes.ring else 0.0
        if drops:
            self.notice("events lost: " + ", ".join(f"{k}={v}" for k, v in drops.items()) +
                        f" ({_drop_reason(drops, peak)})", "warning")
        skipped = probes.skipped_runs()
        if skipped:
            self.notice(f"the kernel skipped {skipped} run(s) of the probes because another BPF "
                        "program was running on that CPU (their recursion misses); the "
                        "tracepoints run host-wide, so most skips are other processes' events, "
                        "but a target's record may be missing", "warning")
        exit_info = self.child.describe_exit() if self.child else None
        if self.child and self.child.poll() is None:
            self.notice(f"command (pid {self.child.pid}) still running when recording stopped")
        trailer = {"reason": self.stop_reason or "stopped", "counts": self.counts,
                   "drops": drops, "ring_records": probes.ring.records if probes.ring else None,
                   "ring_peak_fill": round(peak, 4),
                   "perf_lost": probes.ring.lost if probes.ring else None,
                   "buffer_reader": self._reader_kind, "event_buffers": probes.buffers,
                   "bpf_skipped_runs": skipped,
                   "helpers": stats, "child_exit": exit_info,
                   "unfinished_cuda": int(len(unfinished)), "clocks_end": read_clocks(),
                   "arming": self.arming,
                   **({"cuda_duty": self._duty.trailer()} if self._duty.active else {})}
        try:
            self.writer.close(trailer)
        except RunFileWriteError as e:
            self._write_failed(e)
        if getattr(self, "write_error", None) is not None:
            raise self.write_error
        self.summary = {"output": self.opts.output, **trailer,
                        **({"follow": {"attached": self._follower.attached,
                                       "exited": self._follower.exited}}
                           if self._follower is not None else {}),
                        "size": os.path.getsize(self.opts.output) if self.opts.output else 0}

    def _write_failed(self, e):
        """The run file could not be written (a full disk): stop; run() reports it once."""
        if getattr(self, "write_error", None) is None:
            self.write_error = e
        self.stop_reason = self.stop_reason or "run file write failed"
        self._stop.set()


class Arming:
    """How long arming takes, step by step: from the libcuda lookup to the probes attached
    (what a --pid target runs unrecorded after `record` starts: 3-5 s on the 2-core VM,
    mostly the BPF compile), then the run file and the helpers' start (the trailer's
    "arming" has every step; "total_s" is up to the last one timed)."""
    NAMES = {"libcuda_lookup_s": "libcuda lookup", "bpf_compile_load_s": "BPF compile and load",
             "targets_s": "targets map", "cuda_links_s": "CUDA links",
             "event_buffers_s": "event buffers", "run_file_and_threads_s":
             "run file and thread snapshot", "helpers_s": "clock probe, counters and CUPTI "
             "reader start"}

    def __init__(self):
        self.t0 = self.last = time.monotonic()
        self.steps = {}

    def step(self, name=None):
        """End a step (name None: one whose parts were filled in by someone else)."""
        now = time.monotonic()
        if name is not None:
            self.steps[name] = now - self.last
        self.last = now

    def done(self) -> dict:
        return {"total_s": round(self.last - self.t0, 4),
                **{k: round(v, 4) for k, v in self.steps.items()}}

    def text(self) -> str:
        """One notice: the time to the probes attached, by the steps that took 5 ms or more."""
        d = self.done()
        parts = ", ".join(f"{self.NAMES.get(k, k)} {v:.2f} s" for k, v in d.items()
                          if k != "total_s" and v >= 0.005)
        return f"probes armed in {d['total_s']:.2f} s ({parts})"


def _tgid(pid: int):
    """The process a thread id belongs to (itself for a main thread), None if unknown."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Tgid:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def _check_command(argv, env) -> None:
    """Refuse, before any probe is armed, a command that exec would refuse to run."""
    import shutil
    exe = argv[0] if os.sep in argv[0] else shutil.which(argv[0], path=env.get("PATH"))
    if not exe or not os.path.isfile(exe) or not os.access(exe, os.X_OK):
        raise ClockalignError(f"command not found or not executable: {argv[0]}")
    try:
        with open(exe, "rb") as f:
            head = f.read(4)
    except OSError as e:
        raise ClockalignError(f"cannot run {argv[0]}: {e.strerror}") from None
    if head != b"\x7fELF" and not head.startswith(b"#!"):
        raise ClockalignError(f"cannot run {argv[0]}: it is neither a program nor a script "
                              "starting with #! (exec would fail: exec format error)")


def _drop_reason(drops: dict, peak: float) -> str:
    """One clause on why records were lost, from which counters moved."""
    why = []
    gpu = ("cupti_dropped", "gpu_wire_bad_bytes", "gpu_wire_incomplete_bytes")
    if any(k not in ("state_map_full", "cuda_unpaired", "cuda_nested", "cuda_slot_busy") + gpu
           for k in drops):
        why.append(f"a CPU's event buffer filled up (at most {peak:.0%} full when read): "
                   "raise --ring-mb, or the recorder could not keep up")
    if "state_map_full" in drops:
        why.append("a state map was full (more live target threads than it holds)")
    if "cuda_slot_busy" in drops:
        why.append("two target threads in CUDA calls at once had tids equal modulo the "
                   "call slots")
    if "cuda_nested" in drops:
        why.append("a thread was inside more nested probed CUDA calls than are tracked")
    if "cupti_dropped" in drops:
        why.append("CUPTI dropped GPU activity records (its buffers were full)")
    if "gpu_wire_bad_bytes" in drops or "gpu_wire_incomplete_bytes" in drops:
        why.append("GPU activity bytes from the injected library were unreadable or cut off "
                   "(a target killed mid-write?)")
    if "cuda_unpaired" in drops:
        why.append("a CUDA call's return found another call on top (a return was missed)")
    return "; ".join(why)
