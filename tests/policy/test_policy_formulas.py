"""Tests for hpcckpt.policy.formulas: hand-computed values and properties."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcckpt.errors import CheckpointError
from hpcckpt.policy import formulas as F
from hpcckpt.policy import daly, multilevel_intervals, young


def test_young_hand_computed():
    # C = 40 s, M = 12 h = 43200 s: 2 C M = 2 * 40 * 43200 = 3,456,000; sqrt = 1859.0320...
    assert young(40, 43200) == pytest.approx(1859.0320061, rel=1e-9)
    # C = 50, M = 100: sqrt(10000) = 100 exactly
    assert young(50, 100) == 100.0


def test_daly_hand_computed():
    # C = 50, M = 100: x = C/(2M) = 0.25, sqrt(x) = 0.5
    # sqrt(2CM) = 100; 100 * (1 + 0.5/3 + 0.25/9) - 50
    #   = 100 * (1 + 0.1666667 + 0.0277778) - 50 = 119.44444 - 50 = 69.44444
    assert daly(50, 100) == pytest.approx(69.444444444, rel=1e-9)
    # C = 40, M = 43200: x = 40/86400 = 4.6296296e-4, sqrt(x) = 0.021516574
    # 1859.0320061 * (1 + 0.0071721913 + 0.0000514403) - 40
    #   = 1859.0320061 * 1.0072236316 - 40 = 1872.4608... - 40 = 1832.4608...
    assert daly(40, 43200) == pytest.approx(1832.4609, rel=1e-6)


def test_daly_large_cost_branch():
    # C >= 2M: tau = M
    assert daly(200, 100) == 100.0
    assert daly(1000, 100) == 100.0
    # just below the boundary C = 2M - eps: x -> 1: sqrt(4M^2) * (1 + 1/3 + 1/9) - 2M = 8M/9
    assert daly(199.999999, 100) == pytest.approx(800 / 9, rel=1e-6)


def test_exact_optimum_hand_computed():
    # C/M = 0.1: solve e^{(t+0.1)} (1 - t) = 1 (M = 1).  At t = 0.38318: e^{0.48318} = 1.621231,
    # 1.621231 * 0.61682 = 1.00001 -> t ~= 0.38318; Daly's eq. 37 gives 0.38303.
    t = F.exact_optimum(0.1, 1.0)
    assert t == pytest.approx(0.383183, abs=2e-6)
    assert math.exp(t + 0.1) * (1 - t) == pytest.approx(1.0, abs=1e-12)
    assert daly(0.1, 1.0) == pytest.approx(t, rel=1e-3)


def test_expected_waste_hand_computed():
    # tau = 1, C = 0.1, M = 1, R = 0: 1 - 1 / (e^{1.1} - 1) = 1 - 1/2.004166 = 0.501040
    assert F.expected_waste(1.0, 0.1, 1.0) == pytest.approx(0.5010395, rel=1e-6)
    # with R = 0.5: 1 - 1 / (e^{0.5} (e^{1.1} - 1)) = 1 - 1/(1.648721 * 2.004166)
    #   = 1 - 1/3.304311 = 1 - 0.302635 = 0.697365
    assert F.expected_waste(1.0, 0.1, 1.0, restart=0.5) == pytest.approx(0.697365, rel=2e-6)
    # first order: C/(tau+C) + (tau/2 + R)/M = 0.1/1.1 + 0.5 = 0.590909
    assert F.expected_waste(1.0, 0.1, 1.0, model="first-order") == pytest.approx(0.5909091, rel=1e-6)


def test_expected_waste_minimised_near_daly():
    c, m = 600.0, 43200.0
    td = daly(c, m)
    w0 = F.expected_waste(td, c, m)
    for f in (0.8, 0.9, 1.1, 1.25):
        assert F.expected_waste(td * f, c, m) > w0


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf"), "x", None])
def test_invalid_inputs_raise(bad):
    with pytest.raises(CheckpointError):
        young(bad, 100)
    with pytest.raises(CheckpointError):
        daly(10, bad)
    with pytest.raises(CheckpointError):
        F.expected_waste(10, bad, 100)


def test_zero_mtbf_raises():
    with pytest.raises(CheckpointError):
        young(10, 0)
    with pytest.raises(CheckpointError):
        daly(10, 0.0)
    with pytest.raises(CheckpointError):
        F.exact_optimum(10, 0)
    with pytest.raises(CheckpointError):
        F.expected_waste(0, 10, 100)  # zero interval
    with pytest.raises(CheckpointError):
        F.expected_waste(10, 10, 100, model="nope")


costs = st.floats(min_value=1e-6, max_value=1e6, allow_nan=False)
mtbfs = st.floats(min_value=1e-3, max_value=1e8, allow_nan=False)


@settings(max_examples=300, deadline=None)
@given(costs, mtbfs)
def test_daly_never_above_young(c, m):
    # daly - young = C (-2/3 + (1/9) sqrt(C/2M)) < -(5/9) C for C < 2M; M <= young/2 otherwise
    d, y = daly(c, m), young(c, m)
    if c < 2 * m:
        assert d <= y - (5 / 9) * c * (1 - 1e-9) + 1e-9 * y
        assert d > 0
    else:
        assert d == m
        assert d <= y / 2 * (1 + 1e-12)


@settings(max_examples=300, deadline=None)
@given(costs, costs, mtbfs)
def test_monotone_in_cost(c1, c2, m):
    lo, hi = sorted((c1, c2))
    assert young(lo, m) <= young(hi, m)
    # daly is non-decreasing in C: increasing for C < 2M, jumps 8M/9 -> M at C = 2M, then flat
    assert daly(lo, m) <= daly(hi, m) * (1 + 1e-12)


@settings(max_examples=300, deadline=None)
@given(costs, mtbfs, mtbfs)
def test_monotone_in_mtbf_within_branch(c, m1, m2):
    lo, hi = sorted((m1, m2))
    assert young(c, lo) <= young(c, hi)
    if c < 2 * lo:  # both in the C < 2M branch (derivative > 0 for C < 18M)
        assert daly(c, lo) <= daly(c, hi) * (1 + 1e-12)


@settings(max_examples=200, deadline=None)
@given(st.floats(min_value=1e-5, max_value=1.0), st.floats(min_value=1.0, max_value=1e6))
def test_daly_close_to_exact_optimum(ratio, m):
    # Daly's eq. 37 approximates the exact optimum: 0.04 % off at C/M = 0.1, 1.8 % at C/M = 1
    # (and 6 % just below C = 2M, where it gives 8M/9 vs 0.9475 M).
    c = ratio * m
    tol = 1e-3 if ratio <= 0.1 else 0.02
    assert daly(c, m) == pytest.approx(F.exact_optimum(c, m), rel=tol)


def test_multilevel_two_levels_hand_computed():
    # C1 = 10 s, C2 = 300 s, lambda1 = 4/(5 d) = 4/432000, lambda2 = 1/432000.
    # real n1 = sqrt(lambda1/C1) / sqrt(lambda2/C2) = sqrt(4 * 300 / 10) = sqrt(120) = 10.954
    # candidates n1 = 10, 11:  H(n) = sqrt(2 (n C1 + C2)(lambda1/n + lambda2))
    #   n=10: 2 * 400 * (0.4 + 1)/432000 = 0.0025926 -> H = 0.0509175
    #   n=11: 2 * 410 * (0.363636 + 1)/432000 = 0.0025884 -> H = 0.0508762  (best)
    # W* = sqrt(2 * 410 / (1.363636/432000)) = sqrt(2.5977e8) = 16117.57 s
    plan = multilevel_intervals([10, 300], [4 / 432000, 1 / 432000])
    assert plan.counts == (11, 1)
    assert plan.real_counts[0] == pytest.approx(math.sqrt(120))
    assert plan.pattern_work == pytest.approx(16117.568, rel=1e-6)
    assert plan.periods[0] == pytest.approx(16117.568 / 11, rel=1e-6)
    assert plan.overhead == pytest.approx(0.0508762, rel=1e-5)
    # real-valued optimum periods are Young per level: sqrt(2 C_l / lambda_l)
    assert plan.periods[0] == pytest.approx(math.sqrt(2 * 10 * 432000 / 4), rel=0.02)
    assert plan.periods[1] == pytest.approx(math.sqrt(2 * 300 * 432000), rel=0.02)


def test_multilevel_single_level_is_young():
    plan = multilevel_intervals([40.0], [1 / 43200])
    assert plan.counts == (1,)
    assert plan.pattern_work == pytest.approx(young(40, 43200))


def test_multilevel_rare_local_failures_collapse():
    # local level almost never needed: ratio < 1 -> counts (1, 1)
    plan = multilevel_intervals([10, 20], [1e-9, 1e-4])
    assert plan.counts == (1, 1)


@pytest.mark.parametrize("costs,rates", [([], []), ([1], [1, 2]), ([0, 1], [1, 1]), ([1, 1], [-1, 1]),
                                         ([1, float("nan")], [1, 1])])
def test_multilevel_invalid(costs, rates):
    with pytest.raises(CheckpointError):
        multilevel_intervals(costs, rates)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.floats(1e-2, 1e4), st.floats(1e-8, 1e-2)), min_size=1, max_size=4))
def test_multilevel_rounded_not_worse_than_lower_bound(levels):
    costs = [c for c, _ in levels]
    rates = [r for _, r in levels]
    plan = multilevel_intervals(costs, rates)
    bound = sum(math.sqrt(2 * r * c) for c, r in levels)
    assert plan.overhead >= bound * (1 - 1e-9)
    assert plan.counts[-1] == 1
    for a, b in zip(plan.counts, plan.counts[1:]):
        assert a % b == 0 and a >= b
