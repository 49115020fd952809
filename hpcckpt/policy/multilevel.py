"""Multi-level checkpoint patterns: the expected makespan, its exhaustive search, and a Monte Carlo simulator.

Why: the first-order formula of Benoit et al. (formulas.multilevel_intervals)
ignores restart costs, the job's length and every term beyond the first
order; the learned model (learned_levels.py) is trained on, and compared
with, the optimum this module finds.  Pure numpy, no I/O.

Model (Benoit, Cavelan, Le Fevre, Robert, Sun, IEEE TC 2017, with restarts):

* Levels ``0 .. L-1``, cheapest first.  A *pattern* is ``n_0`` segments of
  ``w`` seconds of work; after each segment a checkpoint is taken, of level
  ``l`` (and every level below, costing ``C_0 + ... + C_l``) when the
  segment's index is a multiple of ``m_l = ratios[0] * ... * ratios[l-1]``
  (``m_0 = 1``), the last segment of a pattern ending with the top level.  So
  ``period_l = m_l w`` seconds of work separate two level-``l`` checkpoints.
* The job needs ``work`` seconds; patterns repeat; the last (partial)
  segment is not followed by a checkpoint.
* Failures of type ``l`` form independent Poisson processes of rate
  ``rates[l]`` (1/s), striking during work, checkpoints and restarts.  A
  type-``l`` failure rolls the job back to its latest checkpoint of level
  ``l`` or higher, after a restart of ``restarts[l]`` seconds; a type-``k``
  failure during that restart starts the restart again at level
  ``max(l, k)``.  A restart from level ``l`` leaves every lower level's copy
  in place again (the job resumes as if it had just taken that checkpoint).

:func:`expected_makespan` computes the expectation of this model exactly (the
exponential failures make the job a Markov chain on its segment index:
``E = sum_s tau_s`` with ``tau_s`` the expected time to get past segment ``s``
for the first time, which only depends on earlier segments of its pattern);
:func:`simulate_makespans` draws it by discrete-event Monte Carlo (the test
that the two agree is tests/policy/test_policy_multilevel.py).
:func:`search` is the exhaustive optimum: every nested ratio up to a bound
and a log grid of base periods around the first-order optimum of each.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Sequence, Tuple

import numpy as np

from hpcckpt.errors import CheckpointError
from hpcckpt.policy.formulas import multilevel_intervals

__all__ = ["LevelConfig", "Pattern", "expected_makespan", "search", "simulate_makespans", "formula_pattern",
           "MAX_LEVELS", "search_many", "fit_to_work", "first_order_period", "MAX_RATIO"]

#: Levels supported by the exact evaluation and the search.
MAX_LEVELS = 4


def _positive(name: str, values, allow_zero: bool = False) -> Tuple[float, ...]:
    try:
        out = tuple(float(v) for v in values)
    except (TypeError, ValueError):
        raise CheckpointError(f"{name} must be numbers, got {values!r}") from None
    for v in out:
        if not math.isfinite(v) or v < 0 or (v == 0 and not allow_zero):
            raise CheckpointError(f"{name} must be finite and {'>=' if allow_zero else '>'} 0, got {values!r}")
    return out


@dataclass(frozen=True)
class LevelConfig:
    """One platform and job: per-level ``costs``, ``restarts`` (seconds) and failure ``rates`` (1/s), cheapest
    level first, and the ``work`` (seconds of computation) the job needs."""

    costs: Tuple[float, ...]
    restarts: Tuple[float, ...]
    rates: Tuple[float, ...]
    work: float

    def __post_init__(self):
        costs = _positive("costs", self.costs)
        restarts = _positive("restarts", self.restarts, allow_zero=True)
        rates = _positive("rates", self.rates)
        (work,) = _positive("work", (self.work,))
        if not 1 <= len(costs) <= MAX_LEVELS or len(restarts) != len(costs) or len(rates) != len(costs):
            raise CheckpointError(f"costs, restarts and rates need the same number of levels (1 to {MAX_LEVELS}), "
                                  f"got {len(costs)}, {len(restarts)}, {len(rates)}")
        object.__setattr__(self, "costs", costs)
        object.__setattr__(self, "restarts", restarts)
        object.__setattr__(self, "rates", rates)
        object.__setattr__(self, "work", work)

    @property
    def levels(self) -> int:
        return len(self.costs)


@dataclass(frozen=True)
class Pattern:
    """``period``: seconds of work between two checkpoints (of any level); ``ratios[l]``: level-``l``
    checkpoints per level-``l+1`` one (integers >= 1); ``makespan``: its expected makespan when known."""

    period: float
    ratios: Tuple[int, ...]
    makespan: float = float("nan")

    @property
    def periods(self) -> Tuple[float, ...]:
        """Seconds of work between two checkpoints of each level (``period * m_l``)."""
        return tuple(self.period * m for m in np.cumprod((1,) + tuple(self.ratios)).tolist())

    @property
    def counts(self) -> Tuple[int, ...]:
        """Checkpoints of each level per pattern (formulas.MultiLevelPlan's ``counts``)."""
        m = np.cumprod((1,) + tuple(self.ratios))
        return tuple(int(m[-1] // x) for x in m)


def _restart_chains(restarts, rates):
    """Per starting level l: expected restart time rho[l] and the probability pi[l][j] to end restarting at j.

    Arrays broadcast over trailing axes (one entry per configuration)."""
    L = len(rates)
    total = sum(rates)
    rho, pi = [None] * L, [None] * L
    for l in range(L - 1, -1, -1):
        fail = -np.expm1(-total * restarts[l])  # a failure before the restart ends
        same = fail * sum(rates[: l + 1]) / total  # ... of a type this level recovers from: start again
        up = [fail * rates[k] / total for k in range(l + 1, L)]
        denom = 1.0 - same
        rho[l] = (fail / total + sum(u * rho[k] for u, k in zip(up, range(l + 1, L)))) / denom
        pi[l] = [((1.0 - fail) * (j == l) + sum(u * pi[k][j] for u, k in zip(up, range(l + 1, L)))) / denom
                 if j >= l else 0.0 for j in range(L)]
    return rho, pi


def _expected(costs, restarts, rates, work, period, ratios):
    """Vectorised expected makespan; every argument but ``ratios`` broadcasts (``costs[l]``... arrays)."""
    L = len(costs)
    m = [int(x) for x in np.cumprod((1,) + tuple(ratios))]  # m[l]: segments between level-l checkpoints
    n = m[-1]
    total = sum(rates)
    rho, pi = _restart_chains(restarts, rates)
    segments = np.ceil(work / period - 1e-12)
    full = np.floor((segments - 1) / n)  # full patterns before the last (partial) one
    tail = segments - full * n  # segments of the last pattern, 1..n
    last_work = work - (segments - 1) * period
    prefix = [0.0]  # S_s: expected time to reach segment s from the pattern's start
    pattern = 0.0
    ending = 0.0
    for s in range(n):
        level = max(l for l in range(L) if (s + 1) % m[l] == 0)
        back = 0.0  # expected extra time after a failure: restart, then redo down to the rollback point
        for k in range(L):
            redo = sum(pi[k][j] * (prefix[s] - prefix[(s // m[j]) * m[j]]) for j in range(k, L))
            back = back + rates[k] / total * (rho[k] + redo)
        cost = sum(costs[: level + 1])
        tau = np.expm1(total * (period + cost)) * (1.0 / total + back)
        tau_last = np.expm1(total * last_work) * (1.0 / total + back)
        ending = ending + np.where(s < tail - 1, tau, 0.0) + np.where(s == tail - 1, tau_last, 0.0)
        pattern = pattern + tau
        prefix.append(prefix[-1] + tau)
    # no full pattern: 0, not 0 x inf (a pattern whose expectation overflows, e.g. checkpoints far beyond the MTBF)
    return np.where(full > 0, full * pattern, 0.0) + ending


def expected_makespan(config: LevelConfig, period: float, ratios: Sequence[int]) -> float:
    """Exact expected makespan (seconds) of the pattern ``(period, ratios)`` for ``config`` (module docstring)."""
    (period,) = _positive("period", (period,))
    ratios = _ratios(ratios, config.levels)
    return float(_expected(config.costs, config.restarts, config.rates, config.work, period, ratios))


def _ratios(ratios, levels: int) -> Tuple[int, ...]:
    out = tuple(ratios)
    if len(out) != levels - 1 or any(isinstance(r, bool) or int(r) != r or r < 1 for r in out):
        raise CheckpointError(f"ratios must be {levels - 1} integer(s) >= 1, got {ratios!r}")
    return tuple(int(r) for r in out)


def first_order_period(costs, rates, ratios) -> float:
    """Base period of Benoit et al.'s first-order optimum for the nested ``ratios``: ``W*(n) / n_0``."""
    counts = Pattern(1.0, tuple(ratios)).counts
    s_cost = sum(c * k for c, k in zip(costs, counts))
    s_rate = sum(r / k for r, k in zip(rates, counts))
    return np.sqrt(2.0 * s_cost / s_rate) / counts[0]


#: Base periods the search tries for each ratio combination, as factors of its first-order period.
SEARCH_FACTORS = np.geomspace(0.2, 2.0, 121)

#: Default bound of each nested ratio in the search, per number of levels (the search visits every combination).
MAX_RATIO = {1: 1, 2: 48, 3: 16, 4: 8}


def search(config: LevelConfig, max_ratio: int | None = None, factors: Sequence[float] = SEARCH_FACTORS) -> Pattern:
    """The exhaustive optimum: every ratio combination with each ratio up to ``max_ratio`` (default
    :data:`MAX_RATIO`), each with the base periods ``factors`` x its first-order period."""
    return search_many([config], max_ratio, factors)[0]


def search_many(configs: Sequence[LevelConfig], max_ratio: int | None = None,
                factors: Sequence[float] = SEARCH_FACTORS) -> list:
    """:func:`search` for configurations with the same number of levels, vectorised over them."""
    levels = {c.levels for c in configs}
    if len(levels) != 1:
        raise CheckpointError("search_many needs configurations with the same number of levels")
    L = levels.pop()
    bound = MAX_RATIO[L] if max_ratio is None else int(max_ratio)
    col = lambda xs: [np.asarray(x, dtype=float)[:, None] for x in zip(*xs)]  # noqa: E731
    costs, restarts, rates = (col([getattr(c, a) for c in configs]) for a in ("costs", "restarts", "rates"))
    work = np.asarray([c.work for c in configs], dtype=float)[:, None]
    f = np.asarray(factors, dtype=float)[None, :]
    best_e = np.full(len(configs), np.inf)
    best_p = np.zeros(len(configs))
    best_r = [()] * len(configs)
    rows = np.arange(len(configs))
    for ratios in itertools.product(range(1, bound + 1), repeat=L - 1):
        periods = first_order_period(costs, rates, ratios) * f
        e = _expected(costs, restarts, rates, work, periods, ratios)
        i = np.argmin(e, axis=1)
        better = e[rows, i] < best_e
        best_e = np.where(better, e[rows, i], best_e)
        best_p = np.where(better, periods[rows, i], best_p)
        best_r = [ratios if b else r for b, r in zip(better, best_r)]
    return [Pattern(float(p), r, float(e)) for p, r, e in zip(best_p, best_r, best_e)]


def fit_to_work(config: LevelConfig, pattern: Pattern) -> Pattern:
    """``pattern`` with its base period adjusted so that the job is a whole number of top-level patterns.

    The nearest whole number ``k >= 1`` of patterns, ``period = work / (k n_0)``: the job then ends exactly
    where a top-level checkpoint would be (and is not taken), instead of paying one for a short remainder
    or redoing a long partial pattern.  This matters when a top-level checkpoint is a sizeable share of
    the job (the expected makespan jumps by one of them as the period crosses such a point).
    """
    n = pattern.counts[0]
    k = max(1, round(config.work / (pattern.period * n)))
    return Pattern(config.work / (k * n), pattern.ratios)


def formula_pattern(config: LevelConfig) -> Pattern:
    """Benoit et al.'s first-order pattern (formulas.multilevel_intervals) with its exact expected makespan."""
    plan = multilevel_intervals(config.costs, config.rates)
    ratios = tuple(plan.counts[l] // plan.counts[l + 1] for l in range(config.levels - 1))
    return Pattern(plan.periods[0], ratios, expected_makespan(config, plan.periods[0], ratios))


def simulate_makespans(config: LevelConfig, period: float, ratios: Sequence[int], seeds: int = 100,
                       seed: int = 0) -> np.ndarray:
    """Makespans of ``seeds`` discrete-event runs of the model (one failure history per seed), seconds."""
    (period,) = _positive("period", (period,))
    ratios = _ratios(ratios, config.levels)
    m = [int(x) for x in np.cumprod((1,) + ratios)]
    L, total = config.levels, sum(config.rates)
    p_type = np.asarray(config.rates) / total
    segments = max(1, math.ceil(config.work / period - 1e-12))
    last = config.work - (segments - 1) * period
    cost = [sum(config.costs[: max(l for l in range(L) if (s + 1) % m[l] == 0) + 1]) for s in range(m[-1])]
    out = np.empty(seeds)
    for j, child in enumerate(np.random.SeedSequence(seed).spawn(seeds)):
        rng = np.random.default_rng(child)
        t, pos = 0.0, 0
        next_fail = rng.exponential(1.0 / total)
        while pos < segments:
            d = last if pos == segments - 1 else period + cost[pos % m[-1]]
            if t + d <= next_fail:
                t += d
                pos += 1
                continue
            t = next_fail
            level = int(rng.choice(L, p=p_type))
            next_fail = t + rng.exponential(1.0 / total)
            while next_fail < t + config.restarts[level]:  # failures during the restart
                t = next_fail
                level = max(level, int(rng.choice(L, p=p_type)))
                next_fail = t + rng.exponential(1.0 / total)
            t += config.restarts[level]
            pos = (pos // m[level]) * m[level]
        out[j] = t
    return out
