"""Ragged loads both ways: through the chunk directory, each rank's rows from one MPI_Scan
(load_plan.scan_rows), wherever rank 0 broadcasts the metadata, and the gathered way where each rank reads it
(hpcckpt.load on a few ranks); exact rows, the same TemplateMismatchError for bad row requests on every rank,
one CheckpointError for one rank's failure.

Run with ``mpiexec -n N python tests/mpi_pytest.py --with-mpi -m mpi tests/loading/test_ragged_directory_mpi.py`` (N = 2..4).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import hpcckpt
from hpcckpt import Block, CheckpointError, CorruptCheckpointError, Ragged, TemplateMismatchError
from mpitools import CountingComm

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(120)]

COLLECTIVES = {"allgather", "gather", "bcast", "scatter", "allreduce", "exscan", "Scan", "Barrier", "barrier",
               "alltoall", "Allgather", "Gather", "Bcast", "Scatter", "Allreduce", "Alltoallv"}
ROWS = np.dtype([("id", "<i8"), ("x", "<f8", (2,))])


@pytest.fixture
def comm():
    from mpi4py import MPI

    return MPI.COMM_WORLD


@pytest.fixture(params=["directory", "gathered"])
def way(request, monkeypatch):
    """The Ragged way of every load in the test: the chunk directory (rank 0 broadcasts the metadata, as beyond
    loading.PER_RANK_METADATA_MAX_RANKS ranks: the threshold set to 0), or the gathered way (each rank reads
    it, as hpcckpt.load does on these few ranks)."""
    from hpcckpt.loading import load as loading

    if request.param == "directory":
        monkeypatch.setattr(loading, "PER_RANK_METADATA_MAX_RANKS", 0)
    return request.param


def _table(nrows: int, lo: int = 0) -> np.ndarray:
    out = np.zeros(nrows, ROWS)
    out["id"] = np.arange(lo, lo + nrows)
    out["x"] = np.stack([out["id"] * 0.5, -out["id"] * 1.0], axis=1)
    return out


def _saved(comm, mpi_tmp, chunk_bytes: int | None = None):
    """Rank r saves 2r+1 particles (ids in rank order), a (2, 3) table of 2-D rows, and its rows of a Block."""
    n, r = comm.size, comm.rank
    first = r * r  # 1 + 3 + ... + (2r - 1)
    state = {"p": Ragged(_table(2 * r + 1, first)), "q": Ragged(np.full((r % 2 + 1, 2, 3), float(r))),
             "u": Block(np.full((2, 3), float(r)), (2 * r, 0), (2 * n, 3))}
    path = os.path.join(mpi_tmp, "ck")
    hpcckpt.save(state, path, comm=comm, **({} if chunk_bytes is None else {"chunk_bytes": chunk_bytes}))
    q = np.concatenate([np.full((k % 2 + 1, 2, 3), float(k)) for k in range(n)])
    return path, _table(n * n), q


def _rows_of(layout: str, nrows: int, size: int, rank: int):
    """The template's Ragged request and the rows it gets: an even split, or counts (uneven, in rank order)."""
    if layout == "split":
        return None, (nrows * rank // size, nrows * (rank + 1) // size)
    cuts = [0] + [min(nrows, (k * k + k) * nrows // (size * size + size)) for k in range(1, size)] + [nrows]
    return cuts[rank + 1] - cuts[rank], (cuts[rank], cuts[rank + 1])


@pytest.mark.parametrize("layout", ["split", "counts"])
@pytest.mark.parametrize("ranks", ["all", "fewer", "one"])
@pytest.mark.parametrize("mixed", [False, True])
def test_ragged_tables_load_exact_on_any_rank_count(comm, mpi_tmp, way, layout, ranks, mixed):
    """Ragged tables alone or with a Block (a code with particles), saved on every rank in several chunks each,
    loaded by an even split or by counts on every rank, on one rank fewer and on one rank: exact rows; the
    directory way is the metadata's bcast, one Scan and the directory's alltoalls (the second unless no rank
    needs a part of a chunk another rank reads), the gathered way the bcast or alltoall and its agreement."""
    path, p_all, q_all = _saved(comm, mpi_tmp, chunk_bytes=2 * ROWS.itemsize)
    n = comm.size
    sub = {"all": comm, "fewer": comm.Split(0 if comm.rank < n - 1 else 1, comm.rank),
           "one": comm.Split(comm.rank, 0)}[ranks]
    if ranks != "fewer" or comm.rank < n - 1:
        counting = CountingComm(sub)
        p_rows, p_want = _rows_of(layout, len(p_all), sub.size, sub.rank)
        q_rows, q_want = _rows_of(layout, len(q_all), sub.size, sub.rank)
        template = {"p": Ragged(rows=p_rows), "q": Ragged(rows=q_rows)}
        if mixed:
            lo, hi = 2 * n * sub.rank // sub.size, 2 * n * (sub.rank + 1) // sub.size
            template["u"] = Block(np.full((hi - lo, 3), -1.0), (lo, 0), (2 * n, 3))
        out = hpcckpt.load(template, path, comm=counting, strict=False)
        assert out["p"].local.dtype == ROWS and np.array_equal(out["p"].local, p_all[slice(*p_want)])
        assert np.array_equal(out["q"].local, q_all[slice(*q_want)])
        if mixed:
            assert np.array_equal(out["u"].local, np.repeat(np.arange(n, dtype=float), 2)[lo:hi, None] + np.zeros(3))
        calls = [c for c in counting.calls if c in COLLECTIVES]
        if way == "directory":
            assert calls[:3] == ["bcast", "Scan", "alltoall"] and calls[3:] in ([], ["alltoall"]), calls
            if sub.size == 1:
                assert calls == ["bcast", "Scan", "alltoall"], calls
        else:
            assert calls == ["alltoall", "allgather"], calls
    if sub is not comm:
        sub.Free()


def test_a_restart_with_the_saved_rows_needs_no_second_exchange(comm, mpi_tmp, way):
    """Every rank asks for as many rows as it saved: its rows are its own chunks, so the directory's first
    alltoall ends the plan (bcast, Scan, alltoall), and the rows are exact."""
    path, p_all, _ = _saved(comm, mpi_tmp)
    r = comm.rank
    counting = CountingComm(comm)
    out = hpcckpt.load({"p": Ragged(rows=2 * r + 1)}, path, comm=counting, strict=False)
    assert np.array_equal(out["p"].local, p_all[r * r:r * r + 2 * r + 1])
    calls = [c for c in counting.calls if c in COLLECTIVES]
    assert calls == (["bcast", "Scan", "alltoall"] if way == "directory" else ["alltoall", "allgather"]), calls


@pytest.mark.parametrize("problem", ["mixed", "negative", "all negative", "too many", "too few"])
def test_bad_row_requests_are_one_template_error_on_every_rank(comm, mpi_tmp, way, problem):
    """plan_rows's three refusals (a mix of Ragged() and counts, a negative count, counts that do not add up to
    the stored rows), found by the last rank's scan in the directory way: the same message on every rank.  (The
    gathered way once sent an even split as -1, so that Ragged(rows=-1) on every rank loaded an even split.)"""
    path, p_all, _ = _saved(comm, mpi_tmp)
    n, r = comm.size, comm.rank
    rows = {"mixed": None if r == 0 else 1, "negative": -1 if r == n - 1 else len(p_all) + 1 - n if r == 0 else 1, "all negative": -10**30,
            "too many": len(p_all) if r == 0 else 1, "too few": 0}[problem]
    want = {"mixed": "some ranks give Ragged\\(rows=...\\) and others do not",
            "negative": "a negative Ragged row count was requested",
            "all negative": "a negative Ragged row count was requested",
            "too many": f"the ranks ask for {len(p_all) + n - 1} rows in all but the checkpoint holds {len(p_all)}",
            "too few": f"the ranks ask for 0 rows in all but the checkpoint holds {len(p_all)}"}[problem]
    with pytest.raises(TemplateMismatchError, match=f"variable 'p': {want}") as info:
        hpcckpt.load({"p": Ragged(rows=rows)}, path, comm=comm, strict=False)
    assert len(set(comm.allgather(str(info.value)))) == 1


def test_a_count_above_the_stored_rows_is_refused_by_its_rank(comm, mpi_tmp, way):
    """A count that no rank count could make valid (here beyond int64, as one rank's typo could be) is that
    rank's template error, before any exchange: the same TemplateMismatchError on every rank, naming it."""
    path, p_all, _ = _saved(comm, mpi_tmp)
    n, r = comm.size, comm.rank
    rows = 10**30 if r == n - 1 else 1
    with pytest.raises(TemplateMismatchError, match=f"on 1 of {n} ranks: rank {n - 1}: variable 'p': "
                                                    f"Ragged\\(rows={10**30}\\) asks for more rows than the "
                                                    f"checkpoint holds \\({len(p_all)}\\)") as info:
        hpcckpt.load({"p": Ragged(rows=rows)}, path, comm=comm, strict=False)
    assert len(set(comm.allgather(str(info.value)))) == 1


def test_a_table_loaded_ragged_on_some_ranks_and_as_a_block_on_others_fails_on_every_rank(comm, mpi_tmp, way):
    path, p_all, _ = _saved(comm, mpi_tmp)
    r = comm.rank
    template = {"p": Ragged()} if r else {"p": Block(np.zeros(len(p_all), ROWS), (0,), (len(p_all),))}
    with pytest.raises(TemplateMismatchError, match="'p' is a Block on some ranks and Ragged on others") as info:
        hpcckpt.load(template, path, comm=comm, strict=False)
    assert len(set(comm.allgather(str(info.value)))) == 1


def test_one_rank_whose_template_check_fails_fails_the_load_on_every_rank(comm, mpi_tmp, way):
    """The last rank's rows have another trailing shape: its check fails before the scan, it adds nothing to it,
    and every rank raises its error, not a row count problem."""
    path, _, _ = _saved(comm, mpi_tmp)
    n, r = comm.size, comm.rank
    template = {"q": Ragged(np.zeros((0, 2, 4)) if r == n - 1 else None)}
    with pytest.raises(TemplateMismatchError, match=f"on 1 of {n} ranks: rank {n - 1}: variable 'q'.*trailing"):
        hpcckpt.load(template, path, comm=comm, strict=False)


@pytest.mark.parametrize("reshard", [False, True])
def test_a_corrupt_chunk_of_the_table_fails_the_load_on_every_rank(comm, mpi_tmp, way, reshard):
    """A bad checksum in the last rank's chunk of the table, found by the rank that reads it (its own rows; in a
    reshard, an even split, by the rank holding the chunk's centre or its largest part): a CorruptCheckpointError
    on every rank, no rank left waiting."""
    from hpcckpt.storage.metadata_file import read_metadata

    path, _, _ = _saved(comm, mpi_tmp)
    if comm.rank == 0:
        meta = read_metadata(path)
        chunks = meta.variables["p"].chunks
        k = len(chunks) - 1
        with open(os.path.join(path, meta.files[int(chunks.file[k])]), "r+b") as f:
            f.seek(int(chunks.offset[k]))
            b = f.read(1)
            f.seek(int(chunks.offset[k]))
            f.write(bytes([b[0] ^ 1]))
    comm.Barrier()
    rows = None if reshard else 2 * comm.rank + 1
    with pytest.raises(CorruptCheckpointError, match="fails its checksum"):
        hpcckpt.load({"p": Ragged(rows=rows)}, path, comm=comm, strict=False)


def test_a_failure_after_the_scan_fails_the_load_on_every_rank(comm, mpi_tmp, way, monkeypatch):
    """One rank breaks in its reads (after the scan in the directory way, after the plan in the gathered way):
    every rank raises its CheckpointError."""
    from hpcckpt.loading import load as loading

    path, _, _ = _saved(comm, mpi_tmp)
    if comm.rank == comm.size - 1:
        def broken(*args):
            raise RuntimeError("rows broke")
        monkeypatch.setattr(loading, "_read_early", broken)
        monkeypatch.setattr(loading, "_read", broken)
    with pytest.raises(CheckpointError, match=f"rank {comm.size - 1}: RuntimeError: rows broke"):
        hpcckpt.load({"p": Ragged(), "q": Ragged()}, path, comm=comm, strict=False)


def test_ragged_rows_of_a_stored_block_take_the_gathered_way_after_the_scan(comm, mpi_tmp, way):
    """A template asking Ragged rows of a variable saved as a Block (the scan does not place them): in the
    directory way every rank learns it in the first alltoall and takes the gathered way (an allgather of the
    requests, then the reads' agreement); the rows are exact either way."""
    path, p_all, _ = _saved(comm, mpi_tmp)
    n, r = comm.size, comm.rank
    counting = CountingComm(comm)
    out = hpcckpt.load({"u": Ragged(rows=2), "p": Ragged()}, path, comm=counting, strict=False)
    assert np.array_equal(out["u"].local, np.full((2, 3), float(r)))
    assert np.array_equal(out["p"].local, p_all[n * n * r // n:n * n * (r + 1) // n])
    calls = [c for c in counting.calls if c in COLLECTIVES]
    want = ["bcast", "Scan", "alltoall", "allgather", "allgather"] if way == "directory" else ["alltoall", "allgather"]
    assert calls == want, calls


@pytest.mark.parametrize("layout", ["split", "counts"])
def test_cast_rows_of_a_reshard_are_exact(comm, mpi_tmp, way, layout):
    """Rows cast on load (float64 stored, float32 asked on some ranks): a rank whose rows are cast cannot send
    from them, so the shared chunks it reads wholly go to the others from what it holds; exact after the cast."""
    path, _, q_all = _saved(comm, mpi_tmp, chunk_bytes=2 * 6 * 8)
    n, r = comm.size, comm.rank
    rows, want = _rows_of(layout, len(q_all), n, r)
    dtype = np.float32 if r % 2 else np.float64
    out = hpcckpt.load({"q": Ragged(np.zeros((0, 2, 3), dtype), rows=rows)}, path, comm=comm, strict=False, cast=True)
    assert out["q"].local.dtype == dtype and np.array_equal(out["q"].local, q_all[slice(*want)].astype(dtype))
