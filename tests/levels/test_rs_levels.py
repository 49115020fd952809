"""The Reed-Solomon level under mpiexec -n 2, 3, 4 on simulated nodes (one rank each): m lost nodes of a group
are rebuilt exactly, m + 1 fall back to the shared root, damaged shards are found by their checksums.

The group is every rank, with rs_group=(k, m) = (N - N // 2, N // 2): (1, 1), (2, 1), (2, 2).
"""

from __future__ import annotations

import os
import shutil
import warnings

import numpy as np
import pytest

from hpcckpt import Checkpointer
from hpcckpt.errors import CheckpointError
from hpcckpt.levels.status import levels_status
from hpcckpt.core.names import rank_file, rs_parity_file
from hpcckpt.state import Block
import rs_spec
from metadata_tools import rewrite_metadata

pytestmark = pytest.mark.mpi(min_size=2)

STEP2 = "step-000000000002"


def _comm():
    from mpi4py import MPI

    return MPI.COMM_WORLD


def _shape(comm) -> tuple[int, int]:
    n = comm.Get_size()
    return n - n // 2, n // 2


def _state(comm, step: int) -> dict:
    sizes = [7000 + 300 * r for r in range(comm.Get_size())]  # unequal files: segments are zero-padded
    r = comm.Get_rank()
    u = np.sin(np.arange(sizes[r], dtype=np.float64) * (step + 1) + r)
    return {"u": Block(u, (sum(sizes[:r]),), (sum(sizes),)), "step": step}


def _checkpointer(comm, path, **more) -> Checkpointer:
    return Checkpointer(os.path.join(path, "root"), comm=comm, local_dir=os.path.join(path, "local"),
                        ranks_per_node=1, track_failures=False, rs_every=1, rs_group=_shape(comm), **more)


def _save_two(comm, path) -> None:
    """Step 1 reaches every level (and the root); step 2 only the node-local ones (L1 + RS), as a job killed
    before its clean end leaves them (close() flushes the newest version to the root: removed again here)."""
    with _checkpointer(comm, path, flush_every=2) as ck:
        for step in (1, 2):
            result = ck.save(_state(comm, step), step)
        ck.wait()
        assert result.levels == ("L1", "RS")
    comm.Barrier()
    if comm.Get_rank() == 0:  # what `hpcckpt ls` shows
        on_root = [v["L4"] for v in levels_status(os.path.join(path, "root"))["versions"]]
        shutil.rmtree(os.path.join(path, "root", STEP2))
        versions = levels_status(os.path.join(path, "root"))["versions"]
    comm.Barrier()
    if comm.Get_rank() == 0:
        assert on_root == [True, True]
        assert [(v["RS"], v["L3"], v["L4"]) for v in versions] == [(True, False, True), (True, False, False)]


def _node(path, rank: int) -> str:
    return os.path.join(path, "local", f"node-{rank}")


def _flip_byte(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([b ^ 0x5A]))


def _between_runs(comm, damage) -> None:
    comm.Barrier()
    if comm.Get_rank() == 0:
        damage()
    comm.Barrier()


