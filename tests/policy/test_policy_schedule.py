"""Tests for the policy objects, CostEstimator, Schedule (deadlines) and SignalFlag."""

import os
import signal
import threading
import time
import warnings

import pytest

from hpcckpt.errors import CheckpointError
from hpcckpt.policy import (
    CostEstimator,
    Daly,
    FixedSeconds,
    FixedSteps,
    Learned,
    Schedule,
    SignalFlag,
    Young,
    daly,
    end_time_from_env,
    young,
)

H = 3600.0


# ----------------------------------------------------------------- policies
def test_fixed_steps_and_seconds():
    p = FixedSteps(10)
    assert p.interval(None, None) == 10
    assert not p.due(0, 0, 9, 0, None, None)
    assert p.due(0, 0, 10, 0, None, None)
    assert p.due(0, 0, 30, 20, None, None) and not p.due(0, 0, 25, 15, None, None)  # multiples of n
    assert p.due(0, 0, 20, None, None, None) and not p.due(0, 0, 20, 20, None, None)  # never twice a step
    q = FixedSeconds(60)
    assert not q.due(159.9, 100.0, 0, 0, None, None) and q.due(160.0, 100.0, 0, 0, None, None)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(CheckpointError):
            FixedSteps(bad)
    with pytest.raises(CheckpointError):
        FixedSeconds(float("nan"))


def test_young_daly_policies_fixed_or_estimated_mtbf():
    assert Young().interval(40, 43200) == young(40, 43200)
    assert Daly().interval(40, 43200) == daly(40, 43200)
    assert Daly(mtbf=1000).interval(40, 43200) == daly(40, 1000)  # own MTBF wins
    with pytest.raises(CheckpointError):
        Young().interval(40, None)
    tau = daly(40, 43200)
    assert not Daly().due(tau - 1, 0.0, 5, 0, 40, 43200)
    assert Daly().due(tau, 0.0, 5, 0, 40, 43200)


def test_learned_policy_updates_with_failures():
    p = Learned(prior_mtbf=100 * H, weibull=False)  # identical gaps would fit Weibull k >> 1
    assert p.mtbf_estimate() == pytest.approx(100 * H)
    for _ in range(10):
        p.record_failure(10 * H)
    # (100 h + 100 h) / (1 + 10)
    assert p.mtbf_estimate() == pytest.approx(200 * H / 11)
    assert p.interval(60) == pytest.approx(daly(60, 200 * H / 11))
    p.record_exposure(20 * H)
    assert p.mtbf_estimate() == pytest.approx(220 * H / 11)


def test_cost_estimator_median_and_ewma():
    c = CostEstimator(initial=5.0)
    assert c.value() == 5.0 and c.high() == 5.0
    for x in (10, 12, 100, 11):
        c.record(x)
    assert c.value() == 11.5  # median of 10, 11, 12, 100
    assert c.high() == 100
    e = CostEstimator(method="ewma", alpha=0.5)
    assert e.value() is None
    e.record(10)
    e.record(20)
    assert e.value() == 15.0
    w = CostEstimator(window=2)
    for x in (100, 1, 3):
        w.record(x)
    assert w.value() == 2.0 and w.high() == 3
    for bad in (-1, float("nan"), "x"):
        with pytest.raises(CheckpointError):
            c.record(bad)
    with pytest.raises(CheckpointError):
        CostEstimator(method="mean")


# ----------------------------------------------------------------- schedule
def test_schedule_interval_uses_measured_cost():
    s = Schedule(Daly(), mtbf=12 * H, initial_cost=30.0)
    assert s.interval() == pytest.approx(daly(30, 12 * H))
    assert not s.due(1000.0, 0)  # start time = first call
    assert s.due(1000.0 + daly(30, 12 * H), 5)
    s.record_save(2000.0, 5, 120.0)
    assert s.interval() == pytest.approx(daly(120, 12 * H))
    assert not s.due(2000.0 + daly(120, 12 * H) - 1, 6)
    assert s.due(2000.0 + daly(120, 12 * H), 7)


def test_schedule_fixed_steps():
    s = Schedule(FixedSteps(3), start_step=10)  # a restart at step 10 keeps the multiples of 3
    assert [s.due(float(t), t) for t in range(10, 17)] == [False, False, True, False, False, True, False]
    s.record_save(12.0, 12, 1.0)
    assert [s.due(float(t), t) for t in range(12, 19)] == [False, False, False, True, False, False, True]


def test_schedule_mtbf_sources():
    assert Schedule(Young(), mtbf=lambda now: 2 * H).mtbf() == 2 * H
    learned = Learned(prior_mtbf=5 * H)
    assert Schedule(learned).mtbf(0.0) == 5 * H
    with pytest.raises(CheckpointError, match="no MTBF"):
        Schedule(Young())
    with pytest.raises(CheckpointError):
        Schedule(Young(), mtbf=-1)
    with pytest.raises(CheckpointError):
        Schedule("daly")


