"""Multi-level patterns (hpcckpt.policy.multilevel) and the learned intervals (hpcckpt.policy.learned_levels)."""

import json
import math
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcckpt.errors import CheckpointError
from hpcckpt.policy import formulas
from hpcckpt.policy import learned_levels as LL
from hpcckpt.policy import multilevel as ML


# ------------------------------------------------------------ exact expectation
@settings(max_examples=60, deadline=None)
@given(cost=st.floats(1.0, 500.0), restart=st.floats(0.0, 500.0), mtbf=st.floats(2000.0, 2e5),
       period=st.floats(100.0, 20000.0), segments=st.integers(1, 50))
def test_one_level_is_dalys_segment_formula(cost, restart, mtbf, period, segments):
    """One level, work = N periods: N - 1 segments with a checkpoint, the last without (Daly's per-segment time)."""
    c = ML.LevelConfig((cost,), (restart,), (1.0 / mtbf,), segments * period)
    seg = lambda d: mtbf * math.exp(restart / mtbf) * math.expm1(d / mtbf)  # noqa: E731
    want = (segments - 1) * seg(period + cost) + seg(period)
    assert ML.expected_makespan(c, period, ()) == pytest.approx(want, rel=1e-9)


@settings(max_examples=40, deadline=None)
@given(costs=st.lists(st.floats(1.0, 300.0), min_size=2, max_size=3), period=st.floats(200.0, 5000.0),
       ratio=st.integers(1, 6), mtbf=st.floats(5000.0, 1e5))
def test_more_failures_or_costs_never_shorten_the_makespan(costs, period, ratio, mtbf):
    L = len(costs)
    ratios = (ratio,) * (L - 1)
    rates = tuple(1.0 / (mtbf * (l + 1)) for l in range(L))
    base = ML.LevelConfig(tuple(costs), tuple(costs), rates, 50 * period)
    e = ML.expected_makespan(base, period, ratios)
    assert e >= base.work  # never faster than the work itself
    worse_rates = ML.LevelConfig(base.costs, base.restarts, tuple(2 * r for r in rates), base.work)
    worse_costs = ML.LevelConfig(tuple(2 * c for c in costs), base.restarts, rates, base.work)
    assert ML.expected_makespan(worse_rates, period, ratios) > e
    assert ML.expected_makespan(worse_costs, period, ratios) > e


@pytest.mark.parametrize("config, period, ratios", [
    (ML.LevelConfig((20.0, 300.0), (30.0, 400.0), (0.8 / 21600, 0.2 / 21600), 3 * 86400), 600.0, (5,)),
    (ML.LevelConfig((20.0, 300.0), (30.0, 400.0), (0.8 / 21600, 0.2 / 21600), 3 * 86400), 900.0, (1,)),
    (ML.LevelConfig((10.0, 60.0, 600.0), (10.0, 60.0, 900.0), (3e-5, 1e-5, 4e-6), 2 * 86400), 500.0, (3, 4)),
])
def test_monte_carlo_agrees_with_the_exact_expectation(config, period, ratios):
    runs = ML.simulate_makespans(config, period, ratios, seeds=1500, seed=3)
    se = runs.std(ddof=1) / math.sqrt(len(runs))
    exact = ML.expected_makespan(config, period, ratios)
    assert abs(runs.mean() - exact) < 4 * se, (runs.mean(), exact, se)


def test_pattern_counts_and_periods():
    p = ML.Pattern(60.0, (4, 3))
    assert p.counts == (12, 3, 1)
    assert p.periods == (60.0, 240.0, 720.0)
    assert ML.Pattern(10.0, ()).counts == (1,)


def test_bad_inputs_are_checkpoint_errors():
    with pytest.raises(CheckpointError, match="same number of levels"):
        ML.LevelConfig((1.0, 2.0), (1.0,), (1e-5, 1e-6), 1000.0)
    with pytest.raises(CheckpointError, match="costs"):
        ML.LevelConfig((-1.0,), (1.0,), (1e-5,), 1000.0)
    with pytest.raises(CheckpointError, match="rates"):
        ML.LevelConfig((1.0,), (1.0,), (float("nan"),), 1000.0)
    c = ML.LevelConfig((1.0, 5.0), (1.0, 5.0), (1e-5, 1e-6), 1000.0)
    with pytest.raises(CheckpointError, match="ratios"):
        ML.expected_makespan(c, 10.0, (0,))
    with pytest.raises(CheckpointError, match="ratios"):
        ML.expected_makespan(c, 10.0, (2, 2))
    with pytest.raises(CheckpointError, match="period"):
        ML.expected_makespan(c, 0.0, (2,))


