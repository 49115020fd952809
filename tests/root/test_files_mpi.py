"""Tracked output files under mpiexec: per-rank and shared files, rollback on another rank count, agreed refusals.

Run with ``mpiexec -n N python tests/mpi_pytest.py --with-mpi -m mpi tests/root/test_files_mpi.py`` (N = 2, 3, 4).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import hpcckpt
from hpcckpt import Block, CheckpointError

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(120)]


@pytest.fixture
def comm():
    from mpi4py import MPI

    return MPI.COMM_WORLD


def state(comm, step):
    return {"u": Block(np.full(3, float(step)), offset=(3 * comm.rank,), global_shape=(3 * comm.size,)), "step": step}


def template(comm):
    return {"u": Block(np.zeros(3), offset=(3 * comm.rank,), global_shape=(3 * comm.size,)), "step": None}


def files(work):
    return {os.path.join(work, "log.{rank}"): "append", os.path.join(work, "shared.csv"): "append",
            os.path.join(work, "field.{rank}.bin"): "inplace"}


def write_step(comm, work, step):
    """Each rank appends to its log and rewrites part of its binary file; rank 0 appends to the shared csv."""
    r = comm.rank
    with open(os.path.join(work, f"log.{r}"), "a") as f:
        f.write(f"rank {r} step {step}\n" * (r + step))
    path = os.path.join(work, f"field.{r}.bin")
    if not os.path.exists(path):
        open(path, "wb").write(bytes(5000 + 700 * r))
    with open(path, "r+b") as f:
        f.seek((step * 1237 + r * 311) % 5000)
        f.write(bytes([step, r]) * 200)
    if r == 0:
        with open(os.path.join(work, "shared.csv"), "a") as f:
            f.write(f"{step},{step * step}\n")


def all_files(comm, work):
    """Every tracked file's bytes, gathered from every rank (the same dict on every rank)."""
    mine = {}
    for name in [f"log.{comm.rank}", f"field.{comm.rank}.bin"] + (["shared.csv"] if comm.rank == 0 else []):
        p = os.path.join(work, name)
        mine[name] = open(p, "rb").read() if os.path.exists(p) else None
    out = {}
    for part in comm.allgather(mine):
        out.update(part)
    return out


def test_per_rank_and_shared_files_roll_back_on_fewer_ranks_and_on_the_same(comm, mpi_tmp):
    from mpi4py import MPI

    work, root = os.path.join(mpi_tmp, "work"), os.path.join(mpi_tmp, "ck")
    if comm.rank == 0:
        os.makedirs(work)
    comm.Barrier()
    ck = hpcckpt.Checkpointer(root, comm=comm, files=files(work), keep=2)
    snaps = {}
    for step in range(1, 5):
        write_step(comm, work, step)
        ck.save(state(comm, step), step)
        snaps[step] = all_files(comm, work)
    ck.close()
    for step in (5, 6):
        write_step(comm, work, step)  # the run went on after its last checkpoint, then crashed

    # restart on one rank fewer: the last rank's files are rolled back by rank (n-1) % (n-1) = 0
    sub = comm.Split(0 if comm.rank < comm.size - 1 else MPI.UNDEFINED, comm.rank)
    if sub != MPI.COMM_NULL:
        ck = hpcckpt.Checkpointer(root, comm=sub, files=files(work))
        n = 3 * comm.size
        lo, hi = sub.rank * n // sub.size, (sub.rank + 1) * n // sub.size
        got = ck.restore({"u": Block(np.zeros(hi - lo), offset=(lo,), global_shape=(n,)), "step": None})
        assert got["step"] == 4
        ck.close()
        sub.Free()
    comm.Barrier()
    assert all_files(comm, work) == snaps[4]

    # and back to step 3 on every rank
    ck = hpcckpt.Checkpointer(root, comm=comm, files=files(work))
    assert ck.restore(template(comm), step=3)["step"] == 3
    assert all_files(comm, work) == snaps[3]
    write_step(comm, work, 4)  # the restarted run redoes step 4 exactly: the same files as the first time
    ck.save(state(comm, 4), 4)
    assert all_files(comm, work) == snaps[4]
    ck.close()


