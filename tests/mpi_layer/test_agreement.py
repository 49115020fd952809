"""Ranks checked against each other: every rank passes the same step, names, kinds, replicated values
and options, or every rank raises the same CheckpointError naming what differs and two ranks, and nothing is
committed; values that differ per rank are hpcckpt.PerRank.

Each case runs for blocking, incremental and asynchronous saves and blocking file-per-rank ones, after a first good
save (so the asynchronous and file-per-rank ones take their cached plan: the check rides on the commit's gather) and
on a first save (the plan's allgather).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import hpcckpt
from hpcckpt import Block, CheckpointError, Checkpointer, PerRank, TemplateMismatchError
from hpcckpt.mpi.agreement import entry_digests, mismatch
from hpcckpt.core.encoding import PerRankEntries, decode_value, encode_per_rank

KINDS = {"blocking": {}, "incremental": {"incremental": True}, "asynchronous": {"asynchronous": True},
         "file-per-rank": {"strategy": "file-per-rank"}}  # blocking, a cached plan checked at the commit


def _state(comm, k=0.0):
    n = 64
    local = np.arange(n, dtype=np.float64) + comm.rank * n + k
    return {"u": Block(local, offset=(comm.rank * n,), global_shape=(comm.size * n,)), "t": k, "name": "run"}


def _save(ck, state, step, **options):
    ck.save(state, step, **options)
    ck.wait()  # an asynchronous save's commit (where a cached plan's digest is checked)


def _expect_failure(ck, state, step, comm, words, **options):
    with pytest.raises(CheckpointError) as info:
        _save(ck, state, step, **options)
    text = str(info.value)
    for w in words:
        assert w in text, text
    texts = comm.allgather(text.partition(" failed")[2])  # the operation's name holds this rank's own step
    assert len(set(texts)) == 1, texts  # the same error on every rank
    return text


def _checkpointer(mpi_tmp, kind, **extra):
    return Checkpointer(f"{mpi_tmp}/root", comm=_world(), track_failures=False, keep=None, **KINDS[kind], **extra)


def _world():
    from mpi4py import MPI

    return MPI.COMM_WORLD


# --------------------------------------------------------------------- pure


def test_mismatch_names_the_first_difference():
    a = entry_digests(3, None, {"u": "block", "t": "value"}, {"t": 1})
    assert mismatch([a, dict(a)]) is None
    assert "steps" in str(mismatch([a, entry_digests(4, None, {"u": "block", "t": "value"}, {"t": 1})]))
    text = str(mismatch([a, a, entry_digests(3, None, {"u": "block", "t": "value"}, {"t": 2})]))
    assert "'t'" in text and "rank 0" in text and "rank 2" in text and "PerRank" in text
    text = str(mismatch([a, entry_digests(3, None, {"u": "block", "v": "value"}, {"v": 1})]))
    assert "state names differ" in text and ("'t'" in text or "'v'" in text)
    text = str(mismatch([a, entry_digests(3, None, {"u": "ragged", "t": "value"}, {"t": 1})]))
    assert "kinds of variable 'u' differ between ranks: a Block on rank 0, a Ragged on rank 1" in text
    # equal dicts in another key order are equal values
    b = entry_digests(3, None, {"d": "value"}, {"d": {"x": 1, "y": 2}})
    assert mismatch([b, entry_digests(3, None, {"d": "value"}, {"d": {"y": 2, "x": 1}})]) is None


def test_a_per_rank_value_decodes_to_its_entries():
    out = decode_value(encode_per_rank([1, {"a": 2}]))
    assert isinstance(out, PerRankEntries) and out == [1, {"a": 2}]


def test_a_serial_per_rank_rng_state_round_trips(tmp_path):
    rng = np.random.default_rng(7)
    rng.random(3)
    with Checkpointer(tmp_path / "root", track_failures=False) as ck:
        ck.save({"rng": PerRank(rng.bit_generator.state), "t": 1}, 1)
        out = ck.restore({"rng": PerRank(), "t": None})
    fresh = np.random.default_rng()
    fresh.bit_generator.state = out["rng"].value
    assert np.array_equal(fresh.random(5), rng.random(5))


# ---------------------------------------------------------------------- MPI


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("first", [False, True], ids=["cached", "first"])
def test_mismatched_steps_raise_on_every_rank(mpi_tmp, kind, first):
    comm = _world()
    with _checkpointer(mpi_tmp, kind) as ck:
        if not first:
            _save(ck, _state(comm), 1)
        step = 10 + (comm.rank == comm.size - 1)
        text = _expect_failure(ck, _state(comm, 1), step, comm, ["step", "rank 0", f"rank {comm.size - 1}"])
        assert "different steps" in text
        _save(ck, _state(comm, 2), 12)  # the checkpointer still works, and nothing of step 10/11 was committed
        assert ck.steps() == ([] if first else [1]) + [12]


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("first", [False, True], ids=["cached", "first"])
def test_a_replicated_value_differing_on_one_rank_raises_naming_it(mpi_tmp, kind, first):
    comm = _world()
    odd = comm.size - 1
    with _checkpointer(mpi_tmp, kind) as ck:
        if not first:
            _save(ck, _state(comm), 1)
        state = _state(comm, 1)
        if comm.rank == odd:
            state["t"] = 1.5
        _expect_failure(ck, state, 2, comm, ["'t'", "rank 0", f"rank {odd}", "PerRank"])
        _save(ck, _state(comm, 3), 3)
        assert ck.steps() == ([] if first else [1]) + [3]


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_differing_variable_names_raise_naming_the_name_and_ranks(mpi_tmp, kind):
    comm = _world()
    odd = comm.size - 1
    with _checkpointer(mpi_tmp, kind) as ck:
        _save(ck, _state(comm), 1)
        state = _state(comm, 1)
        if comm.rank == odd:
            state["extra"] = 5
        _expect_failure(ck, state, 2, comm, ["state names differ", "'extra'", f"rank {odd}", "rank 0"])
        assert ck.steps() == [1]


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("first", [False, True], ids=["cached", "first"])
def test_a_bogus_option_on_one_rank_raises_everywhere(mpi_tmp, kind, first):
    comm = _world()
    odd = comm.size - 1
    with _checkpointer(mpi_tmp, kind) as ck:
        if not first:
            _save(ck, _state(comm), 1)
        bad = {"strategy": "bogus"} if comm.rank == odd else {}
        _expect_failure(ck, _state(comm, 1), 2, comm, ["bogus", f"rank {odd}"], **bad)
        _save(ck, _state(comm, 3), 3)
        assert ck.steps() == ([] if first else [1]) + [3]


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_valid_option_differing_between_ranks_raises_everywhere(mpi_tmp, kind):
    comm = _world()
    odd = comm.size - 1
    with _checkpointer(mpi_tmp, kind) as ck:
        _save(ck, _state(comm), 1)
        other = {"chunk_bytes": 4096} if comm.rank == odd else {}
        _expect_failure(ck, _state(comm, 1), 2, comm, ["'chunk_bytes'", f"rank {odd}", "rank 0"], **other)
        assert ck.steps() == [1]


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(120)
def test_a_bogus_option_at_construction_or_in_save_raises_everywhere(mpi_tmp):
    import hpcckpt

    comm = _world()
    bad = {"strategy": "bogus"} if comm.rank == comm.size - 1 else {}
    with pytest.raises(CheckpointError, match="bogus"):
        Checkpointer(f"{mpi_tmp}/root", comm=comm, track_failures=False, **bad)
    with pytest.raises(CheckpointError, match="bogus"):
        hpcckpt.save(_state(comm), f"{mpi_tmp}/one", comm=comm, **bad)
    other = {"chunk_bytes": 4096} if comm.rank == comm.size - 1 else {}
    with pytest.raises(CheckpointError, match="chunk_bytes"):
        hpcckpt.save(_state(comm), f"{mpi_tmp}/two", comm=comm, **other)


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_per_rank_rng_state_round_trips_exactly(mpi_tmp, kind):
    comm = _world()
    rng = np.random.default_rng([17, comm.rank])
    with _checkpointer(mpi_tmp, kind) as ck:
        for step in (1, 2, 3):  # the later saves use the cached plan (asynchronous: no MPI in save)
            rng.random(10 + comm.rank)
            state = _state(comm, step)
            state["rng"] = PerRank(rng.bit_generator.state)
            _save(ck, state, step)
        want = rng.random(8)
        target = _state(comm, -1)
        target["rng"] = PerRank()
        out = ck.restore(target)
    fresh = np.random.default_rng()
    fresh.bit_generator.state = out["rng"].value
    assert np.array_equal(fresh.random(8), want)
    assert len({repr(s) for s in comm.allgather(out["rng"].value)}) == comm.size  # each rank its own


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(120)
def test_a_per_rank_value_on_another_rank_count_needs_resize(mpi_tmp):
    import hpcckpt

    comm = _world()
    sub = comm.Split(0 if comm.rank < comm.size - 1 else 1, comm.rank)
    path = f"{mpi_tmp}/pr"
    state = {"r": PerRank(comm.rank)}
    hpcckpt.save(state, path, comm=comm)
    if comm.rank < comm.size - 1:  # one rank fewer
        with pytest.raises(TemplateMismatchError, match="resize=True"):
            hpcckpt.load({"r": PerRank()}, path, comm=sub)
        out = hpcckpt.load({"r": PerRank(-1, resize=True)}, path, comm=sub)
        assert out["r"].value == sub.rank
    sub.Free()
    comm.Barrier()


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(120)
def test_ranks_saving_to_different_paths_raise_on_every_rank_and_commit_nothing(mpi_tmp):
    comm = _world()
    odd = comm.size - 1
    paths = [os.path.join(mpi_tmp, name) for name in ("a", "b")]
    with pytest.raises(CheckpointError) as info:
        hpcckpt.save(_state(comm), paths[comm.rank == odd], comm=comm)
    text = str(info.value)
    assert "different paths" in text and "rank 0" in text and f"rank {odd}" in text, text
    assert len(set(comm.allgather(text))) == 1  # the same error on every rank
    comm.Barrier()
    assert not any(os.path.exists(os.path.join(p, "metadata.json")) for p in paths)
    hpcckpt.save(_state(comm, 2), paths[0], comm=comm)  # every rank passing one path still saves
    out = _state(comm, -1)
    hpcckpt.load(out, paths[0], comm=comm)
    assert np.array_equal(out["u"].local, _state(comm, 2)["u"].local)
