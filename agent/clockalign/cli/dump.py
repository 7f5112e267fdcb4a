"""clockalign dump: every event of a run file as one JSON line."""
import json
import sys

import click

from ..errors import TruncatedRun
from ..store.decode import event_dicts
from ..store.reader import RunReader

EPILOG = """\b
Examples:
  clockalign dump run.ca > events.jsonl
  clockalign dump run.ca | jq 'select(.kind=="cuda" and .ret!=0)'
"""


@click.command("dump", epilog=EPILOG)
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("-o", "--output", type=click.File("w"), default="-", help="Output (default stdout).")
def command(file, output):
    """Write each event as a JSON line with kind, t_ns (MONOTONIC), pid, tid and the kind's
    own fields (cuda: fn, ret, dur_ns, args; connect: peer, errno, dur_ns; sched: prev_state,
    off_cpu_ns, wakeup_to_run_ns; xid: code, msg). Exits 3 on a truncated file."""
    r = RunReader(file)
    for batch in r.iter_events():
        for d in event_dicts(batch):
            output.write(json.dumps(d) + "\n")
    output.flush()
    if not r.clean:
        raise TruncatedRun(f"{file} is {r.truncated}; dumped what was kept")
