"""Options and helpers the subcommands share, defined once.

    @click.command("faults")
    @run_file
    @json_flag("One JSON document instead of text.")
    def command(file, as_json): ...
"""
import sys

import click

# the run file a reading command works on
run_file = click.argument("file", type=click.Path(dir_okay=False))


def json_flag(help_text: str):
    """--json: machine-readable output instead of text."""
    return click.option("--json", "as_json", is_flag=True, help=help_text)


def output_option(help_text: str, dest: str = "output", **kw):
    """-o/--output: where a command writes (a file or a directory, per command)."""
    return click.option("-o", "--output", dest, help=help_text, **kw)


def with_progress(tl, label: str, work):
    """work(progress=...) under a progress bar on stderr when it is a terminal (counting the
    run's events), else work() plainly; returns what work returns."""
    if not sys.stderr.isatty():
        return work()
    counts = ((tl.reader.trailer or {}).get("counts") or {})
    total = sum(v for v in counts.values() if isinstance(v, int))
    if not total:          # truncated run: about 128 bytes of run file per event
        total = max(1, tl.reader.size // 140)
    with click.progressbar(length=total, label=label, file=sys.stderr) as bar:
        return work(progress=bar.update)
