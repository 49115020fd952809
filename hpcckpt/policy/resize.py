"""How to change a job's rank count: redistribute in memory, or checkpoint and restart (pure).

Why: a malleable code (docs/malleability.md) can move its state to the new
ranks in memory (hpcckpt.redistribute) or write a checkpoint, relaunch and
reshard-load it.  The first is usually much faster, but it needs room for the
old and the new part side by side on a rank, and a relaunch may be needed
anyway (a new allocation elsewhere).  :func:`choose_resize` compares the two
with the measured bandwidths, as the adaptive manager of "Designing an
Adaptive Application-Level Checkpoint Management System for Malleable MPI
Applications" does, and says which it chose and why.

Model (seconds): in memory, ``moved / redistribute_bandwidth +
redistribute_overhead``; through the file system, ``state / save_bandwidth``
(nothing when a save is due anyway: ``save_due``) ``+ state / load_bandwidth +
restart_overhead`` (the relaunch).  ``moved`` defaults to the whole state (an
upper bound: a shrink of k of n ranks moves less).  Bandwidths are aggregate
bytes per second over the job.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpcckpt.core.humanize import format_duration, human_bytes
from hpcckpt.policy.formulas import check_number

REDISTRIBUTE = "redistribute"
CHECKPOINT_RESTART = "checkpoint-restart"


@dataclass(frozen=True)
class ResizeChoice:
    """The chosen way to resize (``method``: REDISTRIBUTE or CHECKPOINT_RESTART), both estimates, and why."""

    method: str
    redistribute_seconds: float
    restart_seconds: float
    reason: str


def choose_resize(state_bytes, redistribute_bandwidth, save_bandwidth, load_bandwidth, *,
                  moved_bytes=None, redistribute_overhead=0.0, restart_overhead=0.0, save_due: bool = False,
                  peak_bytes_per_rank=None, free_bytes_per_rank=None) -> ResizeChoice:
    """Redistribute in memory or checkpoint-and-restart, whichever the model says is faster (ties: in memory).

    ``peak_bytes_per_rank`` / ``free_bytes_per_rank``: what a redistribution
    needs on its fullest rank (old part + new part + send copies) and the
    memory free there; when both are given and the need exceeds what is free,
    the answer is checkpoint-and-restart whatever the times.  Bad numbers
    (negative, NaN, infinite, zero bandwidths) are a CheckpointError.
    """
    state = check_number("state_bytes", state_bytes)
    moved = state if moved_bytes is None else check_number("moved_bytes", moved_bytes)
    bw_r = check_number("redistribute_bandwidth", redistribute_bandwidth, positive=True)
    bw_s = check_number("save_bandwidth", save_bandwidth, positive=True)
    bw_l = check_number("load_bandwidth", load_bandwidth, positive=True)
    over_r = check_number("redistribute_overhead", redistribute_overhead)
    over_c = check_number("restart_overhead", restart_overhead)
    in_memory = moved / bw_r + over_r
    save = 0.0 if save_due else state / bw_s
    restart = save + state / bw_l + over_c
    through = (f"checkpoint-restart {format_duration(restart)} ("
               f"{'save due anyway' if save_due else 'save ' + format_duration(save)} + load "
               f"{format_duration(state / bw_l)} + relaunch {format_duration(over_c)})")
    memory = f"redistribute {format_duration(in_memory)} ({human_bytes(moved)} moved in memory)"
    if peak_bytes_per_rank is not None and free_bytes_per_rank is not None:
        peak = check_number("peak_bytes_per_rank", peak_bytes_per_rank)
        free = check_number("free_bytes_per_rank", free_bytes_per_rank)
        if peak > free:
            return ResizeChoice(CHECKPOINT_RESTART, in_memory, restart,
                                f"{CHECKPOINT_RESTART}: a redistribution needs {human_bytes(peak)} on a rank and "
                                f"only {human_bytes(free)} is free ({memory}; {through})")
    if in_memory <= restart:
        return ResizeChoice(REDISTRIBUTE, in_memory, restart, f"{REDISTRIBUTE}: {memory} <= {through}")
    return ResizeChoice(CHECKPOINT_RESTART, in_memory, restart, f"{CHECKPOINT_RESTART}: {through} < {memory}")
