"""The per-job checkpoint decision: interval policy + measured cost + MTBF + deadline.

Why: the Checkpointer needs one object that answers "save now?" from the
clock, the step counter, the measured checkpoint cost and the job's wall-time
limit.  It takes ``now`` as an argument (no MPI, no clock of its own), so the
core can evaluate it on rank 0 and broadcast the answer, and tests can drive it
with a fake clock.

Deadline rule (``deadline_due``): the final checkpoint must *finish* before
the deadline.  With ``C_hi`` the cost estimator's high value (largest of the
recent blocking costs, or the initial guess), and ``S`` the smoothed duration of
one application step (the decision is only taken between steps), the final save
must start by ``deadline - margin`` with

    margin = max(margin_factor * C_hi, margin_floor) + S

(defaults ``margin_factor = 2``, ``margin_floor = 30 s``).  ``deadline_due(now)`` is
True once ``now >= deadline - margin`` until a save is recorded inside that
window; afterwards ``deadline_window_open(now)`` stays True so the caller can
stop the application.

Before the first checkpoint cost is measured the policies use
``initial_cost`` (default 30 s).  ``last_save_time`` is the time the blocking part
of the last save ended (``record_save``'s ``now``), or the schedule's start.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Union

from hpcckpt.core.warn import warn
from hpcckpt.errors import CheckpointError
from hpcckpt.policy.policies import CostEstimator, FixedSteps, Policy

__all__ = ["Schedule", "Decision", "end_time_from_env", "DEFAULT_INITIAL_COST"]

DEFAULT_INITIAL_COST = 30.0


def end_time_from_env(env: Optional[Mapping[str, str]] = None) -> Optional[float]:
    """The job's end time (epoch seconds) from ``SLURM_JOB_END_TIME``, or None.

    ``env`` defaults to ``os.environ``.  A missing, empty, non-numeric or
    non-positive value gives None (non-numeric also warns).
    """
    env = os.environ if env is None else env
    raw = env.get("SLURM_JOB_END_TIME")
    if raw is None or str(raw).strip() == "":
        return None
    try:
        t = float(str(raw).strip())
    except ValueError:
        warn(f"hpcckpt: ignoring unparsable SLURM_JOB_END_TIME={raw!r}", RuntimeWarning)
        return None
    if not math.isfinite(t) or t <= 0:
        return None
    return t


@dataclass(frozen=True)
class Decision:
    """``save``: take a checkpoint now; ``reason``: 'signal', 'deadline', 'interval' or None;
    ``final``: the job should stop after this save (signal or deadline)."""

    save: bool
    reason: Optional[str] = None

    @property
    def final(self) -> bool:
        return self.reason in ("signal", "deadline")

    def __bool__(self) -> bool:
        return self.save


def _num(name, v, *, allow_none=False, positive=False):
    if v is None and allow_none:
        return None
    try:
        x = float(v)
    except (TypeError, ValueError):
        raise CheckpointError(f"{name} must be a number, got {v!r}") from None
    if not math.isfinite(x) or x < 0 or (positive and x == 0):
        raise CheckpointError(f"{name} must be finite and {'>' if positive else '>='} 0, got {v!r}")
    return x


class Schedule:
    """Decides when to checkpoint.  See the module docstring for the rules.

    ``mtbf``: a number (seconds), a callable ``f(now) -> seconds`` (or returning
    an object with ``.mtbf``), or None to use the policy's own
    (``Learned.mtbf_estimate``; ``Young``/``Daly`` given ``mtbf=``).
    ``deadline``: epoch seconds the job must finish by (e.g. from
    :func:`end_time_from_env`), or None.
    """

    def __init__(self, policy: Policy, cost_estimator: Optional[CostEstimator] = None,
                 mtbf: Union[None, float, Callable] = None, deadline: Optional[float] = None,
                 margin_factor: float = 2.0, margin_floor: float = 30.0,
                 initial_cost: float = DEFAULT_INITIAL_COST, start_time: Optional[float] = None,
                 start_step: int = 0):
        if not isinstance(policy, Policy):
            raise CheckpointError(f"policy must be a Policy, got {policy!r}")
        self.policy = policy
        self.cost = cost_estimator if cost_estimator is not None else CostEstimator()
        if mtbf is not None and not callable(mtbf):
            mtbf = _num("mtbf", mtbf, positive=True)
        if (mtbf is None and policy.needs_mtbf and getattr(policy, "mtbf", None) is None
                and not hasattr(policy, "mtbf_estimate")):
            raise CheckpointError(
                f"{policy!r} has no MTBF: give Schedule(mtbf=...) or the policy mtbf=, or use Learned()")
        self._mtbf = mtbf
        self.deadline = _num("deadline", deadline, allow_none=True)
        self.margin_factor = _num("margin_factor", margin_factor)
        self.margin_floor = _num("margin_floor", margin_floor)
        self.initial_cost = _num("initial_cost", initial_cost)
        self.start_time = _num("start_time", start_time, allow_none=True)
        self.start_step = int(start_step)
        self.last_save_time: Optional[float] = None
        self.last_save_step: Optional[int] = None
        self.n_saves = 0
        self._prev_point = None  # (now, step) of the previous due()/deadline call
        self.step_seconds: Optional[float] = None  # EWMA of one step's duration

    # --------------------------------------------------------------- inputs
    def record_save(self, now: float, step: int, blocking_seconds: float) -> None:
        """A save finished its blocking part at ``now`` after ``blocking_seconds``."""
        now = _num("now", now)
        self.cost.record(blocking_seconds)
        self.last_save_time = now
        self.last_save_step = int(step)
        self.n_saves += 1

    def _observe(self, now: float, step: Optional[int]) -> None:
        if self.start_time is None:
            self.start_time = now
        if step is None:
            return
        if self._prev_point is not None:
            t0, s0 = self._prev_point
            if step > s0 and now >= t0:
                per = (now - t0) / (step - s0)
                self.step_seconds = per if self.step_seconds is None else 0.3 * per + 0.7 * self.step_seconds
        self._prev_point = (now, step)

    # ------------------------------------------------------------ estimates
    def cost_estimate(self) -> float:
        v = self.cost.value()
        return self.initial_cost if v is None else v

    def mtbf(self, now: Optional[float] = None) -> Optional[float]:
        m = self._mtbf
        if m is None:
            if getattr(self.policy, "mtbf", None) is not None:
                return self.policy.mtbf
            if hasattr(self.policy, "mtbf_estimate"):
                return self.policy.mtbf_estimate(now)
            return None
        if callable(m):
            v = m(now)
            v = getattr(v, "mtbf", v)
            return _num("mtbf estimate", v, positive=True)
        return m

    def interval(self, now: Optional[float] = None) -> float:
        """Current interval (seconds; steps for FixedSteps)."""
        return self.policy.interval(self.cost_estimate(), self.mtbf(now))

    def margin(self) -> float:
        hi = self.cost.high()
        c = self.initial_cost if hi is None else hi
        return max(self.margin_factor * c, self.margin_floor) + (self.step_seconds or 0.0)

    # ------------------------------------------------------------ decisions
    def due(self, now: float, step: int) -> bool:
        """Whether the interval policy wants a checkpoint now (ignores deadline/signals)."""
        now = _num("now", now)
        self._observe(now, step)
        ref_time = self.last_save_time if self.last_save_time is not None else self.start_time
        ref_step = self.last_save_step if self.last_save_step is not None else self.start_step
        if ref_step is not None and step <= ref_step and isinstance(self.policy, FixedSteps):
            return False
        mtbf = None if isinstance(self.policy, FixedSteps) else self.mtbf(now)
        return bool(self.policy.due(now, ref_time, step, ref_step, self.cost_estimate(), mtbf))

    def progress(self, now: float, step: int) -> float:
        """How far the run is from the last checkpoint to the next one the interval policy wants, in [0, 1].

        Steps for FixedSteps (``step % n / n``: its saves fall on multiples of
        n), seconds for the others; what pre-copy (hpcckpt.saving.precopy_plan) paces
        its rounds by.  Pure: reads no clock and changes no estimate.
        """
        if isinstance(self.policy, FixedSteps):
            return (int(step) % self.policy.n) / self.policy.n
        ref_time = self.last_save_time if self.last_save_time is not None else self.start_time
        if ref_time is None:
            return 0.0
        interval = self.policy.interval(self.cost_estimate(), self.mtbf(now))
        if not interval or interval <= 0 or not math.isfinite(interval):
            return 0.0
        return min(max((float(now) - ref_time) / interval, 0.0), 1.0)

    def deadline_window_open(self, now: float) -> bool:
        """True once the final checkpoint must have started (``now >= deadline - margin``)."""
        if self.deadline is None:
            return False
        return _num("now", now) >= self.deadline - self.margin()

    def deadline_due(self, now: float, step: Optional[int] = None) -> bool:
        """True when the final checkpoint must start now and none was saved in the window."""
        if self.deadline is None:
            return False
        now = _num("now", now)
        if step is not None:
            self._observe(now, step)
        window_start = self.deadline - self.margin()
        if now < window_start:
            return False
        return self.last_save_time is None or self.last_save_time < window_start

    def decide(self, now: float, step: int, signalled: bool = False) -> Decision:
        """One decision combining signal > deadline > interval."""
        if signalled:
            self._observe(_num("now", now), step)
            return Decision(True, "signal")
        if self.deadline_due(now, step):
            return Decision(True, "deadline")
        if self.due(now, step):
            return Decision(True, "interval")
        return Decision(False, None)

    def __repr__(self) -> str:
        return (f"Schedule({self.policy!r}, cost={self.cost_estimate():.3g}s, "
                f"deadline={self.deadline!r}, saves={self.n_saves})")
