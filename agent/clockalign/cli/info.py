"""clockalign info: what a run file holds, and whether it ended cleanly."""
import click

from ..errors import TruncatedRun
from ..report.run_info import info_lines
from ..store.reader import RunReader
from .options import run_file

EPILOG = """\b
Examples:
  clockalign info run.ca
"""


@click.command("info", epilog=EPILOG)
@run_file
def command(file):
    """Duration, events per kind, drops, clean or truncated, clocks and targets of FILE.
    Exits 3 when the file is truncated (what was kept is still shown)."""
    r = RunReader(file)
    for line in info_lines(r, file):
        click.echo(line)
    if not r.clean:
        raise TruncatedRun(f"{file} is {r.truncated}; shown is what was kept")
