"""Where a recording's chunks go: the run file, and any sinks that consume them live.

The recorder, its clock probe and its counter sampler all write through one writer; a
ChunkTee hands every chunk to each sink (``clockalign watch`` aggregates them into
Prometheus metrics) and to the run file, or to no file at all.  A sink has
``open(meta)``, ``write_columns(ctype, cols)``, ``write_rows(ctype, rows)`` and
``close(trailer)``; it is called from several threads and must lock for itself.

    writer = open_writer("run.ca" or None, meta, sinks=[aggregator])
"""
from ...store.writer import RunWriter


class ChunkTee:
    """A RunWriter's interface over an optional run file and a list of sinks."""

    def __init__(self, writer, sinks, meta):
        self.file = writer
        self.sinks = list(sinks)
        for s in self.sinks:
            s.open(meta)

    @property
    def size(self) -> int:
        return self.file.size if self.file else 0

    def write_columns(self, ctype: int, cols: dict) -> None:
        for s in self.sinks:
            s.write_columns(ctype, cols)
        if self.file:
            self.file.write_columns(ctype, cols)

    def write_records(self, ctype: int, rows) -> None:
        """A structured array (the recorder's event batches): sinks get its fields as
        columns (views, no copy), the run file the array itself."""
        cols = {name: rows[name] for name in rows.dtype.names}
        for s in self.sinks:
            s.write_columns(ctype, cols)
        if self.file:
            self.file.write_records(ctype, rows)

    def write_rows(self, ctype: int, rows: list) -> None:
        for s in self.sinks:
            s.write_rows(ctype, rows)
        if self.file:
            self.file.write_rows(ctype, rows)

    def flush(self) -> None:
        if self.file:
            self.file.flush()

    def close(self, trailer: dict = None) -> None:
        try:
            if self.file:
                self.file.close(trailer)
        finally:
            for s in self.sinks:
                s.close(trailer)

    def status_text(self) -> str:
        return "  ".join(t for t in (getattr(s, "status_text", lambda: "")() for s in self.sinks)
                         if t)


def open_writer(path, meta: dict, sinks=()):
    """The recorder's writer: a RunWriter when there are no sinks, else a ChunkTee over the
    run file (None: no file) and the sinks."""
    if not sinks:
        return RunWriter(path, meta)
    return ChunkTee(RunWriter(path, meta) if path is not None else None, sinks, meta)
