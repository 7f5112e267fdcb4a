"""One error type for every expected failure.

An expected failure (bad input, missing permission, missing dependency) is raised as
ClockalignError; the CLI prints its one sentence to stderr and exits with its code.
A traceback therefore always means a bug.
"""


class ClockalignError(Exception):
    """An expected failure, reported as one sentence and a non-zero exit."""

    exit_code = 2

    def __init__(self, message: str, exit_code: int = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class NotARunFile(ClockalignError):
    """The file does not start with the clockalign magic."""


class UnsupportedVersion(ClockalignError):
    """The run file was written by a format version this reader does not know."""


class TruncatedRun(ClockalignError):
    """The run file ends early or a chunk is damaged; what came before is kept."""

    exit_code = 3


class DamagedRun(TruncatedRun):
    """Chunks in the middle of a run file are damaged; the intact ones around them are kept."""


class RunFileWriteError(ClockalignError):
    """Writing the run file failed (a full disk, an I/O error); what was written stays readable."""
