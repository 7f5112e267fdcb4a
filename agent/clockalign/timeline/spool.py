"""The events of one pass, decoded, kept in a temporary file for the passes after it.

A command that reads the events twice (export: the fault chains and thread names before
its first row, then every row) would otherwise decompress every chunk twice.  The first
full pass writes each chunk's decoded events (EVENT_DTYPE, XID_MSG parts taken out) to an
unlinked temporary file; a later pass reads them back, a chunk at a time, which is a plain
read instead of zstd and the byte-plane transposes.  Memory stays a chunk; the file costs
the events' size on disk (EVENT_DTYPE.itemsize bytes an event), so it is only made where
that is at most half the free space of its directory (else the chunks are decoded again).

    sp = EventSpool(directory, rows)         # rows: how many events the run holds
    if sp.begin(): ...sp.add(ev) per chunk...; sp.finish()   (or sp.abandon())
    for i, ev in sp.chunks(want): ...        # once finished
"""
import os
import shutil
import tempfile

import numpy as np

from ..store.schema import EVENT_DTYPE


class EventSpool:
    def __init__(self, directory=None, rows: int = 0):
        self.directory = directory or tempfile.gettempdir()
        self.rows = rows
        self.f = None
        self.index = []          # (offset, rows) per EVENTS chunk, in file order
        self.state = "idle"      # idle -> writing -> done; "off": not made
        self.reads = 0           # chunks read back

    def begin(self) -> bool:
        """Start writing (a full pass begins); False when it is written already, being
        written by an enclosing pass, or cannot be made (no room, no directory)."""
        if self.state != "idle":
            return False
        try:
            free = shutil.disk_usage(self.directory).free
            if self.rows * EVENT_DTYPE.itemsize > free // 2:
                self.state = "off"
                return False
            self.f = tempfile.TemporaryFile(prefix="clockalign-events-", dir=self.directory)
        except OSError:
            self.state = "off"
            return False
        self.index, self.state = [], "writing"
        return True

    def add(self, ev: np.ndarray):
        ev = np.ascontiguousarray(ev, dtype=EVENT_DTYPE)
        self.index.append((self.f.tell(), len(ev)))
        try:
            self.f.write(ev.data)
        except OSError:            # the disk filled after all: decode again instead
            self.abandon()
            self.state = "off"

    def writing(self) -> bool:
        return self.state == "writing"

    def finish(self):
        if self.state == "writing":
            self.f.flush()
            self.state = "done"

    def abandon(self):
        """A pass left early: what it wrote is dropped (a later pass starts again)."""
        if self.f is not None:
            self.f.close()
            self.f = None
        if self.state == "writing":
            self.state = "idle"

    @property
    def done(self) -> bool:
        return self.state == "done"

    def chunks(self, want=None):
        """(i, EVENT_DTYPE array) of each chunk, in file order; ``want(i)`` asked first
        can skip it."""
        for i, (off, n) in enumerate(self.index):
            if want is not None and not want(i):
                continue
            out = np.empty(n, dtype=EVENT_DTYPE)
            self.f.seek(off)
            if self.f.readinto(out.data) != out.nbytes:
                raise OSError(f"the events spool in {self.directory} was cut short")
            self.reads += 1
            yield i, out

    def close(self):
        self.abandon()
        self.state = "off"


def spool_dir(f):
    """The directory of an open output file (where the spool should go: a disk the
    export writes to anyway, not a /tmp that may be memory), or None."""
    name = getattr(f, "name", None)
    return os.path.dirname(os.path.abspath(name)) if isinstance(name, str) else None
