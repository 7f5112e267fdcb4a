"""clockalign dump: every event of a run file as one JSON line."""
import json
import sys

import click

from ..errors import ClockalignError, TruncatedRun
from ..store.decode import event_dicts
from ..store.reader import RunReader
from ..store.writer import check_output, open_private

EPILOG = """\b
Examples:
  clockalign dump run.ca > events.jsonl
  clockalign dump run.ca | jq 'select(.kind=="cuda" and .ret!=0)'
"""


@click.command("dump", epilog=EPILOG)
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("-o", "--output", default="-", help="Output (default stdout); created 0600.")
def command(file, output):
    """Write each event as a JSON line with kind, t_ns (MONOTONIC), pid, tid and the kind's
    own fields (cuda: fn, ret, dur_ns, args; connect: peer, errno, dur_ns; sched: prev_state,
    off_cpu_ns, wakeup_to_run_ns; xid: code, dev, msg, msg_whole). Exits 3 on a truncated file."""
    r = RunReader(file)
    if output == "-":
        out = sys.stdout
    else:
        check_output(output, force=True, what="dump output")
        out = open_private(output, "w")
    try:
        for batch in r.iter_events():
            out.writelines(json.dumps(d) + "\n" for d in event_dicts(batch, xid_messages=r.xid_messages))
        out.flush()
    except OSError as e:
        if isinstance(e, BrokenPipeError):
            raise
        raise ClockalignError(f"cannot write {output}: {e.strerror or e}") from None
    finally:
        if out is not sys.stdout:
            try:
                out.close()
            except OSError:
                pass
    if not r.clean:
        raise TruncatedRun(f"{file} is {r.truncated}; dumped what was kept")
