"""A hypothesis state machine over save / crash / gc / compact / retention / restore.

For each kind of save (blocking, incremental, asynchronous, asynchronous +
incremental) hypothesis drives one Checkpointer through random sequences of:
saves of a state that changes a little (a field with one changed block, a
particle table that grows or shrinks), a crash (the process "dies": the
Checkpointer is abandoned with its save uncommitted and a partial version
left behind, and a new one takes over the root), ``gc``, ``compact``, and
restores of any committed step.  The model is the data of every committed
step; after every rule the committed steps are checked against it (retention
keeps at least the newest ``keep``), and every restore must give exactly the
data of its step.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from hpcckpt import Block, Checkpointer, Ragged
from hpcckpt.root.catalog import gc, list_versions
from hpcckpt.incremental.chain import compact
from hpcckpt.core.names import DATA_DIR, rank_file

N = 2048  # float64: 16 KiB, 16 blocks of 1 KiB
KEEP = 3


class CheckpointerMachine(RuleBasedStateMachine):
    """One root, one Checkpointer at a time; ``options`` set by the subclasses below."""

    options: dict = {}

    @initialize()
    def start(self):
        self.tmp = tempfile.mkdtemp(prefix="hpcckpt-sm-")
        self.root = os.path.join(self.tmp, "root")
        self.u = np.arange(N, dtype=np.float64)
        self.p = np.arange(12, dtype=np.int64).reshape(4, 3)
        self.step = 0
        self.committed: dict[int, tuple] = {}  # step -> (u, p) of every version known committed
        self.pending: tuple | None = None  # an asynchronous save not committed yet: (step, u, p)
        self.ck = self._open()

    def _open(self) -> Checkpointer:
        return Checkpointer(self.root, keep=KEEP, track_failures=False, break_lock=True, block_bytes=1024,
                            **self.options)

    @property
    def asynchronous(self) -> bool:
        return bool(self.options.get("asynchronous"))

    def _commit_pending(self):
        """What the Checkpointer commits at its next call: the pending save becomes committed."""
        if self.pending is not None:
            step, u, p = self.pending
            self.committed[step] = (u, p)
            self.pending = None

    def teardown(self):
        try:
            self.ck.close()
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)

    # ------------------------------------------------------------------ rules
    @rule(where=st.integers(0, N - 1), value=st.floats(-1e6, 1e6, allow_nan=False), rows=st.integers(-2, 3))
    def save(self, where, value, rows):
        self.step += 1
        self.u[where] = value
        n = max(0, self.p.shape[0] + rows)
        self.p = np.arange(3 * n, dtype=np.int64).reshape(n, 3) + self.step
        self.ck.save({"u": Block(self.u), "p": Ragged(self.p), "step": self.step}, self.step)
        self._commit_pending()  # a save commits the one before it first
        saved = (self.step, self.u.copy(), self.p.copy())
        if self.asynchronous:
            self.pending = saved
        else:
            self.committed[self.step] = saved[1:]

    @rule()
    def crash(self):
        """The process dies: the save in flight is lost (its data written, never committed), a partial version
        of a later step is left behind, and a new Checkpointer takes over the root."""
        if self.ck.engine is not None and self.ck.engine.pending is not None:
            self.ck.engine.pending.writer.join()  # killed after its data was written, before the commit
        self.pending = None
        partial = os.path.join(self.root, f"step-{self.step + 1:012d}", DATA_DIR)
        os.makedirs(partial, exist_ok=True)
        with open(os.path.join(partial, rank_file(0).split("/")[-1]), "wb") as f:
            f.write(b"\0" * 100)
        self.ck.pacer.close()
        self.ck = self._open()

    @rule()
    def collect_garbage(self):
        self.ck.wait()
        self._commit_pending()
        gc(self.root)

    @rule()
    def compact_chains(self):
        self.ck.wait()
        self._commit_pending()
        compact(self.root)

    @precondition(lambda self: self.committed)
    @rule(data=st.data())
    def restore(self, data):
        self.ck.wait()  # steps() lists committed versions only: commit the pending save first
        self._commit_pending()
        steps = self.ck.steps()
        step = data.draw(st.sampled_from(steps))
        u, p = self.committed[step]
        got = self.ck.restore({"u": Block(np.zeros(N)), "p": Ragged(rows=p.shape[0]), "step": None}, step=step)
        assert got["step"] == step
        assert np.array_equal(got["u"].local, u)
        assert np.array_equal(got["p"].local, p) and got["p"].local.shape == p.shape

    # ------------------------------------------------------------- invariants
    @invariant()
    def committed_versions_match_the_model(self):
        on_disk = [e.step for e in list_versions(self.root) if e.committed]
        assert set(on_disk) <= set(self.committed), (on_disk, sorted(self.committed))
        newest = sorted(self.committed)[-KEEP:]
        assert set(newest) <= set(on_disk), (on_disk, newest)


def _machine(name: str, options: dict):
    machine = type(name, (CheckpointerMachine,), {"options": options})
    machine.TestCase.settings = settings(max_examples=12, stateful_step_count=14, deadline=None,
                                         suppress_health_check=[HealthCheck.too_slow])
    return machine.TestCase


TestBlocking = _machine("Blocking", {})
TestIncremental = _machine("Incremental", {"incremental": True})
TestAsynchronous = _machine("Asynchronous", {"asynchronous": True})
TestAsynchronousIncremental = _machine("AsynchronousIncremental", {"asynchronous": True, "incremental": True})

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
