"""clockalign.report: what happened in a run, as tables and figures.

    from clockalign.timeline import Timeline
    from clockalign.report import build_report
    rep = build_report(Timeline.open("run.ca"), "run-report/")
    print(rep.text)                  # the terminal summary
    rep.files                        # report.md, report.json, *.png

Sections: findings first (a few lines ranked by impact, each pointing to its section), then
alignment (per clock domain: band, residuals, skew, steps, uncertainty budget),
CUDA calls, GPU activity (busy/idle per stream, launch-to-start, idle gaps while the launching
thread was off-CPU), context-switch jitter (off-CPU time inside CUDA calls, preemptions, wakeup
latency, a heatmap), connect() per peer, GPU counters with faults marked, faults with their
chains, and the signals that left their normal band before each fault.
"""
import dataclasses
import os

from ..errors import ClockalignError
from . import assemble
from .collect import collect
from .sections import Context, alignment, anomalies, connect, counters, cuda, faults, \
    findings, gpu_activity, jitter, run

SECTIONS = ["Run", "Findings", "Alignment", "CUDA calls", "CUDA work", "GPU activity",
            "Context-switch jitter", "connect()", "GPU counters", "Faults",
            "Anomalies before faults"]
# the builders of the sections after the head (run.build), in the report's order
BUILDERS = [alignment.build, cuda.calls, cuda.work, gpu_activity.build, jitter.build,
            connect.build, counters.build, faults.build, anomalies.build]


@dataclasses.dataclass
class Options:
    window: int = 50                  # trailing points the robust z is measured against
    threshold: float = 4.0            # |z| that counts as leaving the band
    bin_ns: int = None                # signal bin width (default: run / 500, >= 100 ms)
    lookback_ns: int = 30_000_000_000  # how long before a fault an excursion is listed


@dataclasses.dataclass
class Report:
    text: str
    markdown: str
    files: list
    numbers: dict


def build_report(tl, out_dir, options: Options = None, progress=None) -> Report:
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:
        raise ClockalignError(f"cannot create report directory {out_dir}: "
                              f"{e.strerror or e}") from None
    ctx = Context(tl, collect(tl, progress), out_dir, options or Options())
    head = run.build(ctx)
    sections = [s for s in (b(ctx) for b in BUILDERS) if s is not None]
    sections.insert(0, findings.build(ctx, assemble.numbers(sections)))
    markdown = assemble.markdown(head, sections)
    nums = assemble.numbers([head] + sections)
    assemble.write_text(os.path.join(out_dir, "report.md"), markdown)
    assemble.write_json(os.path.join(out_dir, "report.json"), nums)
    files = ["report.md", "report.json"] + [f for s in sections for f in s.files]
    return Report(text=assemble.text(head, sections), markdown=markdown, files=files,
                  numbers=nums)
