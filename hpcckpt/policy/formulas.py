"""Closed-form checkpoint-interval formulas (pure functions, seconds in, seconds out).

Why: the interval policies, the ``hpcckpt interval`` command and the simulator all
need the same handful of textbook formulas, checked in one place.

Notation: ``C`` is the blocking cost of one checkpoint, ``M`` the mean time
between failures (MTBF), ``R`` the restart cost, ``tau`` the *compute* time
between two checkpoints (the period is ``tau + C``).  All in seconds.

* :func:`young` -- Young (1974): ``tau = sqrt(2 C M)``.
* :func:`daly` -- Daly (2006), FGCS 22(3), eq. 37, the higher-order estimate:
  ``tau = sqrt(2CM) [1 + (1/3) sqrt(C/(2M)) + (1/9) (C/(2M))] - C`` for
  ``C < 2M``, else ``tau = M``.
* :func:`exact_optimum` -- the exact minimiser of Daly's exponential model
  (below), ``tau = M (1 + W0(-exp(-1 - C/M)))`` with ``W0`` the principal
  Lambert-W branch, solved by Newton's method; eq. 37 approximates it.
* :func:`expected_waste` -- the expected waste fraction of Daly's exponential
  model (failures a Poisson process of rate 1/M that may strike during
  computation, checkpointing or restart; each failure loses the work since the
  last completed checkpoint and costs a restart R; no downtime).  Expected time
  to complete one segment of tau seconds of work plus its checkpoint is
  ``M exp(R/M) (exp((tau + C)/M) - 1)``, so the waste fraction (share of the
  wall-clock time not spent on useful work) is
  ``1 - tau / (M exp(R/M) (exp((tau+C)/M) - 1))``.  ``model="first-order"``
  gives Young's first-order approximation ``C/(tau+C) + (tau/2 + R)/M``
  (not clipped to 1) instead.
* :func:`multilevel_intervals` -- the first-order multi-level optimum of
  Benoit, Cavelan, Le Fevre, Robert, Sun, "Towards Optimal Multi-Level
  Checkpointing", IEEE TC 66(7), 2017 (see its docstring).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Sequence, Tuple

from hpcckpt.errors import CheckpointError

__all__ = [
    "young",
    "daly",
    "exact_optimum",
    "expected_waste",
    "expected_makespan",
    "multilevel_intervals",
    "MultiLevelPlan",
]


def check_number(name: str, value, *, positive: bool = False) -> float:
    """Return ``value`` as a float; raise CheckpointError if NaN, infinite, negative
    (or zero when ``positive``), or not a number."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise CheckpointError(f"{name} must be a number, got {value!r}") from None
    if math.isnan(x) or math.isinf(x):
        raise CheckpointError(f"{name} must be finite, got {value!r}")
    if positive and x <= 0.0:
        raise CheckpointError(f"{name} must be > 0, got {value!r}")
    if x < 0.0:
        raise CheckpointError(f"{name} must be >= 0, got {value!r}")
    return x


def young(cost: float, mtbf: float) -> float:
    """Young's first-order optimum compute interval ``sqrt(2 C M)`` in seconds."""
    c = check_number("cost", cost)
    m = check_number("mtbf", mtbf, positive=True)
    return math.sqrt(2.0 * c * m)


def daly(cost: float, mtbf: float) -> float:
    """Daly's higher-order optimum compute interval (Daly 2006, eq. 37), seconds.

    ``sqrt(2CM) [1 + (1/3) sqrt(C/2M) + (1/9) C/2M] - C`` if ``C < 2M`` else ``M``.
    It is always <= young(C, M) (by (5/9) C or more when C < 2M).
    """
    c = check_number("cost", cost)
    m = check_number("mtbf", mtbf, positive=True)
    if c >= 2.0 * m:
        return m
    x = c / (2.0 * m)
    return math.sqrt(2.0 * c * m) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - c


