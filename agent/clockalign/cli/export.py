"""clockalign export: a run as a trace for ui.perfetto.dev or chrome://tracing."""
import os

import click

from ..errors import TruncatedRun
from ..export import EXTENSIONS, FORMATS, export_run
from ..export.window import KIND_CHOICES, Selection
from ..timeline import Timeline
from .options import output_option, run_file, with_progress

EPILOG = """\b
Examples:
  clockalign export run.ca                          # -> run.pftrace (open in ui.perfetto.dev)
  clockalign export run.ca -o /tmp/x.json --format chrome-json
  clockalign export run.ca --from 12.5 --to 14      # 1.5 s of it, seconds since the start
  clockalign export run.ca --from 123456789012ns --pid 4242 --kind cuda --kind gpu_kernel
  cat run.pftrace system.pftrace > merged.pftrace   # merges: the trace has a clock snapshot
"""


@click.command("export", epilog=EPILOG)
@run_file
@output_option("Output path (default: FILE with .pftrace or .json).",
               type=click.Path(dir_okay=False))
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="perfetto",
              show_default=True, help="Native Perfetto protobuf, or Chrome JSON.")
@click.option("--from", "start", metavar="T",
              help="Start of the window: seconds since the run's start (12.5), or a "
                   "CLOCK_MONOTONIC time in ns (123456789012ns).")
@click.option("--to", "end", metavar="T", help="End of the window (excluded), as --from.")
@click.option("--pid", "pids", type=int, multiple=True, metavar="PID",
              help="Only this process's events (repeatable).")
@click.option("--kind", "kinds", multiple=True, metavar="KIND",
              help=f"Only these kinds (repeatable): {', '.join(KIND_CHOICES)}.")
def command(file, output, fmt, start, end, pids, kinds):
    """Write FILE as a trace: CUDA calls, off-CPU intervals (preempted vs blocked),
    connect() calls, GPU counters and faults with flows to what followed them, GPU kernels,
    copies and memsets of a --gpu-activity run (one track per GPU stream, a flow from each
    launch call), all on
    CLOCK_MONOTONIC, with a clock snapshot so the trace merges with a Perfetto system trace.
    Streams: memory stays bounded whatever the run's size.  Exits 3 when FILE is
    truncated (what was kept is still exported).  --from/--to/--pid/--kind write part of the
    run: slices overlapping the window are kept whole, flows only with both ends written,
    counters only without --pid (or with --kind counters); see export/window.py."""
    tl = Timeline.open(file)
    select = Selection.parse(tl, start, end, pids, kinds)
    out = output or os.path.splitext(file)[0] + EXTENSIONS[fmt]
    stats = with_progress(tl, f"export {os.path.basename(out)}",
                          lambda **kw: export_run(tl, out, fmt, select=select, **kw))
    n = sum(stats["events"].values())
    click.echo(f"wrote {out}: {n:,} events on {stats['tracks']} tracks, {stats['faults']} faults, "
               f"{stats['counters']:,} counter samples"
               + (f", {stats['gpu_activity']:,} GPU executions ({stats['gpu_flows']:,} with a flow "
                  "from their launch)" if stats.get("gpu_activity") else "")
               + f" ({stats['bytes'] / 1e6:.1f} MB, {fmt})")
    if tl.truncated:
        raise TruncatedRun(f"{file} is {tl.truncated}; the trace holds what was kept")
