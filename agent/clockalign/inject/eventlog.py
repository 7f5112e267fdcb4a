"""The service's own log of what it did, one JSON line per event, stamped with
time.monotonic_ns() (CLOCK_MONOTONIC: the recording's clock), appended by the service and
its workers with one write() each, so lines from several processes never interleave.

These stamps are where the recording cannot see inside a process (a validation that
rejected a request, an engine call that raised, the moment the service turned ready);
segments.py prefers a kernel-stamped event where one exists and names the source it used.

    log = EventLog(path); log.emit("watchdog_fired", worker=1234)
    rows = read_events(path)     # [{"t_ns", "ev", "pid", "tid", ...}] in time order
"""
import json
import os
import threading
import time


class EventLog:
    def __init__(self, path):
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600) if path else None

    def emit(self, ev: str, t_ns: int = None, **fields) -> int:
        t = time.monotonic_ns() if t_ns is None else t_ns
        if self.fd is not None:
            row = {"t_ns": t, "ev": ev, "pid": os.getpid(), "tid": threading.get_native_id(),
                   **fields}
            os.write(self.fd, (json.dumps(row) + "\n").encode())
        return t

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def read_events(path) -> list:
    """Rows of an event log in time order; a torn last line (a killed writer) is skipped."""
    rows = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    continue
    except FileNotFoundError:
        return []
    rows.sort(key=lambda r: r["t_ns"])
    return rows


def name_thread(name: str) -> None:
    """Set this thread's kernel name (comm), so the recording shows it (task_rename)."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(15, name.encode()[:15], 0, 0, 0)        # PR_SET_NAME
    except (OSError, AttributeError):
        pass


def die_with_parent(sig: int) -> None:
    """Ask the kernel to send ``sig`` when the thread that started us exits (PR_SET_PDEATHSIG),
    so no child of an interrupted session outlives it."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, sig, 0, 0, 0)
    except (OSError, AttributeError):
        pass
