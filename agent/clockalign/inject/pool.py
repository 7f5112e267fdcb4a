"""The engine workers behind the reference service: the one that serves, N warm standbys
(--standby N: started, model loaded, one canary inference run, so on a GPU the CUDA context
is made), a supervisor thread per worker that starts a new one whenever its worker exits,
and the watchdog.

    pool = Pool("onnxruntime", "auto", 1000.0, log, 64.0, standby=1)
    status, body = pool.infer(points, steps)        # (200, {...}) or (5xx, {"error": ...})

The service is ready while a healthy worker serves (``pool.ready``).  When the serving
worker faults (the watchdog fires, it reports a sticky error or an out-of-memory it is
recovering from, it exits) requests go at once to a ready standby ("switch" in the event
log) and the service stays ready; with none ready it is not ready ("not_ready") until a
worker is.  A faulted worker's supervisor starts its replacement, which joins as a standby
("standby_ready": the pool replenished); a worker that recovered by itself (out of memory:
freed, canary) joins as a standby too.  Without standbys this is the one-worker service:
the fault makes it not ready until the restarted worker is ready.
"""
import itertools
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection

from . import model
from .eventlog import name_thread

MODEL = "pointset"
MAX_START_FAILURES = 3


class Slot:
    """One place in the pool: the worker process now in it and whether it is healthy (said
    ready and has not faulted since)."""

    def __init__(self, index):
        self.index = index
        self.proc = self.conn = None
        self.healthy = False

    @property
    def pid(self):
        return self.proc.pid if self.proc is not None else None


