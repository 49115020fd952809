"""AutoLossy under MPI: one choice for all ranks whatever each measured, and bad inputs fail on every rank."""

import os

import numpy as np
import pytest

import hpcckpt
from hpcckpt.codecs import AutoLossy, auto
from hpcckpt.errors import CheckpointError

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(300)]
pytest.importorskip("pysz")
pytest.importorskip("zfpy")


def smooth_rows(comm, rows=64, cols=256):
    """This rank's rows of a smooth global field (rank 1 holds none: a rank without data takes part too)."""
    counts = [0 if r == 1 else rows for r in range(comm.size)]
    start = sum(counts[:comm.rank])
    y, x = np.mgrid[start:start + counts[comm.rank], 0:cols] / 64.0
    return np.sin(x) * np.cos(y) + 0.01 * comm.rank * (counts[comm.rank] > 0), (start, 0), (sum(counts), cols)


def test_every_rank_encodes_with_rank_0s_choice_and_the_bound_holds(mpi_tmp, monkeypatch):
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    local, offset, shape = smooth_rows(comm)
    # each rank saw another write bandwidth (and its own data): the ranks alone would choose differently
    monkeypatch.setattr(auto, "write_bandwidth", lambda: 1e4 if comm.rank % 2 else 1e11)
    ck = hpcckpt.Checkpointer(mpi_tmp, comm=comm, codec=AutoLossy(abs=1e-4), track_failures=False)
    try:
        for step in range(2):
            ck.save({"u": hpcckpt.Block(local, offset, shape), "v": hpcckpt.Block(local * 3, offset, shape,
                                                                                 codec=AutoLossy(rel=1e-5))}, step)
    finally:
        ck.close()
    view = hpcckpt.open(os.path.join(mpi_tmp, "step-000000000001"))
    codecs = {name: view.variables[name].codec["id"] for name in ("u", "v")}
    assert comm.allgather(codecs) == [codecs] * comm.size
    assert codecs["u"] in {"hpcckpt.quantize", "hpcckpt.sz3", "hpcckpt.zfp"}
    assert codecs["v"] in {"hpcckpt.quantize", "hpcckpt.sz3"}  # ZFP has no relative bound
    got = {"u": np.zeros_like(local), "v": np.zeros_like(local)}
    hpcckpt.load({k: hpcckpt.Block(a, offset, shape) for k, a in got.items()}, os.path.join(mpi_tmp,
                                                                                           "step-000000000001"), comm)
    assert np.abs(got["u"] - local).max(initial=0) <= 1e-4
    full = view.read("v")
    assert np.abs(got["v"] - local * 3).max(initial=0) <= 1e-5 * (full.max() - full.min())


def test_an_asynchronous_save_after_a_layout_change_keeps_the_agreed_choice(mpi_tmp, monkeypatch):
    """A rank that plans its changed part alone (asynchronous saves) keeps the ranks' choice, and takes the
    quantizer for a variable that has none yet: the ranks never disagree, so every version commits."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    # rank 0 alone (slow storage) would pick SZ3 from its own sample; the ranks together (the mean) pick otherwise
    monkeypatch.setattr(auto, "write_bandwidth", lambda: 1e4 if comm.rank == 0 else 1e11)
    saved = {}
    with hpcckpt.Checkpointer(mpi_tmp, comm=comm, codec=AutoLossy(abs=1e-4), asynchronous=True,
                              track_failures=False, keep=None) as ck:
        for step, rows, names in ((1, 64, ("u",)), (2, 48, ("u",)), (3, 40, ("u", "w"))):
            local, offset, shape = smooth_rows(comm, rows)
            saved[step] = (local, offset, shape, names)
            ck.save({n: hpcckpt.Block(local * (1 + i), offset, shape) for i, n in enumerate(names)}, step)
            ck.wait()
        codecs = {step: {n: hpcckpt.open(os.path.join(mpi_tmp, f"step-{step:012d}")).variables[n].codec
                         for n in saved[step][3]} for step in saved}
        assert codecs[2]["u"] == codecs[3]["u"] == codecs[1]["u"]
        assert codecs[3]["w"]["id"] == "hpcckpt.quantize"
        for step, (local, offset, shape, names) in saved.items():
            got = {n: np.zeros_like(local) for n in names}
            ck.restore({n: hpcckpt.Block(a, offset, shape) for n, a in got.items()}, step=step)
            for i, n in enumerate(names):
                assert np.abs(got[n] - local * (1 + i)).max(initial=0) <= 1e-4


def test_ranks_asking_for_different_bounds_fail_together(mpi_tmp):
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    local, offset, shape = smooth_rows(comm)
    spec = AutoLossy(abs=1e-3 if comm.rank else 1e-4)
    with pytest.raises(CheckpointError, match="different codecs"):
        hpcckpt.save({"u": hpcckpt.Block(local, offset, shape, codec=spec)}, os.path.join(mpi_tmp, "c"), comm)
    assert not os.path.exists(os.path.join(mpi_tmp, "c", "metadata.json"))


def test_a_non_float_variable_fails_on_every_rank(mpi_tmp):
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    ids = np.arange(10, dtype=np.int64) + 10 * comm.rank
    with pytest.raises(CheckpointError, match="float"):
        hpcckpt.save({"ids": hpcckpt.Block(ids, (10 * comm.rank,), (10 * comm.size,))}, os.path.join(mpi_tmp, "c"),
                     comm, codec=AutoLossy(rel=1e-3))
