"""Adaptive checkpoint intervals: formulas, policies, failure learning, schedule, simulator.

Why: checkpointing too often wastes time writing, too rarely wastes time
recomputing after a failure.  This package holds the pure decision logic
(no MPI): closed-form intervals (formulas), policy objects and the measured
cost (policies), the persisted failure history (history) and the MTBF
estimators (estimators), the per-job decision object (schedule), a signal
flag (signals) and a discrete-event simulator (simulate); multi-level patterns
(multilevel: exact expected makespan, exhaustive search) and their learned
intervals (learned_levels), imported on demand.  See docs/interval.md.
"""

from hpcckpt.policy.estimators import (
    DEFAULT_MTBF,
    DEFAULT_PRIOR_WEIGHT,
    Estimate,
    WeibullFit,
    estimate_mtbf,
    gamma_posterior,
    weibull_mle,
)
from hpcckpt.policy.formulas import (
    MultiLevelPlan,
    daly,
    exact_optimum,
    expected_makespan,
    expected_waste,
    multilevel_intervals,
    young,
)
from hpcckpt.policy.history import FailureHistory, RunRecord
from hpcckpt.policy.policies import (
    CostEstimator,
    Daly,
    FixedSeconds,
    FixedSteps,
    Learned,
    Policy,
    Young,
)
from hpcckpt.policy.resize import CHECKPOINT_RESTART, REDISTRIBUTE, ResizeChoice, choose_resize
from hpcckpt.policy.schedule import Decision, Schedule, end_time_from_env
from hpcckpt.policy.signals import SignalFlag

__all__ = [
    "young", "daly", "exact_optimum", "expected_waste", "expected_makespan",
    "multilevel_intervals", "MultiLevelPlan",
    "Policy", "FixedSteps", "FixedSeconds", "Young", "Daly", "Learned", "CostEstimator",
    "FailureHistory", "RunRecord",
    "Estimate", "WeibullFit", "estimate_mtbf", "gamma_posterior", "weibull_mle",
    "DEFAULT_MTBF", "DEFAULT_PRIOR_WEIGHT",
    "Schedule", "Decision", "end_time_from_env",
    "SignalFlag",
    "choose_resize", "ResizeChoice", "REDISTRIBUTE", "CHECKPOINT_RESTART",
]
