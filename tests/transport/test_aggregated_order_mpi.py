"""An aggregated file holds each rank's pieces together, in rank order, whatever order they arrive in.

Run with ``mpiexec -n N python tests/mpi_pytest.py --with-mpi -m mpi tests/transport/test_aggregated_order_mpi.py``
(N = 2, 3, 4).  One aggregator serves every rank; rank 1 has many more pieces
than the others, so the others' pieces arrive during its turn and wait
(received whole while they fit ``aggregator_buffer``, or left with their
sender), and the file must still read: the aggregator's own pieces, then rank
1's, then rank 2's ..., back to back, and every version restores exactly.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import hpcckpt
from hpcckpt import Block
from hpcckpt.storage.metadata_file import read_metadata

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(120)]


def rows_of(size: int) -> list[int]:
    """Rows per rank: rank 1 holds far more than the others (its turn lasts while the others send)."""
    return [6 if r != 1 else 90 for r in range(size)]


@pytest.mark.parametrize("codec", ["none", "lz4"])
@pytest.mark.parametrize("budget", [16, 200, 1 << 20])  # no piece fits / some fit / all fit while waiting
def test_one_aggregator_writes_the_ranks_in_rank_order(mpi_tmp, codec, budget):
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    counts = rows_of(comm.size)
    starts = np.concatenate([[0], np.cumsum(counts)]).tolist()
    total, ncols = starts[-1], 5
    g = (np.arange(total * ncols, dtype=np.float64) % 7).reshape(total, ncols)  # compressible for lz4
    lo, hi = starts[comm.rank], starts[comm.rank + 1]
    path = os.path.join(mpi_tmp, f"ck-{codec}-{budget}")
    hpcckpt.save({"u": Block(g[lo:hi].copy(), (lo, 0), (total, ncols), codec=codec)}, path, comm=comm,
                 strategy="aggregated", aggregators=1, chunk_bytes=2 * ncols * 8, aggregator_buffer=budget)
    out = np.full((hi - lo, ncols), -1.0)
    hpcckpt.load({"u": Block(out, (lo, 0), (total, ncols))}, path, comm=comm)
    assert np.array_equal(out, g[lo:hi])
    if comm.rank == 0:
        meta = read_metadata(path)
        assert meta.files == ["data/agg-000000.bin"]
        chunks = meta.variables["u"].chunks
        order = np.argsort(chunks.offset, kind="stable")
        writers = np.searchsorted(starts, chunks.start[order, 0], side="right") - 1
        assert np.all(np.diff(writers) >= 0), f"pieces out of rank order: {writers.tolist()}"
        assert writers.tolist()[0] == 0 and sorted(set(writers.tolist())) == list(range(comm.size))
        rows = chunks.start[order, 0]
        assert all(np.all(np.diff(rows[writers == r]) > 0) for r in range(comm.size)), "a rank's pieces reordered"
        ends = chunks.offset[order] + chunks.nbytes[order]
        assert np.array_equal(chunks.offset[order][1:], ends[:-1]), "the file has gaps or overlaps"
        assert os.path.getsize(os.path.join(path, meta.files[0])) == ends[-1]
        with hpcckpt.open(path) as view:
            assert np.array_equal(view.read("u"), g)


@pytest.mark.parametrize("budget", [768 << 10, 64 << 20])  # each chunk in three slices / in one
def test_the_members_large_chunks_are_stored_where_the_metadata_says(mpi_tmp, budget):
    """Chunks large enough for the storage to start them at their page phase (a gap before them) and streamed
    from a member in slices: each starts at the recorded offset and its slices follow it directly."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rows, ncols = 4096, 64  # 2 MiB of float64 per rank, one chunk each
    g = np.arange(comm.size * rows * ncols, dtype=np.float64).reshape(-1, ncols)
    lo = comm.rank * rows
    path = os.path.join(mpi_tmp, f"ck-large-{budget}")
    hpcckpt.save({"u": Block(g[lo:lo + rows].copy(), (lo, 0), g.shape)}, path, comm=comm,
                 strategy="aggregated", aggregators=1, aggregator_buffer=budget)
    out = np.full((rows, ncols), -1.0)
    hpcckpt.load({"u": Block(out, (lo, 0), g.shape)}, path, comm=comm)
    assert np.array_equal(out, g[lo:lo + rows])
    if comm.rank == 0:
        with hpcckpt.open(path) as view:
            assert np.array_equal(view.read("u"), g)
