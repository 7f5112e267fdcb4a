"""Test support: a run file copied chunk by chunk into another format version."""
from clockalign.store.reader import RunReader
from clockalign.store.schema import Chunk
from clockalign.store.writer import RunWriter


def copy_run(src, dst, version=2) -> RunReader:
    """Rewrite src as dst in format ``version``, chunk for chunk; a clean source gets its
    trailer again, a truncated one stays without.  Returns the source's reader."""
    r = RunReader(src)
    w = RunWriter(dst, r.meta, format_version=version)
    for ctype, payload in r.iter_chunks():
        if ctype == Chunk.TRAILER:
            continue
        if "rows" in payload:
            w.write_rows(ctype, payload["rows"])
        else:
            w.write_columns(ctype, r.decode_payload(payload))
    if r.clean:
        w.close({k: v for k, v in r.trailer.items() if k != "chunks"})
    else:
        w.flush()
    return r
