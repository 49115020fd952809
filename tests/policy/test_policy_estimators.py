"""Tests for the failure history (persistence, failure detection) and the MTBF estimators."""

import json
import math
import os
import warnings

import numpy as np
import pytest

from hpcckpt.errors import CheckpointError
from hpcckpt.policy import (
    DEFAULT_MTBF,
    FailureHistory,
    estimate_mtbf,
    gamma_posterior,
    weibull_mle,
)
from hpcckpt.policy.history import HISTORY_FILENAME

H = 3600.0


# ------------------------------------------------------------------ history
def test_unclean_run_is_a_failure_with_heartbeat_exposure(tmp_path):
    h = FailureHistory.load(str(tmp_path))
    assert h.runs == []
    assert h.job_start(1000.0, job_id="42", restart_count=0) == []
    h.heartbeat(1000.0 + 2 * H)
    # killed; the next start detects it: exposure = last heartbeat - start = 2 h
    h2 = FailureHistory.load(str(tmp_path))
    new = h2.job_start(1000.0 + 5 * H, job_id="42", restart_count=1)
    assert len(new) == 1 and new[0].failed and new[0].exposure == pytest.approx(2 * H)
    h2.clean_end(1000.0 + 6 * H)
    h3 = FailureHistory.load(str(tmp_path))
    assert h3.n_failures == 1
    assert h3.observations() == [(2 * H, True), (1 * H, False)]
    assert h3.total_exposure() == pytest.approx(3 * H)


def test_unclean_run_without_heartbeat_uses_next_start(tmp_path):
    h = FailureHistory.load(str(tmp_path))
    h.job_start(0.0, job_id="7")
    new = h.job_start(3 * H, job_id="7")
    assert new[0].exposure == pytest.approx(3 * H)
    assert FailureHistory.load(str(tmp_path)).n_failures == 1


def test_clean_end_is_not_a_failure(tmp_path):
    h = FailureHistory.load(str(tmp_path))
    h.job_start(0.0)
    h.clean_end(H, reason="deadline")
    h.job_start(2 * H)
    h = FailureHistory.load(str(tmp_path))
    assert h.n_failures == 0
    assert h.runs[0].end_reason == "deadline"
    assert h.current is not None
    assert h.observations(now=2.5 * H) == [(H, False), (0.5 * H, False)]


def test_restart_count_gap_adds_zero_exposure_failures(tmp_path):
    h = FailureHistory.load(str(tmp_path))
    h.job_start(0.0, job_id="9", restart_count=0)
    h.heartbeat(100.0)
    # SLURM restarted it 3 times; attempts 1 and 2 never recorded a start
    new = h.job_start(500.0, job_id="9", restart_count=3)
    assert [r.exposure for r in new] == [100.0, 0.0, 0.0]
    assert FailureHistory.load(str(tmp_path)).n_failures == 3


def test_write_is_atomic_and_valid_json(tmp_path, monkeypatch):
    h = FailureHistory.load(str(tmp_path))
    h.job_start(0.0)
    path = tmp_path / HISTORY_FILENAME
    before = path.read_text()
    calls = []
    real_replace = os.replace

    def spy(src, dst):
        calls.append((src, dst))
        assert json.load(open(src))["runs"][0]["last_alive"] == 5.0  # temp file complete first
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    h.heartbeat(5.0)
    assert len(calls) == 1 and calls[0][1] == str(path)
    assert os.path.dirname(calls[0][0]) == str(tmp_path)
    assert path.read_text() != before
    assert [p.name for p in tmp_path.iterdir()] == [HISTORY_FILENAME]  # no temp left behind

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        h.heartbeat(6.0)
    assert json.loads(path.read_text())["runs"][0]["last_alive"] == 5.0  # old file intact
    assert [p.name for p in tmp_path.iterdir()] == [HISTORY_FILENAME]


@pytest.mark.parametrize("content", [
    "{not json", "[]", '{"format": "other"}',
    '{"format": "hpcckpt-failure-history", "version": 99, "runs": []}',
    '{"format": "hpcckpt-failure-history", "version": 1, "runs": [{"start": "x"}]}',
    '{"format": "hpcckpt-failure-history", "version": 1, "runs": [{"start": 1, "failed": true}]}',
    b"\xff\xfe\x00garbage",
])
def test_malformed_history_warns_and_starts_fresh(tmp_path, content):
    path = tmp_path / HISTORY_FILENAME
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    with pytest.warns(RuntimeWarning, match="malformed failure history"):
        h = FailureHistory.load(str(tmp_path))
    assert h.runs == []
    assert (tmp_path / (HISTORY_FILENAME + ".bad")).exists()
    h.job_start(1.0)  # and it can be used and rewritten
    assert FailureHistory.load(str(tmp_path)).current.start == 1.0


