"""The conformance suite of a Checkpointer configuration: what an application relies on, for every kind of save.

Subclass it in a pytest module and set ``options`` (the Checkpointer keyword
arguments of the configuration; ``local_dir=True`` stands for a node-local
directory under the test's ``tmp_path``)::

    class TestAsyncIncremental(CheckpointerTests):
        options = {"asynchronous": True, "incremental": True, "block_bytes": 4096}

Each test runs on one process (a SerialComm): exact data after every restore,
the same meaning of SaveResult for every kind, state changed right after a
save not leaking into it, retention, a failed save committing nothing, a
restart continuing the run, layouts that change between saves, a swapped
(rebound) buffer saved as it is at the save, nested state, and (for
incremental configurations) only the changed blocks written.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from hpcckpt.checkpointer import Checkpointer
from hpcckpt.errors import CheckpointError
from hpcckpt.state import Block, Ragged


class CheckpointerTests:
    """Conformance tests every Checkpointer configuration must pass (pytest collects them from subclasses)."""

    options: dict = {}

    # ---------------------------------------------------------------- helpers
    def checkpointer(self, tmp_path, **more) -> Checkpointer:
        """A Checkpointer of this configuration under ``tmp_path/root`` (``more`` overrides options)."""
        opts = {**self.options, **more}
        if opts.get("local_dir") is True:
            opts["local_dir"] = os.path.join(tmp_path, "local")
        return Checkpointer(os.path.join(tmp_path, "root"), track_failures=False, **opts)

    def reader(self, tmp_path) -> Checkpointer:
        """A blocking Checkpointer over the same root and levels, for restoring what the configuration wrote."""
        levels = {k: v for k, v in self.options.items() if k in ("local_dir", "ranks_per_node")}
        return self.checkpointer(tmp_path, asynchronous=False, incremental=False, **levels) if levels else \
            Checkpointer(os.path.join(tmp_path, "root"), track_failures=False)

    @property
    def incremental(self) -> bool:
        return bool(self.options.get("incremental"))

    @property
    def asynchronous(self) -> bool:
        return bool(self.options.get("asynchronous"))

    @staticmethod
    def state(step: int, n: int = 6000) -> dict:
        """The state of a run at ``step``: a field that changes in one place per step, particles, scalars."""
        u = np.arange(n, dtype=np.float64)
        u[: step * 10] = -step  # a prefix that changes every step; the rest stays
        parts = np.arange(3 * (5 + step), dtype=np.int32).reshape(-1, 3) * step
        return {"u": Block(u), "p": Ragged(parts), "step": step, "name": f"run-{step}"}

    @staticmethod
    def template(n: int = 6000, rows: int = 0) -> dict:
        return {"u": Block(np.zeros(n)), "p": Ragged(rows=rows), "step": None, "name": None}

    def check(self, got: dict, step: int) -> None:
        want = self.state(step)
        assert np.array_equal(got["u"].local, want["u"].local)
        assert np.array_equal(got["p"].local, want["p"].local) and got["p"].local.dtype == np.int32
        assert got["step"] == step and got["name"] == f"run-{step}"

    def restore(self, ck: Checkpointer, step: int | None = None) -> dict:
        rows = self.state(step).get("p").local.shape[0] if step is not None else None
        if rows is None:
            rows = self.state(ck.latest())["p"].local.shape[0]
        return ck.restore(self.template(rows=rows), step=step)

    # ------------------------------------------------------------------ tests
    def test_every_step_restores_exactly(self, tmp_path):
        with self.checkpointer(tmp_path) as ck:
            for step in range(1, 5):
                ck.save(self.state(step), step)
            ck.wait()
            assert ck.steps() == [1, 2, 3, 4]
            for step in (4, 2, 1, 3):
                self.check(self.restore(ck, step), step)
        with self.reader(tmp_path) as ck:
            assert ck.latest() == 4
            self.check(self.restore(ck), 4)

    def test_save_result_means_the_same_for_every_kind(self, tmp_path):
        with self.checkpointer(tmp_path) as ck:
            first = ck.save(self.state(1), 1)
            assert first.step == 1 and first.path.startswith(os.path.join(tmp_path, "root"))
            if self.asynchronous:
                assert first.pending and first.bytes_written == 0 and first.nchunks == 0
                committed = ck.wait()
            else:
                assert not first.pending
                committed = first
            assert committed is ck.last_result and not committed.pending
            assert committed.path == first.path and committed.step == 1
            assert committed.bytes_written >= 6000 * 8 and committed.nchunks >= 2
            assert committed.kind == "full" and committed.levels
            assert all(v >= 0 for v in committed.timings.values()) and "commit" in committed.timings
            if self.incremental:
                assert committed.incremental["kind"] == "full" and committed.incremental["written_bytes"] > 0
            else:
                assert committed.incremental is None
            ck.save(self.state(2), 2)
            second = ck.wait() if self.asynchronous else ck.last_result
            assert second.step == 2 and second.kind == ("incremental" if self.incremental else "full")

    def test_state_changed_right_after_save_is_not_saved(self, tmp_path):
        with self.checkpointer(tmp_path) as ck:
            state = self.state(1)
            ck.save(state, 1)
            state["u"].local[:] = 1e9  # the application goes on at once
            state["p"].local[:] = -7
            ck.wait()
            self.check(self.restore(ck, 1), 1)

    def test_a_swapped_buffer_is_saved_as_it_is_now(self, tmp_path):
        """The ping-pong swap ``u, un = un, u``: every save writes the live buffer, in each safe form."""

        class Sim:  # the Stateful protocol
            def __init__(self, n=6000):
                self.u, self.un, self.step = np.zeros(n), np.zeros(n), 0

            def advance(self):
                self.un[:] = self.step + 1.0
                self.u, self.un = self.un, self.u
                self.step += 1

            def state_dict(self):
                return {"u": Block(self.u), "step": self.step}

            def load_state_dict(self, d):
                self.step = d["step"]

        sim = Sim()
        forms = {"stateful": sim, "callable": sim.state_dict,
                 "getter": {"u": Block(lambda: sim.u), "step": 0}}
        for k, (label, state) in enumerate(forms.items()):
            root = os.path.join(tmp_path, label)
            os.makedirs(root)
            with self.checkpointer(root) as ck:
                ck.register(state)
                for _ in range(3):
                    sim.advance()
                    ck.save(step=sim.step)
                ck.wait()
                live = sim.u.copy()
                sim.u[:], sim.un[:] = -1.0, -2.0  # both buffers now differ from what was saved
                fresh = Sim()
                template = {"stateful": fresh, "callable": fresh.state_dict,
                            "getter": {"u": Block(lambda: fresh.u), "step": None}}[label]
                got = ck.restore(template)
                assert np.array_equal(fresh.u, live), label  # filled through what the template gives now
                assert np.array_equal(got["u"].local, live), label
                # a plain value in a registered dict is the object it holds (0 here); Stateful/callable read it now
                assert got["step"] == (0 if label == "getter" else 3 * (k + 1)), label
                if label == "stateful":
                    assert fresh.step == 3 * (k + 1)

    def test_nested_state_round_trips_with_its_nesting(self, tmp_path):
        state = self.state(1)
        nested = {"fluid": {"u": state["u"], "nu": 0.1, "opts": {"a": 1}}, "parts": {"p": state["p"]},
                  "step": 1, "name": "run-1"}
        with self.checkpointer(tmp_path) as ck:
            ck.save(nested, 1)
            ck.wait()
            assert set(ck.restore({"fluid/u": Block(np.zeros(6000)), "fluid/nu": None, "fluid/opts": None,
                                   "parts/p": Ragged(), "step": None, "name": None})) >= {"fluid/u"}
            template = {"fluid": {"u": Block(np.zeros(6000)), "nu": None, "opts": None},
                        "parts": {"p": Ragged()}, "step": None, "name": None}
            got = ck.restore(template)
        assert np.array_equal(template["fluid"]["u"].local, state["u"].local)
        assert got["fluid"]["nu"] == 0.1 and got["fluid"]["opts"] == {"a": 1}
        assert np.array_equal(got["parts"]["p"].local, state["p"].local)
        assert got["step"] == 1 and got["name"] == "run-1"

    def test_retention_keeps_the_newest_versions_whole(self, tmp_path):
        with self.checkpointer(tmp_path, keep=2) as ck:
            for step in range(1, 7):
                ck.save(self.state(step), step)
            ck.wait()
            assert ck.steps()[-2:] == [5, 6]
            self.check(self.restore(ck, 5), 5)
            self.check(self.restore(ck, 6), 6)
        root = os.path.join(tmp_path, "root")
        committed = [d for d in os.listdir(root) if d.startswith("step-")
                     and os.path.isfile(os.path.join(root, d, "metadata.json"))]
        assert len(committed) <= 6  # older ones were removed unless a kept version needs their data

    def test_a_failed_save_commits_nothing_and_the_next_one_works(self, tmp_path):
        with self.checkpointer(tmp_path) as ck:
            ck.save(self.state(1), 1)
            bad = self.state(2)
            bad["u"] = Block(np.zeros(10), offset=(5,), global_shape=(12,))  # does not fit its global shape
            with pytest.raises(CheckpointError):
                ck.save(bad, 2)
                ck.wait()
            assert ck.steps() == [1]
            ck.save(self.state(3), 3)
            ck.wait()
            assert ck.steps() == [1, 3]
            self.check(self.restore(ck, 3), 3)

    def test_a_restarted_run_continues_its_versions(self, tmp_path):
        with self.checkpointer(tmp_path) as ck:
            for step in (1, 2):
                ck.save(self.state(step), step)
        with self.checkpointer(tmp_path) as ck:
            self.check(self.restore(ck), 2)
            for step in (3, 4):
                ck.save(self.state(step), step)
            ck.wait()
            assert ck.steps() == [1, 2, 3, 4]
            for step in (1, 4):
                self.check(self.restore(ck, step), step)

    def test_layouts_that_change_between_saves(self, tmp_path):
        with self.checkpointer(tmp_path) as ck:
            ck.save({"u": Block(np.arange(100.0)), "t": 1}, 1)
            ck.save({"u": Block(np.arange(300.0)), "v": Block(np.ones((4, 5), np.float32)), "t": 2}, 2)
            ck.save({"v": Block(np.full((4, 5), 2, np.float32)), "t": 3}, 3)
            ck.wait()
            got = ck.restore({"u": Block(np.zeros(100)), "t": None}, step=1)
            assert np.array_equal(got["u"].local, np.arange(100.0)) and got["t"] == 1
            got = ck.restore({"u": Block(np.zeros(300)), "v": Block(np.zeros((4, 5), np.float32)), "t": None}, step=2)
            assert np.array_equal(got["u"].local, np.arange(300.0)) and np.all(got["v"].local == 1)
            got = ck.restore({"v": Block(np.zeros((4, 5), np.float32)), "t": None})
            assert np.all(got["v"].local == 2) and got["t"] == 3

    def test_incremental_writes_only_what_changed(self, tmp_path):
        if not self.incremental:
            pytest.skip("not an incremental configuration")
        u = np.arange(64 * 1024, dtype=np.float64)  # 512 KiB: 128 blocks of 4 KiB
        with self.checkpointer(tmp_path, block_bytes=4096) as ck:
            ck.save({"u": Block(u)}, 1)
            u[1000] = -1.0  # one block changes
            ck.save({"u": Block(u)}, 2)
            result = ck.wait() if self.asynchronous else ck.last_result
            assert result.kind == "incremental" and result.bytes_written == 4096
            assert result.incremental["referenced_bytes"] == u.nbytes - 4096
            got = ck.restore({"u": Block(np.zeros_like(u))})
            assert np.array_equal(got["u"].local, u)
