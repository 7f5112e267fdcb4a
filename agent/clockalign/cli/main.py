"""The ``clockalign`` command: one click subcommand per module, registered in _COMMANDS.

    clockalign doctor
    sudo clockalign record --pid 1234 -o run.ca
    clockalign info run.ca
"""
import importlib
import os
import sys

import click

from .. import __version__
from ..errors import ClockalignError

# module name under clockalign.cli -> each exposes ``command`` (a click.Command)
_COMMANDS = ["doctor", "record", "watch", "info", "dump", "align", "faults", "export", "report",
             "demo", "inject"]


class _Group(click.Group):
    def invoke(self, ctx):
        # the reader of our stdout left (clockalign dump run.ca | head -1): what it wanted
        # was written, so this is success; click itself would exit 1
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            _stdout_gone()
            return None

    def list_commands(self, ctx):
        return [c for c in _COMMANDS if _load(c) is not None]

    def get_command(self, ctx, name):
        return _load(name) if name in _COMMANDS else None


def _load(name):
    try:
        mod = importlib.import_module(f"clockalign.cli.{name}")
    except ModuleNotFoundError as e:
        if e.name == f"clockalign.cli.{name}":
            return None
        raise
    return mod.command


@click.command(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(version=__version__, prog_name="clockalign")
def cli():
    """clockalign: CUDA calls, context switches, connect(), GPU counters and faults on one
    clock, each timestamp with its uncertainty."""


def _stdout_gone():
    """Point stdout at /dev/null, so the interpreter's last flush has nowhere to fail."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def main(argv=None):
    """Entry point: expected failures become one sentence on stderr and a non-zero exit."""
    try:
        # not standalone: click returns an Exit's code (--help, --version) instead of exiting
        code = cli.main(args=argv, prog_name="clockalign", standalone_mode=False)
    except ClockalignError as e:
        click.echo(f"clockalign: {e}", err=True)
        sys.exit(e.exit_code)
    except click.exceptions.Abort:
        click.echo("clockalign: aborted", err=True)
        sys.exit(130)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _stdout_gone()
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
