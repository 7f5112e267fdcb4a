"""The report's sections, one builder each: ``build(ctx) -> Section`` (None: not in this run).

    ctx = Context(tl, collect(tl), out_dir, Options())
    sec = alignment.build(ctx)
    sec.title, sec.text, sec.markdown, sec.numbers, sec.files

A section's text and markdown are its body; report/assemble.py puts titles on them and joins
them per format.  ``numbers`` go into report.json in the order the sections come; ``files``
are the figures the section wrote into ``out_dir``.
"""
import dataclasses
import functools

from .. import analysis


@dataclasses.dataclass
class Section:
    title: str
    text: str
    markdown: str
    numbers: dict = dataclasses.field(default_factory=dict)
    files: list = dataclasses.field(default_factory=list)


class Context:
    """What every section reads: the timeline, its collected columns, where figures go."""

    def __init__(self, tl, data, out_dir, options):
        self.tl, self.data, self.out_dir, self.opt = tl, data, out_dir, options
        self.t0, self.t1 = tl.start_ns, tl.end_ns
        self.faults = tl.faults()

    @functools.cached_property
    def inside(self):
        """Off-CPU time inside CUDA calls (the jitter and the anomaly sections use it)."""
        return analysis.offcpu_in_calls(self.data.cuda, self.data.sched)


def figure(f) -> list:
    """A figure function's result (a file name or None) as a list of files."""
    return [f] if f else []
