"""Node-local restores whose load reads other nodes' files (hpcckpt/levels/fetch.py).

The pure plan (who sends which file to whom) is tested with hypothesis; the
rest under ``mpiexec -n 2, 3, 4`` on simulated nodes (one rank each):
``mpiexec -n N python tests/mpi_pytest.py --with-mpi -m mpi tests/levels/test_nodelocal_fetch.py``.
Step 1 of every run reaches the shared root, step 2 only the node-local levels,
so a restore that gives step 2 read it from the nodes.  The real-node
counterpart is tests/cluster/test_node_loss.py.
"""

from __future__ import annotations

import os
import shutil
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcckpt import Block, Checkpointer, Ragged
from hpcckpt.levels import fetch
from hpcckpt.levels.fetch import plan_fetches, round_bytes
from hpcckpt.core.regions import even_rows


# ------------------------------------------------------------------ the plan (pure)
@st.composite
def _situations(draw):
    nranks = draw(st.integers(1, 7))
    node_of = sorted(draw(st.lists(st.integers(0, 3), min_size=nranks, max_size=nranks)))
    files = [f"data/part-{i:06d}.bin" for i in range(draw(st.integers(1, 6)))]
    size = {f: draw(st.integers(0, 50)) for f in files}
    node_holds = {n: set(draw(st.lists(st.sampled_from(files), unique=True))) for n in set(node_of)}
    held = [{f: size[f] for f in node_holds[node_of[r]]} for r in range(nranks)]
    needs = [set(draw(st.lists(st.sampled_from(files), unique=True))) for _ in range(nranks)]
    return needs, held, node_of


@settings(max_examples=300, deadline=None)
@given(_situations())
def test_every_need_is_met_on_its_node_once_or_reported_lost(situation):
    needs, held, node_of = situation
    moves, lost = plan_fetches(needs, held, node_of)
    anywhere = set().union(*held)
    assert lost == sorted(lost)
    assert set(lost) == {(r, f) for r, fs in enumerate(needs) for f in fs if f not in anywhere}
    arrived = {(node_of[dst], name) for _, dst, name, _ in moves}
    assert len(arrived) == len(moves), "a file sent twice to one node"
    for src, dst, name, size in moves:
        assert held[src].get(name) == size, "sent by a rank whose node does not hold it whole"
        assert name not in held[dst] and name in needs[dst], "sent where it is not needed or already held"
    for r, fs in enumerate(needs):
        for f in fs:
            assert f in held[r] or (node_of[r], f) in arrived or (r, f) in lost


def test_the_bytes_are_spread_over_the_holders():
    needs = [set(), set(), {"a", "b"}, {"a", "b"}]
    held = [{"a": 10, "b": 10}, {"a": 10, "b": 10}, {}, {}]
    moves, lost = plan_fetches(needs, held, [0, 1, 2, 3])
    assert lost == [] and sorted(m[0] for m in moves) == [0, 0, 1, 1]


def test_a_busy_rank_gets_smaller_pieces_down_to_a_floor():
    assert round_bytes([]) == fetch.ROUND_BYTES
    assert round_bytes([(1, 0, "a", 9), (2, 0, "b", 9), (3, 4, "c", 9)]) == fetch.ROUND_BYTES // 2
    many = [(s, 0, str(s), 9) for s in range(1, 10_000)]
    assert round_bytes(many) == fetch.MIN_ROUND


# ------------------------------------------------------------------ MPI: simulated nodes
STEP2 = "step-000000000002"
ROWS = 150  # rank r saves ROWS * (r + 1) rows: uneven, so an even split reads other ranks' files


def _comm():
    from mpi4py import MPI

    return MPI.COMM_WORLD


def _table(step: int, nrows: int) -> np.ndarray:
    return np.arange(nrows * 3, dtype=np.float64).reshape(nrows, 3) + 0.5 * step


