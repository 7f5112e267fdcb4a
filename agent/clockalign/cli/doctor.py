"""clockalign doctor: check, one line each, what recording needs on this host."""
import click

from ..capture.preflight import run_checks
from ..errors import ClockalignError

EPILOG = """\b
Examples:
  sudo clockalign doctor
  sudo clockalign doctor --pid 1234     # also: which libcuda that process uses
"""


@click.command("doctor", epilog=EPILOG)
@click.option("--pid", type=int, help="Check libcuda for this process.")
def command(pid):
    """Check the C helpers, privileges, tracefs, BCC, kernel headers, tracepoints, uprobes,
    libcuda, NVML/DCGM and GPUs; say what to do about each one missing. Exits 1 if a
    requirement is missing."""
    checks = run_checks(pid=pid)
    for c in checks:
        click.echo(c.line())
    missing = [c for c in checks if c.required and not c.ok]
    if missing:
        raise ClockalignError(f"{len(missing)} requirement(s) missing: "
                              f"{', '.join(c.name for c in missing)}", exit_code=1)
    click.echo("ready to record")