def exact_optimum(cost: float, mtbf: float) -> float:
    """Exact minimiser of the exponential-model waste (module docstring), seconds.

    Solves ``exp((tau+C)/M) (1 - tau/M) = 1`` for ``0 < tau < M``; with
    ``z = tau/M - 1`` this is ``z e^z = -exp(-1 - C/M)``, the principal Lambert-W
    branch.  Newton iterations on ``z`` from a series start; independent of R.
    """
    c = check_number("cost", cost)
    m = check_number("mtbf", mtbf, positive=True)
    if c == 0.0:
        return 0.0
    a = -math.exp(-1.0 - c / m)  # in (-1/e, 0)
    # Start: branch-point series for small C/M (p = sqrt(2(1 + e a))), else 0-ish.
    p = math.sqrt(max(2.0 * (1.0 + math.e * a), 0.0))
    z = -1.0 + p - p * p / 3.0 + 11.0 / 72.0 * p ** 3
    if not (-1.0 < z < 0.0):
        z = max(min(z, -1e-12), -1.0 + 1e-12)
    for _ in range(100):
        ez = math.exp(z)
        f = z * ez - a
        fp = ez * (z + 1.0)
        if fp == 0.0:
            break
        step = f / fp
        znew = z - step
        if znew <= -1.0:
            znew = (z - 1.0) / 2.0
        if abs(znew - z) <= 1e-15 * max(1.0, abs(z)):
            z = znew
            break
        z = znew
    return m * (1.0 + z)


def expected_makespan(work: float, interval: float, cost: float, mtbf: float,
                      restart: float = 0.0) -> float:
    """Expected wall-clock time to do ``work`` seconds of computation in Daly's
    exponential model: ``(work / tau) M exp(R/M) (exp((tau+C)/M) - 1)``.

    Treats ``work / tau`` as a (possibly fractional) number of full segments, each
    followed by a checkpoint, as Daly does.
    """
    w = check_number("work", work)
    tau = check_number("interval", interval, positive=True)
    c = check_number("cost", cost)
    m = check_number("mtbf", mtbf, positive=True)
    r = check_number("restart", restart)
    return (w / tau) * m * math.exp(r / m) * math.expm1((tau + c) / m)


def expected_waste(interval: float, cost: float, mtbf: float, restart: float = 0.0,
                   model: str = "exponential") -> float:
    """Expected waste fraction of a periodic checkpoint with compute interval ``interval``.

    ``model="exponential"`` (default): Daly's exponential-failure model,
    ``1 - tau / (M e^{R/M} (e^{(tau+C)/M} - 1))``, in [0, 1).
    ``model="first-order"``: ``C/(tau+C) + (tau/2 + R)/M`` (Young's approximation,
    valid when tau + C << M; may exceed 1).
    """
    tau = check_number("interval", interval, positive=True)
    c = check_number("cost", cost)
    m = check_number("mtbf", mtbf, positive=True)
    r = check_number("restart", restart)
    if model == "exponential":
        denom = m * math.exp(r / m) * math.expm1((tau + c) / m)
        if math.isinf(denom):
            return 1.0
        return 1.0 - tau / denom
    if model == "first-order":
        return c / (tau + c) + (tau / 2.0 + r) / m
    raise CheckpointError(f"unknown waste model {model!r} (use 'exponential' or 'first-order')")


@dataclass(frozen=True)
class MultiLevelPlan:
    """A periodic multi-level pattern (Benoit et al. 2017), levels cheapest first.

    ``pattern_work``: seconds of computation in one pattern (between two
    top-level checkpoints).  ``counts[l]``: checkpoints of level ``l`` per pattern
    (integers, nested: each is a multiple of the next, ``counts[-1] == 1``).
    ``periods[l] = pattern_work / counts[l]``: compute seconds between two
    checkpoints of level ``l`` (or higher).  ``real_counts``: the unconstrained
    real-valued optimum before rounding.  ``overhead``: first-order waste
    fraction of the chosen pattern (without recovery terms).
    """

    pattern_work: float
    counts: Tuple[int, ...]
    periods: Tuple[float, ...]
    real_counts: Tuple[float, ...]
    overhead: float