def _saved_rows(r: int) -> tuple[int, int]:
    return ROWS * r * (r + 1) // 2, ROWS * (r + 1) * (r + 2) // 2


def _vector(step: int, lo: int, hi: int) -> np.ndarray:
    return np.arange(lo, hi, dtype=np.float64) + 1e6 * step


def _block_of(r: int) -> tuple[int, int]:
    return 1000 * r * (r + 1) // 2, 1000 * (r + 1) * (r + 2) // 2  # uneven as well


def _saved_state(comm, step: int) -> dict:
    r, n = comm.Get_rank(), comm.Get_size()
    lo, hi = _saved_rows(r)
    b0, b1 = _block_of(r)
    return {"t": Ragged(_table(step, _saved_rows(n - 1)[1])[lo:hi]),
            "u": Block(_vector(step, b0, b1), (b0,), (_block_of(n - 1)[1],)), "step": step}


def _options(path: str, level: str, nranks: int) -> dict:
    return {"partner_every": 1} if level == "L2" else {"parity_every": 1} if level == "L3" else {
        "rs_every": 1, "rs_group": (nranks - nranks // 2, nranks // 2)} if level == "RS" else {
        "pmem_dir": os.path.join(path, "pmem"), "pmem_block": 256} if level == "PM" else {}


def _checkpointer(comm, path, level, saved_ranks, **more) -> Checkpointer:
    return Checkpointer(os.path.join(path, "root"), comm=comm, local_dir=os.path.join(path, "local"),
                        track_failures=False, chunk_bytes=2048, **{"ranks_per_node": 1, **more},
                        **_options(path, level, saved_ranks))


def _save_two(comm, path, level, **more) -> None:
    """Step 1 reaches the root, step 2 only the node-local levels (a job killed before its clean end)."""
    with _checkpointer(comm, path, level, comm.Get_size(), flush_every=2, **more) as ck:
        for step in (1, 2):
            ck.save(_saved_state(comm, step), step)
        ck.wait()
        assert not os.path.exists(os.path.join(path, "root", STEP2, "metadata.json"))
    _forget_the_clean_end(comm, path)


def _forget_the_clean_end(comm, path) -> None:
    """The root as a job killed before close() leaves it: close() flushed the newest version, step 2, there."""
    comm.Barrier()
    if comm.Get_rank() == 0:
        shutil.rmtree(os.path.join(path, "root", STEP2))
    comm.Barrier()


def _between_runs(comm, damage) -> None:
    comm.Barrier()
    if comm.Get_rank() == 0:
        damage()
    comm.Barrier()


def _restore(comm, path, level, saved_ranks, which, step=None, **more):
    """(restored step, level, rank 0's warnings) of a restore on ``comm`` that reads other nodes' files: an even
    split of the Ragged table (``which="ragged"``) or an even split of the Block (``"block"``); asserts the data
    is exactly the restored step's."""
    r, n = comm.Get_rank(), comm.Get_size()
    nrows, length = _saved_rows(saved_ranks - 1)[1], _block_of(saved_ranks - 1)[1]
    lo, hi = even_rows(length, n, r)
    template = {"t": Ragged(), "step": None} if which == "ragged" else {
        "u": Block(np.full(hi - lo, -1.0), (lo,), (length,)), "step": None}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with _checkpointer(comm, path, level, saved_ranks, **more) as ck:
            got = ck.restore(template, step=step, strict=False)
            restored_level = ck.engine.restored_level
    if which == "ragged":
        a, b = even_rows(nrows, n, r)
        assert np.array_equal(got["t"].local, _table(got["step"], nrows)[a:b])
    else:
        assert np.array_equal(template["u"].local, _vector(got["step"], lo, hi))
    return got["step"], restored_level, " ".join(str(w.message) for w in caught)


def _lose_node_1(path):
    return lambda: shutil.rmtree(os.path.join(path, "local", "node-1"))


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(180)
@pytest.mark.parametrize("which", ["ragged", "block"])
@pytest.mark.parametrize("level", ["L1", "L2", "L3", "RS", "PM"])
def test_the_newest_version_restores_on_another_split_of_the_same_ranks(mpi_tmp, level, which):
    comm = _comm()
    if level == "RS":
        from hpcckpt.levels import rs_coder

        if rs_coder.missing() is not None:
            pytest.skip(rs_coder.missing())
    _save_two(comm, mpi_tmp, level)
    if level != "L1":  # the level must rebuild (or, PM, refill) node 1's files before they can be fetched
        _between_runs(comm, _lose_node_1(mpi_tmp))
    step, got_level, warned = _restore(comm, mpi_tmp, level, comm.Get_size(), which)
    assert (step, got_level, warned) == (2, level, "")


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(120)
def test_files_streamed_in_many_small_pieces_arrive_whole(mpi_tmp, monkeypatch):
    comm = _comm()
    monkeypatch.setattr(fetch, "ROUND_BYTES", 1000)
    monkeypatch.setattr(fetch, "MIN_ROUND", 100)  # a few KB per file: dozens of rounds
    _save_two(comm, mpi_tmp, "L1")
    assert _restore(comm, mpi_tmp, "L1", comm.Get_size(), "ragged") == (2, "L1", "")


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(120)
def test_a_step_held_only_node_locally_restores_by_its_number(mpi_tmp):
    comm = _comm()
    _save_two(comm, mpi_tmp, "L1")
    assert _restore(comm, mpi_tmp, "L1", comm.Get_size(), "ragged", step=2) == (2, "L1", "")


def _fewer(comm, k: int):
    """A communicator of the first ``size - k`` ranks (COMM_NULL elsewhere)."""
    from mpi4py import MPI

    return comm.Split(0 if comm.Get_rank() < comm.Get_size() - k else MPI.UNDEFINED, comm.Get_rank())


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("which", ["ragged", "block"])
def test_one_rank_fewer_restores_the_newest_from_a_partner_copy(mpi_tmp, which):
    """The last node is not in the new run; its file has a partner copy on node 0."""
    from mpi4py import MPI

    comm = _comm()
    _save_two(comm, mpi_tmp, "L2")
    sub = _fewer(comm, 1)
    if sub != MPI.COMM_NULL:
        try:
            assert _restore(sub, mpi_tmp, "L1", comm.Get_size(), which) == (2, "L1", "")
        finally:
            sub.Free()
    comm.Barrier()


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(120)
def test_data_on_no_node_of_the_run_falls_back_to_the_root_with_the_reason(mpi_tmp):
    from mpi4py import MPI

    comm = _comm()
    _save_two(comm, mpi_tmp, "L1")
    sub = _fewer(comm, 1)
    if sub != MPI.COMM_NULL:
        try:
            step, got_level, warned = _restore(sub, mpi_tmp, "L1", comm.Get_size(), "ragged")
            assert (step, got_level) == (1, "L4")
            if sub.Get_rank() == 0:
                assert f"no node of this run holds a whole copy of data/part-{comm.Get_size() - 1:06d}.bin" in warned
        finally:
            sub.Free()
    comm.Barrier()


@pytest.mark.mpi(min_size=4)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("which", ["ragged", "block"])
def test_four_ranks_on_two_nodes_restore_on_two_ranks(mpi_tmp, which):
    """Saved with two ranks per node, restored on one rank per node: each node holds two ranks' files."""
    from mpi4py import MPI

    comm = _comm()
    if comm.Get_size() != 4:
        pytest.skip("a 4-rank layout")
    _save_two(comm, mpi_tmp, "L1", ranks_per_node=2)
    sub = _fewer(comm, 2)
    if sub != MPI.COMM_NULL:
        try:
            assert _restore(sub, mpi_tmp, "L1", 4, which) == (2, "L1", "")
        finally:
            sub.Free()
    comm.Barrier()
