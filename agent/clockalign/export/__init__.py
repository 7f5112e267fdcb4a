"""clockalign.export: a run as a trace for Perfetto UI / chrome://tracing, streamed.

    from clockalign.timeline import Timeline
    from clockalign.export import export_run
    stats = export_run(Timeline.open("run.ca"), "run.pftrace", "perfetto")   # or "chrome-json"

pipeline.py is the one driver (pipeline.export), the same steps for every format, through a
writer per format: perfetto.py's PerfettoWriter, native protobuf with Perfetto's own trace
protos (gpu_tracks.py its GPU executions); chrome_json.py's JsonWriter, the Trace Event
Format (gpu_json.py its GPU executions, jsonrows.py the row matrices both build on).
model.py decides what each event shows, as rows (rows.py) on tracks (tracks.py) kept in
order by overflow lanes (lanes.py); clocks.py gives the clock snapshot and GPU clock bands; window.py the part of a run to
write (export --from/--to/--pid/--kind).
"""
import os

from ..errors import ClockalignError
from ..store.writer import open_private

FORMATS = ("perfetto", "chrome-json")
EXTENSIONS = {"perfetto": ".pftrace", "chrome-json": ".json"}


def export_run(tl, out, fmt: str = "perfetto", progress=None, select=None) -> dict:
    """Write the run behind Timeline ``tl`` to path ``out``; returns what was written.
    ``select``: window.Selection, the part of the run to write (None: all of it)."""
    if fmt not in FORMATS:
        raise ClockalignError(f"unknown export format {fmt!r}; choose one of {', '.join(FORMATS)}")
    from .pipeline import export
    if fmt == "perfetto":
        from .perfetto import PerfettoWriter as Writer
    else:
        from .chrome_json import JsonWriter as Writer
    tmp = f"{out}.partial"
    try:
        with open_private(tmp, "wb") as f:        # 0600, the sudo user's: like the run file
            stats = export(tl, Writer(f), progress=progress, select=select)
        os.replace(tmp, out)
    except OSError as e:
        raise ClockalignError(f"cannot write {out}: {e.strerror or e}") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    stats["path"] = os.fspath(out)
    stats["format"] = fmt
    return stats
