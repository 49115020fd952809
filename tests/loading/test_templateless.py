"""Restore without a template, restore results for codes that rebind arrays, read-only templates.

``hpcckpt.load(None, path)`` and ``Checkpointer.restore(None)`` (or
``restore()`` with nothing registered, which warns) return every variable by its stored name: a Block variable as
this rank's even share of the first axis, Ragged rows as ``Ragged()`` splits
them, values whole, PerRank by its resize rule.  Under mpiexec (marker mpi)
on the saving rank count and on one rank fewer.
"""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest

import hpcckpt
from hpcckpt import Block, Checkpointer, PerRank, Ragged, TemplateMismatchError
from hpcckpt.core.regions import even_rows


def saved_state(n: int, r: int) -> dict:
    shape = (2 * n + 1, 3)
    lo, hi = (0, 2 * n + 1) if r == 0 else (0, 0)  # saved by rank 0 alone: any decomposition will do
    g = np.arange(np.prod(shape), dtype=np.float64).reshape(shape)
    rng = np.random.default_rng(r)
    return {"u": Block(g[lo:hi].copy(), (lo, 0), shape), "p": Ragged(np.full((r + 1, 2), r, np.int32)),
            "s": Block(np.array(2.5), replicated=True), "g": {"v": Block(np.arange(4.0) if r == 0 else
                                                                         np.zeros(0), (0,), (4,))},
            "t": 7, "rng": PerRank(rng.bit_generator.state)}


def check_templateless(out: dict, comm, saved_ranks: int) -> None:
    n, r = comm.Get_size(), comm.Get_rank()
    shape = (2 * saved_ranks + 1, 3)
    g = np.arange(np.prod(shape), dtype=np.float64).reshape(shape)
    assert sorted(out) == ["g/v", "p", "rng", "s", "t", "u"]
    lo, hi = even_rows(shape[0], n, r)
    u = out["u"]
    assert isinstance(u, Block) and u.offset == (lo, 0) and u.global_shape == shape
    assert np.array_equal(u.local, g[lo:hi])
    v0, v1 = even_rows(4, n, r)
    assert np.array_equal(out["g/v"].local, np.arange(4.0)[v0:v1])
    assert out["s"].local.shape == () and float(out["s"].local) == 2.5  # 0-d: whole on every rank
    assert out["t"] == 7
    rows = np.concatenate([np.full((k + 1, 2), k, np.int32) for k in range(saved_ranks)])
    p0, p1 = even_rows(len(rows), n, r)
    assert np.array_equal(out["p"].local, rows[p0:p1])
    want = np.random.default_rng(r).bit_generator.state if r < saved_ranks else None
    assert out["rng"] == PerRank(want)


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(180)
def test_load_without_a_template_on_as_many_and_fewer_ranks(mpi_tmp):
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    n, r = comm.size, comm.rank
    path = os.path.join(mpi_tmp, "ck")
    hpcckpt.save(saved_state(n, r), path, comm=comm, chunk_bytes=24)
    check_templateless(hpcckpt.load(None, path, comm=comm), comm, n)
    fewer = comm.Split(0 if r < n - 1 else MPI.UNDEFINED, r)
    if fewer != MPI.COMM_NULL:
        check_templateless(hpcckpt.load(None, path, comm=fewer), fewer, n)
        fewer.Free()
    comm.Barrier()


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(180)
def test_checkpointer_restore_without_template_or_registered_state(mpi_tmp):
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    n, r = comm.size, comm.rank
    with Checkpointer(os.path.join(mpi_tmp, "root"), comm=comm, track_failures=False) as ck:
        ck.save(saved_state(n, r), 4)
        check_templateless(ck.restore(None), comm, n)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            check_templateless(ck.restore(step=4), comm, n)
        assert [str(w.message)[:60] for w in caught] == (
            ["hpcckpt: Checkpointer.restore() without a state, and none is"] if r == 0 else [])


def test_restore_without_a_state_or_a_registered_one_warns_and_fills_nothing(tmp_path):
    u = np.arange(6.0)
    with Checkpointer(tmp_path, comm=None, track_failures=False) as ck:
        ck.save({"u": Block(u), "step": 3}, 3)
        u[:] = 0
        with pytest.warns(UserWarning, match=r"restore\(\) without a state, and none is registered.*none of the "
                                             r"application's is filled.*restore\(None\)") as caught:
            got = ck.restore()
        assert [w.filename for w in caught] == [__file__]
        assert np.array_equal(u, np.zeros(6)) and np.array_equal(got["u"].local, np.arange(6.0)) and got["step"] == 3
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert np.array_equal(ck.restore(None)["u"].local, np.arange(6.0))  # asked for: no warning
            ck.register(lambda: {"u": Block(u), "step": 0})
            assert ck.restore(None)["u"].local is not u  # None is no template even with one registered
            assert ck.restore()["step"] == 3 and np.array_equal(u, np.arange(6.0))


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(120)
def test_read_only_template_fails_on_every_rank_saying_what_to_do(mpi_tmp):
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    n, r = comm.size, comm.rank
    path = os.path.join(mpi_tmp, "ck")
    hpcckpt.save({"u": Block(np.arange(float(n)) [r:r + 1], (r,), (n,))}, path, comm=comm)
    local = np.zeros(1)
    if r == n - 1:
        local = np.broadcast_to(np.zeros(1), (1,))  # a broadcast view: read-only
    with pytest.raises(TemplateMismatchError, match=r"'u': the template's local array is read-only.*must be "
                                                    r"writeable.*out\['u'\]\.local"):
        hpcckpt.load({"u": Block(local, (r,), (n,))}, path, comm=comm)


