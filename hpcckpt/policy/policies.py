"""Checkpoint-interval policy objects and the online checkpoint-cost estimator.

Why: the application loop asks one question -- "is a checkpoint due now?" --
and the answer depends on a rule (fixed steps, fixed seconds, Young, Daly,
Daly with a learned MTBF).  These objects hold the rule; :class:`Schedule`
(schedule.py) feeds them the measured cost and the MTBF estimate.

Common interface:

* ``interval(cost_estimate, mtbf_estimate)`` -> compute seconds between two
  checkpoints (``FixedSteps``: a number of steps).
* ``due(now, last_save_time, step, last_save_step, cost, mtbf)`` -> bool.
  ``last_save_time`` is when the application resumed after the last save (the
  end of its blocking part) or the job start; ``last_save_step`` likewise.

``Young``/``Daly`` given ``mtbf=`` use that fixed value and ignore the estimate
passed in; with ``mtbf=None`` they use the estimate.  ``Learned`` is Daly with
the MTBF it estimates itself (estimators.py) from a failure history and/or
failures reported to it; :class:`Schedule` asks it via ``mtbf_estimate(now)``.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from typing import List, Optional, Tuple

from hpcckpt.errors import CheckpointError
from hpcckpt.policy import formulas
from hpcckpt.policy.estimators import (
    DEFAULT_PRIOR_WEIGHT,
    Estimate,
    estimate_mtbf,
    gamma_posterior,
)

__all__ = ["Policy", "FixedSteps", "FixedSeconds", "Young", "Daly", "Learned", "CostEstimator"]


def _pos(name, v, allow_zero=False) -> float:
    try:
        x = float(v)
    except (TypeError, ValueError):
        raise CheckpointError(f"{name} must be a number, got {v!r}") from None
    if not math.isfinite(x) or x < 0 or (x == 0 and not allow_zero):
        raise CheckpointError(f"{name} must be finite and {'>=' if allow_zero else '>'} 0, got {v!r}")
    return x


class Policy:
    """Base class: time-based policies compare elapsed time with ``interval``."""

    #: True when ``interval`` needs an MTBF (the Schedule then supplies one).
    needs_mtbf = False

    def interval(self, cost_estimate: Optional[float], mtbf_estimate: Optional[float]) -> float:
        raise NotImplementedError

    def due(self, now, last_save_time, step, last_save_step, cost, mtbf) -> bool:
        return (now - last_save_time) >= self.interval(cost, mtbf)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class FixedSteps(Policy):
    """Checkpoint at every step that is a multiple of ``n`` (``interval`` returns steps, not seconds).

    Multiples, not "n steps after the last save": a run restarted from step 150
    with n=50 saves at 200, 250, ... exactly like the run it continues.
    """

    def __init__(self, n: int):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise CheckpointError(f"FixedSteps needs an integer n >= 1, got {n!r}")
        self.n = n

    def interval(self, cost_estimate=None, mtbf_estimate=None) -> int:
        return self.n

    def due(self, now, last_save_time, step, last_save_step, cost=None, mtbf=None) -> bool:
        return step % self.n == 0 and (last_save_step is None or step > last_save_step)

    def __repr__(self) -> str:
        return f"FixedSteps({self.n})"


class FixedSeconds(Policy):
    """Checkpoint every ``s`` seconds of wall-clock time since the last save."""

    def __init__(self, s: float):
        self.s = _pos("FixedSeconds interval", s)

    def interval(self, cost_estimate=None, mtbf_estimate=None) -> float:
        return self.s

    def __repr__(self) -> str:
        return f"FixedSeconds({self.s:g})"


class _Formula(Policy):
    _fn = staticmethod(formulas.daly)
    needs_mtbf = True

    def __init__(self, mtbf: Optional[float] = None):
        self.mtbf = None if mtbf is None else _pos("mtbf", mtbf)

    def interval(self, cost_estimate, mtbf_estimate=None) -> float:
        m = self.mtbf if self.mtbf is not None else mtbf_estimate
        if m is None:
            raise CheckpointError(f"{type(self).__name__} needs an MTBF (give mtbf= or an estimate)")
        if cost_estimate is None:
            raise CheckpointError(f"{type(self).__name__} needs a checkpoint cost estimate")
        return self._fn(cost_estimate, m)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(mtbf={self.mtbf!r})"


class Young(_Formula):
    """Young's interval ``sqrt(2 C M)``."""

    _fn = staticmethod(formulas.young)


class Daly(_Formula):
    """Daly's higher-order interval (Daly 2006 eq. 37)."""

    _fn = staticmethod(formulas.daly)


