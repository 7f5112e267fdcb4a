"""clockalign faults: every fault of a run in time order, with what followed each one."""
import json

import click

from ..errors import TruncatedRun
from ..report.fault_list import document, render
from ..timeline import Timeline
from .options import json_flag, run_file

EPILOG = """\b
Examples:
  clockalign faults run.ca
  clockalign faults run.ca --json | jq '.faults[] | select(.kind == "xid")'
"""


@click.command("faults", epilog=EPILOG)
@run_file
@json_flag("One JSON document instead of text.")
@click.option("--deadline", type=float, default=2.8, show_default=True,
              help="Seconds a service may take from a fault to healthy again (0: don't judge).")
def command(file, as_json, deadline):
    """List the faults of FILE in time order: CUDA errors (sticky ones grouped under the
    first), Xids (one fault per Xid, whichever sources saw it), failed connect() calls,
    fatal signals, non-zero exits and GPU power/thermal capping, each with its time on
    MONOTONIC ± uncertainty, the process and thread, and its chain: retries, later errors,
    the next successful call and the recovery time, judged against --deadline (the time
    from the fault to the first successful call after its last error).  Exits 3 when FILE is truncated (the
    faults found in what was kept are still listed)."""
    tl = Timeline.open(file)
    faults = tl.faults()
    deadline_ns = int(deadline * 1e9) if deadline > 0 else None
    if as_json:
        click.echo(json.dumps(document(tl, faults, deadline_ns), indent=1))
    else:
        for line in render(tl, faults, deadline_ns):
            click.echo(line)
        for n in tl.notes:
            click.echo(f"note: {n}")
    if tl.truncated:
        raise TruncatedRun(f"{file} is {tl.truncated}; the faults listed are from what was kept")
