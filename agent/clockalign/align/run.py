"""Fit every clock domain of a run file: CPU clocks and each GPU's %globaltimer.

Each domain is fitted on its own: one that cannot be fitted (a stuck GPU clock) is listed
in ``failed`` with its reason, and every other domain keeps its model.

    models = fit_run(RunReader("run.ca"))       # {"REALTIME": model, "GPU0": model, ...}
    host_ns, unc_ns = models["GPU0"].map(gpu_ns)
    models.failed                               # {"GPU1": "no line fits ...: stuck?"}
"""
import numpy as np

from ..errors import ClockalignError
from ..store.schema import Chunk, ClockDomain
from .model import fit_sandwiches


def _sandwiches(cols, sel):
    return tuple(np.asarray(cols[k][sel]).astype(np.int64) for k in ("t0", "remote", "t1"))


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
    ticks = {row["domain"]: int(row.get("tick_ns") or 0)
             for row in reader.rows(Chunk.CLOCK_INFO) if isinstance(row, dict) and "domain" in row}
    sources = []
    cpu = reader.columns(Chunk.CPU_CLOCK)
    if cpu:
        for d in np.unique(cpu["domain"]):
            name = ClockDomain(d).name if d in ClockDomain._value2member_map_ else f"CPU{d}"
            sources.append((name, _sandwiches(cpu, cpu["domain"] == d)))
    gpu = reader.columns(Chunk.GPU_CLOCK)
    if gpu:
        for g in np.unique(gpu["gpu"]):
            sources.append((f"GPU{g}", _sandwiches(gpu, gpu["gpu"] == g)))
    models = Fits()
    for name, (t0, remote, t1) in sources:
        if len(t0) < 2:
            continue
        try:
            models[name] = fit_sandwiches(
                t0, remote, t1, tick_ns=ticks.get(name, 0) if tick_ns is None else tick_ns,
                window_ns=window_ns, burst_gap_ns=burst_gap_ns, name=name)
        except ClockalignError as e:
            models.failed[name] = str(e)
    return models
