"""One percentile definition in align and report, and exact int64 grids (issue 16 item 6)."""
import ast
import os

import numpy as np

import clockalign
from clockalign.align.stats import int_grid, pct
from clockalign.report import analysis
from clockalign.timeline import Timeline

PKG = os.path.dirname(clockalign.__file__)
RUN = os.path.join(os.path.dirname(__file__), "..", "data", "synthetic-report", "run.ca")


def test_pct_is_nearest_rank():
    x = np.array([10, 20, 30, 40])
    assert [pct(x, q) for q in (0, 25, 26, 50, 51, 75, 99, 100)] == [10, 10, 20, 20, 30, 30,
                                                                        40, 40]
    assert pct(np.arange(1, 101), 99) == 99 and pct(np.arange(1, 1001), 99.9) == 999
    assert pct([], 50) is None and pct(np.array([1.5, 2.5]), 50) == 1.5


def test_no_other_percentile_in_align_or_report():
    """np.percentile/quantile/median interpolate: a p99 in the report and one in align would
    differ on the same numbers.  Medians that are estimators, not reported percentiles,
    stay: align/mindelay's size burst gaps, report/anomaly's robust z is median/MAD."""
    found = []
    for sub in ("align", "report"):
        for name in os.listdir(os.path.join(PKG, sub)):
            if not name.endswith(".py") or name == "mindelay.py":
                continue
            path = os.path.join(PKG, sub, name)
            for node in ast.walk(ast.parse(open(path).read())):
                if isinstance(node, ast.Attribute) and node.attr in (
                        "percentile", "quantile", "nanpercentile", "median", "nanmedian"):
                    found.append((f"{sub}/{name}", node.attr))
    assert set(found) <= {("report/anomaly.py", "nanmedian"), ("report/anomaly.py", "median")}
    assert found.count(("report/anomaly.py", "median")) == 1, found      # bin sizing


def test_int_grid_is_exact_on_epoch_nanoseconds():
    lo, hi = 1_764_583_200_123_456_789, 1_764_583_260_987_654_321
    g = int_grid(lo, hi, 400)
    assert g.dtype == np.int64 and g[0] == lo and g[-1] == hi
    assert np.all(np.diff(g) - (hi - lo) // 399 <= 1)
    f = np.linspace(lo, hi, 400).astype(np.int64)     # what float64 gives: 256 ns steps
    assert f[0] != lo or f[-1] != hi


def test_realtime_band_of_the_figure_on_exact_stamps():
    tl = Timeline.open(RUN)
    rows = {r["domain"]: r for r in analysis.alignment(tl)}
    r = rows["REALTIME"]
    cpu = tl.reader.columns(2)
    rem = cpu["remote"][cpu["domain"] == 1].astype(np.int64)
    want, _ = tl.models["REALTIME"].map(np.array([rem.min(), rem.max()], dtype=np.int64))
    assert r["band_t"][0] == want[0] and r["band_t"][-1] == want[1]
