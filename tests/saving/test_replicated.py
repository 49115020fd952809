"""Blocks replicated over part of the process grid, overlapping load templates, messages that name where.

Under mpiexec (marker mpi): a Veros-like accumulator decomposed in y and
identical on every x-rank, an array every rank holds whole and a plain Block,
saved by blocking, incremental and asynchronous Checkpointers and restored
exactly; copies that differ are the same CheckpointError on every rank,
naming the variable, two ranks and the region, and nothing is committed.
Serially: the errors of undeclared overlaps, 0-d Blocks and declarations that
differ between ranks, through hpcckpt.core.planning.plan_save (pure).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import hpcckpt
from hpcckpt import Block, Checkpointer, CheckpointError, TemplateMismatchError
from hypothesis import given, settings
from hypothesis import strategies as st

from decompositions import decompositions
from hpcckpt.core.planning import plan_save
from hpcckpt.core.regions import intersect, tiling_problem
from hpcckpt.state import summarize_for_save

MODES = {"blocking": {}, "incremental": {"incremental": True, "block_bytes": 64},
         "asynchronous": {"asynchronous": True},
         "levels": {"asynchronous": True, "incremental": True, "block_bytes": 64, "local_dir": "node-local"}}


def checkpointer(comm, tmp: str, mode: str) -> Checkpointer:
    opts = dict(MODES[mode])
    if "local_dir" in opts:
        opts["local_dir"] = os.path.join(tmp, mode + "-" + opts["local_dir"])
    return Checkpointer(os.path.join(tmp, mode), comm=comm, track_failures=False, **opts)


def grid(n: int, r: int) -> tuple[int, int, int]:
    """``(y-ranks, this rank's y index, x index)``: ranks ``y + ny * x``; an odd count has one y-rank."""
    ny = n // 2 if n % 2 == 0 else 1
    return ny, r % ny, r // ny


def state_of(n: int, r: int, step: int, acc_shape=(9, 4), whole_shape=(5,)):
    """The accumulator (rows split over the y-ranks, whole rows on every x-rank), an array every rank holds
    whole, and a plain Block of rows split over every rank; data set by ``step``."""
    ny, y, _ = grid(n, r)
    a0, a1 = y * acc_shape[0] // ny, (y + 1) * acc_shape[0] // ny
    acc = (np.arange(np.prod(acc_shape), dtype=np.float64).reshape(acc_shape) + 1000 * step)[a0:a1]
    whole = np.arange(np.prod(whole_shape), dtype=np.int32).reshape(whole_shape) * (step + 1)
    u0, u1 = r * 7 // n, (r + 1) * 7 // n
    u = np.arange(7 * 3, dtype=np.float32).reshape(7, 3)[u0:u1] - step
    return {"acc": Block(acc.copy(), (a0, 0), acc_shape, replicated=True),
            "whole": Block(whole, (0,), whole_shape, replicated=True),
            "u": Block(u.copy(), (u0, 0), (7, 3)), "step": step}


def expected(step: int) -> dict:
    return {"acc": np.arange(36, dtype=np.float64).reshape(9, 4) + 1000 * step,
            "whole": np.arange(5, dtype=np.int32) * (step + 1),
            "u": np.arange(21, dtype=np.float32).reshape(7, 3) - step}


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(240)
@pytest.mark.parametrize("mode", sorted(MODES))
def test_replicated_blocks_saved_once_and_restored_exactly(mpi_tmp, mode):
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    n, r = comm.size, comm.rank
    root = os.path.join(mpi_tmp, mode)
    with checkpointer(comm, mpi_tmp, mode) as ck:
        for step in (1, 2, 3):  # a repeated save reuses the plan (the cached owned parts) and its check
            ck.save(state_of(n, r, step), step)
        ck.wait()
        assert ck.steps() == [1, 2, 3]
        # restored on another decomposition: every rank asks for all of acc (overlapping templates), its
        # reversed share of u, and whole
        acc, whole = np.zeros((9, 4)), np.zeros(5, np.int32)
        q = n - 1 - r
        u = np.zeros(((q + 1) * 7 // n - q * 7 // n, 3), np.float32)
        got = ck.restore({"acc": Block(acc, (0, 0), (9, 4)), "whole": Block(whole, (0,), (5,)),
                          "u": Block(u, (q * 7 // n, 0), (7, 3)), "step": None})
    want = expected(3)
    assert got["step"] == 3 and np.array_equal(acc, want["acc"]) and np.array_equal(whole, want["whole"])
    assert np.array_equal(u, want["u"][q * 7 // n:(q + 1) * 7 // n])
    if r == 0:  # each element stored once: the chunks tile the global array (the normal on-disk form)
        with hpcckpt.open(root) as view:  # the newest version on the root (with levels: the last one flushed)
            assert view.verify() == []
            stored = expected(view.step)
            for name in ("acc", "whole", "u"):
                chunks = view.variables[name].chunks
                extents = np.asarray(chunks.stop) - np.asarray(chunks.start)
                assert int(np.prod(extents, axis=1).sum()) == stored[name].size, name
                assert np.array_equal(np.asarray(view[name]), stored[name])


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(240)
@pytest.mark.parametrize("mode", sorted(MODES))
def test_copies_that_differ_fail_on_every_rank_and_commit_nothing(mpi_tmp, mode):
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    n, r = comm.size, comm.rank
    with checkpointer(comm, mpi_tmp, mode) as ck:
        ck.save(state_of(n, r, 1), 1)
        ck.wait()
        bad = state_of(n, r, 2)
        if r == n - 1:
            bad["whole"].local[3] += 1  # the last rank's copy of the array every rank holds whole
        with pytest.raises(CheckpointError) as err:
            ck.save(bad, 2)
            ck.wait()  # an asynchronous save fails at its commit
        text = str(err.value)
        assert "replicated Block 'whole' differs between rank 0 and rank" in text and "[0:5]" in text, text
        assert f"rank {n - 1}" in text, text
        assert ck.steps() == [1]
        ck.save(state_of(n, r, 3), 3)  # the next save plans and commits as usual
        ck.wait()
        assert ck.steps() == [1, 3]


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(120)
def test_undeclared_overlap_fails_on_every_rank_naming_replicated(mpi_tmp):
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    with pytest.raises(TemplateMismatchError, match=r"'g'.*rank 0 \[0:4\] and the block of rank 1 \[0:4\] overlap"
                                                    r".*replicated=True"):
        hpcckpt.save({"g": Block(np.zeros(4))}, os.path.join(mpi_tmp, "ck"), comm=comm)
    with pytest.raises(TemplateMismatchError, match=r"'s' is a 0-d Block, which is the whole array"):
        hpcckpt.save({"s": Block(np.array(1.5))}, os.path.join(mpi_tmp, "ck"), comm=comm)
    out = os.path.join(mpi_tmp, "zero-d")
    hpcckpt.save({"s": Block(np.array(1.5), replicated=True)}, out, comm=comm)
    got = hpcckpt.load({"s": Block(np.zeros(()))}, out, comm=comm)  # a 0-d template on every rank: overlapping
    assert float(got["s"].local) == 1.5


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(120)
def test_overlapping_load_templates_give_every_rank_its_region(mpi_tmp):
    """Rows [r, r + 3) of a 2-D array on every rank (neighbours overlap), from a slab decomposition; chunks shared."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    n, r = comm.size, comm.rank
    shape = (n + 2, 5)
    g = np.arange(np.prod(shape), dtype=np.int64).reshape(shape)
    lo, hi = r * shape[0] // n, (r + 1) * shape[0] // n
    path = os.path.join(mpi_tmp, "ck")
    hpcckpt.save({"g": Block(g[lo:hi].copy(), (lo, 0), shape)}, path, comm=comm, chunk_bytes=40)
    window = np.zeros((3, 5), np.int64)
    hpcckpt.load({"g": Block(window, (r, 0), shape)}, path, comm=comm)
    assert np.array_equal(window, g[r:r + 3])
    if n > 2:  # rows n+1 in no template: the gap named in global indices
        with pytest.raises(TemplateMismatchError, match=rf"gap at \[{n + 1}:{n + 2}, 0:5\]"):
            hpcckpt.load({"g": Block(np.zeros((2, 5), np.int64), (min(r, n - 1), 0), shape)}, path, comm=comm)


def summaries(blocks: list, name: str = "x") -> list:
    return [{name: summarize_for_save(name, b)} for b in blocks]


def test_gap_names_the_missing_region():
    blocks = [Block(np.zeros((2, 4)), (0, 0), (4, 4)), Block(np.zeros((1, 4)), (3, 0), (4, 4))]
    with pytest.raises(TemplateMismatchError, match=r"'x': blocks do not tile.*cover 12 of 16 elements: "
                                                    r"there is a gap at \[2:3, 0:4\], which is in none of them"):
        plan_save(summaries(blocks))


def test_replicated_declared_on_some_ranks_only_is_named():
    blocks = [Block(np.zeros(3), (0,), (3,), replicated=True), Block(np.zeros(3), (0,), (3,))]
    with pytest.raises(TemplateMismatchError, match=r"declared Block\(\.\.\., replicated=True\) on rank 0 but not "
                                                    "on rank 1"):
        plan_save(summaries(blocks))


def test_replicated_with_a_gap_is_named_too():
    blocks = [Block(np.zeros(3), (0,), (8,), replicated=True), Block(np.zeros(3), (0,), (8,), replicated=True),
              Block(np.zeros(2), (6,), (8,), replicated=True)]
    with pytest.raises(TemplateMismatchError, match=r"cover 5 of 8 elements: there is a gap at \[3:6\]"):
        plan_save(summaries(blocks))


@settings(max_examples=100, deadline=None)
@given(decompositions(max_ndim=2, max_side=5), st.data())
def test_owned_parts_of_a_replicated_decomposition_tile_the_array(dec, data):
    """Any tiling with some blocks repeated on further ranks (and empty ranks): the owned parts tile it."""
    shape, boxes = dec
    extra = data.draw(st.lists(st.sampled_from(boxes), max_size=4))
    order = data.draw(st.permutations(boxes + extra))
    blocks = [Block(np.zeros(tuple(b - a for a, b in zip(*box))), box[0], shape, replicated=True) for box in order]
    _, boxes_out, replicas = plan_save(summaries(blocks))
    parts = [p for rep in replicas for p in rep["x"][0]]
    starts = np.asarray([p[0] for p in parts], np.int64).reshape(len(parts), len(shape))
    stops = np.asarray([p[1] for p in parts], np.int64).reshape(len(parts), len(shape))
    assert tiling_problem(starts, stops, shape) is None
    for rank, rep in enumerate(replicas):  # a rank owns a part only if no lower rank holds it
        for p in rep["x"][0]:
            assert all(intersect(*p, *boxes_out[q]["x"]) is None for q in range(rank))


def test_plan_of_replicated_blocks_owner_is_the_lowest_rank():
    # rank 0 rows 0:2, ranks 1 and 2 rows 1:4 (overlapping rank 0 in row 1), rank 3 nothing
    blocks = [Block(np.zeros((2, 2)), (0, 0), (4, 2), replicated=True),
              Block(np.zeros((3, 2)), (1, 0), (4, 2), replicated=True),
              Block(np.zeros((3, 2)), (1, 0), (4, 2), replicated=True),
              Block(np.zeros((0, 2)), (0, 0), (4, 2), replicated=True)]
    variables, boxes, replicas = plan_save(summaries(blocks))
    assert variables["x"].replicated
    assert [rep["x"][0] for rep in replicas] == [[((0, 0), (2, 2))], [((2, 0), (4, 2))], [], []]
    assert replicas[0]["x"][1] == [((1, 0), (2, 2))]
    assert replicas[1]["x"][1] == replicas[2]["x"][1] == [((1, 0), (2, 2)), ((2, 0), (4, 2))]
    assert replicas[3]["x"][1] == []
    assert "y" not in replicas[0] and boxes[1]["x"] == ((1, 0), (4, 2))


def test_replica_digests_agree_between_host_and_device_copies(monkeypatch):
    """A rank holding its copy on a GPU and one holding it on the host hash equal data alike (pieces go to the host)."""
    import fakecupy

    from hpcckpt.saving.selection import region_digest, select_full

    cupy = fakecupy.install(monkeypatch)
    host = np.arange(60.0).reshape(6, 10)
    device = cupy.asarray(host)
    assert region_digest(device[1:5, 2:9]) == region_digest(host[1:5, 2:9])  # strided views, both
    assert region_digest(host[1:5, 2:9]) != region_digest(host[1:5, 2:8])
    changed = host.copy()
    changed[2, 3] += 1
    assert region_digest(changed) != region_digest(host)
    # the select stage of a rank that owns rows 2:6 of its block [0:6) and shares rows 0:6 with another
    replicas = {"x": ([((2, 0), (6, 10))], [((0, 0), (2, 10)), ((2, 0), (6, 10))])}
    sel = select_full({"x": device}, {"x": (0, 0)}, replicas)
    assert [(i[0], i[1], i[2].shape) for i in sel.items] == [("x", (2, 0), (4, 10))]
    assert sel.replicas == {("x", (0, 0), (2, 10)): region_digest(host[:2]),
                            ("x", (2, 0), (6, 10)): region_digest(host[2:])}


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(120)
def test_asynchronous_save_that_adds_overlapping_replicated_blocks_fails_once(mpi_tmp):
    """Planned without a collective (the cached plan had no replicated Block): refused at the commit, then agreed."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    n, r = comm.size, comm.rank
    with checkpointer(comm, mpi_tmp, "asynchronous") as ck:
        plain = state_of(n, r, 1)
        del plain["acc"], plain["whole"]
        ck.save(plain, 1)
        ck.wait()
        with pytest.raises(CheckpointError, match="variable 'acc': the replicated Blocks changed their layout in an "
                                                  "asynchronous save"):
            ck.save(state_of(n, r, 2), 2)
            ck.wait()
        ck.save(state_of(n, r, 3), 3)
        ck.wait()
        assert ck.steps() == [1, 3]
        got = ck.restore({"whole": Block(np.zeros(5, np.int32), (0,), (5,)), "acc": Block(np.zeros((9, 4))),
                          "u": Block(np.zeros((7, 3), np.float32)) if r == 0 else
                          Block(np.zeros((0, 3), np.float32), (7, 0), (7, 3)), "step": None})
    assert np.array_equal(got["whole"].local, expected(3)["whole"]) and np.array_equal(got["acc"].local,
                                                                                       expected(3)["acc"])


def test_replica_mismatch_names_the_variable_the_region_and_two_ranks():
    from hpcckpt.mpi.agreement import HASH_FAILED, replica_mismatch

    key = ("acc", (0, 2), (4, 6))
    assert replica_mismatch([{key: "d1"}, None, {key: "d1"}]) is None
    error = replica_mismatch([{key: "d1"}, {}, {key: "d1"}, {key: "d2"}])
    assert "the replicated Block 'acc' differs between rank 0 and rank 3 in [0:4, 2:6]" in str(error)
    failed = replica_mismatch([{key: "d1"}, {key: f"{HASH_FAILED}MemoryError: no room"}])
    assert "rank 1 could not hash its copy of the replicated Block 'acc': MemoryError: no room" in str(failed)