class Solver:
    """Rebinds its arrays on every update (numpy backends that copy), and keeps a nested Stateful part."""

    def __init__(self, n):
        self.u = np.zeros(n)
        self.t = 0.0

    def state_dict(self):
        return {"u": Block(self.u), "t": self.t}

    def load_state_dict(self, d):
        self.t = d["t"]
        self.u = d["u"].local  # set back from the restore's result


def test_restore_returns_every_kind_filled_nested_too(tmp_path):
    solver = Solver(5)
    solver.u = np.arange(5.0)
    solver.t = 2.0
    box = {"w": np.full(3, 4.0)}
    state = {"fluid": {"u": Block(np.arange(6.0).reshape(2, 3)), "getter": Block(lambda: box["w"]),
                       "p": Ragged(np.arange(4, dtype=np.int16).reshape(2, 2)), "nu": 0.1,
                       "rng": PerRank(3)}, "solver": solver, "step": 9}
    hpcckpt.save(state, tmp_path / "ck")
    plain, getter = np.zeros((2, 3)), np.zeros(3)
    fresh_solver = Solver(5)
    template = {"fluid": {"u": Block(plain), "getter": Block(lambda: getter), "p": Ragged(), "nu": None,
                          "rng": PerRank()}, "solver": fresh_solver, "step": None}
    out = hpcckpt.load(template, tmp_path / "ck")
    fluid = out["fluid"]
    assert fluid["u"].local is plain and np.array_equal(plain, np.arange(6.0).reshape(2, 3))
    assert fluid["getter"].local is getter and np.array_equal(getter, np.full(3, 4.0))
    assert np.array_equal(fluid["p"].local, np.arange(4, dtype=np.int16).reshape(2, 2))
    assert fluid["nu"] == 0.1 and fluid["rng"] == PerRank(3) and out["step"] == 9
    assert np.array_equal(out["solver"]["u"].local, np.arange(5.0)) and out["solver"]["t"] == 2.0
    assert fresh_solver.u is out["solver"]["u"].local and fresh_solver.t == 2.0


def test_read_only_template_arrays_are_refused_serially(tmp_path):
    hpcckpt.save({"u": Block(np.arange(4.0))}, tmp_path / "ck")
    frozen = np.zeros(4)
    frozen.flags.writeable = False
    with pytest.raises(TemplateMismatchError, match="read-only.*writeable=False.*must be writeable"):
        hpcckpt.load({"u": Block(frozen)}, tmp_path / "ck")
    assert not frozen.any()


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(120)
def test_a_template_that_names_some_variables(mpi_tmp):
    """strict=False skips what the template omits (as before); strict="rest" returns it as load(None) would."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    n, r = comm.size, comm.rank
    path = os.path.join(mpi_tmp, "ck")
    hpcckpt.save(saved_state(n, r), path, comm=comm)
    shape = (2 * n + 1, 3)
    mine = np.zeros((shape[0], 3)) if r == n - 1 else np.zeros((0, 3))  # the last rank asks for all of u
    template = {"u": Block(mine, (0, 0), shape)}
    skipped = hpcckpt.load(template, path, comm=comm, strict=False)
    assert sorted(skipped) == ["u"]
    rest = hpcckpt.load(template, path, comm=comm, strict="rest")
    assert sorted(rest) == ["g/v", "p", "rng", "s", "t", "u"] and rest["u"].local is mine
    if r == n - 1:
        assert np.array_equal(mine, np.arange(np.prod(shape), dtype=np.float64).reshape(shape))
    v0, v1 = even_rows(4, n, r)
    assert np.array_equal(rest["g/v"].local, np.arange(4.0)[v0:v1]) and rest["t"] == 7
    with pytest.raises(TemplateMismatchError, match="strict must be True, False or 'rest', got 'all'"):
        hpcckpt.load(template, path, comm=comm, strict="all" if r == 0 else "rest")


def test_hdf5_files_need_a_template(tmp_path):
    h5py = pytest.importorskip("h5py")
    path = tmp_path / "in.h5"
    with h5py.File(path, "w") as f:
        f["u"] = np.arange(3.0)
    with pytest.raises(hpcckpt.CheckpointError, match="HDF5 file: loading it needs a template"):
        hpcckpt.load(None, path)
    assert np.array_equal(hpcckpt.load({"u": Block(np.zeros(3))}, path)["u"].local, np.arange(3.0))