def _restore(comm, path):
    """(restored step, level, rank 0's warnings, this rank's data equals the saved step's)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with _checkpointer(comm, path) as ck:
            template = _state(comm, 0)
            template["u"].local[:] = -1
            got = ck.restore(template)
            exact = np.array_equal(template["u"].local, _state(comm, got["step"])["u"].local)
            return got["step"], ck.engine.restored_level, " ".join(str(w.message) for w in caught), exact


@pytest.mark.parametrize("which", ["first", "last"])
def test_m_lost_nodes_of_a_group_are_rebuilt_exactly(mpi_tmp, which):
    comm = _comm()
    k, m = _shape(comm)
    _save_two(comm, mpi_tmp)
    lost = list(range(m)) if which == "first" else list(range(comm.Get_size() - m, comm.Get_size()))
    _between_runs(comm, lambda: [shutil.rmtree(_node(mpi_tmp, r)) for r in lost])
    step, level, _, exact = _restore(comm, mpi_tmp)
    assert (step, level) == (2, "RS")
    assert comm.allgather(exact) == [True] * comm.Get_size()
    if comm.Get_rank() in lost:  # the rebuilt file is back on its node, byte for byte what was lost
        assert os.path.getsize(os.path.join(_node(mpi_tmp, comm.Get_rank()), STEP2, rank_file(comm.Get_rank()))) > 0


@pytest.mark.mpi(min_size=3)
def test_m_plus_one_lost_nodes_fall_back_to_the_root_with_the_reason(mpi_tmp):
    comm = _comm()
    k, m = _shape(comm)
    _save_two(comm, mpi_tmp)
    _between_runs(comm, lambda: [shutil.rmtree(_node(mpi_tmp, r)) for r in range(1, m + 2)])
    step, level, said, exact = _restore(comm, mpi_tmp)
    assert (step, level) == (1, "L4") and exact
    if comm.Get_rank() == 0:
        lost = list(range(1, m + 2))
        assert f"rank(s) {lost} of Reed-Solomon group {list(range(comm.Get_size()))} are lost" in said, said
        assert f"a (k={k}, m={m}) Reed-Solomon code rebuilds at most {m} per stripe" in said, said
        assert "restoring step-000000000001 from the shared root (L4)" in said, said


def test_a_damaged_check_block_with_m_lost_nodes_is_detected_and_falls_back(mpi_tmp):
    """Every member holds a shard of every stripe here (g = k + m): one damaged shard of a survivor is one
    erasure too many for step 2, found by its checksum before any decoding; step 1, intact on the survivors,
    is rebuilt instead."""
    comm = _comm()
    k, m = _shape(comm)
    _save_two(comm, mpi_tmp)
    survivor = comm.Get_size() - 1

    def damage():
        for r in range(m):
            shutil.rmtree(_node(mpi_tmp, r))
        _flip_byte(os.path.join(_node(mpi_tmp, survivor), STEP2, rs_parity_file(survivor)), 17)

    _between_runs(comm, damage)
    step, level, said, exact = _restore(comm, mpi_tmp)
    assert (step, level) == (1, "RS") and exact
    if comm.Get_rank() == 0:
        assert f"{STEP2} cannot be restored from the node-local levels: rank(s) {list(range(m))} of Reed-Solomon " \
            f"group {list(range(comm.Get_size()))} are lost and rank(s) [{survivor}] hold damaged shards" in said, said


@pytest.mark.mpi(min_size=4)
def test_a_damaged_data_file_of_a_survivor_is_rebuilt_with_a_lost_node(mpi_tmp):
    """m = 2: one node lost and a flipped byte in another rank's data file (same size, wrong bytes): both
    files are rebuilt and the restore is exact from RS (XOR parity could only fail over to the root)."""
    comm = _comm()
    _save_two(comm, mpi_tmp)
    damaged = 2

    def damage():
        shutil.rmtree(_node(mpi_tmp, 1))
        _flip_byte(os.path.join(_node(mpi_tmp, damaged), STEP2, rank_file(damaged)), 4000)

    _between_runs(comm, damage)
    step, level, said, exact = _restore(comm, mpi_tmp)
    assert (step, level) == (2, "RS"), said
    assert comm.allgather(exact) == [True] * comm.Get_size()


def test_check_blocks_of_another_coder_are_not_decoded_and_the_search_goes_on(mpi_tmp):
    """A version whose ``extra.levels.rs`` names no coder (the level's earlier zfec code) with m lost nodes: its
    check blocks are not decoded as ISA-L's; step 1, written by this coder, is rebuilt instead."""
    comm = _comm()
    k, m = _shape(comm)
    _save_two(comm, mpi_tmp)

    def no_coder(doc):
        del doc["extra"]["levels"]["rs"]["coder"]

    def older():
        for r in range(m):
            shutil.rmtree(_node(mpi_tmp, r))
        for r in range(m, comm.Get_size()):
            rewrite_metadata(os.path.join(_node(mpi_tmp, r), STEP2), no_coder)

    _between_runs(comm, older)
    step, level, said, exact = _restore(comm, mpi_tmp)
    assert (step, level) == (1, "RS") and exact
    if comm.Get_rank() == 0:
        assert f"{STEP2} cannot be restored from the node-local levels: its Reed-Solomon check blocks were made by " \
            "the 'zfec' code, this hpcckpt decodes 'isa_l_rs_cauchy' only" in said, said


def test_the_files_are_what_format_md_section_11_says(mpi_tmp):
    """Every stripe of step 2, read as docs/format.md section 11 lays it out (tests/support/rs_spec.py, no hpcckpt):
    the checksums match, the check blocks are the section's code of the data, and the last k positions alone
    (every check block among them) give the data back."""
    comm = _comm()
    _save_two(comm, mpi_tmp)
    comm.Barrier()
    if comm.Get_rank() == 0:
        spec = rs_spec.read_version(os.path.join(_node(mpi_tmp, 0), STEP2),
                                    lambda r: os.path.join(_node(mpi_tmp, r), STEP2))
        rs, shards = spec["rs"], spec["shards"]
        k, m = rs["k"], rs["m"]
        assert rs["coder"] == "isa_l_rs_cauchy" and rs["groups"] == [list(range(comm.Get_size()))]
        for gi, group in enumerate(rs["groups"]):
            g = len(group)
            for s in range(g):
                def shard(p):
                    segments, checks = shards[gi, rs_spec.shard_holder(g, s, p)]
                    return segments[p] if p < k else checks[p - k]

                data = [shard(p) for p in range(k)]
                assert rs_spec.check_blocks(k, m, data) == [shard(p) for p in range(k, k + m)], s
                assert rs_spec.solve(k, m, list(range(m, k + m)), [shard(p) for p in range(m, k + m)]) == data, s
    comm.Barrier()


def test_too_few_nodes_for_the_group_is_warned_and_the_level_skipped(mpi_tmp):
    comm = _comm()
    n = comm.Get_size()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with Checkpointer(os.path.join(mpi_tmp, "root"), comm=comm, local_dir=os.path.join(mpi_tmp, "local"),
                          ranks_per_node=1, track_failures=False, rs_every=1, rs_group=(n, 1)) as ck:
            result = ck.save(_state(comm, 1), 1)
    assert result.levels == ("L1",)
    if comm.Get_rank() == 0:
        assert any(f"rs_group=({n}, 1) needs {n + 1} nodes, this run has {n}" in str(w.message) for w in caught)


def test_a_bad_rs_group_is_refused_on_every_rank(mpi_tmp):
    comm = _comm()
    with pytest.raises(CheckpointError, match="rs_group must be"):
        Checkpointer(os.path.join(mpi_tmp, "root"), comm=comm, local_dir=os.path.join(mpi_tmp, "local"),
                     rs_every=1, rs_group=(2, 0))
    with pytest.raises(CheckpointError, match="rs_group must be"):
        Checkpointer(os.path.join(mpi_tmp, "root"), comm=comm, asynchronous=True, rs_every=1, rs_group="k+m")
