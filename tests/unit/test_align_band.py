"""The estimators one by one, against brute force: hull, band, min-delay filter, L1, LS."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from scipy.optimize import linprog

from clockalign.align.band import fit_band, l1_violators
from clockalign.align.hull import upper_hull
from clockalign.align.lsq import midpoint_lsq
from clockalign.align.mindelay import burst_groups, fastest_per_group, min_delay_select


def _random_sandwiches(rng, n, jitter=200.0):
    u = np.sort(rng.uniform(-1, 1, n))
    c, m = rng.normal(0, 50), rng.normal(0, 30)
    true = c + m * u
    lo = true - rng.exponential(jitter, n) - 5
    hi = true + rng.exponential(jitter, n) + 5
    return u, lo, hi, (c, m)


def _lp_extreme(u, lo, hi, m_max, at, sign):
    """max (sign=-1) or min (sign=1) of c + m*at over the feasible lines, by linprog."""
    a = np.r_[np.c_[-np.ones_like(u), -u], np.c_[np.ones_like(u), u]]
    b = np.r_[-lo, hi]
    res = linprog([sign, sign * at], A_ub=a, b_ub=b,
                  bounds=[(None, None), (-m_max, m_max)], method="highs")
    assert res.status == 0
    return sign * res.fun


@given(st.integers(0, 2**32 - 1), st.integers(2, 60))
@settings(max_examples=40, deadline=None)
def test_band_matches_linear_programming(seed, n):
    rng = np.random.default_rng(seed)
    u, lo, hi, (c, m) = _random_sandwiches(rng, n)
    band = fit_band(u, lo, hi, m_max=1e4)
    assert band.feasible
    low, high = band.bounds(u)
    assert np.all(low >= lo - 1e-6) and np.all(high <= hi + 1e-6)
    assert low[0] <= c + m * u[0] <= high[0]          # the truth is one of the lines
    for at in np.r_[rng.uniform(-3, 3, 4), u[0], u[-1]]:
        lo_at, hi_at = band.bounds(np.array([at]))
        assert lo_at[0] == pytest.approx(_lp_extreme(u, lo, hi, 1e4, at, 1), abs=1e-5, rel=1e-9)
        assert hi_at[0] == pytest.approx(_lp_extreme(u, lo, hi, 1e4, at, -1), abs=1e-5, rel=1e-9)
    # the centre line is inside the band and as far from every bound as any line can be
    assert np.all(band.center(u) - lo >= band.margin - 1e-6)
    assert np.all(hi - band.center(u) >= band.margin - 1e-6)
    a = np.r_[np.c_[-np.ones(n), -u, np.ones(n)], np.c_[np.ones(n), u, np.ones(n)]]
    res = linprog([0, 0, -1], A_ub=a, b_ub=np.r_[-lo, hi],
                  bounds=[(None, None), (-1e4, 1e4), (None, None)], method="highs")
    assert band.margin == pytest.approx(-res.fun, abs=1e-6)


def test_band_widens_outside_the_data():
    rng = np.random.default_rng(1)
    u, lo, hi, _ = _random_sandwiches(rng, 40)
    band = fit_band(u, lo, hi, m_max=1e4)
    widths = [np.subtract(*band.bounds(np.array([x])))[0] * -1 for x in (0.0, 1.0, 3.0, 10.0)]
    assert widths == sorted(widths) and widths[-1] > 3 * widths[0]


def test_band_reports_infeasible_sets():
    u = np.array([-1.0, 0.0, 1.0])
    lo = np.array([0.0, 100.0, 0.0])
    hi = np.array([10.0, 110.0, 10.0])     # the middle one sits 100 ns off any line
    band = fit_band(u, lo, hi, m_max=1e4)
    assert not band.feasible and band.margin < -40
    assert list(l1_violators(u, lo, hi, 1e4)) == [1]


def test_band_with_ties_and_single_points():
    # many readings at the same remote tick, and a segment of one remote value
    u = np.array([0.0, 0.0, 0.0, 1.0, 1.0])
    lo = np.array([0.0, 3.0, 1.0, 10.0, 12.0])
    hi = np.array([20.0, 15.0, 18.0, 30.0, 25.0])
    band = fit_band(u, lo, hi, m_max=1e4)
    low, high = band.bounds(np.array([0.0, 1.0]))
    assert low == pytest.approx([3.0, 12.0]) and high == pytest.approx([15.0, 25.0])
    one = fit_band(np.zeros(3), np.array([0.0, 2.0, 1.0]), np.array([9.0, 8.0, 7.0]), m_max=5.0)
    low, high = one.bounds(np.array([0.0, 2.0]))
    assert low == pytest.approx([2.0, -8.0]) and high == pytest.approx([7.0, 17.0])


def test_upper_hull_is_convex_and_covers_all_points():
    rng = np.random.default_rng(2)
    x = np.sort(rng.uniform(0, 100, 500))
    x = np.unique(x)
    y = rng.normal(0, 1, x.size) - 0.01 * (x - 50) ** 2
    h = upper_hull(x, y)
    assert h[0] == 0 and h[-1] == x.size - 1
    slopes = np.diff(y[h]) / np.diff(x[h])
    assert np.all(np.diff(slopes) < 0)
    assert np.all(y <= np.interp(x, x[h], y[h]) + 1e-9)


def test_min_delay_keeps_the_fastest_and_the_one_way_extremes():
    # two bursts of three; the fastest of burst 0 is the middle one
    t0 = np.array([0, 100, 200, 10_000, 10_100, 10_200], dtype=np.int64)
    t1 = np.array([90, 150, 290, 10_050, 10_180, 10_290], dtype=np.int64)
    remote = np.array([60, 125, 230, 10_030, 10_110, 10_260], dtype=np.int64)
    assert list(burst_groups(t0)) == [0, 0, 0, 1, 1, 1]
    groups = burst_groups(t0, gap_ns=1000)
    assert list(groups) == [0, 0, 0, 1, 1, 1]
    assert list(fastest_per_group(t0, t1, groups)) == [1, 3]
    # burst 0: index 1 is fastest and has the smallest delay on both sides; burst 1: 3 is
    # fastest and nearest t1 (remote - t1 = -20), 4 nearest t0 (t0 - remote = -10)
    assert list(min_delay_select(t0, remote, t1, groups)) == [1, 3, 4]
    assert list(burst_groups(t0, gap_ns=0)) == list(range(6))


def test_auto_bursts_only_when_the_stream_is_bursty():
    steady = np.arange(0, 10_000_000_000, 1_000_000, dtype=np.int64)
    steady[5000:] += 50_000_000          # one pause does not make a stream bursty
    assert len(np.unique(burst_groups(steady))) == steady.size
    rng = np.random.default_rng(0)       # nor do the chance long gaps of a random stream
    poisson = np.sort(rng.integers(0, 30_000_000_000, 6000))
    assert len(np.unique(burst_groups(poisson))) == poisson.size
    bursty = (np.arange(100)[:, None] * 100_000_000 + np.arange(64)[None, :] * 3000).ravel()
    assert len(np.unique(burst_groups(bursty))) == 100


def test_midpoint_least_squares_recovers_a_line():
    x = np.arange(0, 10_000_000_000, 100_000_000, dtype=np.int64)
    remote = 1_700_000_000_000_000_000 + x
    host = 5_000_000_000 + x + np.rint(x * 20e-6).astype(np.int64) + 777
    a, b, xm = midpoint_lsq(host - 100, remote, host + 100, remote[0], host[0] - 777)
    assert b == pytest.approx(20e-6, rel=1e-6)
    assert a + b * (0 - xm) == pytest.approx(777, abs=0.01)
