"""clockalign dump: every event of a run file as one JSON line."""
import contextlib
import json
import sys

import click

from ..errors import ClockalignError, TruncatedRun
from ..store.devices import Devices
from ..store.kinds import event_dicts
from ..store.reader import RunReader
from ..store.schema import Chunk
from ..store.writer import check_output, open_private
from .options import output_option, run_file

EPILOG = """\b
Examples:
  clockalign dump run.ca > events.jsonl
  clockalign dump run.ca | jq 'select(.kind=="cuda" and .ret!=0)'
"""


@click.command("dump", epilog=EPILOG)
@run_file
@output_option("Output (default stdout); created 0600.", default="-")
def command(file, output):
    """Write each event as a JSON line with kind, t_ns (MONOTONIC), pid, tid and the kind's
    own fields (store/kinds.py; cuda: fn, ret, dur_ns, args; cuda_entry, a call recorded at
    its entry only: fn, args, entry_only; connect: peer, errno, dur_ns; sched: prev_state,
    off_cpu_ns, wakeup_to_run_ns; xid: code, dev, msg, msg_whole, and gpu (GPU0) and bus_id
    where the device is in the run's table), then the GPU activity of a --gpu-activity run
    (gpu_kernel, gpu_copy, gpu_memset: t_ns, end_ns and unc_ns mapped from the GPU's clock,
    device, stream, name, grid/block or bytes, and the launching call's tid and t_ns).
    Exits 3 on a truncated file."""
    r = RunReader(file)
    devices = Devices.from_meta(r.meta)   # the header only: a damaged chunk changes no line
    if output == "-":
        out = sys.stdout
    else:
        check_output(output, force=True, what="dump output")
        out = open_private(output, "w")
    try:
        with contextlib.nullcontext(out) if out is sys.stdout else out:
            for batch in r.iter_events():
                out.writelines(json.dumps(d) + "\n"
                               for d in event_dicts(batch, xid_messages=r.xid_messages,
                                                    devices=devices))
            if Chunk.GPU_ACTIVITY in r.chunk_types():
                from ..timeline import Timeline
                from ..timeline.gpu_activity import activity_dicts
                acts = Timeline(r).gpu_activity()
                out.writelines(json.dumps(d) + "\n" for d in activity_dicts(acts))
                for n in acts.notes:
                    click.echo(f"clockalign: {n}", err=True)
            out.flush()
    except BrokenPipeError:
        raise                     # the reader left (dump | head): main exits 0
    except OSError as e:
        raise ClockalignError(f"cannot write {output}: {e.strerror or e}") from None
    if not r.clean:
        raise TruncatedRun(f"{file} is {r.truncated}; dumped what was kept")
