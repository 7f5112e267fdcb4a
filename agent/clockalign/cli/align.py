"""``clockalign align``: fit clock domains onto MONOTONIC and show how well they are known."""
import csv
import json
import os

import click

from ..errors import ClockalignError, TruncatedRun

EXAMPLES = """Examples:

\b
  clockalign align run.ca                       every domain of a recording
  clockalign align run.ca --json                the same, machine-readable
  clockalign align run.ca --domain GPU0 --map 1732870000123456768
  clockalign align --pairs pairs.csv --tick 32  any two clocks: t0_ns,remote_ns,t1_ns
  clockalign align --pairs pairs.csv --window 2 --map 1732870000123456768 --json
"""

COLUMNS = ("t0_ns", "remote_ns", "t1_ns")


def _int(text, what):
    try:
        return int(text)
    except (TypeError, ValueError):
        raise ClockalignError(f"{what} {text!r} is not an integer number of nanoseconds") from None


def read_pairs(path):
    """(t0, remote, t1) int64 arrays from a CSV with a t0_ns,remote_ns,t1_ns header."""
    import numpy as np

    if not os.path.exists(path):
        raise ClockalignError(f"{path} does not exist")
    try:
        with open(path, newline="") as f:
            rows = csv.reader(f)
            header = [h.strip() for h in next(rows, [])]
            missing = [c for c in COLUMNS if c not in header]
            if missing:
                raise ClockalignError(
                    f"{path} needs a header with columns t0_ns,remote_ns,t1_ns (missing "
                    f"{','.join(missing)}; found {','.join(header) or 'nothing'})")
            pos = [header.index(c) for c in COLUMNS]
            out = [[], [], []]
            for line, row in enumerate(rows, start=2):
                if not row or not "".join(row).strip():
                    continue
                for col, (p, name) in enumerate(zip(pos, COLUMNS)):
                    out[col].append(_int(row[p].strip() if p < len(row) else "",
                                         f"{path} line {line}: {name}"))
    except (UnicodeDecodeError, csv.Error) as e:
        raise ClockalignError(f"{path} is not a readable CSV file ({e})") from None
    except IsADirectoryError:
        raise ClockalignError(f"{path} is a directory, not a CSV file") from None
    if len(out[0]) < 2:
        raise ClockalignError(f"{path} has {len(out[0])} sandwich rows; at least 2 are needed "
                              "to fit a line")
    try:
        t0, remote, t1 = (np.array(c, dtype=np.int64) for c in out)
    except OverflowError:
        raise ClockalignError(f"{path} has a value beyond int64 nanoseconds") from None
    bad = np.flatnonzero(t1 < t0)
    if bad.size:
        raise ClockalignError(f"{path} line {bad[0] + 2}: t1_ns is before t0_ns, so it is not "
                              "a sandwich")
    return t0, remote, t1


def _describe(name, s):
    hw = s["halfwidth_ns"]
    lines = [f"{name}: {len(s['segments'])} segment(s), skew {s['skew_ppm']:+.3f} ppm, "
             f"offset {s['offset_ns']} ns (host - remote at the first sandwich)",
             f"  sandwiches used {s['samples_used']}/{s['samples_total']}, min round trip "
             f"{s['min_rtt_ns']} ns (floor +-{s['floor_ns']} ns), tick {s['tick_ns']} ns",
             f"  band half-width p50 {hw['p50']} ns, p99 {hw['p99']} ns, max {hw['max']} ns"]
    if not s["steps"]:
        lines.append("  steps: none found")
    for st in s["steps"]:
        w0, w1 = st["host_window_ns"]
        lines.append(f"  step: remote clock jumped {st['remote_jump_ns']:+d} ns at host "
                     f"{st['host_ns']} (between {w0} and {w1}), remote {st['remote_ns']}")
    lines.append("  segment  start_remote_ns       end_remote_ns         offset_ns             "
                 "skew_ppm   used/total  wander_ns")
    segs = s["segments"]
    shown = segs if len(segs) <= 12 else segs[:10]
    for i, g in enumerate(shown):
        lines.append(f"  {i:7d}  {g['start_remote_ns']:<20d}  {g['end_remote_ns']:<20d}  "
                     f"{g['offset_ns']:<20d}  {g['skew_ppm']:+9.3f}  "
                     f"{g['samples_used']:>5d}/{g['samples_total']:<5d}  {g['wander_ns']}")
    if len(shown) < len(segs):
        lines.append(f"  ... {len(segs) - len(shown)} more segments (--json lists all)")
    return "\n".join(lines)


