"""The clock-probe thread of ``clockalign record``: CPU and GPU clock sandwiches into the run file.

Every ``cpu_period_s`` it takes one fastest-of-16 sandwich of REALTIME, BOOTTIME and
MONOTONIC_RAW against MONOTONIC (capture/clocks/cpuclock.py); every ``gpu_period_s`` it takes a
burst of ``pings`` ping-pong sandwiches per GPU (capture/clocks/gpuclock.py) and keeps them all.
CPU rows are written as one CPU_CLOCK chunk about once a second; each GPU round is one
GPU_CLOCK chunk.  A GPU problem never stops the recording: a ping-pong burst that fails
is redone with launch+sync, three failures in a row switch that GPU to launch+sync for
good, and a GPU whose CUDA calls fail is dropped; each step leaves a NOTICES row.

``gpus`` are the devices to probe: store/devices.Device rows (the CUDA ordinal to open,
the GPU<n> name and bus id of the run's device table), or bare CUDA ordinals, which
then also name the domain.  The GPU_CLOCK gpu column is that n.

The GPUs of a round are probed one after the other, never interleaved within a burst:
one host thread answers every ping, so a ping to a second GPU inside a first GPU's
sandwich would put that wait into the first sandwich's round trip, and two ping-pong
kernels spinning on mapped host memory at once share the host's memory path.  Each burst
ends with its kernel gone (GpuClock.pingpong waits for it) before the next GPU's starts.

    probe = ClockProbeThread(writer, gpus=devices, cpu_period_s=0.1, gpu_period_s=1.0, pings=64)
    probe.start(); ...; probe.stop()
    probe.stats()   # {"bursts": {"GPU0": 60}, "sandwiches": {...}, "method": {...}, ...}
"""
import threading
import time

import numpy as np

from ...store.schema import Chunk, ClockDomain
from . import cpuclock
from .cudadriver import GpuClockError
from .gpuclock import (METHOD_LAUNCH_SYNC, METHOD_NAMES, METHOD_PINGPONG, GpuClock,
                       gpu_clock_available)

FAILURES_BEFORE_FALLBACK = 3
MAX_NOTICES_PER_GPU = 10


def _mono() -> int:
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