def test_deadline_margin_rule():
    # margin = max(2 * C_hi, 30 s) + step time
    end = 100000.0
    s = Schedule(FixedSeconds(1e9), deadline=end, margin_factor=2.0, margin_floor=30.0, initial_cost=5.0)
    assert s.margin() == 30.0  # 2 * 5 < 30 -> floor
    s.record_save(1000.0, 1, 100.0)  # a measured blocking cost of 100 s
    assert s.margin() == 200.0
    assert not s.deadline_due(end - 200.1)
    assert s.deadline_due(end - 200.0)
    assert s.decide(end - 150.0, 2).reason == "deadline"
    assert s.decide(end - 150.0, 2).final
    # once a save is recorded inside the window, no more deadline saves
    s.record_save(end - 50.0, 2, 100.0)
    assert not s.deadline_due(end - 40.0)
    assert s.deadline_window_open(end - 40.0)


def test_deadline_margin_includes_step_time():
    end = 10000.0
    s = Schedule(FixedSeconds(1e9), deadline=end, margin_floor=30.0, initial_cost=1.0)
    # steps take 100 s each
    for step in range(5):
        s.due(1000.0 + 100.0 * step, step)
    assert s.step_seconds == pytest.approx(100.0)
    assert s.margin() == pytest.approx(130.0)
    assert not s.deadline_due(end - 131.0)
    assert s.deadline_due(end - 129.0)


def test_no_deadline_never_due():
    s = Schedule(FixedSeconds(10))
    assert not s.deadline_due(1e12) and not s.deadline_window_open(1e12)


def test_decide_priorities():
    s = Schedule(FixedSeconds(100), deadline=1000.0, margin_floor=10, initial_cost=1)
    assert s.decide(0.0, 0).save is False
    assert s.decide(1.0, 1, signalled=True).reason == "signal"
    assert s.decide(100.0, 2).reason == "interval"
    assert not s.decide(100.0, 2).final
    assert s.decide(995.0, 3).reason == "deadline"


def test_end_time_from_env():
    assert end_time_from_env({"SLURM_JOB_END_TIME": "1700000000"}) == 1700000000.0
    assert end_time_from_env({}) is None
    assert end_time_from_env({"SLURM_JOB_END_TIME": ""}) is None
    assert end_time_from_env({"SLURM_JOB_END_TIME": "0"}) is None
    with pytest.warns(RuntimeWarning):
        assert end_time_from_env({"SLURM_JOB_END_TIME": "tomorrow"}) is None


# ------------------------------------------------------------------ signals
def _wait_for(flag, timeout=2.0):
    t0 = time.monotonic()
    while not flag and time.monotonic() - t0 < timeout:
        time.sleep(0.001)
    return bool(flag)


def test_signal_flag_sigusr1_and_restore():
    prev = signal.getsignal(signal.SIGUSR1)
    sentinel_hits = []

    def sentinel(signum, frame):
        sentinel_hits.append(signum)

    signal.signal(signal.SIGUSR1, sentinel)
    try:
        flag = SignalFlag().install()
        assert flag.installed and not flag
        os.kill(os.getpid(), signal.SIGUSR1)
        assert _wait_for(flag)
        assert flag.signum == signal.SIGUSR1 and flag.is_set
        assert sentinel_hits == [signal.SIGUSR1]  # chained: the application's handler runs too
        flag.clear()
        assert not flag
        flag.uninstall()
        assert signal.getsignal(signal.SIGUSR1) is sentinel
        os.kill(os.getpid(), signal.SIGUSR1)
        t0 = time.monotonic()
        while len(sentinel_hits) < 2 and time.monotonic() - t0 < 2:
            time.sleep(0.001)
        assert sentinel_hits == [signal.SIGUSR1] * 2 and not flag
    finally:
        signal.signal(signal.SIGUSR1, prev)


def test_signal_flag_sigterm_context_manager():
    prev = signal.getsignal(signal.SIGTERM)
    with SignalFlag(signals=(signal.SIGTERM,)) as flag:
        os.kill(os.getpid(), signal.SIGTERM)
        assert _wait_for(flag) and flag.signum == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) == prev


def test_signal_flag_outside_main_thread_warns_and_skips():
    out = {}

    def worker():
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            f = SignalFlag().install()
            out["installed"] = f.installed
            out["warned"] = any("main thread" in str(w.message) for w in rec)

    before = signal.getsignal(signal.SIGUSR1)
    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert out == {"installed": False, "warned": True}
    assert signal.getsignal(signal.SIGUSR1) == before


def test_progress_towards_the_next_checkpoint():
    from hpcckpt.policy import FixedSeconds, FixedSteps, Schedule

    steps = Schedule(FixedSteps(8), start_time=0.0)
    assert [steps.progress(0.0, s) for s in (8, 9, 12, 15, 16)] == [0.0, 0.125, 0.5, 0.875, 0.0]
    secs = Schedule(FixedSeconds(100.0), start_time=1000.0)
    assert secs.progress(1000.0, 1) == 0.0 and secs.progress(1025.0, 2) == 0.25 and secs.progress(5000.0, 3) == 1.0
    secs.record_save(1100.0, 3, 1.0)
    assert secs.progress(1150.0, 4) == 0.5  # from the last save