class Learned(Daly):
    """Daly's interval with an MTBF learned from failures (estimators.py).

    ``prior_mtbf``: the user's MTBF guess (default: estimators.DEFAULT_MTBF);
    ``prior_weight``: its weight in pseudo-failures; ``history``: a
    FailureHistory whose runs are used (its open run counts as censored
    exposure up to ``now``).  ``record_failure`` / ``record_exposure`` add
    observations seen during this process (the simulator uses them).

    The full estimate (with the Weibull fit) is recomputed only when a failure
    is added; between failures only the Gamma-Poisson part is updated with the
    growing exposure, which is cheap.
    """

    def __init__(self, prior_mtbf: Optional[float] = None, history=None,
                 prior_weight: float = DEFAULT_PRIOR_WEIGHT, weibull: bool = True):
        super().__init__(mtbf=None)
        self.prior_mtbf = None if prior_mtbf is None else _pos("prior_mtbf", prior_mtbf)
        self.prior_weight = _pos("prior_weight", prior_weight)
        self.history = history
        self.weibull = weibull
        self._extra: List[Tuple[float, bool]] = []
        self._cache: Optional[Tuple[int, Estimate]] = None

    def record_failure(self, exposure: float) -> None:
        self._extra.append((_pos("exposure", exposure, allow_zero=True), True))
        self._cache = None

    def record_exposure(self, exposure: float) -> None:
        """A censored observation (a run that ended without failure)."""
        self._extra.append((_pos("exposure", exposure, allow_zero=True), False))
        self._cache = None

    def observations(self, now: Optional[float] = None):
        obs = list(self.history.observations(now)) if self.history is not None else []
        return obs + self._extra

    def estimate(self, now: Optional[float] = None) -> Estimate:
        obs = self.observations(now)
        n = sum(1 for _, f in obs if f)
        closed_key = (n, len(self._extra), 0 if self.history is None else len(self.history.runs))
        if self._cache is None or self._cache[0] != closed_key:
            full = estimate_mtbf(obs, prior_mtbf=self.prior_mtbf, prior_weight=self.prior_weight,
                                 weibull=self.weibull)
            self._cache = (closed_key, full)
            return full
        full = self._cache[1]
        if full.method == "weibull-mle":
            return full
        exposure = float(sum(t for t, _ in obs))
        a, b = gamma_posterior(n, exposure, full.prior_mtbf, self.prior_weight)
        return Estimate(mtbf=b / a, method=full.method if obs else "prior", n_failures=n,
                        exposure=exposure, weibull_shape=full.weibull_shape,
                        weibull_scale=full.weibull_scale, prior_mtbf=full.prior_mtbf,
                        prior_weight=self.prior_weight)

    def mtbf_estimate(self, now: Optional[float] = None) -> float:
        return self.estimate(now).mtbf

    def interval(self, cost_estimate, mtbf_estimate=None) -> float:
        m = mtbf_estimate if mtbf_estimate is not None else self.mtbf_estimate()
        return super().interval(cost_estimate, m)

    def __repr__(self) -> str:
        return f"Learned(prior_mtbf={self.prior_mtbf!r}, prior_weight={self.prior_weight!r})"


class CostEstimator:
    """Smoothed blocking checkpoint cost, fed with ``record(seconds)``.

    ``method="median"`` (default): median of the last ``window`` samples --
    robust to one slow save (first file creation, a busy file system).
    ``method="ewma"``: exponentially weighted mean with weight ``alpha`` on the
    newest sample.  ``value()`` is ``initial`` until a sample arrives (None if
    no initial guess was given).  ``high()`` is the largest recent sample (or
    ``value()``), used for safety margins.  For asynchronous saves record only
    the part the application waits for.
    """

    def __init__(self, method: str = "median", window: int = 8, alpha: float = 0.3,
                 initial: Optional[float] = None):
        if method not in ("median", "ewma"):
            raise CheckpointError(f"CostEstimator method must be 'median' or 'ewma', got {method!r}")
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise CheckpointError(f"window must be an integer >= 1, got {window!r}")
        a = float(alpha)
        if not (0.0 < a <= 1.0):
            raise CheckpointError(f"alpha must be in (0, 1], got {alpha!r}")
        self.method = method
        self.alpha = a
        self.initial = None if initial is None else _pos("initial", initial, allow_zero=True)
        self._recent = deque(maxlen=window)
        self._ewma: Optional[float] = None
        self.count = 0

    def record(self, seconds: float) -> None:
        x = _pos("checkpoint cost", seconds, allow_zero=True)
        self._recent.append(x)
        self._ewma = x if self._ewma is None else self.alpha * x + (1.0 - self.alpha) * self._ewma
        self.count += 1

    def value(self) -> Optional[float]:
        if not self._recent:
            return self.initial
        if self.method == "median":
            return float(statistics.median(self._recent))
        return self._ewma

    def high(self) -> Optional[float]:
        if not self._recent:
            return self.initial
        return max(max(self._recent), self.value())

    def __repr__(self) -> str:
        return f"CostEstimator(method={self.method!r}, value={self.value()!r}, n={self.count})"
