"""MTBF estimators from a failure history: Gamma-Poisson posterior and Weibull MLE.

Why: the interval formulas need M, which has to be learned from few failures.
A Bayesian estimate with a weak prior gives a sensible value from the first
run; a Weibull fit catches failure processes that are clearly not memoryless.

Observations are ``(exposure_seconds, failed)`` pairs: one per run, the time it
was at risk and whether it ended in a failure (``failed=False`` means
right-censored: it ended cleanly or is still running).

**Gamma-Poisson** (the default).  Failures are a Poisson process of rate
``lam``; the prior is ``Gamma(shape=a0, rate=b0)`` with ``a0 = w`` pseudo-failures
observed in ``b0 = w * M0`` pseudo-seconds, so the prior mean rate is ``1/M0``.
``M0`` is the user's MTBF (``prior_mtbf``) or :data:`DEFAULT_MTBF` = 24 h, and
the weight ``w`` is :data:`DEFAULT_PRIOR_WEIGHT` = 1 pseudo-failure (the prior
counts as much as one observed failure, so ten real failures dominate it).
After ``n`` failures in total exposure ``T`` the posterior is
``Gamma(w + n, w M0 + T)`` and the estimate reported is the MTBF at the
posterior mean rate, ``(w M0 + T) / (w + n)``.  (The posterior mean of
``1/lam`` itself is ``(w M0 + T)/(w + n - 1)``, which is infinite with one
pseudo-failure and no data, so it is not used.)

**Weibull** (``shape k``, ``scale lam``, mean ``lam Gamma(1 + 1/k)``).  With at
least :data:`WEIBULL_MIN_FAILURES` = 5 failures (of positive exposure), the
maximum-likelihood fit with right-censoring is computed: the profile
likelihood gives ``lam^k = sum_all t^k / r`` (``r`` failures) and ``k`` solves

    sum_all t^k ln t / sum_all t^k - 1/k - mean_failures(ln t) = 0,

whose left side increases in ``k``; it is solved by bisection on ``log k``.
The Weibull mean replaces the Gamma-Poisson estimate when the shape is *far
from 1*: ``k`` outside [0.8, 1.25] **and** the likelihood-ratio test against
the exponential (``k = 1``) rejects it at the 1 % level (``2 (l_weibull -
l_exp) > 6.635``, the 0.99 quantile of chi-square with 1 degree of freedom).
The Weibull estimate ignores the prior.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Tuple

import numpy as np

from hpcckpt.errors import CheckpointError
from hpcckpt.core.humanize import format_duration

__all__ = [
    "Estimate",
    "WeibullFit",
    "estimate_mtbf",
    "gamma_posterior",
    "weibull_mle",
    "DEFAULT_MTBF",
    "DEFAULT_PRIOR_WEIGHT",
    "WEIBULL_MIN_FAILURES",
]

DEFAULT_MTBF = 24 * 3600.0
DEFAULT_PRIOR_WEIGHT = 1.0
WEIBULL_MIN_FAILURES = 5
WEIBULL_SHAPE_BAND = (0.8, 1.25)
WEIBULL_LR_CRITICAL = 6.635  # chi2(1) 0.99 quantile


@dataclass(frozen=True)
class WeibullFit:
    shape: float
    scale: float
    loglik: float
    loglik_exp: float
    n_failures: int

    @property
    def mean(self) -> float:
        return self.scale * math.gamma(1.0 + 1.0 / self.shape)

    @property
    def lr_statistic(self) -> float:
        return max(0.0, 2.0 * (self.loglik - self.loglik_exp))

    @property
    def far_from_exponential(self) -> bool:
        lo, hi = WEIBULL_SHAPE_BAND
        return (self.shape < lo or self.shape > hi) and self.lr_statistic > WEIBULL_LR_CRITICAL


@dataclass(frozen=True)
class Estimate:
    """An MTBF estimate and where it came from; ``str()`` is one line for ``hpcckpt ls``."""

    mtbf: float
    method: str  # "prior", "gamma-poisson" or "weibull-mle"
    n_failures: int
    exposure: float
    weibull_shape: Optional[float] = None
    weibull_scale: Optional[float] = None
    prior_mtbf: float = DEFAULT_MTBF
    prior_weight: float = DEFAULT_PRIOR_WEIGHT

    def __str__(self) -> str:
        head = f"MTBF {format_duration(self.mtbf)} ({self.method}"
        if self.method == "weibull-mle":
            head += f", shape k={self.weibull_shape:.2f}"
        head += f"; {self.n_failures} failure{'s' if self.n_failures != 1 else ''}"
        head += f" in {format_duration(self.exposure)} exposure"
        if self.method != "weibull-mle":
            head += f"; prior {format_duration(self.prior_mtbf)} x{self.prior_weight:g}"
            if self.weibull_shape is not None:
                head += f"; weibull k={self.weibull_shape:.2f} not used"
        return head + ")"


def _as_observations(data) -> List[Tuple[float, bool]]:
    """Accept a FailureHistory, a sequence of failure intervals, or (exposure, failed) pairs."""
    from hpcckpt.policy.history import FailureHistory  # local: avoid import cycle at load

    if isinstance(data, FailureHistory):
        data = data.observations()
    if data is None:
        return []
    obs: List[Tuple[float, bool]] = []
    for item in data:
        if isinstance(item, (tuple, list)):
            if len(item) != 2:
                raise CheckpointError(f"observation must be (exposure, failed), got {item!r}")
            t, failed = item
            failed = bool(failed)
        else:
            t, failed = item, True
        try:
            t = float(t)
        except (TypeError, ValueError):
            raise CheckpointError(f"exposure must be a number, got {t!r}") from None
        if not math.isfinite(t) or t < 0:
            raise CheckpointError(f"exposure must be finite and >= 0, got {t!r}")
        obs.append((t, failed))
    return obs


def gamma_posterior(n_failures: float, exposure: float, prior_mtbf: Optional[float] = None,
                    prior_weight: float = DEFAULT_PRIOR_WEIGHT) -> Tuple[float, float]:
    """(shape, rate) of the Gamma posterior of the failure rate (1/s)."""
    m0 = DEFAULT_MTBF if prior_mtbf is None else prior_mtbf
    for name, v in (("prior_mtbf", m0), ("prior_weight", prior_weight)):
        if not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise CheckpointError(f"{name} must be finite and > 0, got {v!r}")
    if not math.isfinite(exposure) or exposure < 0 or n_failures < 0:
        raise CheckpointError("n_failures and exposure must be >= 0")
    return prior_weight + n_failures, prior_weight * m0 + exposure


def weibull_mle(observations) -> Optional[WeibullFit]:
    """Maximum-likelihood Weibull fit with right-censoring, or None if < 2 usable failures.

    Observations with zero exposure are dropped (log 0).  numpy only.
    """
    obs = _as_observations(observations)
    t = np.array([x for x, _ in obs if x > 0], dtype=float)
    f = np.array([fl for x, fl in obs if x > 0], dtype=bool)
    r = int(f.sum())
    if r < 2:
        return None
    tmax = float(t.max())
    lu = np.log(t / tmax)  # <= 0: keeps u**k in [0, 1] for any k > 0
    mean_lf = float(lu[f].mean())

    def g(k):
        w = np.exp(k * lu)
        return float((w * lu).sum() / w.sum()) - 1.0 / k - mean_lf

    lo, hi = math.log(1e-3), math.log(1e3)
    if g(math.exp(hi)) <= 0:
        k = math.exp(hi)
    elif g(math.exp(lo)) >= 0:
        k = math.exp(lo)
    else:
        for _ in range(200):
            mid = 0.5 * (lo + hi)
            if g(math.exp(mid)) > 0:
                hi = mid
            else:
                lo = mid
            if hi - lo < 1e-12:
                break
        k = math.exp(0.5 * (lo + hi))
    s = float(np.exp(k * lu).sum())
    # scale in units of tmax: (lam/tmax)^k = s / r
    log_scale_u = math.log(s / r) / k
    scale = tmax * math.exp(log_scale_u)
    lt = np.log(t)
    ll = r * math.log(k) - r * k * math.log(scale) + (k - 1.0) * float(lt[f].sum()) - r
    scale_exp = float(t.sum()) / r
    ll_exp = -r * math.log(scale_exp) - r
    return WeibullFit(shape=k, scale=scale, loglik=ll, loglik_exp=ll_exp, n_failures=r)


def estimate_mtbf(history_or_intervals, prior_mtbf: Optional[float] = None,
                  prior_weight: float = DEFAULT_PRIOR_WEIGHT, now: Optional[float] = None,
                  weibull: bool = True) -> Estimate:
    """Estimate the MTBF from a :class:`FailureHistory` or a list of observations.

    ``history_or_intervals``: a FailureHistory (its open run counts as censored
    exposure up to ``now`` when ``now`` is given), a sequence of failure
    inter-arrival times (all failures), or ``(exposure, failed)`` pairs.
    Returns the Gamma-Poisson estimate, or the Weibull mean when the rule in the
    module docstring selects it (``weibull=False`` disables the fit).
    """
    from hpcckpt.policy.history import FailureHistory

    if isinstance(history_or_intervals, FailureHistory):
        obs = history_or_intervals.observations(now)
    else:
        obs = _as_observations(history_or_intervals)
    m0 = DEFAULT_MTBF if prior_mtbf is None else float(prior_mtbf)
    n = sum(1 for _, fl in obs if fl)
    exposure = float(sum(t for t, _ in obs))
    a, b = gamma_posterior(n, exposure, m0, prior_weight)
    method = "prior" if not obs else "gamma-poisson"
    est = Estimate(mtbf=b / a, method=method, n_failures=n, exposure=exposure,
                   prior_mtbf=m0, prior_weight=float(prior_weight))
    if weibull and n >= WEIBULL_MIN_FAILURES:
        fit = weibull_mle(obs)
        if fit is not None and fit.n_failures >= WEIBULL_MIN_FAILURES:
            if fit.far_from_exponential:
                return Estimate(mtbf=fit.mean, method="weibull-mle", n_failures=n, exposure=exposure,
                                weibull_shape=fit.shape, weibull_scale=fit.scale,
                                prior_mtbf=m0, prior_weight=float(prior_weight))
            return Estimate(mtbf=est.mtbf, method=method, n_failures=n, exposure=exposure,
                            weibull_shape=fit.shape, weibull_scale=fit.scale,
                            prior_mtbf=m0, prior_weight=float(prior_weight))
    return est
