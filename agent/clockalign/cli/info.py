"""clockalign info: what a run file holds, and whether it ended cleanly."""
import datetime

import click

from ..errors import TruncatedRun
from ..store.reader import RunReader
from ..store.schema import KIND_NAMES, Chunk

EPILOG = """\b
Examples:
  clockalign info run.ca
"""


@click.command("info", epilog=EPILOG)
@click.argument("file", type=click.Path(dir_okay=False))
def command(file):
    """Duration, events per kind, drops, clean or truncated, clocks and targets of FILE.
    Exits 3 when the file is truncated (what was kept is still shown)."""
    r = RunReader(file)
    m = r.meta
    ev = r.columns(Chunk.EVENTS)
    kinds = ev.get("kind")
    ts = ev.get("ts")
    start = m.get("clocks", {}).get("MONOTONIC")
    end = (r.trailer or {}).get("t_ns")
    if end is None and ts is not None and len(ts):
        end = int(ts.max())
    real = m.get("clocks", {}).get("REALTIME")
    when = datetime.datetime.fromtimestamp(real / 1e9, datetime.timezone.utc).isoformat() \
        if real else "?"
    click.echo(f"file      {file} ({r.size} bytes, format v{r.version}, {r.chunk_count} chunks)")
    click.echo(f"state     {'clean' if r.clean else r.truncated}")
    click.echo(f"host      {m.get('host')}  kernel {m.get('kernel')}  driver {m.get('driver')}")
    click.echo(f"started   {when}  mode {m.get('mode')}")
    if start is not None and end is not None:
        click.echo(f"duration  {(end - start) / 1e9:.3f} s")
    for t in m.get("targets", []):
        click.echo(f"target    pid {t['pid']}: {' '.join(t.get('cmdline') or [])[:100]}"
                   f"  libcuda {t.get('libcuda')}")
    for g in m.get("gpus", []):
        click.echo(f"gpu       {g.get('index')}: {g.get('name')} {g.get('uuid', '')}")
    clocks = m.get("clocks", {})
    click.echo("clocks    " + "  ".join(f"{k}={v}" for k, v in clocks.items()))
    if kinds is not None and len(kinds):
        import numpy as np
        counts = np.bincount(kinds.astype(np.int64))
        click.echo("events    " + ", ".join(f"{KIND_NAMES.get(k, k)} {n}"
                                            for k, n in enumerate(counts) if n))
    else:
        click.echo("events    none")
    other = {Chunk(c).name.lower(): n for c in r.chunk_types() if c != Chunk.EVENTS
             for n in [sum(len(x) for x in r.columns(c).values()) // max(1, len(r.columns(c)))
                       if c in (Chunk.CPU_CLOCK, Chunk.GPU_CLOCK, Chunk.COUNTERS)
                       else len(r.rows(c))]}
    if other:
        click.echo("records   " + ", ".join(f"{k} {v}" for k, v in other.items()))
    if r.trailer:
        drops = r.trailer.get("drops") or {}
        click.echo(f"drops     {sum(drops.values())}" +
                   (" (" + ", ".join(f"{k} {v}" for k, v in drops.items()) + ")" if drops else ""))
        click.echo(f"stopped   {r.trailer.get('reason')}")
        helpers = r.trailer.get("helpers") or {}
        c = helpers.get("counters")
        if c and "samples" in c:
            click.echo(f"counters  {c.get('backend', '?')}: {c['samples']} samples every "
                       f"{c.get('interval_s', '?')} s, {c.get('missed_deadlines', 0)} missed "
                       f"sampling deadlines, {c.get('errors', 0)} errors")
        k = helpers.get("clocks")
        if k and "bursts" in k:
            for dom, n in (k.get("bursts") or {}).items():
                click.echo(f"gpu clock {dom}: {n} bursts by {k.get('method', {}).get(dom)}, "
                           f"{k.get('failures', {}).get(dom, 0)} failures")
        if r.trailer.get("child_exit"):
            click.echo(f"command   {r.trailer['child_exit']}")
    for n in r.rows(Chunk.NOTICES):
        click.echo(f"notice    [{n.get('level')}] {n.get('text')}")
    if not r.clean:
        raise TruncatedRun(f"{file} is {r.truncated}; shown is what was kept")
