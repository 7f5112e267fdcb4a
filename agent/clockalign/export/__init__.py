"""clockalign.export: a run as a trace for Perfetto UI / chrome://tracing, streamed.

    from clockalign.timeline import Timeline
    from clockalign.export import export_run
    stats = export_run(Timeline.open("run.ca"), "run.pftrace", "perfetto")   # or "chrome-json"

perfetto.py writes native protobuf with Perfetto's own trace protos; chrome_json.py the
Trace Event Format; for both, model.py decides what each event shows, as rows (rows.py) on
tracks (tracks.py) kept in order by overflow lanes (lanes.py), and pipeline.py drives a
writer over the batches.
"""
import os

from ..errors import ClockalignError
from ..store.writer import open_private

FORMATS = ("perfetto", "chrome-json")
EXTENSIONS = {"perfetto": ".pftrace", "chrome-json": ".json"}


def export_run(tl, out, fmt: str = "perfetto", progress=None) -> dict:
    """Write the run behind Timeline ``tl`` to path ``out``; returns what was written."""
    if fmt not in FORMATS:
        raise ClockalignError(f"unknown export format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if fmt == "perfetto":
        from .perfetto import write_perfetto as write
    else:
        from .chrome_json import write_chrome_json as write
    tmp = f"{out}.partial"
    try:
        with open_private(tmp, "wb") as f:        # 0600, the sudo user's: like the run file
            stats = write(tl, f, progress=progress)
        os.replace(tmp, out)
    except OSError as e:
        raise ClockalignError(f"cannot write {out}: {e.strerror or e}") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    stats["path"] = os.fspath(out)
    stats["format"] = fmt
    return stats