def _mapped(model, stamps):
    import numpy as np

    r = np.array([_int(t, "--map value") for t in stamps], dtype=np.int64)
    host, unc = model.map(r)
    return [{"remote_ns": int(a), "host_ns": int(b), "unc_ns": int(c)}
            for a, b, c in zip(r, host, unc)]


@click.command("align", epilog=EXAMPLES)
@click.argument("run_file", required=False, metavar="[FILE]")
@click.option("--pairs", metavar="PAIRS.csv",
              help="Fit two clocks from a CSV with header t0_ns,remote_ns,t1_ns instead.")
@click.option("--json", "as_json", is_flag=True, help="Print the fit as JSON.")
@click.option("--map", "stamps", multiple=True, metavar="T",
              help="Map remote timestamp T (ns) to host ns with its uncertainty; repeatable.")
@click.option("--domain", metavar="NAME", help="Domain of FILE to --map (GPU0, REALTIME, ...).")
@click.option("--window", type=float, default=5.0, show_default=True, metavar="S",
              help="Segment length in seconds.")
@click.option("--tick", type=int, default=None, metavar="NS",
              help="Remote clock resolution in ns (default: as recorded, or 0 for --pairs).")
def command(run_file, pairs, as_json, stamps, domain, window, tick):
    """Fit every clock domain onto host MONOTONIC and report how well each is known.

    Each domain (REALTIME, BOOTTIME, MONOTONIC_RAW, GPU0, ...) is fitted piecewise from
    its clock sandwiches t0 <= remote <= t1: minimum-delay filtering, the band of lines
    consistent with every sandwich, its widest-margin centre, and steps where no line
    fits.  The band's half-width is the honest uncertainty of a mapped time.
    """
    from ..align import ASSUMPTION, fit_run, fit_sandwiches

    if (run_file is None) == (pairs is None):
        raise ClockalignError("give either a run FILE or --pairs PAIRS.csv (exactly one)")
    if not window > 0:
        raise ClockalignError(f"--window must be a positive number of seconds, not {window}")
    if tick is not None and tick < 0:
        raise ClockalignError(f"--tick must not be negative, not {tick}")
    window_ns = int(round(window * 1e9))
    if pairs is not None:
        t0, remote, t1 = read_pairs(pairs)
        model = fit_sandwiches(t0, remote, t1, tick_ns=tick or 0, window_ns=window_ns)
        out = model.summary()
        if stamps:
            out["map"] = _mapped(model, stamps)
        if as_json:
            click.echo(json.dumps(out, indent=2))
            return
        click.echo(_describe(os.path.basename(pairs), out))
        for m in out.get("map", []):
            click.echo(f"{m['remote_ns']} -> {m['host_ns']} +- {m['unc_ns']} ns")
        click.echo(f"\nassumption: {ASSUMPTION}")
        return

    from ..store.reader import RunReader

    if not os.path.exists(run_file):
        raise ClockalignError(f"{run_file} does not exist")
    reader = RunReader(run_file)
    models = fit_run(reader, window_ns=window_ns, tick_ns=tick)
    if not models:
        raise ClockalignError(f"{run_file} holds no clock sandwiches (no CPU_CLOCK or GPU_CLOCK "
                              "chunks with 2 or more rows)")
    mapped = None
    if stamps:
        if domain is None and len(models) > 1:
            raise ClockalignError(f"--map needs --domain, one of {', '.join(models)}")
        name = domain or next(iter(models))
        if name not in models:
            raise ClockalignError(f"{run_file} has no clock domain {name}; it has "
                                  f"{', '.join(models)}")
        mapped = (name, _mapped(models[name], stamps))
    if as_json:
        out = {name: m.summary() for name, m in models.items()}
        if mapped:
            out[mapped[0]]["map"] = mapped[1]
        click.echo(json.dumps(out, indent=2))
    else:
        _print_models(models, mapped)
    if reader.truncated:
        raise TruncatedRun(f"{run_file} is {reader.truncated}; fitted what it holds")


def _print_models(models, mapped):
    from ..align import ASSUMPTION
    for name, m in models.items():
        click.echo(_describe(name, m.summary()))
        if mapped and mapped[0] == name:
            for row in mapped[1]:
                click.echo(f"  {row['remote_ns']} -> {row['host_ns']} +- {row['unc_ns']} ns")
        click.echo("")
    click.echo(f"assumption: {ASSUMPTION}")
