"""hpcckpt.redistribute under mpiexec: random old/new rank subsets, shrink 4 -> 3, grow 2 -> 4 by Comm_spawn.

The scripts (tests/scripts/malleable.py) check exact data on every rank (Blocks
in C and Fortran order, a structured Ragged table with uneven and even splits,
replicated values, PerRank), that an incremental Checkpointer resized with the
job saves a valid incremental version restorable on other rank counts, and that
bad inputs are the same CheckpointError on every rank.
"""

from __future__ import annotations

import os

import pytest

from mpitools import run_mpi
from testpaths import TESTS

HERE = TESTS
SCRIPT = os.path.join(HERE, "scripts", "malleable.py")

pytestmark = pytest.mark.timeout(400)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_random_holders_and_targets(n):
    proc = run_mpi(n, SCRIPT, "mix", *range(10), timeout=180)
    assert proc.stdout.count("OK rank") == n, proc.stdout


@pytest.mark.parametrize("n", [1, 2, 3])
def test_bad_inputs_fail_every_rank(n):
    proc = run_mpi(n, SCRIPT, "bad", timeout=180)
    assert proc.stdout.count("OK rank") == n, proc.stdout


def test_shrink_4_to_3_then_the_chain_restores_on_other_counts(tmp_path):
    root = str(tmp_path / "root")
    proc = run_mpi(4, SCRIPT, "shrink", root, 5, timeout=180)
    assert proc.stdout.count("OK rank") == 4 and "OK rank 3 left" in proc.stdout, proc.stdout
    for m in (1, 2, 4):
        proc = run_mpi(m, SCRIPT, "check", root, 5, timeout=180)
        assert proc.stdout.count("OK rank") == m, proc.stdout


def test_grow_2_to_4_by_spawn_then_the_chain_restores_on_other_counts(tmp_path):
    root = str(tmp_path / "root")
    proc = run_mpi(2, SCRIPT, "grow", root, 6, timeout=180)
    assert proc.stdout.count("OK rank") == 4, proc.stdout
    for m in (1, 3):
        proc = run_mpi(m, SCRIPT, "check", root, 6, timeout=180)
        assert proc.stdout.count("OK rank") == m, proc.stdout


def test_a_checkpointer_whose_rank_0_leaves_fails_on_every_rank(tmp_path):
    proc = run_mpi(3, SCRIPT, "resize-bad", str(tmp_path / "root"), timeout=120)
    assert proc.stdout.count("OK rank") == 3, proc.stdout


def test_one_process_without_mpi_copies_into_a_stateful_template():
    """The serial stand-in communicator: the same result as a save and a load, delivered to a Stateful object."""
    import numpy as np

    import hpcckpt
    from hpcckpt.mpi.collective import SerialComm

    class Sim:
        def __init__(self):
            self.u, self.got = np.zeros((4, 3)), None

        def state_dict(self):
            return {"u": hpcckpt.Block(self.u), "rows": hpcckpt.Ragged(), "t": None}

        def load_state_dict(self, d):
            self.got = d

    held = {"u": hpcckpt.Block(np.arange(12.0).reshape(4, 3)), "rows": hpcckpt.Ragged(np.arange(5)), "t": 1.5}
    sim = Sim()
    out = hpcckpt.redistribute(SerialComm(), held, sim)
    assert np.array_equal(sim.u, held["u"].local) and sim.got is out
    assert np.array_equal(out["rows"].local, np.arange(5)) and out["t"] == 1.5
    with pytest.raises(hpcckpt.TemplateMismatchError, match="not in the checkpoint"):
        hpcckpt.redistribute(SerialComm(), held, {**sim.state_dict(), "v": hpcckpt.Block(np.zeros(1))})


def test_replicated_blocks_are_refused_with_what_to_do():
    """Each holder's part is one chunk of the in-memory source, so copies on several holders are refused."""
    import numpy as np

    import hpcckpt
    from hpcckpt.mpi.collective import SerialComm

    held = {"acc": hpcckpt.Block(np.ones(4), replicated=True)}
    with pytest.raises(hpcckpt.CheckpointError, match=r"does not take replicated Blocks yet \(\[.acc.\]\)"):
        hpcckpt.redistribute(SerialComm(), held, {"acc": hpcckpt.Block(np.zeros(4))})
