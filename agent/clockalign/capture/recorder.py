"""One recording: arm the probes, stream events and clocks into the run file, end cleanly.

    rec = Recorder(RecordOptions(pids=[1234], duration=10, output="run.ca"))
    summary = rec.run()      # blocks until --duration, Ctrl-C/SIGTERM or the targets' exit

The event path stays bulk: the per-CPU slot rings (transport/slotring.py; perf buffers,
transport/perfbuf.py, where they do not load) are read by a C thread (transport/drain.py) as
numpy batches and each batch becomes one columnar chunk; the clock probe, the counter sampler
and the GPU activity reader (helpers.py) run in their own threads and write their own
chunks.  arming.py checks the request and times the arming, header.py writes the run file's
header, status.py words the status line and the losses.
"""
import dataclasses
import os
import signal
import sys
import threading
import time

import numpy as np

from ..errors import ClockalignError, RunFileWriteError
from ..store.schema import KIND_NAMES, Chunk
from ..store.writer import check_output
from . import preflight
from .arming import Arming, check_request
from .gpu.gpuactivity import prepare_activity
from .header import device_table, gpu_inventory, nvidia_driver_version, read_clocks, run_meta
from .helpers import preload, start_helpers
from .probes.cflags import ProbeOptions
from .probes.duty import Duty
from .probes.libcuda import TargetLibraries
from .probes.program import Probes
from .status import drop_reason, status_line
from .targets import process as targets
from .transport.drain import start_drain
from .transport.sinks import open_writer

POLL_S = 0.05
# The run file goes to the OS after every event batch (a batch gathers for at most POLL_S):
# a SIGKILL of the recorder loses the last 14-63 ms of events, not the up to 308 ms a
# 250 ms interval lost, at no measurable cost (about 15 more write() calls a second;
# scripts/bench/sigkill.py, results/sigkill/sigkill.md).
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
    cuda_duty_period: float = 1.0     # seconds (capture/probes/duty.py)
    follow_children: bool = None      # default: on in spawn mode, off for --pid
    ring_mb: float = None             # None: 8 MiB of event buffer a CPU
    counters: str = "auto"
    counter_interval: float = 0.1
    gpu_clock: bool = True
    gpu_clock_period: float = 1.0
    gpu_clock_pings: int = 64
    gpu_activity: bool = False        # CUPTI kernels/copies/memsets of a spawned command
    gpu_activity_timestamps: str = "raw"   # "converted": CUPTI's own CPU-time conversion
    gpu_activity_duty: float = 1.0    # --pid: share of each period CUPTI is attached
    gpu_activity_duty_period: float = 10.0
    status: bool = None               # default: on when stderr is a TTY
    env: dict = None                  # environment of a spawned command (default: ours)
    force: bool = False               # -o may replace a file that is not a run, or a symlink
    sinks: list = dataclasses.field(default_factory=list)   # fed every chunk (transport/sinks.py)


def _now():
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


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
        self.closers = []            # counter backends, closed at the end
        self.activity = None         # GpuActivity of --gpu-activity (gpu/gpuactivity.py)
        self.duty = Duty(opts.cuda_duty, opts.cuda_duty_period)
        self.libs = TargetLibraries(self.notice)   # the libcuda of each target
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

    # ---------------------------------------------------------------- run
    def run(self) -> dict:
        o = self.opts
        check_request(o)
        self._follower = None
        if o.follow:
            from .targets.follow import Follower
            self._follower = Follower(o.follow)
        preflight.require(needs_cuda=o.cuda)
        if o.output is not None:
            check_output(o.output, force=o.force)
        self.gpus, self.gpu_why = gpu_inventory()
        self.devices, dev_notes = device_table(self.gpus, o.gpu_clock)
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
        preload(o, self.devices)
        arm = Arming()
        try:
            cuda_lib = self.libs.resolve(o, self.child is not None, tgids, env)
            arm.step("libcuda_lookup_s")
            self.duty.start()            # the first armed window opens as the links arm
            probes = Probes(ProbeOptions(cuda_lib=cuda_lib, follow_children=follow,
                                         cuda_args=o.cuda_args, cuda_returns=o.cuda_returns,
                                         ring_mb=o.ring_mb), tgids)
            if self.duty.active and probes.attach_mode != "uprobe_multi":
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
                    self.writer = open_writer(o.output, run_meta(self, tgids, cuda_lib, probes),
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
        self.activity = prepare_activity(self.opts, env, self.notice, nvidia_driver_version())

    def _close_activity(self):
        if self.activity is not None:
            self.activity.close()

    def _start_helpers(self, helpers):
        start_helpers(self, helpers)

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
            self.duty.tick(probes)
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
                           else self.libs.of(pid)[0])
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
        drops = sum(probes.drops().values())
        where = (f"{self.writer.size / 1e6:.1f} MB" if self.opts.output is not None else "")
        extra = getattr(self.writer, "status_text", lambda: "")()
        if self._follower is not None:
            f = self._follower
            extra = (f"following: {len(f.matched)} attached, {f.exited} exited" +
                     (f"  {extra}" if extra else ""))
        sys.stderr.write(status_line(elapsed, self.counts, drops, (where, extra)))
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
        for close in self.closers:
            try:
                close()
            except Exception as e:
                self.notice(f"closing a counter backend failed: {e}", "warning")
        self._close_activity()
        act = stats.get("gpu_activity")
        if self.activity is not None and "error" not in (act or {}):
            for k in ("gpu_kernel", "gpu_copy", "gpu_memset", "gpu_launch_call"):
                self.counts[k] = act[k]
            for text in self.activity.summary_notes():
                self.notice(text, "warning")
        for batch in self._stop_drain():     # the loop never ran: a helper failed to start
            self._record_batch(batch)
        self._record_batch(probes.ring.read())
        self.duty.close()
        unfinished = probes.unfinished_cuda(_now())
        self._record_batch(unfinished)
        self._snapshot_threads([p for p in tgids if targets.alive(p)])
        drops = probes.drops()
        if self.activity is not None:
            drops.update(self.activity.drops())
        peak = probes.ring.peak_fill if probes.ring else 0.0
        if drops:
            self.notice("events lost: " + ", ".join(f"{k}={v}" for k, v in drops.items()) +
                        f" ({drop_reason(drops, peak)})", "warning")
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
                   **({"cuda_duty": self.duty.trailer()} if self.duty.active else {})}
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