def test_one_ranks_missing_file_fails_on_every_rank_and_touches_nothing(comm, mpi_tmp):
    work, root = os.path.join(mpi_tmp, "work"), os.path.join(mpi_tmp, "ck")
    if comm.rank == 0:
        os.makedirs(work)
    comm.Barrier()
    ck = hpcckpt.Checkpointer(root, comm=comm, files=files(work))
    write_step(comm, work, 1)
    ck.save(state(comm, 1), 1)
    ck.close()
    write_step(comm, work, 2)
    victim = comm.size - 1
    if comm.rank == victim:
        os.remove(os.path.join(work, f"field.{victim}.bin"))
    comm.Barrier()
    before = all_files(comm, work)
    ck = hpcckpt.Checkpointer(root, comm=comm, files=files(work))
    with pytest.raises(CheckpointError, match=f"field.{victim}.bin' is missing"):
        ck.restore(template(comm))
    assert all_files(comm, work) == before
    ck.close()


def test_a_file_recorded_by_two_ranks_fails_the_save_on_every_rank(comm, mpi_tmp):
    work, root = os.path.join(mpi_tmp, "work"), os.path.join(mpi_tmp, "ck")
    if comm.rank == 0:
        os.makedirs(work)
    comm.Barrier()
    write_step(comm, work, 1)
    ck = hpcckpt.Checkpointer(root, comm=comm, files=[os.path.join(work, "log.{rank}"),
                                                      os.path.join(work, "log.1")])  # rank 0 records log.1 too
    with pytest.raises(CheckpointError, match="recorded by rank 0 and rank 1"):
        ck.save(state(comm, 1), 1)
    assert ck.latest() is None
    ck.close()


def test_crafted_records_are_ignored_on_every_rank_and_an_escape_on_one_rank_touches_nothing(comm, mpi_tmp):
    """A record of an unregistered path (rank 0 warns) and a per-rank glob match whose directory is a link out
    of the registered one (the recording rank warns): neither file changes, the registered ones roll back."""
    import warnings

    from metadata_tools import rewrite_metadata

    work, root = os.path.join(mpi_tmp, "work"), os.path.join(mpi_tmp, "ck")
    outside = os.path.join(mpi_tmp, "outside")
    last = comm.size - 1
    if comm.rank == 0:
        os.makedirs(os.path.join(work, "r0"))
        os.makedirs(outside)
        for name in ("victim.txt", "x.log"):
            with open(os.path.join(outside, name), "wb") as f:
                f.write(b"precious\n")
    comm.Barrier()
    registered = {os.path.join(work, "log.{rank}"): "append", os.path.join(work, "r*", "x.{rank}.log"): "append"}
    ck = hpcckpt.Checkpointer(root, comm=comm, files=registered)
    with open(os.path.join(work, f"log.{comm.rank}"), "ab") as f:
        f.write(b"saved\n")
    ck.save(state(comm, 1), 1)
    ck.close()
    with open(os.path.join(work, f"log.{comm.rank}"), "ab") as f:
        f.write(b"after\n")
    if comm.rank == 0:
        os.rename(os.path.join(outside, "x.log"), os.path.join(outside, f"x.{last}.log"))
        os.symlink(outside, os.path.join(work, "r9"))
        vdir = os.path.join(root, sorted(d for d in os.listdir(root) if d.startswith("step-"))[-1])
        empty_tail = "2d06800538d394c2"
        rewrite_metadata(vdir, lambda doc: doc["extra"]["files"]["entries"].extend([
            {"path": os.path.join(outside, "victim.txt"), "rank": last, "mode": "absent"},
            {"path": os.path.join(work, "r9", f"x.{last}.log"), "rank": last, "mode": "append", "size": 0,
             "tail_bytes": 1 << 20, "tail": empty_tail}]))
    comm.Barrier()
    ck = hpcckpt.Checkpointer(root, comm=comm, files=registered)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ck.restore(template(comm))
    ck.close()
    said = " ".join(str(w.message) for w in caught)
    if comm.rank == 0:
        assert "victim.txt" in said and "no registration of this run covers them" in said
    if comm.rank == last:
        assert f"x.{last}.log" in said and "resolves outside the registered one" in said
    assert open(os.path.join(work, f"log.{comm.rank}"), "rb").read() == b"saved\n"
    comm.Barrier()
    assert open(os.path.join(outside, "victim.txt"), "rb").read() == b"precious\n"
    assert open(os.path.join(outside, f"x.{last}.log"), "rb").read() == b"precious\n"
    comm.Barrier()
