"""The blocking save's plan cache: a repeated file-per-rank save makes two collectives (planned locally, checked at
the commit), one whose plan is agreed first three, and any change of layout replans or is
reconciled at the commit and still restores exactly."""

from __future__ import annotations

import numpy as np
import pytest

from hpcckpt import Block, Checkpointer, Ragged
from mpitools import CountingComm

COLLECTIVES = {"allgather", "gather", "bcast", "scatter", "allreduce", "exscan", "Scan", "Barrier", "barrier", "alltoall",
               "Allgather", "Gather", "Bcast", "Scatter", "Allreduce", "Alltoallv", "send", "recv", "Send", "Recv",
               "sendrecv", "Sendrecv", "Split", "Dup"}


@pytest.fixture
def world():
    from mpi4py import MPI

    return MPI.COMM_WORLD


def _state(comm, n=2000, k=0.0, rows=3):
    local = np.arange(n, dtype=np.float64) + comm.rank * n + k
    return {"u": Block(local, offset=(comm.rank * n,), global_shape=(comm.size * n,)),
            "p": Ragged(np.full(rows + comm.rank, comm.rank, np.int64)), "t": k}


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(120)
def test_a_repeated_blocking_save_makes_two_collectives(world, mpi_tmp):
    comm = CountingComm(world)
    with Checkpointer(f"{mpi_tmp}/root", comm=comm, strategy="file-per-rank", track_failures=False) as ck:
        comm.calls.clear()
        ck.save(_state(world), 1)  # the lock's allgather, a plan at once, the commit
        assert [c for c in comm.calls if c in COLLECTIVES] == ["allgather", "gather", "bcast", "scatter", "gather",
                                                               "bcast"]
        counts = []
        for step in (2, 3, 4):
            comm.calls.clear()
            ck.save(_state(world, k=step), step)
            counts.append([c for c in comm.calls if c in COLLECTIVES])
        assert counts == [["gather", "bcast"]] * 3, counts
        target = _state(world, k=-1)
        out = ck.restore(target)
    assert out["t"] == 4 and np.array_equal(target["u"].local, _state(world, k=4)["u"].local)


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(120)
def test_a_changed_layout_replans_and_restores_exactly(world, mpi_tmp):
    with Checkpointer(f"{mpi_tmp}/root", comm=world, track_failures=False, keep=None) as ck:
        ck.save(_state(world), 1)
        ck.save(_state(world, k=2, rows=5), 2)  # Ragged rows changed on every rank
        ck.save(_state(world, k=3, rows=5, n=1500), 3)  # the Block's extent changed
        ck.save(_state(world, k=4, rows=5, n=1500), 4)  # unchanged again: the cache
        for step, n, rows in ((2, 2000, 5), (3, 1500, 5), (4, 1500, 5)):
            target = _state(world, k=-1, n=n, rows=rows)
            out = ck.restore(target, step=step)
            want = _state(world, k=step, n=n, rows=rows)
            assert np.array_equal(target["u"].local, want["u"].local)
            parts = np.concatenate(world.allgather(out["p"].local))
            assert parts.tolist() == sorted(sum(([r] * (rows + r) for r in range(world.size)), []))


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(120)
def test_a_failure_after_a_cached_plan_is_agreed_and_the_next_save_replans(world, mpi_tmp):
    from hpcckpt import CheckpointError

    with Checkpointer(f"{mpi_tmp}/root", comm=world, track_failures=False) as ck:
        ck.save(_state(world), 1)
        bad = _state(world, k=2)
        if world.rank == 1:
            bad["u"] = Block(np.zeros(3), offset=(0,), global_shape=(world.size * 2000,))  # overlaps rank 0
        with pytest.raises(CheckpointError):
            ck.save(bad, 2)
        ck.save(_state(world, k=3), 3)
        assert ck.steps() == [1, 3]


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_repeated_incremental_save_plans_from_the_cache(world, mpi_tmp, asynchronous):
    """Incremental saves share the plan cache: the plan's allreduce, the select stage's allgather, the commit's
    gather + bcast; the base's block index is never shipped again (every rank holds it from the commit)."""
    comm = CountingComm(world)
    with Checkpointer(f"{mpi_tmp}/root", comm=comm, strategy="file-per-rank", track_failures=False,
                      incremental=True, block_bytes=4096, asynchronous=asynchronous) as ck:
        ck.save(_state(world), 1)
        ck.wait()
        counts = []
        for step in (2, 3):
            comm.calls.clear()
            state = _state(world)
            state["u"].local[7] = step  # one block changes
            ck.save(state, step)
            ck.wait()
            counts.append([c for c in comm.calls if c in COLLECTIVES])
            assert ck.last_result.kind == "incremental" and ck.last_result.bytes_written <= 4096 * world.size
        assert all(c == ["allreduce", "allgather", "gather", "bcast"] for c in counts), counts
        target = _state(world, k=-1)
        ck.restore(target)
    want = _state(world)["u"].local
    want[7] = 3
    assert np.array_equal(target["u"].local, want)


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(120)
def test_a_layout_that_keeps_changing_is_reconciled_at_the_commit(world, mpi_tmp):
    """A file-per-rank save whose Ragged rows change on every rank: each rank plans its own part, rank 0 reconciles
    the row offsets at the commit; two collectives every time, and every version restores exactly."""
    comm = CountingComm(world)
    with Checkpointer(f"{mpi_tmp}/root", comm=comm, strategy="file-per-rank", track_failures=False,
                      keep=None) as ck:
        counts = []
        for step, (rows, n) in enumerate(((3, 2000), (4, 2000), (5, 1500), (6, 1500), (6, 1500))):
            comm.calls.clear()
            ck.save(_state(world, k=step, rows=rows, n=n), step)
            counts.append([c for c in comm.calls if c in COLLECTIVES])
        assert counts[1:] == [["gather", "bcast"]] * 4, counts
        for step, (rows, n) in enumerate(((3, 2000), (4, 2000), (5, 1500), (6, 1500), (6, 1500))):
            target = _state(world, k=-1, rows=rows, n=n)
            out = ck.restore(target, step=step)
            assert out["t"] == step and np.array_equal(target["u"].local, _state(world, k=step, n=n)["u"].local)
            parts = np.concatenate(world.allgather(out["p"].local))
            assert parts.tolist() == sorted(sum(([r] * (rows + r) for r in range(world.size)), []))


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(120)
def test_a_layout_that_keeps_changing_is_planned_at_once(world, mpi_tmp):
    """A plan agreed before the data move (here: the aggregated strategy, whose ranks write through aggregators):
    after one miss, saves plan without asking the cache first (gather, bcast, scatter); when the layout settles,
    the cache is checked again and a repeated save is back to three collectives."""
    PLANNING = {"allgather", "gather", "bcast", "scatter", "allreduce"}
    comm = CountingComm(world)
    with Checkpointer(f"{mpi_tmp}/root", comm=comm, strategy="aggregated", track_failures=False) as ck:
        counts = []
        for step, rows in enumerate((3, 4, 5, 6, 6, 6)):
            comm.calls.clear()
            ck.save(_state(world, k=step, rows=rows), step)
            counts.append([c for c in comm.calls if c in PLANNING])  # the transport's own messages aside
        commit = ["gather", "bcast"]
        assert counts[1] == ["allreduce", "gather", "bcast", "scatter"] + commit, counts  # expected a hit: missed
        assert counts[2] == counts[3] == ["gather", "bcast", "scatter"] + commit, counts  # planned at once
        assert counts[4] == ["gather", "bcast", "scatter"] + commit, counts  # unchanged: check the cache next
        assert counts[5] == ["allreduce"] + commit, counts
        target = _state(world, k=-1, rows=6)
        out = ck.restore(target)
    assert out["t"] == 5 and np.array_equal(target["u"].local, _state(world, k=5, rows=6)["u"].local)


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("reshard", [False, True])
@pytest.mark.parametrize("ragged", [False, True])
def test_a_load_makes_at_most_three_collectives(world, mpi_tmp, reshard, ragged):
    """hpcckpt.load and Checkpointer.restore: the metadata (on a few ranks each rank reads it; a restore first
    gets the version listing in rank 0's broadcast), then with a Ragged table after per-rank metadata one
    alltoall of the checked template's requests (a rank that could not read the metadata sends its failure in
    it) and the agreement after the reads; otherwise the chunk directory's two alltoalls (the reads come before
    them; with a Ragged table after one Scan that places every rank's rows), the second one only when some rank
    needs a part of a chunk another rank reads (a reshard of the Block; the Ragged rows split evenly across
    the saved ones); the parts of chunks read by another rank come point to point.  Reshard: the Block is split
    another way than it was saved."""
    from hpcckpt import load

    with Checkpointer(f"{mpi_tmp}/root", comm=world, strategy="file-per-rank", track_failures=False) as ck:
        saved = _state(world, k=7)
        if not ragged:  # a checkpoint of Blocks alone
            saved.pop("p")
        ck.save(saved, 1)
        path = ck.last_result.path
    n, size = 2000, world.size
    lo, hi = (world.rank * n + (n // 2 if reshard and world.rank else 0),
              (world.rank + 1) * n + (n // 2 if reshard and world.rank < size - 1 else 0))
    want = np.arange(size * n, dtype=np.float64) + 7
    comm = CountingComm(world)
    for restore in (False, True):
        target = np.zeros(hi - lo)
        state = {"u": Block(target, offset=(lo,), global_shape=(size * n,)), "p": Ragged(), "t": 0.0}
        if not ragged:
            state.pop("p")
        if restore:
            with Checkpointer(f"{mpi_tmp}/root", comm=comm, track_failures=False) as ck:
                comm.calls.clear()  # from the restore on (the constructor agrees on its options)
                out = ck.restore(state)
                calls = [c for c in comm.calls if c in COLLECTIVES]
        else:
            comm.calls.clear()
            out = load(state, path, comm=comm)
            calls = [c for c in comm.calls if c in COLLECTIVES]
        metadata = ["bcast"] if restore else []  # a load on a few ranks: each rank reads the metadata itself
        saved_rows = np.cumsum([3 + q for q in range(size)]).tolist()  # the table's saved chunk boundaries
        split_on_saved = all(saved_rows[-1] * q // size in [0] + saved_rows for q in range(size))
        if ragged:  # restore too: on a few ranks it reads the metadata on each rank, as a load does
            plan = ["alltoall", "allgather"]
        else:
            plan = (["Scan"] if ragged else []) + (
                ["alltoall", "alltoall"] if reshard or (ragged and not split_on_saved) else ["alltoall"])
        assert calls == metadata + plan, calls
        assert out["t"] == 7 and np.array_equal(target, want[lo:hi])
        if ragged:
            rows = np.concatenate(world.allgather(out["p"].local))
            assert np.array_equal(rows, np.concatenate([np.full(3 + r, r, np.int64) for r in range(size)]))


def _versions(world, root) -> list:
    """Every version directory under ``root``, committed or not (a leftover would show here), as rank 0 lists it
    once every rank is done (the same answer on every rank: an assertion fails everywhere, no rank hangs)."""
    import os

    world.Barrier()
    return world.bcast(sorted(p for p in os.listdir(root) if p.startswith("step-")) if world.rank == 0 else None)


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["overlap", "disk full", "write error", "step"])
def test_a_failing_save_checked_at_the_commit_fails_on_every_rank_and_loses_nothing(world, mpi_tmp, monkeypatch,
                                                                                   how):
    """A save planned locally (file-per-rank, cached plan) that fails on one rank: a Block that now overlaps rank
    0's (its layout changed and does not reconcile), a full disk, a failure in the middle of the write, a step of
    its own.  Every rank raises the same CheckpointError, no directory of the failed version is left, the earlier
    versions restore exactly, and the next save plans collectively and commits."""
    import errno

    from hpcckpt import CheckpointError
    from hpcckpt.transport import file_per_rank

    odd = world.size - 1
    root = f"{mpi_tmp}/root"
    comm = CountingComm(world)
    with Checkpointer(root, comm=comm, strategy="file-per-rank", track_failures=False, keep=None) as ck:
        ck.save(_state(world), 1)
        ck.save(_state(world, k=2), 2)
        state, step = _state(world, k=3), 3
        if world.rank == odd:
            if how == "overlap":
                state["u"] = Block(np.zeros(3), offset=(0,), global_shape=(world.size * 2000,))
            elif how == "disk full":
                monkeypatch.setattr(file_per_rank.os, "fsync",
                                    lambda fd: (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space left on device")))
            elif how == "write error":
                monkeypatch.setattr(file_per_rank, "store_piece",
                                    lambda *a: (_ for _ in ()).throw(RuntimeError("the codec broke")))
            else:
                step = 4
        comm.calls.clear()
        with pytest.raises(CheckpointError) as info:
            ck.save(state, step)
        monkeypatch.undo()
        texts = world.allgather(str(info.value).partition(" failed")[2])
        assert len(set(texts)) == 1, texts
        assert f"rank {odd}" in texts[0] or how in ("overlap", "step"), texts[0]
        if how != "overlap":  # the others were caught at the commit's gather: no collective beyond it
            assert [c for c in comm.calls if c in COLLECTIVES] == ["gather", "bcast"], comm.calls
        assert _versions(world, root) == ["step-000000000001", "step-000000000002"]
        assert ck.steps() == [1, 2]
        target = _state(world, k=-1)
        assert ck.restore(target)["t"] == 2 and np.array_equal(target["u"].local, _state(world, k=2)["u"].local)
        comm.calls.clear()
        ck.save(_state(world, k=5), 5)  # plans collectively again (the first after a failure), then commits
        assert [c for c in comm.calls if c in COLLECTIVES][:3] == ["gather", "bcast", "scatter"], comm.calls
        assert ck.steps() == [1, 2, 5]
    assert _versions(world, root) == ["step-000000000001", "step-000000000002", "step-000000000005"]


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("other", [{"incremental": True, "block_bytes": 4096}, {"chunk_bytes": 4096}])
def test_other_options_on_every_rank_plan_collectively_after_all(world, mpi_tmp, other):
    """The ranks ask for another kind of save than the one whose plan is cached: nobody writes, the commit's
    gather finds out, and every rank plans collectively after all; the version is committed once and exact."""
    root = f"{mpi_tmp}/root"
    comm = CountingComm(world)
    with Checkpointer(root, comm=comm, strategy="file-per-rank", track_failures=False, keep=None) as ck:
        ck.save(_state(world), 1)
        comm.calls.clear()
        ck.save(_state(world, k=2), 2, **other)
        calls = [c for c in comm.calls if c in COLLECTIVES]
        assert calls[:2] == ["gather", "bcast"] and len(calls) > 4, calls  # then the agreed save
        assert (ck.last_result.incremental is not None) == ("incremental" in other)  # the save asked for
        assert _versions(world, root) == ["step-000000000001", "step-000000000002"]
        target = _state(world, k=-1)
        assert ck.restore(target)["t"] == 2 and np.array_equal(target["u"].local, _state(world, k=2)["u"].local)


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(120)
def test_retention_leaves_the_next_save_alone_that_other_ranks_have_started(world, mpi_tmp, monkeypatch):
    """Rank 0 applies retention after the commit's bcast, while the other ranks may already write the next save
    (planned locally: they create its directory): retention must not take that directory for a leftover."""
    import time

    from hpcckpt.saving import run

    real = run.list_versions
    if world.rank == 0:  # a slow listing of the root by retention and by the plan stage
        monkeypatch.setattr(run, "list_versions", lambda root, *rest: (time.sleep(0.3), real(root, *rest))[1])
    root = f"{mpi_tmp}/root"
    with Checkpointer(root, comm=world, strategy="file-per-rank", track_failures=False, keep=2) as ck:
        for step in range(1, 6):
            ck.save(_state(world, k=step), step)
        assert ck.steps() == [4, 5]
        target = _state(world, k=-1)
        assert ck.restore(target)["t"] == 5 and np.array_equal(target["u"].local, _state(world, k=5)["u"].local)
    assert _versions(world, root) == ["step-000000000004", "step-000000000005"]
