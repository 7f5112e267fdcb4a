"""``clockalign align``: fit clock domains onto MONOTONIC and show how well they are known."""
import json
import os

import click

from ..errors import ClockalignError, TruncatedRun
from .options import json_flag

EXAMPLES = """Examples:

\b
  clockalign align run.ca                       every domain of a recording
  clockalign align run.ca --json                the same, machine-readable
  clockalign align run.ca --domain GPU0 --map 1732870000123456768
  clockalign align run.ca --write-pairs pairs/  also each domain's sandwiches as CSV
  clockalign align --pairs pairs.csv --tick 32  any two clocks: t0_ns,remote_ns,t1_ns
  clockalign align --pairs pairs.csv --window 2 --map 1732870000123456768 --json
"""


@click.command("align", epilog=EXAMPLES)
@click.argument("run_file", required=False, metavar="[FILE]")
@click.option("--pairs", metavar="PAIRS.csv",
              help="Fit two clocks from a CSV with header t0_ns,remote_ns,t1_ns instead.")
@click.option("--write-pairs", "pairs_dir", metavar="DIR",
              help="Also write FILE's raw sandwiches to DIR, one CSV a domain "
                   "(gpu0_sandwiches.csv, cpu_REALTIME_sandwiches.csv, ...): --pairs input.")
@json_flag("Print the fit as JSON.")
@click.option("--map", "stamps", multiple=True, metavar="T",
              help="Map remote timestamp T (ns) to host ns with its uncertainty; repeatable.")
@click.option("--domain", metavar="NAME", help="Domain of FILE to --map (GPU0, REALTIME, ...).")
@click.option("--window", type=float, default=5.0, show_default=True, metavar="S",
              help="Segment length in seconds.")
@click.option("--tick", type=int, default=None, metavar="NS",
              help="Remote clock resolution in ns (default: as recorded, or 0 for --pairs).")
def command(run_file, pairs, pairs_dir, as_json, stamps, domain, window, tick):
    """Fit every clock domain onto host MONOTONIC and report how well each is known.

    Each domain (REALTIME, BOOTTIME, MONOTONIC_RAW, GPU0, ...) is fitted piecewise from
    its clock sandwiches t0 <= remote <= t1: minimum-delay filtering, the band of lines
    consistent with every sandwich, its widest-margin centre, and steps where no line
    fits.  The band's half-width is the honest uncertainty of a mapped time.  A domain
    that cannot be fitted (a stuck clock) is listed with the reason; the others are not
    affected.
    """
    from ..align import fit_run, fit_sandwiches
    from ..align.pairs import map_stamps, read_pairs
    from ..align.run import Fits
    from ..report.fit_text import describe_fits

    if (run_file is None) == (pairs is None):
        raise ClockalignError("give either a run FILE or --pairs PAIRS.csv (exactly one)")
    if not window > 0:
        raise ClockalignError(f"--window must be a positive number of seconds, not {window}")
    if tick is not None and tick < 0:
        raise ClockalignError(f"--tick must not be negative, not {tick}")
    if pairs_dir is not None and run_file is None:
        raise ClockalignError("--write-pairs writes a run FILE's sandwiches; it takes no --pairs")
    window_ns = int(round(window * 1e9))
    reader = None
    if pairs is not None:
        name = os.path.basename(pairs)
        models = Fits({name: fit_sandwiches(*read_pairs(pairs), tick_ns=tick or 0,
                                            window_ns=window_ns)})
    else:
        from ..store.reader import RunReader

        if not os.path.exists(run_file):
            raise ClockalignError(f"{run_file} does not exist")
        reader = RunReader(run_file)
        if pairs_dir is not None:
            _write_pairs(reader, pairs_dir)
        models = fit_run(reader, window_ns=window_ns, tick_ns=tick)
        if not models and not models.failed:
            raise ClockalignError(f"{run_file} holds no clock sandwiches (no CPU_CLOCK or "
                                  "GPU_CLOCK chunks with 2 or more rows)")
    mapped = None
    if stamps:
        if domain is None and len(models) + len(models.failed) > 1:
            raise ClockalignError(f"--map needs --domain, one of "
                                  f"{', '.join([*models, *models.failed])}")
        name = domain or next(iter(models), None) or next(iter(models.failed))
        if name in models.failed:
            raise ClockalignError(f"cannot map {name} times: its fit failed "
                                  f"({models.failed[name]})")
        if name not in models:
            raise ClockalignError(f"{run_file} has no clock domain {name}; it has "
                                  f"{', '.join(models)}")
        mapped = (name, map_stamps(models[name], stamps))
    devices = None
    if reader is not None:
        from ..store.devices import Devices
        from ..store.schema import Chunk
        devices = Devices.from_meta(reader.meta, reader.rows(Chunk.CLOCK_INFO))
    if as_json:
        out = {name: m.summary() for name, m in models.items()}
        out.update({name: {"error": why} for name, why in models.failed.items()})
        for name, d in out.items():
            dev = devices.by_name(name) if devices is not None else None
            if dev is not None:
                d["device"] = dev.row()
        if mapped:
            out[mapped[0]]["map"] = mapped[1]
        click.echo(json.dumps(out[name] if pairs is not None else out, indent=2))
    else:
        click.echo(describe_fits(models, mapped, devices))
    if reader is not None and reader.truncated:
        raise TruncatedRun(f"{run_file} is {reader.truncated}; fitted what it holds")


def _write_pairs(reader, pairs_dir):
    """Each domain's sandwiches as CSV in pairs_dir, one line each on stderr."""
    from ..align.sandwiches import run_sandwiches, write_pairs
    try:
        written = write_pairs(run_sandwiches(reader), pairs_dir)
    except OSError as e:
        raise ClockalignError(f"cannot write the sandwiches to {pairs_dir}: "
                              f"{e.strerror or e}") from None
    for path, n in written:
        click.echo(f"{path}: {n} sandwiches", err=True)
