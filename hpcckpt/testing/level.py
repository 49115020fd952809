"""The conformance suite of a redundancy Level: a version it protected survives the loss of one node.

Subclass it in a pytest module, set ``level`` (an instance) and ``options``
(the Checkpointer options that make it due at every checkpoint), and run the
module under ``mpiexec -n N`` (N >= ``min_ranks``; each rank is a simulated
node of its own, ``ranks_per_node=1``)::

    class TestMine(LevelTests):
        level = MyLevel()
        options = {"mine_every": 1}

The tests carry the ``mpi`` marker (pytest-mpi) and skip on fewer ranks.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile

import numpy as np
import pytest

from hpcckpt.checkpointer import Checkpointer
from hpcckpt.levels.base import Level
from hpcckpt.storage.metadata_file import read_metadata
from hpcckpt.state import Block


class LevelTests:
    """Conformance tests every Level must pass under MPI (pytest collects them from subclasses)."""

    level: Level
    options: dict = {}
    min_ranks: int = 2

    @pytest.fixture
    def where(self):
        """``(comm, shared temporary directory)`` on every rank; skips below ``min_ranks``."""
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        if comm.Get_size() < self.min_ranks:
            pytest.skip(f"needs mpiexec -n {self.min_ranks} or more")
        path = comm.bcast(tempfile.mkdtemp(prefix="hpcckpt-level-") if comm.Get_rank() == 0 else None, root=0)
        yield comm, path
        comm.Barrier()
        if comm.Get_rank() == 0:
            shutil.rmtree(path, ignore_errors=True)

    def _checkpointer(self, comm, path, **more) -> Checkpointer:
        return Checkpointer(os.path.join(path, "root"), comm=comm, local_dir=os.path.join(path, "local"),
                            ranks_per_node=1, track_failures=False, **{**self.options, **more})

    @staticmethod
    def _state(comm, step: int) -> dict:
        n = 5000 + 100 * comm.Get_rank()  # unequal file sizes: parity pads, partners copy whole files
        u = np.arange(n, dtype=np.float64) * step + comm.Get_rank()
        start = sum(5000 + 100 * r for r in range(comm.Get_rank()))
        total = sum(5000 + 100 * r for r in range(comm.Get_size()))
        return {"u": Block(u, (start,), (total,)), "step": step}

    @pytest.mark.mpi(min_size=2)
    def test_a_protected_version_survives_the_loss_of_one_node(self, where):
        comm, path = where
        with self._checkpointer(comm, path, flush_every=2) as ck:  # step 1 reaches the root, step 2 does not
            for step in (1, 2):
                ck.save(self._state(comm, step), step)
            result = ck.wait() or ck.last_result
            assert self.level.label in result.levels, result.levels
            meta = read_metadata(os.path.join(ck.engine.node.node_dir, "step-000000000002"))
            assert json.loads(json.dumps(meta.extra["levels"][self.level.key])) is not None
            lost = os.path.join(path, "local", "node-1")
        comm.Barrier()
        if comm.Get_rank() == 0:
            shutil.rmtree(lost)  # node 1 is gone, and with it rank 1's file and any copies it held
        comm.Barrier()
        with self._checkpointer(comm, path) as ck:
            template = self._state(comm, 0)
            template["u"].local[:] = -1
            got = ck.restore(template)
            assert got["step"] == 2 and ck.engine.restored_level == self.level.label
            assert np.array_equal(template["u"].local, self._state(comm, 2)["u"].local)

    @pytest.mark.mpi(min_size=2)
    def test_a_damaged_file_while_protecting_fails_everywhere_and_commits_nothing(self, where, monkeypatch):
        """One rank's data file turns into a directory just before the level reads it: the level must finish
        its exchanges, and every rank gets the same CheckpointError (no rank hangs); nothing is committed."""
        from hpcckpt.errors import CheckpointError
        from hpcckpt.core.names import rank_file

        comm, path = where
        with self._checkpointer(comm, path) as ck:
            ck.save(self._state(comm, 1), 1)
            ck.wait()
            original = type(self.level).protect

            def damaged(level, node, directory, *args):
                if node.rank == comm.Get_size() - 1:
                    mine = os.path.join(directory, rank_file(node.rank))
                    os.rename(mine, mine + ".gone")
                    os.mkdir(mine)
                return original(level, node, directory, *args)

            monkeypatch.setattr(type(self.level), "protect", damaged)
            with pytest.raises(CheckpointError, match=f"rank {comm.Get_size() - 1}"):
                ck.save(self._state(comm, 2), 2)  # the commit runs in the save (or at wait, asynchronously)
                ck.wait()
            monkeypatch.undo()
            assert ck.steps() == [1]
            ck.save(self._state(comm, 3), 3)
            ck.wait()
            assert ck.steps() == [1, 3]