def _ml_overhead(counts, costs, rates) -> Tuple[float, float]:
    s_cost = sum(n * c for n, c in zip(counts, costs))
    s_rate = sum(lam / n for n, lam in zip(counts, rates))
    w = math.sqrt(2.0 * s_cost / s_rate)
    return math.sqrt(2.0 * s_cost * s_rate), w


def multilevel_intervals(costs: Sequence[float], failure_rates: Sequence[float]) -> MultiLevelPlan:
    """First-order optimal multi-level pattern (Benoit, Cavelan, Le Fevre, Robert, Sun 2017).

    ``costs[l]`` is the cost ``C_l`` of a level-``l`` checkpoint and
    ``failure_rates[l]`` the rate ``lambda_l`` (1/s) of failures that need a
    checkpoint of level ``l`` or higher to recover; levels are ordered from the
    cheapest/local (index 0) to the most expensive/shared file system (last).
    As in the paper, a level-``l`` checkpoint is taken together with all lower
    levels, so a pattern of ``W`` seconds of work with ``n_l`` level-``l``
    checkpoints (equally spaced, nested) has first-order overhead

        H(W, n) = sum_l n_l C_l / W + sum_l lambda_l W / (2 n_l)

    (recovery costs add a constant and do not move the optimum).  For fixed
    ``n``, ``W* = sqrt(2 sum n_l C_l / sum lambda_l/n_l)`` and
    ``H = sqrt(2 (sum n_l C_l)(sum lambda_l/n_l))``; by Cauchy-Schwarz the
    real-valued optimum is ``n_l proportional to sqrt(lambda_l / C_l)``
    (normalised ``n_top = 1``), giving ``H* = sum_l sqrt(2 lambda_l C_l)`` and
    per-level periods ``W*/n_l = sqrt(2 C_l / lambda_l)`` -- Young's formula per
    level.  The counts must be integers and nested, so each ratio
    ``n_l / n_{l+1}`` (at least 1) is rounded down or up, every combination is
    scored with ``H`` and the best is returned with its own ``W*``.  (The
    paper's dynamic programme that drops unhelpful levels is not implemented: a
    level whose real ratio is below 1 is simply taken with the level above.)
    """
    if len(costs) != len(failure_rates) or len(costs) == 0:
        raise CheckpointError("costs and failure_rates must be non-empty and the same length")
    if len(costs) > 8:
        raise CheckpointError("at most 8 checkpoint levels are supported")
    cs = [check_number(f"costs[{i}]", c, positive=True) for i, c in enumerate(costs)]
    ls = [check_number(f"failure_rates[{i}]", r, positive=True) for i, r in enumerate(failure_rates)]
    k = len(cs)
    real = [math.sqrt(ls[i] / cs[i]) / math.sqrt(ls[-1] / cs[-1]) for i in range(k)]
    # ratios between consecutive levels: real[i] / real[i+1]
    options = []
    for i in range(k - 1):
        r = real[i] / real[i + 1]
        lo = max(1, math.floor(r))
        options.append(sorted({lo, max(1, math.ceil(r))}))
    best = None
    for combo in itertools.product(*options) if options else [()]:
        counts = [1] * k
        for i in range(k - 2, -1, -1):
            counts[i] = counts[i + 1] * combo[i]
        h, w = _ml_overhead(counts, cs, ls)
        if best is None or h < best[0]:
            best = (h, w, tuple(counts))
    h, w, counts = best
    return MultiLevelPlan(
        pattern_work=w,
        counts=counts,
        periods=tuple(w / n for n in counts),
        real_counts=tuple(real),
        overhead=h,
    )