class Pool:
    """The workers, their supervisors and the watchdog.  One request is in an engine at a
    time; the others wait for it (or get 503 while no worker is ready)."""

    def __init__(self, engine, device, deadline_ms, log, max_memory_gib, standby=0):
        self.engine, self.device, self.log = engine, device, log
        self.deadline_ns = int(deadline_ms * 1e6)
        self.max_memory_gib = max_memory_gib
        self.standby = standby
        self.ready = threading.Event()   # a healthy worker serves
        self.failed = None               # why a worker could not start
        self.gave_up = False
        self.info = {}
        self.stopping = False
        self.slots = [Slot(i) for i in range(1 + standby)]
        self.active = None               # the slot that serves; None: no healthy worker
        self.route = threading.Lock()    # guards active and the slots' health
        self.lock = threading.Lock()     # one request in an engine
        self.cond = threading.Condition()
        self.inflight = None             # (rid, deadline_ns, pid) while an engine works
        self.reply = None
        self.replied = threading.Event()
        self.timed_out = set()
        self.ids = itertools.count(1)
        self.threads = [threading.Thread(target=self._supervise, args=(s,),
                                         name=_supervisor_name(s), daemon=True)
                        for s in self.slots]
        self.threads.append(threading.Thread(target=self._watch, name="ca-watchdog",
                                             daemon=True))
        for t in self.threads:
            t.start()

    def params(self) -> dict:
        """The model metadata's parameters about the pool (none without standbys)."""
        if not self.standby:
            return {}
        with self.route:
            return {"standby": self.standby, "standby_ready": self._standbys()}

    # ------------------------------------------------------------ routing
    def _standbys(self) -> int:
        return sum(1 for s in self.slots if s.healthy and s is not self.active)

    def _healthy(self, slot):
        with self.route:
            slot.healthy = True
            if self.active is None:
                self.active = slot
                self.log.emit("ready", worker=slot.pid)
                self.ready.set()
            else:
                self.log.emit("standby_ready", worker=slot.pid, standbys=self._standbys())

    def _fault(self, slot, why):
        """``slot``'s worker can serve no more: a healthy standby takes over, else the
        service is not ready.  why: None for an exit (already reported when it follows a
        fault)."""
        with self.route:
            slot.healthy = False
            if self.active is not slot:
                return
            spare = next((s for s in self.slots if s.healthy), None)
            self.active = spare
            if spare is None:
                self.ready.clear()
                self.log.emit("not_ready", why=why or "worker exit")
            else:
                self.log.emit("switch", worker=spare.pid, old=slot.pid,
                              why=why or "worker exit", standbys=self._standbys())

    # ------------------------------------------------------------ supervisors
    def _spawn(self):
        mine, theirs = socket.socketpair()
        cmd = [sys.executable, "-m", "clockalign.inject.worker", "--fd", str(theirs.fileno()),
               "--engine", self.engine, "--device", self.device,
               "--max-memory-gib", str(self.max_memory_gib)]
        if self.log.path:
            cmd += ["--events", self.log.path]
        # its own process group: a Ctrl-C at the terminal is the service's to act on
        proc = subprocess.Popen(cmd, pass_fds=[theirs.fileno()], start_new_session=True)
        theirs.close()
        self.log.emit("worker_spawn", worker=proc.pid)
        return proc, Connection(os.dup(mine.fileno())), mine

    def _supervise(self, slot):
        name_thread(_supervisor_name(slot))
        failures = 0                      # workers in a row that died before being ready
        while not self.stopping:
            slot.proc, slot.conn, sock = self._spawn()
            proc, was_ready = slot.proc, False
            while True:
                try:
                    msg = slot.conn.recv()
                except (EOFError, OSError):
                    break
                if msg[0] == "ready":
                    if len(msg) > 1:
                        self.info = {"device": msg[1], "engine_version": msg[2]}
                    self._healthy(slot)
                    was_ready = True
                elif msg[0] == "failed":
                    self.failed = msg[1]
                elif msg[0] in ("ok", "error"):
                    if msg[0] == "error" and msg[4]:    # the worker is recovering
                        self._fault(slot, msg[2])
                    self._answer(msg, proc.pid)
            self._fault(slot, None)
            code = proc.wait()
            self.log.emit("worker_exit", worker=proc.pid, code=code)
            slot.conn.close()
            sock.close()
            self._answer(("gone", None, code), proc.pid)
            failures = 0 if was_ready else failures + 1
            if failures and (not self.info or failures >= MAX_START_FAILURES):
                self.log.emit("service_gives_up", why=self.failed or f"worker status {code}")
                self.gave_up = True
                os.kill(os.getpid(), signal.SIGTERM)   # never started, or cannot any more
                return
            if not self.stopping:
                if failures:
                    time.sleep(1.0)
                self.log.emit("restart")

    def _answer(self, msg, pid):
        """Hand ``msg`` from worker ``pid`` to the request waiting for that worker."""
        with self.cond:
            if self.inflight is None or self.inflight[2] != pid:
                return
            self.inflight = None
            self.reply = msg
            self.replied.set()
            self.cond.notify_all()

    # ------------------------------------------------------------ watchdog
    def _watch(self):
        name_thread("ca-watchdog")
        with self.cond:
            while not self.stopping:
                if self.inflight is None:
                    self.cond.wait()
                    continue
                rid, deadline, pid = self.inflight
                if deadline is None:
                    self.cond.wait()
                    continue
                left = deadline - time.monotonic_ns()
                if left > 0:
                    self.cond.wait(left / 1e9)
                    continue
                self.log.emit("watchdog_fired", worker=pid, rid=rid)
                self.timed_out.add(rid)
                slot = next((s for s in self.slots if s.pid == pid), None)
                if slot is not None:
                    self._fault(slot, "watchdog")
                self.inflight = (rid, None, pid)       # once per request
                try:
                    os.kill(pid, signal.SIGKILL)
                    self.log.emit("kill_sent", worker=pid)
                except ProcessLookupError:
                    pass

    # ------------------------------------------------------------ requests
    def infer(self, points, steps):
        """-> (HTTP status, body dict)."""
        with self.lock:
            with self.route:
                slot = self.active
                pid, conn = (slot.pid, slot.conn) if slot is not None else (None, None)
            if slot is None or not self.ready.is_set():
                return 503, {"error": "model is not ready (worker restarting)"}
            rid = next(self.ids)
            with self.cond:
                self.replied.clear()
                self.inflight = (rid, time.monotonic_ns() + self.deadline_ns, pid)
                self.cond.notify_all()
            try:
                conn.send(("infer", rid, points, steps))
            except OSError:          # it exited before it could be asked
                self._answer(("gone", None, None), pid)
            self.replied.wait()
            msg = self.reply
        if rid in self.timed_out:
            self.timed_out.discard(rid)
            return 504, {"error": f"inference ran past the {self.deadline_ns / 1e6:.0f} ms "
                                  "deadline: the watchdog killed the worker; it is restarting"}
        if msg[0] == "ok":
            return 200, {"model_name": MODEL, "outputs": [
                {"name": model.OUTPUT, "datatype": "FP32", "shape": list(msg[2].shape),
                 "data": msg[2].ravel().tolist()}]}
        if msg[0] == "gone":
            return 500, {"error": f"the worker exited (status {msg[2]}) during inference; "
                                  "it is restarting"}
        status = {"oom": 507, "sticky": 500}.get(msg[2], 400)
        return status, {"error": f"{msg[2]}: {msg[3]}"}

    def stop(self):
        self.stopping = True
        self.ready.clear()
        with self.cond:
            self.cond.notify_all()
        for s in self.slots:
            if s.proc is not None and s.proc.poll() is None:
                s.proc.terminate()
        for s in self.slots:
            if s.proc is None:
                continue
            try:
                s.proc.wait(5)
            except subprocess.TimeoutExpired:
                s.proc.kill()
                s.proc.wait()


def _supervisor_name(slot) -> str:
    return "ca-supervisor" if slot.index == 0 else f"ca-supervisor-{slot.index}"