class ClockProbeThread(threading.Thread):
    """Samples CPU clocks and GPU %globaltimer into ``writer`` until stop()."""

    def __init__(self, writer, gpus=(0,), cpu_period_s: float = 0.1, gpu_period_s: float = 1.0,
                 pings: int = 64, gpu: bool = True, cpu_reads: int = cpuclock.DEFAULT_READS,
                 launch_sync_pings: int = 16, flush_period_s: float = 1.0,
                 ping_timeout_s: float = 0.02, idle_timeout_ns: int = 50_000_000):
        super().__init__(name="clockalign-clockprobe", daemon=True)
        if pings < 1 or cpu_period_s <= 0 or gpu_period_s <= 0:
            raise ValueError("pings must be >= 1 and the periods > 0")
        self.writer = writer
        self.gpus = None if gpus is None else [_identity(g) for g in gpus]
        self.cpu_period_ns = int(cpu_period_s * 1e9)
        self.gpu_period_ns = int(gpu_period_s * 1e9)
        self.pings = int(pings)
        self.launch_sync_pings = max(1, min(int(launch_sync_pings), self.pings))
        self.gpu_requested = bool(gpu)
        self.cpu_reads = int(cpu_reads)
        self.flush_period_ns = int(flush_period_s * 1e9)
        self.ping_timeout_s = ping_timeout_s
        self.idle_timeout_ns = int(idle_timeout_ns)
        self._stop_ev = threading.Event()
        self._pause_ev = threading.Event()
        self._paused_ack = threading.Event()
        self._lock = threading.Lock()
        self._error = None
        self._clocks = []          # open GpuClock objects
        self._method = {}          # domain -> METHOD_*
        self._fails = {}           # domain -> consecutive failed ping-pong bursts
        self._gpu_notices = {}     # domain -> notices written
        self._cpu_rounds = []
        self._stats = {
            "cpu_rounds": 0, "bursts": {}, "sandwiches": {}, "method": {}, "failures": {},
            "fallback_bursts": {}, "tick_ns": {}, "gpu": False, "gpu_off_reason": None,
            "notices": [], "cpu_time_s": 0.0, "burst_wall_ns": {}, "start_wait_ns": {},
        }
        if not self.gpu_requested:
            self._stats["gpu_off_reason"] = "not requested"

    # -- public ------------------------------------------------------------------------
    def stop(self, timeout: float = 30.0) -> None:
        """End sampling, write what is pending, release the GPUs, join.

        GPU failures never raise here (they are notices); an unexpected error of the CPU
        side or of the writer is re-raised, because it is a bug.
        """
        self._stop_ev.set()
        self._pause_ev.clear()
        if self.is_alive():
            self.join(timeout)
        if self._error is not None:
            err, self._error = self._error, None
            raise err

    def pause(self, wait: bool = True, timeout: float = 5.0) -> None:
        """Stop sampling until resume() (used to measure the probe's cost); the GPUs stay open."""
        self._paused_ack.clear()
        self._pause_ev.set()
        if wait and self.is_alive():
            self._paused_ack.wait(timeout)

    def resume(self) -> None:
        self._pause_ev.clear()

    def stats(self) -> dict:
        """Counters so far: rounds, bursts and sandwiches per domain, methods, failures."""
        with self._lock:
            s = {k: (dict(v) if isinstance(v, dict) else list(v) if isinstance(v, list) else v)
                 for k, v in self._stats.items()}
        s["burst_mean_us"] = {d: s["burst_wall_ns"][d] / s["bursts"][d] / 1e3
                              for d in s["burst_wall_ns"] if s["bursts"].get(d)}
        s["start_wait_mean_us"] = {d: s["start_wait_ns"][d] / s["bursts"][d] / 1e3
                                   for d in s["start_wait_ns"] if s["bursts"].get(d)}
        del s["burst_wall_ns"], s["start_wait_ns"]
        return s

    # -- thread ------------------------------------------------------------------------
    def run(self):
        try:
            self._run()
        except BaseException as e:  # reported by stop(); the recording itself goes on
            self._error = e
            try:
                self._notice(f"clock probing stopped by an internal error: "
                             f"{type(e).__name__}: {e}", level="error")
            except Exception:
                pass
        finally:
            for clock in self._clocks:
                clock.close()
            self._clocks = []

    def _run(self):
        self.writer.write_rows(Chunk.CLOCK_INFO, cpuclock.clock_info_rows(self.cpu_reads))
        if self.gpu_requested:
            self._open_gpus()
        now = _mono()
        next_cpu = now
        next_gpu = now
        next_flush = now + self.flush_period_ns
        while not self._stop_ev.is_set():
            if self._pause_ev.is_set():
                self._flush_cpu()
                self._paused_ack.set()
                while self._pause_ev.is_set() and not self._stop_ev.is_set():
                    self._stop_ev.wait(0.01)
                now = _mono()
                next_cpu = next_gpu = now
                continue
            now = _mono()
            if now >= next_cpu:
                self._cpu_round()
                next_cpu = _next(next_cpu, self.cpu_period_ns, now)
            if self._clocks and now >= next_gpu:
                self._gpu_round()
                next_gpu = _next(next_gpu, self.gpu_period_ns, now)
            if now >= next_flush:
                self._flush_cpu()
                next_flush = _next(next_flush, self.flush_period_ns, now)
            with self._lock:
                self._stats["cpu_time_s"] = time.thread_time()
            wake = min(next_cpu, next_flush, next_gpu if self._clocks else next_flush)
            self._stop_ev.wait(max(0, wake - _mono()) / 1e9)
        self._cpu_round()
        self._flush_cpu()
        with self._lock:
            self._stats["cpu_time_s"] = time.thread_time()

    # -- CPU ---------------------------------------------------------------------------
    def _cpu_round(self):
        self._cpu_rounds.append(cpuclock.sample_round(reads=self.cpu_reads))
        with self._lock:
            self._stats["cpu_rounds"] += 1

    def _flush_cpu(self):
        if not self._cpu_rounds:
            return
        cols = cpuclock.concat_rounds(self._cpu_rounds)
        self._cpu_rounds = []
        self.writer.write_columns(Chunk.CPU_CLOCK, cols)
        with self._lock:
            sw = self._stats["sandwiches"]
            for d in np.unique(cols["domain"]):
                name = ClockDomain(int(d)).name
                sw[name] = sw.get(name, 0) + int(np.count_nonzero(cols["domain"] == d))

    # -- GPU ---------------------------------------------------------------------------
    def _open_gpus(self):
        ok, reason = _available(None if self.gpus is None else [g[0] for g in self.gpus])
        if not ok:
            self._gpu_off(reason)
            return
        wanted = self.gpus if self.gpus is not None else \
            [(o, o, None) for o in _all_ordinals()]
        for ordinal, number, bus in wanted:
            clock = GpuClock(ordinal, number=number, idle_timeout_ns=self.idle_timeout_ns,
                             ping_timeout_s=self.ping_timeout_s)
            try:
                clock.open()
                _check_bus(clock, bus)
            except Exception as e:
                clock.close()
                self._notice(f"GPU clock probing is off for GPU{number}: {_sentence(e)}")
                continue
            self._clocks.append(clock)
            self._method[clock.domain] = METHOD_PINGPONG
            self._fails[clock.domain] = 0
            with self._lock:
                self._stats["tick_ns"][clock.domain] = clock.tick_ns
                self._stats["method"][clock.domain] = METHOD_NAMES[METHOD_PINGPONG]
                for key in ("bursts", "failures", "fallback_bursts", "burst_wall_ns",
                            "start_wait_ns"):
                    self._stats[key].setdefault(clock.domain, 0)
                self._stats["sandwiches"].setdefault(clock.domain, 0)
            self._write_gpu_info(clock)
        with self._lock:
            self._stats["gpu"] = bool(self._clocks)
            self._stats["host_loop"] = {c.domain: c.info.get("host_loop") for c in self._clocks}
            if not self._clocks:
                self._stats["gpu_off_reason"] = "no GPU could be opened (see notices)"
        if not self._clocks:
            self._notice("GPU clock probing is off, CPU clocks only: "
                         "no requested GPU could be opened")

    def _write_gpu_info(self, clock, since_ns=None):
        row = dict(clock.info)
        row["method"] = METHOD_NAMES[self._method[clock.domain]]
        row["pings"] = self.pings if self._method[clock.domain] == METHOD_PINGPONG \
            else self.launch_sync_pings
        row["period_s"] = self.gpu_period_ns / 1e9
        if since_ns is not None:
            row["since_ns"] = since_ns
        self.writer.write_rows(Chunk.CLOCK_INFO, [row])

    def _gpu_off(self, reason: str):
        with self._lock:
            self._stats["gpu"] = False
            self._stats["gpu_off_reason"] = reason
        self._notice(f"GPU clock probing is off, CPU clocks only: {reason}")

    def _gpu_round(self):
        parts = []
        for clock in list(self._clocks):
            start = _mono()
            try:
                got = self._gpu_burst(clock)
            except Exception as e:
                self._drop(clock, e)
                continue
            with self._lock:
                self._stats["burst_wall_ns"][clock.domain] += _mono() - start
            parts.extend(got)
        if parts:
            cols = {
                "gpu": np.concatenate([np.full(len(p[2]), p[0], dtype=np.uint8) for p in parts]),
                "method": np.concatenate([np.full(len(p[2]), p[1], dtype=np.uint8) for p in parts]),
                "t0": np.concatenate([p[2] for p in parts]),
                "remote": np.concatenate([p[3] for p in parts]),
                "t1": np.concatenate([p[4] for p in parts]),
            }
            self.writer.write_columns(Chunk.GPU_CLOCK, cols)

    def _gpu_burst(self, clock) -> list:
        """[(gpu, method, t0, remote, t1)] for one GPU; raises GpuClockError if it is unusable."""
        d = clock.domain
        out = []
        if self._method[d] == METHOD_PINGPONG:
            try:
                t0, rem, t1 = clock.pingpong(self.pings)
                why = clock.last_note
            except GpuClockError as e:
                t0 = t1 = rem = np.zeros(0, dtype=np.int64)
                why = _sentence(e)
            if len(t0):
                self._fails[d] = 0
                out.append((clock.number, METHOD_PINGPONG, t0, rem, t1))
                self._count(d, len(t0))
                with self._lock:
                    self._stats["start_wait_ns"][d] += clock.last_start_wait_ns or 0
                return out
            self._fails[d] += 1
            with self._lock:
                self._stats["failures"][d] += 1
            if self._fails[d] >= FAILURES_BEFORE_FALLBACK:
                self._method[d] = METHOD_LAUNCH_SYNC
                with self._lock:
                    self._stats["method"][d] = METHOD_NAMES[METHOD_LAUNCH_SYNC]
                self._gpu_notice(d, f"{d}: ping-pong failed {self._fails[d]} bursts in a row "
                                 f"(last: {why}); switched to launch+sync sandwiches, which are "
                                 "wider (about 9 us against 2 us)", force=True)
                self._write_gpu_info(clock, since_ns=_mono())
            else:
                self._gpu_notice(d, f"{d}: ping-pong burst failed ({why}); this burst fell back "
                                 "to launch+sync")
            with self._lock:
                self._stats["fallback_bursts"][d] += 1
        t0, rem, t1 = clock.launch_sync(self.launch_sync_pings)
        out.append((clock.number, METHOD_LAUNCH_SYNC, t0, rem, t1))
        self._count(d, len(t0))
        return out

    def _count(self, domain, n):
        with self._lock:
            self._stats["bursts"][domain] += 1
            self._stats["sandwiches"][domain] += n

    def _drop(self, clock, err):
        self._clocks.remove(clock)
        clock.close()
        self._notice(f"GPU clock probing stopped for {clock.domain}: {_sentence(err)}")
        if not self._clocks:
            with self._lock:
                self._stats["gpu"] = False
                self._stats["gpu_off_reason"] = f"{clock.domain} failed: {_sentence(err)}"

    def _gpu_notice(self, domain, text, force=False):
        n = self._gpu_notices.get(domain, 0) + 1
        self._gpu_notices[domain] = n
        if force or n < MAX_NOTICES_PER_GPU:
            self._notice(text)
        elif n == MAX_NOTICES_PER_GPU:
            self._notice(text + " (further such notices for this GPU are left out)")

    def _notice(self, text: str, level: str = "warning"):
        row = {"t_ns": _mono(), "level": level, "text": text}
        with self._lock:
            self._stats["notices"].append(text)
        self.writer.write_rows(Chunk.NOTICES, [row])


