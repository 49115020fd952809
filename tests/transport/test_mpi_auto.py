"""strategy="auto" under a Checkpointer: file-per-rank first, aggregation tried once, then the measurement decides."""

import numpy as np
import pytest

import hpcckpt
from hpcckpt.transport import io_history
from hpcckpt.transport.auto import choose_strategy

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(120)]


def test_auto_explores_aggregation_once_then_keeps_the_measured_best(mpi_tmp):
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    n = 1000
    ck = hpcckpt.Checkpointer(mpi_tmp, comm=comm, ranks_per_node=2, track_failures=False)
    u = np.arange(n, dtype=np.float64) + comm.rank * n
    used = []
    try:
        for step in range(4):
            result = ck.save({"u": hpcckpt.Block(u, (comm.rank * n,), (comm.size * n,))}, step)
            used.append(result.strategy)
    finally:
        ck.close()
    assert used[:2] == ["file-per-rank", "aggregated"]
    assert comm.allgather(used) == [used] * comm.size
    # from then on the measurements decide (the pure rule, tested in test_io_planning.py): each later save used
    # what the rule gives for the bandwidths recorded before it
    history = io_history.read(mpi_tmp)
    assert [h["strategy"] for h in history] == used
    for k in (2, 3):
        assert used[k] == choose_strategy(comm.size, n * 8, 2, history[:k])
    view = hpcckpt.open(f"{mpi_tmp}/step-000000000003")
    assert view.meta.extra["strategy"] == used[3]
    assert np.array_equal(view.read("u"), np.arange(comm.size * n, dtype=np.float64))
