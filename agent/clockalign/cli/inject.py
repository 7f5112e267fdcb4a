"""clockalign inject: a fault's life cycle per engine, inject -> detect -> recover, recorded."""
import click

from ..inject.faults import FAULTS
from ..inject.run import ENGINES, Plan, inject

EPILOG = """\b
Examples:
  sudo clockalign inject --engine onnxruntime --fault invalid-input -n 20 -o out/
  sudo clockalign inject --engine torch --fault oom --fault illegal-address --load 8 -o out/
  sudo clockalign inject --engine torch --fault timeout --standby 1 -o out/
  sudo clockalign inject --engine v2 --url http://127.0.0.1:8000 --fault invalid-input -o out/
"""


@click.command("inject", epilog=EPILOG)
@click.option("--engine", "engines", multiple=True, required=True, type=click.Choice(ENGINES),
              help="torch / onnxruntime: the reference V2 service with that engine, started "
                   "here; v2: the V2 server at --url (repeatable).")
@click.option("--fault", "faults", multiple=True, required=True,
              type=click.Choice(list(FAULTS)), help="Fault to inject (repeatable).")
@click.option("--url", help="The V2 server for --engine v2 (http://HOST:PORT).")
@click.option("--model", help="Model on the V2 server (default: the first ready one).")
@click.option("-n", "n", type=int, default=20, show_default=True, help="Repetitions.")
@click.option("--standby", type=click.IntRange(0, 8), default=0, show_default=True,
              help="Warm standby workers the reference service keeps (model loaded, CUDA "
                   "context made): a fault switches to one at once, a new one replenishes.")
@click.option("--load", type=click.IntRange(0, 256), default=0,
              help="Background load: this many users (Locust, else a thread pool), loopback only.")
@click.option("--load-generator", type=click.Choice(["auto", "locust", "threads"]),
              default="auto", show_default=True)
@click.option("--port", type=click.IntRange(0, 65535), default=0,
              help="Port of the reference service on 127.0.0.1 (default: any free one).")
@click.option("--deadline-ms", type=click.FloatRange(1, min_open=False), default=1000.0,
              show_default=True, help="The service's watchdog deadline for one inference.")
@click.option("--recovery-deadline", type=click.FloatRange(0, min_open=True), default=2.8,
              show_default=True, help="Seconds from the request to ready again for a pass.")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto",
              show_default=True, help="Where the reference engines run.")
@click.option("--no-export", is_flag=True, help="Do not write Perfetto traces.")
@click.option("-o", "--out-dir", required=True, help="Directory for the outputs.")
def command(engines, faults, url, model, n, standby, load, load_generator, port, deadline_ms,
            recovery_deadline, device, no_export, out_dir):
    """Inject faults into an inference service through real requests, N times each, while
    clockalign records the service and the client; split each repetition into segments
    (request sent, the fault at its source, the error answer, the recovery actions, ready
    again), each boundary with its uncertainty and the source that saw it.

    Writes OUT_DIR/lifecycle.json, lifecycle.md, lifecycle.png and, per engine x fault,
    a run file, its Perfetto trace and the repetitions' stamps.  Rows already in
    OUT_DIR/lifecycle.json for other engine x fault pairs are kept."""
    r = inject(Plan(engines=list(engines), faults=list(faults), out_dir=out_dir, n=n, url=url,
                    model=model, port=port, load=load, load_generator=load_generator,
                    standby=standby,
                    deadline_ms=deadline_ms, recovery_deadline_ms=recovery_deadline * 1000,
                    device=device, export=not no_export))
    for row in r["rows"]:
        t = row["total_ms"]
        total = (f"total p50 {t['p50']} ms, p99 {t['p99']} ms" if row["n"]
                 else "no repetition recovered from the fault")
        click.echo(f"{row['engine']} {row['fault']}: n={row['n']}, {total}: "
                   f"{'pass' if row['pass'] else 'FAIL'}")
    for note in r["notes"]:
        click.echo(f"note: {note}", err=True)
    click.echo(f"wrote {r['paths']['md']}, {r['paths']['json']}, {r['paths']['png']}")