def _next(prev: int, period: int, now: int) -> int:
    """The next deadline on the grid; skip missed ones instead of bursting to catch up."""
    nxt = prev + period
    return nxt if nxt > now else now + period


def _sentence(err) -> str:
    if isinstance(err, GpuClockError):
        return str(err)
    return f"unexpected {type(err).__name__}: {err}"


def _available(gpus):
    try:
        return gpu_clock_available(gpus)
    except Exception as e:  # a broken cuda-bindings install must not stop a recording
        return False, _sentence(e)


def _identity(g) -> tuple:
    """(CUDA ordinal, n of GPU<n>, bus id or None) of a Device row or a bare ordinal."""
    if isinstance(g, int) or hasattr(g, "__index__"):
        return int(g), int(g), None
    if g.cuda_ordinal is None:
        raise ValueError(f"{g.name} ({g.bus_id}) has no CUDA ordinal: CUDA does not see it")
    return int(g.cuda_ordinal), int(g.number), g.bus_id


def _check_bus(clock, bus):
    """The device CUDA opened must be the one the table names (GpuClockError if not)."""
    from ...store.devices import bus_id
    got = bus_id(clock.info.get("pci_bus_id"))
    if bus and got and got != bus_id(bus):
        raise GpuClockError(f"CUDA device {clock.ordinal} is at {got}, not at {bus}; "
                            "was CUDA_VISIBLE_DEVICES changed?")
    if got:
        clock.info["bus_id"] = got


def _all_ordinals():
    from .cudadriver import init_driver
    return list(range(init_driver()))
