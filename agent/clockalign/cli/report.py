"""clockalign report: what happened in a run, as text tables, report.md and PNG figures."""
import os

import click

from ..errors import TruncatedRun
from ..timeline import Timeline
from .options import output_option, run_file, with_progress

EPILOG = """\b
Examples:
  clockalign report run.ca                      # -> run-report/report.md + *.png
  clockalign report run.ca -o /tmp/r --window 100 --threshold 5
  clockalign report run.ca --bin-ms 50 --lookback-s 60
"""


@click.command("report", epilog=EPILOG)
@run_file
@output_option("Directory for report.md, report.json and the figures (default: FILE "
               "without its extension + '-report').", dest="out_dir",
               type=click.Path(file_okay=False))
@click.option("--window", type=click.IntRange(5), default=50, show_default=True,
              help="Anomalies: points of trailing history each value is judged against.")
@click.option("--threshold", type=click.FloatRange(0, min_open=True), default=4.0,
              show_default=True, help="Anomalies: robust |z| that leaves the normal band.")
@click.option("--bin-ms", type=click.FloatRange(0, min_open=True),
              help="Anomalies: bin width of event signals (default: run length / 1000, "
                   "at least 10 ms).")
@click.option("--lookback-s", type=click.FloatRange(0, min_open=True), default=30.0,
              show_default=True, help="Anomalies: how long before a fault to look.")
def command(file, out_dir, window, threshold, bin_ms, lookback_s):
    """Summarise FILE: alignment per clock domain (band, residuals, skew, steps, uncertainty
    budget), CUDA call latency per function, context-switch jitter (off-CPU time inside
    CUDA calls, preemptions, wakeup latency), connect() per peer, GPU counters, faults with
    their chains, and the signals that left their normal band before each fault.  Prints
    the tables and writes report.md with PNG figures.  Exits 3 when FILE is truncated
    (what was kept is still reported)."""
    from ..report import Options, build_report

    tl = Timeline.open(file)
    out_dir = out_dir or os.path.splitext(file)[0] + "-report"
    opt = Options(window=window, threshold=threshold,
                  bin_ns=int(bin_ms * 1e6) if bin_ms else None,
                  lookback_ns=int(lookback_s * 1e9))
    rep = with_progress(tl, "report", lambda **kw: build_report(tl, out_dir, opt, **kw))
    click.echo(rep.text, nl=False)
    click.echo(f"\nwrote {os.path.join(out_dir, 'report.md')} and {len(rep.files) - 1} more "
               f"file(s) in {out_dir}")
    if tl.truncated:
        raise TruncatedRun(f"{file} is {tl.truncated}; the report covers what was kept")
