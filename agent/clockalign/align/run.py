"""Fit every clock domain of a run file: CPU clocks and each GPU's %globaltimer.

Each domain is fitted on its own: one that cannot be fitted (a stuck GPU clock) is listed
in ``failed`` with its reason, and every other domain keeps its model.

    models = fit_run(RunReader("run.ca"))       # {"REALTIME": model, "GPU0": model, ...}
    host_ns, unc_ns = models["GPU0"].map(gpu_ns)
    models.failed                               # {"GPU1": "no line fits ...: stuck?"}
"""
from ..errors import ClockalignError
from .model import fit_sandwiches
from .sandwiches import recorded_ticks, run_sandwiches


class Fits(dict):
    """{domain name: AlignmentModel}, and ``failed``: {domain name: why its fit failed}."""

    def __init__(self, *args, failed: dict = None, **kw):
        super().__init__(*args, **kw)
        self.failed = dict(failed or {})


def fit_run(reader, window_ns=5_000_000_000, burst_gap_ns=None, tick_ns=None) -> Fits:
    """{domain name: AlignmentModel} for every domain with at least 2 sandwiches that fits;
    the domains that do not are in the result's ``failed``.

    Both GPU probe methods (ping-pong and launch+sync) give valid sandwiches, so they are
    fitted together; the wider launch+sync ones only bind where ping-pong is missing.
    tick_ns overrides the ticks recorded in CLOCK_INFO.
    """
    ticks = recorded_ticks(reader)
    models = Fits()
    for name, s in run_sandwiches(reader).items():
        if len(s) < 2:
            continue
        try:
            models[name] = fit_sandwiches(
                s.t0, s.remote, s.t1, tick_ns=ticks.get(name, 0) if tick_ns is None else tick_ns,
                window_ns=window_ns, burst_gap_ns=burst_gap_ns, name=name)
        except ClockalignError as e:
            models.failed[name] = str(e)
    return models
