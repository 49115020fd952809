"""The incremental save's deduplication through the keys' owners (hpcckpt.incremental.dedup_owners), under mpiexec.

Run with ``mpiexec -n N python tests/mpi_pytest.py --with-mpi -m mpi tests/incremental/test_dedup_owners_mpi.py`` (N = 2, 3,
4): the owners' exchange is forced at these sizes (mpitools.force_dedup_exchange), and the same chain saved
through the allgather must store exactly the same chunks.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from hpcckpt import Block, Checkpointer, CheckpointError, open as open_view
from mpitools import CountingComm, force_dedup_exchange

COLS = 64  # float64: a row is 512 bytes, one block of the grid at block_bytes=512
STEPS = 4  # full (no base), incremental, full (max_chain 1, reusable blocks rewritten), incremental


@pytest.fixture
def world():
    from mpi4py import MPI

    return MPI.COMM_WORLD


def rows_of(rank: int) -> int:
    return 5 + 3 * rank  # uneven: ranks hold different numbers of blocks


def global_state(step: int, nranks: int) -> dict:
    """Rows repeat within and across ranks (``u``: 5 contents; ``v``: 3, which ``u`` has too); at each step a
    few rows everywhere get the same new content (new blocks duplicated across ranks)."""
    n = sum(rows_of(r) for r in range(nranks))
    i = np.arange(n)
    u = np.repeat((i % 5).astype(np.float64)[:, None], COLS, axis=1)
    for s in range(2, step + 1):
        u[(i * 7 + s) % 4 == 0] = 100.0 + s
    v = np.repeat((i % 3).astype(np.float64)[:, None], COLS, axis=1)
    return {"u": u, "v": v}


def local_state(step: int, comm) -> dict:
    lo = sum(rows_of(r) for r in range(comm.rank))
    hi = lo + rows_of(comm.rank)
    g = global_state(step, comm.size)
    return {name: Block(a[lo:hi].copy(), (lo, 0), a.shape) for name, a in g.items()}


def contents(step: int, nranks: int) -> list[bytes]:
    """Every block of a step, in the order ranks write them (rank, then variable, then row)."""
    out = []
    g = global_state(step, nranks)
    lo = 0
    for r in range(nranks):
        for name in sorted(g):
            out += [row.tobytes() for row in g[name][lo:lo + rows_of(r)]]
        lo += rows_of(r)
    return out


def chunk_rows(path: str) -> dict:
    with open(os.path.join(path, "metadata.json"), "rb") as f:
        meta = json.loads(f.read())
    return {name: v["chunks"] for name, v in meta["variables"].items()}


def save_chain(root: str, comm, monkeypatch) -> list:
    """Save STEPS versions; returns ``[(result, the collectives of its select stage)]``."""
    from hpcckpt.saving import pipeline as save_pipeline

    counting = CountingComm(comm)
    select = save_pipeline.select_changed

    def marked(*args, **kwargs):  # the calls between the marks are the select stage's
        counting.calls.append("<select")
        try:
            return select(*args, **kwargs)
        finally:
            counting.calls.append("select>")

    monkeypatch.setattr(save_pipeline, "select_changed", marked)
    out = []
    with Checkpointer(root, comm=counting, keep=None, incremental=True, block_bytes=512, max_chain=1,
                      full_threshold=0.9, strategy="file-per-rank", track_failures=False,
                      handle_signals=False) as ck:
        for step in range(1, STEPS + 1):
            counting.calls.clear()
            result = ck.save(local_state(step, comm), step)
            calls = counting.calls
            out.append((result, calls[calls.index("<select") + 1:calls.index("select>")]))
    return out


def serial_restore_problems(root: str, nranks: int, paths: list) -> list:
    """One process restores every version of ``root`` (saved by ``nranks``) and verifies it: what differs."""
    from mpi4py import MPI

    problems = []
    with Checkpointer(root, comm=MPI.COMM_SELF, track_failures=False, handle_signals=False) as ck:
        for step, path in enumerate(paths, 1):
            g = global_state(step, nranks)
            target = {name: Block(np.zeros_like(a), (0, 0), a.shape) for name, a in g.items()}
            ck.restore(target, step=step)
            problems += [(step, name) for name in g if not np.array_equal(target[name].local, g[name])]
            with open_view(path) as view:
                problems += [(step, p) for p in view.verify()]
    return problems


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(180)
def test_owners_store_what_the_allgather_stores_and_every_version_restores_on_other_rank_counts(
        world, mpi_tmp, monkeypatch):
    from mpi4py import MPI

    saved = {}
    for exchange in ("allgather", "owners"):
        force_dedup_exchange(monkeypatch, exchange)
        saved[exchange] = save_chain(os.path.join(mpi_tmp, exchange), world, monkeypatch)
    block = COLS * 8
    previous: set = set()
    for step, ((by_all, calls_all), (by_owners, calls_owners)) in enumerate(zip(saved["allgather"],
                                                                                 saved["owners"]), 1):
        now = contents(step, world.size)
        kind = "full" if step % 2 else "incremental"
        assert by_owners.kind == by_all.kind == kind, (step, by_owners.kind, by_all.kind)
        candidates = now if kind == "full" else [c for c in now if c not in previous]
        for info in (by_all.incremental, by_owners.incremental):
            assert info["written_bytes"] == block * len(set(candidates)), (step, info)  # each content once
            assert info["deduplicated_bytes"] == block * (len(candidates) - len(set(candidates))) > 0, (step, info)
        # the select stage: one allgather (two for the full version with reusable blocks) against two alltoalls
        assert calls_owners == ["alltoall", "alltoall"], (step, calls_owners)
        assert calls_all == ["allgather"] * (2 if step == 3 else 1), (step, calls_all)
        same = chunk_rows(by_owners.path) == chunk_rows(by_all.path) if world.rank == 0 else None
        assert world.bcast(same), step  # the same chunks, in the same files at the same offsets
        previous = set(now)
    root = os.path.join(mpi_tmp, "owners")
    problems = serial_restore_problems(root, world.size, [r.path for r, _ in saved["owners"]]) \
        if world.rank == 0 else None
    assert world.bcast(problems) == []  # every rank fails alike, none waits in the Split below
    sub = world.Split(0 if world.rank < world.size - 1 else MPI.UNDEFINED, world.rank)
    wrong = []
    if sub != MPI.COMM_NULL:  # one rank fewer, an even split of the rows
        with Checkpointer(root, comm=sub, track_failures=False, handle_signals=False) as ck:
            for step in range(1, STEPS + 1):
                g = global_state(step, world.size)
                n = len(g["u"])
                lo, hi = n * sub.rank // sub.size, n * (sub.rank + 1) // sub.size
                target = {name: Block(np.zeros((hi - lo, COLS)), (lo, 0), a.shape) for name, a in g.items()}
                ck.restore(target, step=step)
                wrong += [(step, name) for name in g if not np.array_equal(target[name].local, g[name][lo:hi])]
        sub.Free()
    assert world.allgather(wrong) == [[]] * world.size


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(120)
def test_a_rank_whose_hashing_fails_is_the_same_error_on_every_rank_and_nothing_is_committed(
        world, mpi_tmp, monkeypatch, dedup_exchange):
    from hpcckpt.saving import selection

    root = os.path.join(mpi_tmp, "root")
    with Checkpointer(root, comm=world, keep=None, incremental=True, block_bytes=512, strategy="file-per-rank",
                      track_failures=False, handle_signals=False) as ck:
        ck.save(local_state(1, world), 1)
        if world.rank == 1:
            def broken(*args, **kwargs):
                raise OSError("the device vanished while hashing")
            monkeypatch.setattr(selection, "hash_pieces", broken)
        with pytest.raises(CheckpointError) as err:
            ck.save(local_state(2, world), 2)
        assert "rank 1: OSError: the device vanished while hashing" in str(err.value)
        assert ck.steps() == [1]
        monkeypatch.undo()
        force_dedup_exchange(monkeypatch, dedup_exchange)
        result = ck.save(local_state(3, world), 3)
        assert result.kind == "incremental" and ck.steps() == [1, 3]
