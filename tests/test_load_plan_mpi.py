"""The load plan across ranks (issue 20): the chunk directory of Block-only checkpoints and the allgather way
of Ragged ones give exact data on any rank count, bad templates fail on every rank, and the collectives are
counted.

Run with ``mpiexec -n N python tests/mpi_pytest.py --with-mpi -m mpi tests/test_load_plan_mpi.py`` (N = 2..4).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import hpcckpt
from hpcckpt import Block, Ragged, TemplateMismatchError
from decompositions import global_array, grid_blocks
from mpitools import CountingComm

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(120)]

COLLECTIVES = {"allgather", "gather", "bcast", "scatter", "allreduce", "exscan", "Barrier", "barrier", "alltoall",
               "Allgather", "Gather", "Bcast", "Scatter", "Allreduce", "Alltoallv", "Split", "Dup"}


@pytest.fixture
def comm():
    from mpi4py import MPI

    return MPI.COMM_WORLD


def _local(g, box):
    return np.ascontiguousarray(g[tuple(slice(a, b) for a, b in zip(*box))])


def _shared_seed(comm, k):
    return comm.bcast(int(np.random.default_rng().integers(1 << 30)) if comm.rank == 0 else None) + k


@pytest.mark.parametrize("k", range(4))
def test_random_block_reshards_both_ways_are_exact(comm, mpi_tmp, k, table_form):
    """Random uneven 3-D decompositions (empty blocks, permuted): saved on all ranks, loaded on all ranks with
    another decomposition and on one rank fewer (a sub-communicator), exact on every rank."""
    seed = _shared_seed(comm, k)
    rng = np.random.default_rng(seed)
    shape = tuple(int(x) for x in rng.integers(1, 9, size=3))
    g = global_array(shape, np.float64, seed=seed % 1000)
    saved = grid_blocks(rng, shape, comm.size)
    path = os.path.join(mpi_tmp, "ck")
    hpcckpt.save({"u": Block(_local(g, saved[comm.rank]), saved[comm.rank][0], shape)}, path, comm=comm,
                 chunk_bytes=int(rng.integers(8, 200)))
    for sub in (comm, comm.Split(0 if comm.rank < comm.size - 1 else 1, comm.rank)):
        boxes = grid_blocks(np.random.default_rng(seed + 7 + sub.size), shape, sub.size)
        if sub.size == comm.size or comm.rank < comm.size - 1:
            box = boxes[sub.rank]
            out = np.full(tuple(b - a for a, b in zip(*box)), -1.0)
            hpcckpt.load({"u": Block(out, box[0], shape)}, path, comm=sub)
            assert np.array_equal(out, _local(g, box))
        if sub is not comm:
            sub.Free()


def _saved(comm, mpi_tmp, ragged=False):
    n, r = comm.size, comm.rank
    shape = (2 * n, 3)
    state = {"u": Block(np.full((2, 3), float(r)), (2 * r, 0), shape), "v": Block(np.ones((2, 3)), (2 * r, 0), shape)}
    if ragged:
        state["p"] = Ragged(np.arange(r + 1.0))
    path = os.path.join(mpi_tmp, "ck")
    hpcckpt.save(state, path, comm=comm)
    return path, shape


@pytest.mark.parametrize("ragged", [False, True])
def test_an_overlapping_load_template_gives_every_rank_its_region(comm, mpi_tmp, ragged):
    """Both ways of planning (the chunk directory; the allgather when a Ragged table is loaded) accept blocks
    that overlap on load: reading is not ambiguous."""
    path, shape = _saved(comm, mpi_tmp, ragged)
    whole = hpcckpt.open(path).read("u") if comm.rank == 0 else None
    whole = comm.bcast(whole, root=0)
    r = comm.rank
    lo = max(2 * r - 1, 0)
    template = {"u": Block(np.full((2 * r + 2 - lo, 3), -1.0), (lo, 0), shape)}
    if ragged:
        template["p"] = Ragged()
    out = hpcckpt.load(template, path, comm=comm, strict=False)
    np.testing.assert_array_equal(out["u"].local, whole[lo:2 * r + 2])


@pytest.mark.parametrize("problem", ["gap", "outside", "names", "kinds"])
@pytest.mark.parametrize("ragged", [False, True])
def test_a_bad_load_template_fails_on_every_rank(comm, mpi_tmp, problem, ragged):
    path, shape = _saved(comm, mpi_tmp, ragged)
    n, r = comm.size, comm.rank
    victim = n - 1
    template = {"u": Block(np.zeros((2, 3)), (2 * r, 0), shape), "v": Block(np.zeros((2, 3)), (2 * r, 0), shape)}
    if ragged:
        template["p"] = Ragged()
    strict = True
    if r == victim:
        if problem == "gap":
            template["u"] = Block(np.zeros((1, 3)), (2 * r, 0), shape)
        elif problem == "outside":
            template["u"] = Block(np.zeros((2, 3)), (2 * r + 1, 0), shape)
        elif problem == "names":
            del template["v"]
            strict = False
        else:
            template["u"] = Ragged(rows=2)
    match = {"gap": "'u'.*gap", "outside": f"rank {victim}: variable 'u'.*does not fit",
             "names": "names differ between ranks.*'v'", "kinds": "'u' is a Block on some ranks and Ragged"}[problem]
    with pytest.raises(TemplateMismatchError, match=match):
        hpcckpt.load(template, path, comm=comm, strict=strict)


@pytest.mark.parametrize("ragged", [False, True])
def test_a_load_makes_four_collectives(comm, mpi_tmp, ragged, table_form):
    """bcast (metadata), two alltoalls (the chunk directory) or one allgather (Ragged: every rank's requests),
    the read's agreement; the shared parts move point to point."""
    path, shape = _saved(comm, mpi_tmp, ragged)
    r = comm.rank
    counting = CountingComm(comm)
    template = {"u": Block(np.zeros((2, 3)), (2 * r, 0), shape), "v": Block(np.zeros((2, 3)), (2 * r, 0), shape)}
    if ragged:
        template["p"] = Ragged(rows=r + 1)
    out = hpcckpt.load(template, path, comm=counting)
    calls = [c for c in counting.calls if c in COLLECTIVES]
    assert calls == (["bcast", "allgather", "allgather"] if ragged else ["bcast", "alltoall", "alltoall", "allgather"])
    assert np.array_equal(out["u"].local, np.full((2, 3), float(r)))
    if ragged:
        assert np.array_equal(out["p"].local, np.arange(r + 1.0))


def test_a_failure_inside_the_directory_fails_the_load_on_every_rank(comm, mpi_tmp, monkeypatch):
    from hpcckpt import CheckpointError, load_plan

    path, shape = _saved(comm, mpi_tmp)
    r = comm.rank
    if r == comm.size - 1:
        def broken(*args):
            raise RuntimeError("directory broke")
        monkeypatch.setattr(load_plan, "decide", broken)
    template = {"u": Block(np.zeros((2, 3)), (2 * r, 0), shape), "v": Block(np.zeros((2, 3)), (2 * r, 0), shape)}
    with pytest.raises(CheckpointError, match=f"rank {comm.size - 1}: RuntimeError: directory broke"):
        hpcckpt.load(template, path, comm=comm)
