"""Checkpointer.should_save/maybe_save/should_exit under MPI: one agreed decision on every rank."""

import os
import signal
import time

import numpy as np
import pytest

import hpcckpt
from hpcckpt.policy import FixedSeconds, FixedSteps

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(120)]


def _state(comm, step):
    u = np.full(5, comm.rank * 1000 + step, dtype=np.int64)
    return {"u": hpcckpt.Block(u, (5 * comm.rank,), (5 * comm.size,)), "step": step}


def test_signal_on_one_rank_makes_every_rank_save_and_exit(mpi_tmp):
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    ck = hpcckpt.Checkpointer(mpi_tmp, comm=comm, policy=FixedSteps(1000), handle_signals=True)
    saved = []
    last = comm.size - 1
    try:
        for step in range(50):
            if step == 7 and comm.rank == last:
                os.kill(os.getpid(), signal.SIGUSR1)
            if ck.maybe_save(_state(comm, step), step) is not None:
                saved.append(step)
            if ck.should_exit():
                break
    finally:
        ck.close()
    assert saved == [7]
    assert step == 7
    assert comm.allgather((saved, step)) == [([7], 7)] * comm.size
    view = hpcckpt.open(os.path.join(mpi_tmp, "step-000000000007"))
    expected = np.concatenate([np.full(5, r * 1000 + 7) for r in range(comm.size)])
    assert np.array_equal(view.read("u"), expected)


def test_interval_decision_is_rank0s_even_when_clocks_differ(mpi_tmp, monkeypatch):
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    if comm.rank != 0:  # other ranks' clocks run wild: they must not matter
        monkeypatch.setattr(time, "time", lambda: 1e12 * (1 + comm.rank))
    ck = hpcckpt.Checkpointer(mpi_tmp, comm=comm, policy=FixedSeconds(3600), track_failures=False)
    try:
        decisions = [ck.should_save(step) for step in range(5)]
    finally:
        ck.close()
    assert decisions == [False] * 5
    assert comm.allgather(decisions) == [decisions] * comm.size


def test_deadline_triggers_one_final_save(mpi_tmp):
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    deadline = comm.bcast(time.time() + 2.0)  # margin floor is 30 s, so the window is already open
    ck = hpcckpt.Checkpointer(mpi_tmp, comm=comm, policy=FixedSteps(1000), deadline=deadline,
                              handle_signals=False, track_failures=False)
    try:
        first = ck.maybe_save(_state(comm, 3), 3)
        assert first is not None and ck.should_exit()
    finally:
        ck.close()
    assert sorted(n for n in os.listdir(mpi_tmp) if n.startswith("step-")) == ["step-000000000003"]


def test_failure_history_counts_an_unclosed_run(mpi_tmp):
    from mpi4py import MPI

    from hpcckpt.policy import FailureHistory

    comm = MPI.COMM_WORLD
    hpcckpt.Checkpointer(mpi_tmp, comm=comm, policy=FixedSteps(10))  # never closed: a crash
    ck = hpcckpt.Checkpointer(mpi_tmp, comm=comm, policy=FixedSteps(10))
    ck.close()
    comm.Barrier()
    history = FailureHistory.load(mpi_tmp)
    assert history.n_failures == 1
    assert [r.failed for r in history.runs] == [True, False]


class _SignalBeforeDecision:
    """A communicator that sends SIGUSR1 to this process when the ``n``-th decision allreduce starts:
    after this rank has read its flag for that decision, before the allreduce (the racy instant)."""

    def __init__(self, comm, n):
        self._comm, self._n = comm, n

    def __getattr__(self, name):
        return getattr(self._comm, name)

    def allreduce(self, obj, op=None):
        self._n -= 1  # should_save's only collective: the decision (this test saves nothing)
        if self._n == 0:
            os.kill(os.getpid(), signal.SIGUSR1)
        return self._comm.allreduce(obj, op=op)


def test_signal_between_flag_read_and_allreduce_on_one_rank_counts_at_the_next_decision(mpi_tmp):
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    last = comm.size - 1
    mine = _SignalBeforeDecision(comm, 4) if comm.rank == last else comm
    ck = hpcckpt.Checkpointer(mpi_tmp, comm=mine, policy=FixedSteps(1000), handle_signals=True, track_failures=False)
    try:
        decisions = []
        for step in range(1, 10):
            decisions.append(ck.should_save(step))
            if ck.should_exit():
                break
    finally:
        ck.close()
    # the signal came during the 4th decision on one rank: every rank says no then, and yes at the 5th
    assert decisions == [False] * 4 + [True]
    assert comm.allgather((decisions, ck.stop_reason)) == [(decisions, "SIGUSR1")] * comm.size