def test_missing_history_is_empty_without_warning(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        h = FailureHistory.load(str(tmp_path / "sub"))
    assert h.runs == [] and not (tmp_path / "sub").exists()


def test_history_rejects_bad_event_values(tmp_path):
    h = FailureHistory.load(str(tmp_path))
    with pytest.raises(CheckpointError):
        h.job_start(float("nan"))
    with pytest.raises(CheckpointError):
        h.job_start(0.0, restart_count=-1)


# --------------------------------------------------------------- estimators
def test_gamma_poisson_hand_computed():
    # prior M0 = 10 h, weight 1 -> Gamma(1, 10 h); 4 failures in 30 h -> Gamma(5, 40 h); MTBF = 8 h
    a, b = gamma_posterior(4, 30 * H, 10 * H, 1.0)
    assert (a, b) == (5.0, 40 * H)
    est = estimate_mtbf([(10 * H, True), (5 * H, True), (5 * H, True), (8 * H, True), (2 * H, False)],
                        prior_mtbf=10 * H)
    assert est.mtbf == pytest.approx(8 * H)
    assert est.method == "gamma-poisson" and est.n_failures == 4
    assert est.exposure == pytest.approx(30 * H)
    assert est.weibull_shape is None


def test_prior_only_and_default():
    est = estimate_mtbf([])
    assert est.mtbf == DEFAULT_MTBF and est.method == "prior"
    assert "prior" in str(est) and "\n" not in str(est)
    assert estimate_mtbf([], prior_mtbf=5 * H).mtbf == 5 * H


def test_estimate_from_history(tmp_path):
    h = FailureHistory.load(str(tmp_path))
    h.job_start(0.0)
    h.job_start(4 * H)  # failure, exposure 4 h
    est = estimate_mtbf(h, prior_mtbf=2 * H)  # (2 h + 4 h) / (1 + 1) = 3 h
    assert est.mtbf == pytest.approx(3 * H)
    est_now = estimate_mtbf(h, prior_mtbf=2 * H, now=10 * H)  # + 6 h censored: 12 h / 2
    assert est_now.mtbf == pytest.approx(6 * H)


@pytest.mark.parametrize("bad", [[-1.0], [float("nan")], [(1.0, True, 3)], ["abc"]])
def test_estimator_rejects_bad_observations(bad):
    with pytest.raises(CheckpointError):
        estimate_mtbf(bad)
    with pytest.raises(CheckpointError):
        estimate_mtbf([1.0], prior_mtbf=0.0)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_exponential_log_recovers_mtbf(seed):
    rng = np.random.default_rng(seed)
    m = 12 * H
    t = rng.exponential(m, 400)
    est = estimate_mtbf(list(t), prior_mtbf=120 * H)  # prior off by 10x, weight 1
    # 400 failures: relative s.e. 1/sqrt(400) = 5 %; allow 15 %
    assert est.mtbf == pytest.approx(m, rel=0.15)
    assert est.method == "gamma-poisson"
    assert est.weibull_shape == pytest.approx(1.0, abs=0.15)


def test_exponential_with_censoring_recovers_mtbf():
    rng = np.random.default_rng(5)
    m = 6 * H
    fail = rng.exponential(m, 500)
    cens = rng.uniform(0, 12 * H, 500)
    obs = [(min(f, c), f <= c) for f, c in zip(fail, cens)]
    est = estimate_mtbf(obs)
    assert est.mtbf == pytest.approx(m, rel=0.15)
    assert est.method == "gamma-poisson"


@pytest.mark.parametrize("k,seed", [(0.6, 11), (0.7, 12), (2.0, 13)])
def test_weibull_log_recovers_shape_and_scale(k, seed):
    rng = np.random.default_rng(seed)
    scale = 10 * H
    t = rng.weibull(k, 400) * scale
    fit = weibull_mle(list(t))
    # asymptotic s.e. of k-hat ~ 0.78 k / sqrt(n) = 4 %: allow 15 %
    assert fit.shape == pytest.approx(k, rel=0.15)
    assert fit.scale == pytest.approx(scale, rel=0.15)
    est = estimate_mtbf(list(t))
    assert est.method == "weibull-mle"
    assert est.mtbf == pytest.approx(scale * math.gamma(1 + 1 / k), rel=0.15)
    assert "k=" in str(est)


def test_weibull_with_censoring():
    rng = np.random.default_rng(21)
    k, scale = 0.6, 8 * H
    fail = rng.weibull(k, 600) * scale
    cens = rng.uniform(0, 30 * H, 600)
    obs = [(min(f, c), bool(f <= c)) for f, c in zip(fail, cens)]
    fit = weibull_mle(obs)
    assert fit.shape == pytest.approx(k, rel=0.15)
    assert fit.scale == pytest.approx(scale, rel=0.2)


def test_weibull_needs_five_failures():
    # four very regular failures: Weibull would be far from 1, but n < 5 -> Gamma-Poisson
    est = estimate_mtbf([10 * H, 10.1 * H, 9.9 * H, 10 * H], prior_mtbf=10 * H)
    assert est.method == "gamma-poisson" and est.weibull_shape is None
    est5 = estimate_mtbf([10 * H, 10.1 * H, 9.9 * H, 10 * H, 10.05 * H], prior_mtbf=10 * H)
    assert est5.method == "weibull-mle" and est5.weibull_shape > 10


def test_weibull_false_positive_rate_on_exponential_data():
    # the LR test at 1 % plus the shape band should rarely pick Weibull for exponential data
    rng = np.random.default_rng(99)
    picked = sum(estimate_mtbf(list(rng.exponential(H, 8))).method == "weibull-mle" for _ in range(200))
    assert picked <= 8  # expected ~1 % of 200
