"""clockalign export: a run as a trace for ui.perfetto.dev or chrome://tracing."""
import os
import sys

import click

from ..errors import TruncatedRun
from ..export import EXTENSIONS, FORMATS, export_run
from ..timeline import Timeline

EPILOG = """\b
Examples:
  clockalign export run.ca                          # -> run.pftrace (open in ui.perfetto.dev)
  clockalign export run.ca -o /tmp/x.json --format chrome-json
  cat run.pftrace system.pftrace > merged.pftrace   # merges: the trace has a clock snapshot
"""


def progress_bar(tl, label):
    """A click progress bar on stderr when it is a terminal, else None; counts events."""
    if not sys.stderr.isatty():
        return None
    counts = ((tl.reader.trailer or {}).get("counts") or {})
    total = sum(v for v in counts.values() if isinstance(v, int))
    if not total:          # truncated run: about 128 bytes of run file per event
        total = max(1, tl.reader.size // 140)
    return click.progressbar(length=total, label=label, file=sys.stderr)


@click.command("export", epilog=EPILOG)
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("-o", "--output", type=click.Path(dir_okay=False),
              help="Output path (default: FILE with .pftrace or .json).")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="perfetto",
              show_default=True, help="Native Perfetto protobuf, or Chrome JSON.")
def command(file, output, fmt):
    """Write FILE as a trace: CUDA calls, off-CPU intervals (preempted vs blocked),
    connect() calls, GPU counters and faults with flows to what followed them, all on
    CLOCK_MONOTONIC, with a clock snapshot so the trace merges with a Perfetto system trace.
    Streams: memory stays bounded whatever the run's size.  Exits 3 when FILE is
    truncated (what was kept is still exported)."""
    tl = Timeline.open(file)
    out = output or os.path.splitext(file)[0] + EXTENSIONS[fmt]
    bar = progress_bar(tl, f"export {os.path.basename(out)}")
    if bar is not None:
        with bar:
            stats = export_run(tl, out, fmt, progress=bar.update)
    else:
        stats = export_run(tl, out, fmt)
    n = sum(stats["events"].values())
    click.echo(f"wrote {out}: {n:,} events on {stats['tracks']} tracks, {stats['faults']} faults, "
               f"{stats['counters']:,} counter samples ({stats['bytes'] / 1e6:.1f} MB, {fmt})")
    if tl.truncated:
        raise TruncatedRun(f"{file} is {tl.truncated}; the trace holds what was kept")
