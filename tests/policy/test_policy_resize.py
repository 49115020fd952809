"""hpcckpt.policy.choose_resize: the in-memory vs checkpoint-and-restart decision (pure, hypothesis)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpcckpt import CheckpointError
from hpcckpt.policy import CHECKPOINT_RESTART, REDISTRIBUTE, choose_resize

sizes = st.floats(0, 1e15, allow_nan=False)
bandwidths = st.floats(1e3, 1e12, allow_nan=False)
overheads = st.floats(0, 1e4, allow_nan=False)


@given(sizes, bandwidths, bandwidths, bandwidths, overheads, overheads, st.booleans())
def test_the_choice_is_the_faster_estimate_and_says_why(state, bw_r, bw_s, bw_l, over_r, over_c, due):
    c = choose_resize(state, bw_r, bw_s, bw_l, redistribute_overhead=over_r, restart_overhead=over_c, save_due=due)
    assert math.isclose(c.redistribute_seconds, state / bw_r + over_r, rel_tol=1e-12)
    assert math.isclose(c.restart_seconds, (0 if due else state / bw_s) + state / bw_l + over_c, rel_tol=1e-12)
    assert c.method == (REDISTRIBUTE if c.redistribute_seconds <= c.restart_seconds else CHECKPOINT_RESTART)
    assert c.reason.startswith(c.method + ":") and "redistribute" in c.reason and "checkpoint-restart" in c.reason
    assert ("save due anyway" in c.reason) == due


@given(sizes, bandwidths, bandwidths, bandwidths, st.floats(1.0, 1e3))
def test_a_faster_network_never_turns_redistribution_into_a_restart(state, bw_r, bw_s, bw_l, factor):
    slow = choose_resize(state, bw_r, bw_s, bw_l)
    fast = choose_resize(state, bw_r * factor, bw_s, bw_l)
    assert not (slow.method == REDISTRIBUTE and fast.method == CHECKPOINT_RESTART)


@given(sizes, bandwidths, st.floats(0, 1e12), st.floats(0, 1e12))
def test_too_little_memory_forces_a_restart(state, bw, peak, free):
    c = choose_resize(state, bw * 1e6, bw, bw, peak_bytes_per_rank=peak, free_bytes_per_rank=free)
    if peak > free:
        assert c.method == CHECKPOINT_RESTART and "free" in c.reason
    else:
        assert c.method == REDISTRIBUTE  # a million times faster in memory


def test_the_papers_case_memory_wins_and_a_slow_network_loses():
    gib = 1 << 30
    assert choose_resize(gib, 10 * gib, 2 * gib, 2 * gib).method == REDISTRIBUTE
    assert choose_resize(gib, 0.1 * gib, 2 * gib, 2 * gib).method == CHECKPOINT_RESTART
    # a save due anyway makes the restart cheaper, but not cheaper than moving in memory at the same speed
    assert choose_resize(gib, 2 * gib, 2 * gib, 2 * gib, save_due=True).method == REDISTRIBUTE


@pytest.mark.parametrize("kwargs", [dict(state_bytes=-1), dict(redistribute_bandwidth=0), dict(save_bandwidth=math.nan),
                                    dict(load_bandwidth=math.inf), dict(restart_overhead=-2), dict(moved_bytes="x")])
def test_bad_numbers_are_a_checkpoint_error(kwargs):
    args = {**dict(state_bytes=1, redistribute_bandwidth=1, save_bandwidth=1, load_bandwidth=1), **kwargs}
    with pytest.raises(CheckpointError):
        choose_resize(**args)