@settings(max_examples=60, deadline=None)
@given(period=st.floats(1.0, 1e5), ratios=st.lists(st.integers(1, 20), max_size=3), work=st.floats(10.0, 1e7))
def test_fit_to_work_makes_the_job_a_whole_number_of_patterns(period, ratios, work):
    c = ML.LevelConfig((1.0,) * (len(ratios) + 1), (1.0,) * (len(ratios) + 1), (1e-5,) * (len(ratios) + 1), work)
    p = ML.fit_to_work(c, ML.Pattern(period, tuple(ratios)))
    patterns = work / p.periods[-1]
    assert p.ratios == tuple(ratios) and patterns == pytest.approx(round(patterns), rel=1e-9)
    assert round(patterns) == max(1, round(work / ML.Pattern(period, tuple(ratios)).periods[-1]))


# ------------------------------------------------------------ search and formula
def test_one_level_search_finds_the_exact_model_optimum():
    c = ML.LevelConfig((300.0,), (0.0,), (1.0 / 43200,), 1000 * 43200.0)  # a long job: the tail does not matter
    best = ML.search(c)
    assert best.period == pytest.approx(formulas.exact_optimum(300.0, 43200.0), rel=0.02)


def test_search_is_no_worse_than_the_first_order_pattern_within_its_grid():
    configs = LL.sample_configs(np.random.default_rng(11), 15, 2)
    for c, best in zip(configs, ML.search_many(configs)):
        f = ML.formula_pattern(c)
        assert best.makespan <= f.makespan * 1.003  # the grid's step around the formula's period
        assert best.makespan == pytest.approx(ML.expected_makespan(c, best.period, best.ratios), rel=1e-12)


# ------------------------------------------------------------ learned model
def test_learned_is_within_two_percent_of_the_search_on_held_out_configurations():
    configs = LL.sample_configs(np.random.default_rng(12345), 40, 2)  # not a training seed
    gaps = [LL.predict(c).makespan / best.makespan - 1 for c, best in zip(configs, ML.search_many(configs))]
    assert np.mean(np.asarray(gaps) <= 0.02) >= 0.9, gaps


@settings(max_examples=50, deadline=None)
@given(levels=st.sampled_from([2, 3]), seed=st.integers(0, 2 ** 32 - 1), far=st.floats(1e-3, 1e3))
def test_learned_patterns_are_valid_even_outside_the_training_domain(levels, seed, far):
    (c,) = LL.sample_configs(np.random.default_rng(seed), 1, levels)
    c = ML.LevelConfig(tuple(x * far for x in c.costs), c.restarts, c.rates, c.work)  # costs scaled anywhere
    p = LL.predict(c)
    assert len(p.ratios) == levels - 1 and all(isinstance(r, int) and r >= 1 for r in p.ratios)
    assert math.isfinite(p.period) and p.period > 0 and p.makespan >= c.work


def test_fit_recovers_a_polynomial_correction_exactly():
    """One level: optima whose period is the first-order one times exp(a quadratic in the features)."""
    def truth(c):
        x = LL.features(c)
        return math.sqrt(2 * c.costs[0] / c.rates[0]) * math.exp(0.1 * x[0] - 0.05 * x[-1] + 0.02 * x[0] ** 2)

    # long jobs (thousands of periods): fitting the period to the work (the prediction's last step) moves it
    # by less than 1e-3, so the regression itself is what is checked
    configs = [ML.LevelConfig(c.costs, c.restarts, c.rates, c.work * 1e4)
               for c in LL.sample_configs(np.random.default_rng(5), 100, 1)]
    model = LL.fit(configs, [ML.Pattern(truth(c), ()) for c in configs], degree=2, ridge=1e-12)
    for c in configs[::5]:  # inside the training range (a held-out one may be clipped to its edge)
        got = LL.predict(c, model, with_makespan=False)
        assert got.ratios == () and got.period == pytest.approx(truth(c), rel=1e-3)


def test_model_file_errors(tmp_path):
    bad = tmp_path / "model.json"
    bad.write_text(json.dumps({"format": "something else"}))
    with pytest.raises(CheckpointError, match="not a"):
        LL.load_models(str(bad))
    with pytest.raises(CheckpointError, match="cannot read"):
        LL.load_models(str(tmp_path / "missing.json"))
    c = LL.sample_configs(np.random.default_rng(1), 1, 3)[0]
    with pytest.raises(CheckpointError, match="level"):
        LL.predict(c, LL.load_models()[2])


def test_the_shipped_model_has_two_and_three_levels_and_needs_no_sklearn():
    assert {2, 3} <= set(LL.load_models())
    code = ("import sys, hpcckpt, hpcckpt.policy.learned_levels as L, hpcckpt.policy.multilevel as M;"
            "c = M.LevelConfig((10.0, 300.0), (10.0, 300.0), (2e-5, 5e-6), 1e6); L.predict(c);"
            "print('sklearn' in sys.modules, 'scipy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
