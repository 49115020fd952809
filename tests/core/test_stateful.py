"""State read at save time: Stateful objects, callables, getter Blocks, nested dicts (hpcckpt.stateful).

The conformance suite (hpcckpt.testing.CheckpointerTests) checks the ping-pong
swap and nested state for every kind of save; here: the one-call API, bad
inputs, and (under mpiexec, marker mpi) nested state restored on another
decomposition.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import hpcckpt
from hpcckpt import Block, Checkpointer, CheckpointError, Ragged, TemplateMismatchError


class Model:
    def __init__(self, n=8):
        self.w = np.zeros(n)
        self.epoch = 0
        self.loaded = None

    def state_dict(self):
        return {"w": Block(self.w), "epoch": self.epoch}

    def load_state_dict(self, d):
        self.epoch = d["epoch"]
        self.loaded = d


def test_stateful_round_trip_through_save_and_load(tmp_path):
    m = Model()
    m.w = np.arange(8.0)  # rebound after construction: read at the save
    m.epoch = 4
    hpcckpt.save(m, tmp_path / "ck")
    with hpcckpt.open(tmp_path / "ck") as view:
        assert sorted(view.variables) == ["w"] and view.values == {"epoch": 4}
    fresh = Model()
    out = hpcckpt.load(fresh, tmp_path / "ck")
    assert np.array_equal(fresh.w, np.arange(8.0)) and fresh.epoch == 4 and fresh.loaded is out


def test_stateful_values_inside_a_dict_get_load_state_dict(tmp_path):
    m = Model()
    m.w[:] = 3.0
    m.epoch = 2
    hpcckpt.save({"model": m, "step": 7}, tmp_path / "ck")
    with hpcckpt.open(tmp_path / "ck") as view:
        assert sorted(view.variables) == ["model/w"] and view.values == {"model/epoch": 2, "step": 7}
    fresh = Model()
    out = hpcckpt.load({"model": fresh, "step": None}, tmp_path / "ck")
    assert fresh.epoch == 2 and np.array_equal(fresh.w, m.w) and out["step"] == 7


def test_callable_state_and_getter_ragged(tmp_path):
    box = {"u": np.full(5, 1.0), "parts": np.arange(6, dtype=np.int32).reshape(3, 2)}
    state = lambda: {"u": Block(box["u"]), "p": Ragged(lambda: box["parts"]), "t": float(box["u"][0])}  # noqa: E731
    with Checkpointer(tmp_path / "root", track_failures=False) as ck:
        ck.register(state)
        box["u"] = np.full(5, 2.0)  # rebound between registration and save
        ck.save(1)
        assert ck.maybe_save(2) is None or ck.latest() == 2  # the registered state, step first
        box["u"] = np.zeros(5)
        got = ck.restore(step=1)
    assert np.array_equal(box["u"], np.full(5, 2.0)) and got["t"] == 2.0
    assert np.array_equal(got["p"].local, box["parts"])


def test_plain_dicts_of_values_stay_replicated_values(tmp_path):
    hpcckpt.save({"u": Block(np.ones(3)), "params": {"dt": 0.1, "nested": {"k": [1, 2]}}}, tmp_path / "ck")
    with hpcckpt.open(tmp_path / "ck") as view:
        assert view.values == {"params": {"dt": 0.1, "nested": {"k": [1, 2]}}}


def test_deeply_nested_groups(tmp_path):
    state = {"a": {"b": {"c": Block(np.arange(4.0))}, "x": 1}}
    hpcckpt.save(state, tmp_path / "ck")
    with hpcckpt.open(tmp_path / "ck") as view:
        assert list(view.variables) == ["a/b/c"] and view.values == {"a/x": 1}
    out = hpcckpt.load({"a": {"b": {"c": Block(np.zeros(4))}, "x": None}}, tmp_path / "ck")
    assert np.array_equal(out["a"]["b"]["c"].local, np.arange(4.0)) and out["a"]["x"] == 1


class Bad:
    def state_dict(self):
        return [1, 2]

    def load_state_dict(self, d):
        pass


def _raise():
    raise RuntimeError("no field yet")


@pytest.mark.parametrize("bad, match", [
    (Bad(), r"Bad.state_dict\(\) returned list, not a dict"),
    (lambda: 3, "returned int, not a dict"),
    ({"u": Block(_raise)}, "variable 'u': the Block's getter _raise raised RuntimeError: no field yet"),
    ({"g": {"a/b": Block(np.zeros(2))}}, "group 'g': key 'a/b' contains '/'"),
    ({"g/u": Block(np.zeros(2)), "g": {"u": Block(np.zeros(2))}}, "'g/u' is named twice"),
    ({"g": {1: Block(np.zeros(2))}}, "keys must be non-empty strings"),
    (42, "must be a dict, an object with state_dict"),
])
def test_bad_states_are_clear_errors_and_leave_nothing(tmp_path, bad, match):
    path = tmp_path / "ck"
    with pytest.raises(TemplateMismatchError, match=match):
        hpcckpt.save(bad, path)
    assert not os.path.exists(os.path.join(path, "metadata.json"))


def test_a_getter_that_raises_at_restore_is_a_template_error_not_a_skipped_version(tmp_path):
    with Checkpointer(tmp_path / "root", track_failures=False) as ck:
        ck.save({"u": Block(np.ones(3))}, 1)
        with pytest.raises(TemplateMismatchError, match="getter"):
            ck.restore({"u": Block(_raise)})
        with pytest.raises(CheckpointError, match="without a state"):
            ck.save(step=2)


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(120)
def test_nested_state_under_mpi_with_a_reshard(mpi_tmp):
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    n, r = comm.size, comm.rank
    shape = (4 * n + 1, 3)
    g = np.arange(np.prod(shape), dtype=np.float64).reshape(shape)
    lo, hi = r * shape[0] // n, (r + 1) * shape[0] // n
    parts = np.full((r + 1, 2), r, np.int32)

    class Sim:
        def __init__(self, u):
            self.u = u
            self.t = 0.0

        def state_dict(self):
            return {"fluid": {"u": Block(self.u, (lo_, 0), shape), "nu": 0.3}, "parts": {"p": Ragged(self.p)},
                    "t": self.t}

        def load_state_dict(self, d):
            self.t = d["t"]

    lo_ = lo
    sim = Sim(np.zeros((hi - lo, 3)))
    sim.p = parts
    sim.u = g[lo:hi].copy()  # rebound before the save
    sim.t = 1.5
    with Checkpointer(os.path.join(mpi_tmp, "root"), comm=comm, track_failures=False) as ck:
        ck.register(sim).save(step=3)
        # another decomposition: columns split the other way round (reverse rank order of rows)
        q = n - 1 - r
        lo2, hi2 = q * shape[0] // n, (q + 1) * shape[0] // n
        u2 = np.zeros((hi2 - lo2, 3))
        fresh = {"fluid": {"u": Block(lambda: u2, (lo2, 0), shape), "nu": None}, "parts": {"p": Ragged()},
                 "t": None}
        got = ck.restore(fresh)
    assert np.array_equal(u2, g[lo2:hi2]) and got["fluid"]["nu"] == 0.3 and got["t"] == 1.5
    total = comm.allgather(got["parts"]["p"].local)
    assert np.array_equal(np.concatenate(total), np.concatenate([np.full((k + 1, 2), k, np.int32) for k in range(n)]))


class _GlobalIndexed(np.ndarray):
    """An ndarray subclass whose indexing means something else (as Devito's Data under MPI)."""

    def __getitem__(self, index):
        raise AssertionError("hpcckpt indexed the subclass")

    __setitem__ = __getitem__


def test_an_ndarray_subclass_is_saved_and_filled_in_place_through_a_plain_view(tmp_path):
    u = np.arange(12.0).reshape(3, 4).view(_GlobalIndexed)
    with Checkpointer(tmp_path / "root", track_failures=False) as ck:
        ck.save({"u": Block(u)}, 1)
        u.view(np.ndarray)[...] = 0
        ck.restore({"u": Block(u)})
    assert np.array_equal(u.view(np.ndarray), np.arange(12.0).reshape(3, 4))
