"""The pure rules of self-adaptive pre-copy (hpcckpt.saving.precopy_plan): rounds, stop, block size."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcckpt import CheckpointError
from hpcckpt.saving.precopy_plan import PrecopyConfig, PrecopyPlan

fractions = st.floats(0.0, 1.0, allow_nan=False)


def run_interval(plan: PrecopyPlan, rate: float, calls: int = 50) -> list:
    """Drive one interval at ``calls`` evenly spaced calls, the state changing at ``rate`` per unit progress."""
    ran, last = [], 0.0
    for k in range(calls):
        p = k / calls
        if plan.wants_round(p):
            changed = min(1.0, rate * (p - last)) if ran else min(1.0, rate * p)
            ran.append(p)
            last = p
            plan.round_done(p, changed)
    return ran


@settings(max_examples=200, deadline=None)
@given(rate=st.floats(0.0, 5.0, allow_nan=False), calls=st.integers(2, 200))
def test_rounds_are_ordered_bounded_and_before_the_checkpoint(rate, calls):
    config = PrecopyConfig()
    plan = PrecopyPlan(config, 1 << 20)
    ran = run_interval(plan, rate, calls)
    assert ran == sorted(ran) and len(set(ran)) == len(ran)
    assert len(ran) <= config.max_rounds
    assert all(config.start <= p < 1.0 for p in ran)
    if calls >= 4 and rate * (1 - config.start) < config.stop_fraction:
        assert ran  # a state that pays gets at least its first round


@settings(max_examples=200, deadline=None)
@given(rate=st.floats(0.0, 5.0, allow_nan=False))
def test_a_state_that_changes_everywhere_stops_and_backs_off(rate):
    config = PrecopyConfig()
    plan = PrecopyPlan(config, 1 << 20)
    run_interval(plan, rate, 100)
    if plan.stopped:  # only when what changes before the checkpoint would be most of the state
        assert plan.rate * (1 - plan.last_progress) >= config.stop_fraction
        plan.checkpoint_done(1.0)
        assert not plan.active and not any(plan.wants_round(p / 10) for p in range(10))  # skipped interval
        plan.checkpoint_done(1.0)
        assert plan.active  # then it probes again
    else:
        assert plan.rate is None or plan.rate * (1 - plan.last_progress) < config.stop_fraction


def test_everywhere_every_step_stops_after_the_second_round_and_the_backoff_doubles():
    plan = PrecopyPlan(PrecopyConfig(), 1 << 20)
    skips = []
    for _ in range(6):
        run_interval(plan, 50.0)  # everything changes at every call
        assert plan.rounds <= 2
        skips.append(plan.skip)
        plan.checkpoint_done(1.0)
        while plan.skip:
            assert run_interval(plan, 50.0) == []
            plan.checkpoint_done(1.0)
    assert skips == [1, 2, 4, 8, 8, 8]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 50.0, allow_nan=False), fractions, st.booleans()), min_size=1, max_size=30))
def test_rounds_probe_from_a_stop_until_an_interval_shows_that_precopy_pays(intervals):
    """The first interval copies; a stop turns the rounds into probes (hash only), and only an interval whose
    rounds ran, did not stop, and left less than ``stop_fraction`` changed at a timely checkpoint turns them back."""
    config = PrecopyConfig()
    plan = PrecopyPlan(config, 1 << 20)
    assert plan.copies
    for rate, fraction, late in intervals:
        copies = plan.copies
        ran = run_interval(plan, rate) if plan.active else []
        stopped_in_rounds, backoff = plan.stopped, plan.backoff
        plan.checkpoint_done(fraction, late)
        stopped = stopped_in_rounds or plan.backoff > backoff or (plan.skip == config.max_backoff and ran)
        pays = bool(ran) and not stopped_in_rounds and not late and fraction < config.stop_fraction
        if stopped:
            assert not plan.copies
        elif pays:
            assert plan.copies and plan.backoff == 1
        else:
            assert plan.copies == copies  # a skipped interval, or a late one that did not stop, changes nothing


def test_after_a_stop_the_next_active_interval_probes_and_copies_again_once_it_pays():
    plan = PrecopyPlan(PrecopyConfig(), 1 << 20)
    run_interval(plan, 50.0)  # changes everywhere: stops in its rounds
    plan.checkpoint_done(1.0)
    assert plan.skip == 1 and not plan.copies
    plan.checkpoint_done(1.0)  # the skipped interval
    assert plan.active and not plan.copies  # it probes: rounds that hash only
    assert run_interval(plan, 0.2)  # the state has slowed down: the probe rounds run and do not stop
    plan.checkpoint_done(0.05)
    assert plan.active and plan.copies and plan.backoff == 1  # it pays again: the next interval copies
    run_interval(plan, 50.0)
    plan.checkpoint_done(1.0)
    plan.checkpoint_done(1.0)
    run_interval(plan, 50.0)  # a probe that stops: it backs off again and the next active one probes
    plan.checkpoint_done(1.0)
    assert plan.skip == 2 and not plan.copies


def test_a_slow_state_gets_more_rounds_than_none_and_stops_once_little_is_left():
    plan = PrecopyPlan(PrecopyConfig(target=0.02), 1 << 20)
    ran = run_interval(plan, 0.2, 1000)
    assert 2 <= len(ran) <= 4
    plan2 = PrecopyPlan(PrecopyConfig(target=0.02), 1 << 20)
    assert len(run_interval(plan2, 0.01, 1000)) == 2  # 1% per interval: the second round shows little is left


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(fractions, st.integers(0, 1 << 30)), max_size=30))
def test_the_block_size_stays_a_power_of_two_step_within_bounds(checkpoints):
    config = PrecopyConfig(min_block=1 << 16, max_block=1 << 22)
    plan = PrecopyPlan(config, 1 << 20)
    for fraction, nbytes in checkpoints:
        size = plan.adapt_block(fraction, nbytes, True)
        assert config.min_block <= size <= config.max_block
        assert (size & (size - 1)) == 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(fractions, st.integers(0, 1 << 30), st.booleans()), max_size=20),
       st.lists(st.tuples(st.floats(0.0, 5.0, allow_nan=False), st.booleans()), min_size=20, max_size=20))
def test_the_block_size_depends_on_the_global_figures_only(checkpoints, own):
    """Two ranks whose own rounds differ (rates, late writers) keep one block size: the grid is global."""
    a, b = PrecopyPlan(PrecopyConfig(), 1 << 20), PrecopyPlan(PrecopyConfig(), 1 << 20)
    for (fraction, nbytes, used), (rate, late) in zip(checkpoints, own):
        run_interval(a, rate)
        a.checkpoint_done(fraction, late)
        b.checkpoint_done(fraction)
        assert a.adapt_block(fraction, nbytes, used) == b.adapt_block(fraction, nbytes, used)


def test_block_size_halves_when_sparse_and_undoes_a_halving_that_did_not_pay():
    plan = PrecopyPlan(PrecopyConfig(), 1 << 20)
    assert plan.adapt_block(0.05, 1000, True) == 1 << 19
    assert plan.adapt_block(0.05, 900, True) == 1 << 20  # 900 > 0.75 * 1000: back
    for _ in range(3):
        assert plan.adapt_block(0.05, 900, True) == 1 << 20  # and not halved again
    assert plan.adapt_block(0.01, 10, False) == 1 << 20  # no pre-copied block anywhere: no change
    dense = PrecopyPlan(PrecopyConfig(), 1 << 20)
    assert dense.adapt_block(0.4, 1000, True) == 1 << 21


@pytest.mark.parametrize("bad", [{"start": 1.5}, {"max_rounds": 0}, {"min_block": 8, "max_block": 4},
                                 {"nope": 1}, "yes", 3])
def test_bad_settings_are_checkpoint_errors(bad):
    with pytest.raises(CheckpointError):
        PrecopyConfig.from_option(bad)


def test_rounds_still_writing_at_the_checkpoint_move_the_start_earlier_then_stop():
    plan = PrecopyPlan(PrecopyConfig(start=0.5), 1 << 20)
    starts = []
    for _ in range(3):
        run_interval(plan, 0.1)
        plan.checkpoint_done(0.01, late=True)
        starts.append(plan.start)
    assert starts == [0.25, 0.0, 0.0] and plan.skip == 1  # at 0 already: the writes are too slow, stop
    assert run_interval(plan, 0.1) == []
