"""SaveResult means the same for every kind of save: global bytes, the slowest rank's phases,
full or incremental, the levels reached, and pending for an asynchronous save until it commits."""

from __future__ import annotations

import os

import numpy as np
import pytest

import hpcckpt
from hpcckpt import Block, Checkpointer
from testpaths import REPO

ROOT_DIR = REPO


def _state(n=4096, k=0.0):
    return {"a": Block(np.arange(n, dtype=np.float64) + k), "t": k}


def _stored_phases(path):
    with hpcckpt.open(path) as view:
        return view.meta.extra["stats"]["phases"]


def test_blocking_full_save(tmp_path):
    res = hpcckpt.save(_state(), tmp_path / "v", chunk_bytes=8192)
    assert (res.kind, res.levels, res.pending, res.incremental) == ("full", ("root",), False, None)
    assert res.bytes_written == 4096 * 8 and res.nchunks == 4
    phases = _stored_phases(tmp_path / "v")
    assert {p: max(v) for p, v in phases.items()} == {p: res.timings[p] for p in phases}
    assert "commit" in res.timings


def test_incremental_saves_say_their_kind(tmp_path):
    with Checkpointer(tmp_path, incremental=True, block_bytes=4096, track_failures=False) as ck:
        first = ck.save(_state(), 1)
        state = _state()
        state["a"].local[:10] = -1.0  # one block of eight changes
        second = ck.save(state, 2)
    assert first.kind == "full" and first.incremental["kind"] == "full"
    assert second.kind == "incremental" and second.incremental["written_bytes"] == second.bytes_written == 4096
    assert second.nchunks == 8 and second.levels == ("root",) and not second.pending  # the whole index


@pytest.mark.parametrize("levels", [False, True], ids=["root", "node-local"])
def test_asynchronous_and_multi_level_saves_are_incremental_too(tmp_path, levels):
    """docs/incremental.md said "Not yet: asynchronous / multi-level incremental saves"; they combine
    (its section on them, and docs/async.md): the second save writes only the changed block."""
    kw = {"local_dir": tmp_path / "local"} if levels else {}
    with Checkpointer(tmp_path / "root", incremental=True, asynchronous=True, block_bytes=4096,
                      track_failures=False, **kw) as ck:
        ck.save(_state(), 1)
        first = ck.wait()
        state = _state()
        state["a"].local[:10] = -1.0  # one block of eight changes
        ck.save(state, 2)
        second = ck.wait()
        assert (first.kind, second.kind) == ("full", "incremental") and not second.pending
        assert second.incremental["written_bytes"] == second.bytes_written == 4096
        assert (second.levels[0] == "L1") == levels
        back = {"a": Block(np.zeros(4096)), "t": None}
        ck.restore(back)
        assert np.array_equal(back["a"].local, state["a"].local)
    with open(os.path.join(ROOT_DIR, "docs", "incremental.md"), encoding="utf-8") as f:
        doc = f.read()
    assert "Not yet: asynchronous" not in doc and "combine with the asynchronous and multi-level engine" in doc


def test_asynchronous_save_is_pending_until_committed(tmp_path):
    with Checkpointer(tmp_path, asynchronous=True, track_failures=False) as ck:
        res = ck.save(_state(), 1)
        assert res.pending and (res.bytes_written, res.nchunks, res.levels) == (0, 0, ())
        assert ck.last_result is None or ck.last_result.step != 1
        done = ck.wait()
        assert done is ck.last_result and not done.pending and done.step == 1
        assert done.bytes_written == 4096 * 8 and done.kind == "full" and done.levels == ("root",)
        phases = _stored_phases(done.path)
        assert all(done.timings[p] == max(v) for p, v in phases.items())
        ck.save(_state(k=1.0), 2)
        assert ck.last_result.step == 1  # the pending step 2 is not committed yet
        ck.wait()
        assert ck.last_result.step == 2


def test_node_local_levels_are_reported(tmp_path):
    with Checkpointer(tmp_path / "root", local_dir=tmp_path / "local", track_failures=False) as ck:
        res = ck.save(_state(), 1)
    assert not res.pending and res.levels[0] == "L1" and res.bytes_written == 4096 * 8


@pytest.mark.mpi(min_size=2)
def test_every_rank_gets_the_same_result_with_the_slowest_phases(mpi_tmp):
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    n = 1000
    local = np.arange(n, dtype=np.float64) + comm.rank * n
    state = {"a": Block(local, offset=(comm.rank * n,), global_shape=(comm.size * n,))}
    for kind, kw in (("blocking", {}), ("incremental", {"incremental": True})):
        with Checkpointer(f"{mpi_tmp}/{kind}", comm=comm, track_failures=False, **kw) as ck:
            res = ck.save(state, 1)
        everyone = comm.allgather((res.bytes_written, res.nchunks, res.kind, {p: t for p, t in res.timings.items()
                                                                              if p not in ("commit", "retention")}))
        assert all(e == everyone[0] for e in everyone), everyone
        assert res.bytes_written == comm.size * n * 8
        phases = _stored_phases(res.path)
        assert {p: max(v) for p, v in phases.items()} == everyone[0][3]
        assert res.timings["retention"] >= 0  # this rank's own, like commit (docs/api.md, SaveResult)


def test_a_short_repr_and_this_ranks_own_figures(tmp_path):
    with Checkpointer(tmp_path / "root", track_failures=False, asynchronous=True) as ck:
        pending = ck.save(_state(), 1)
        assert repr(pending) == "SaveResult(step-000000000001, step 1, pending)"
        done = ck.wait()
    text = repr(done)
    assert text.startswith("SaveResult(step-000000000001, step 1, full, 32.0 KiB in ") and "root" in text, text
    assert len(text) < 140 and done.this_rank["bytes"] == done.bytes_written
    assert "write" in done.this_rank["timings"] and "stage" in done.this_rank["timings"]


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("asynchronous", [False, True])
def test_this_ranks_bytes_add_up_to_the_global_bytes(mpi_tmp, asynchronous):
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    n = 1000 + 100 * comm.rank
    start = sum(1000 + 100 * r for r in range(comm.rank))
    total = sum(1000 + 100 * r for r in range(comm.size))
    state = {"a": Block(np.ones(n), offset=(start,), global_shape=(total,))}
    with Checkpointer(f"{mpi_tmp}/root", comm=comm, track_failures=False, asynchronous=asynchronous,
                      strategy="file-per-rank") as ck:
        ck.save(state, 1)
        res = ck.wait() or ck.last_result
    assert res.this_rank["bytes"] == n * 8
    assert comm.allreduce(res.this_rank["bytes"]) == res.bytes_written == total * 8
