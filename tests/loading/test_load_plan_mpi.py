"""The load plan across ranks: the chunk directory of Block-only checkpoints and the allgather way
of Ragged ones give exact data on any rank count, bad templates fail on every rank, and the collectives are
counted.

Run with ``mpiexec -n N python tests/mpi_pytest.py --with-mpi -m mpi tests/loading/test_load_plan_mpi.py`` (N = 2..4).
"""

from __future__ import annotations

import contextlib
import os

import numpy as np
import pytest

import hpcckpt
from hpcckpt import Block, Ragged, TemplateMismatchError
from decompositions import global_array, grid_blocks
from mpitools import CountingComm

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(120)]

COLLECTIVES = {"allgather", "gather", "bcast", "scatter", "allreduce", "exscan", "Scan", "Barrier", "barrier", "alltoall",
               "Allgather", "Gather", "Bcast", "Scatter", "Allreduce", "Alltoallv", "Split", "Dup"}


@pytest.fixture
def comm():
    from mpi4py import MPI

    return MPI.COMM_WORLD


def _local(g, box):
    return np.ascontiguousarray(g[tuple(slice(a, b) for a, b in zip(*box))])


def _shared_seed(comm, k):
    return comm.bcast(int(np.random.default_rng().integers(1 << 30)) if comm.rank == 0 else None) + k


@pytest.mark.parametrize("k", range(4))
def test_random_block_reshards_both_ways_are_exact(comm, mpi_tmp, k, table_form):
    """Random uneven 3-D decompositions (empty blocks, permuted): saved on all ranks, loaded on all ranks with
    another decomposition and on one rank fewer (a sub-communicator), exact on every rank."""
    seed = _shared_seed(comm, k)
    rng = np.random.default_rng(seed)
    shape = tuple(int(x) for x in rng.integers(1, 9, size=3))
    g = global_array(shape, np.float64, seed=seed % 1000)
    saved = grid_blocks(rng, shape, comm.size)
    path = os.path.join(mpi_tmp, "ck")
    hpcckpt.save({"u": Block(_local(g, saved[comm.rank]), saved[comm.rank][0], shape)}, path, comm=comm,
                 chunk_bytes=int(rng.integers(8, 200)))
    for sub in (comm, comm.Split(0 if comm.rank < comm.size - 1 else 1, comm.rank)):
        boxes = grid_blocks(np.random.default_rng(seed + 7 + sub.size), shape, sub.size)
        if sub.size == comm.size or comm.rank < comm.size - 1:
            box = boxes[sub.rank]
            out = np.full(tuple(b - a for a, b in zip(*box)), -1.0)
            hpcckpt.load({"u": Block(out, box[0], shape)}, path, comm=sub)
            assert np.array_equal(out, _local(g, box))
        if sub is not comm:
            sub.Free()


def _saved(comm, mpi_tmp, ragged=False):
    n, r = comm.size, comm.rank
    shape = (2 * n, 3)
    state = {"u": Block(np.full((2, 3), float(r)), (2 * r, 0), shape), "v": Block(np.ones((2, 3)), (2 * r, 0), shape)}
    if ragged:
        state["p"] = Ragged(np.arange(r + 1.0))
    path = os.path.join(mpi_tmp, "ck")
    hpcckpt.save(state, path, comm=comm)
    return path, shape


@pytest.mark.parametrize("ragged", [False, True])
def test_an_overlapping_load_template_gives_every_rank_its_region(comm, mpi_tmp, ragged):
    """Both ways of planning (the chunk directory; the allgather when a Ragged table is loaded) accept blocks
    that overlap on load: reading is not ambiguous."""
    path, shape = _saved(comm, mpi_tmp, ragged)
    whole = hpcckpt.open(path).read("u") if comm.rank == 0 else None
    whole = comm.bcast(whole, root=0)
    r = comm.rank
    lo = max(2 * r - 1, 0)
    template = {"u": Block(np.full((2 * r + 2 - lo, 3), -1.0), (lo, 0), shape)}
    if ragged:
        template["p"] = Ragged()
    out = hpcckpt.load(template, path, comm=comm, strict=False)
    np.testing.assert_array_equal(out["u"].local, whole[lo:2 * r + 2])


@pytest.mark.parametrize("problem", ["gap", "twice", "outside", "names", "kinds"])
@pytest.mark.parametrize("ragged", [False, True])
def test_a_bad_load_template_fails_on_every_rank(comm, mpi_tmp, problem, ragged):
    path, shape = _saved(comm, mpi_tmp, ragged)
    n, r = comm.size, comm.rank
    victim = n - 1
    template = {"u": Block(np.zeros((2, 3)), (2 * r, 0), shape), "v": Block(np.zeros((2, 3)), (2 * r, 0), shape)}
    if ragged:
        template["p"] = Ragged()
    strict = True
    if r == victim:
        if problem == "gap":
            template["u"] = Block(np.zeros((1, 3)), (2 * r, 0), shape)
        elif problem == "twice":  # whole saved chunks, so every rank reads all it needs: rank 0's rows twice
            template["u"] = Block(np.zeros((2, 3)), (0, 0), shape)
        elif problem == "outside":
            template["u"] = Block(np.zeros((2, 3)), (2 * r + 1, 0), shape)
        elif problem == "names":
            del template["v"]
            strict = False
        else:
            template["u"] = Ragged(rows=2)
    match = {"gap": "'u'.*gap", "twice": "'u'.*gap", "outside": f"rank {victim}: variable 'u'.*does not fit",
             "names": "names differ between ranks.*'v'", "kinds": "'u' is a Block on some ranks and Ragged"}[problem]
    with pytest.raises(TemplateMismatchError, match=match):
        hpcckpt.load(template, path, comm=comm, strict=strict)


def _rows(nrows: int, size: int, rank: int, layout: str) -> tuple[int, int]:
    """Rank ``rank``'s rows of ``nrows`` over a communicator of ``size`` ranks: an even split ("split": the saved
    blocks of 2 rows per rank on as many ranks as saved, unaligned with them on fewer), the split with every
    inner boundary moved down a row ("shifted": unaligned on any count), or the split with a row of halo on each
    side ("halo": the blocks overlap)."""
    lo, hi = nrows * rank // size, nrows * (rank + 1) // size
    if layout == "shifted":
        return lo + (rank > 0), hi + (rank < size - 1)
    if layout == "halo":
        return max(lo - 1, 0), min(hi + 1, nrows)
    return lo, hi


@pytest.fixture(params=["own", "bcast"])
def metadata_way(request, monkeypatch):
    """How a load gets the metadata: every rank reads it (at most loading.PER_RANK_METADATA_MAX_RANKS ranks, as
    here), or rank 0 broadcasts it (beyond: the threshold set to 0).  Returns the collectives it adds first."""
    from hpcckpt.loading import load as loading

    if request.param == "bcast":
        monkeypatch.setattr(loading, "PER_RANK_METADATA_MAX_RANKS", 0)
        return ["bcast"]
    return []


@pytest.mark.parametrize("layout", ["split", "shifted", "halo"])
@pytest.mark.parametrize("ragged", [False, True])
@pytest.mark.parametrize("ranks", ["all", "fewer", "one"])
def test_a_load_makes_at_most_three_collectives(comm, mpi_tmp, layout, ragged, ranks, table_form, metadata_way):
    """The metadata (each rank reads it on a few ranks; else rank 0's bcast), then the chunk directory's first
    alltoall (the reads come before it, their failures ride on it), and its second only when some rank needs a
    part of a chunk another rank reads; with a Ragged table, after the broadcast one Scan first (each rank's
    rows), and when each rank read the metadata, every rank's requests instead (an alltoall: the same first
    collective as the directory's) and the read's agreement; the shared parts move point to point.  On every rank, on one rank fewer (reshard: unaligned with
    the saved blocks of 2 rows, but for 2 ranks: one rank loads all) and on a one-rank communicator (each rank
    loads the whole array alone, with any layout): the second alltoall is left out exactly when every rank's rows
    are whole saved chunks (boundaries on even rows) and the blocks do not overlap.  Checkpointer.restore reads
    the metadata with the version listing (tests/saving/test_plan_cache.py)."""
    path, shape = _saved(comm, mpi_tmp, ragged)
    n = comm.size
    whole = hpcckpt.open(path).read("u") if comm.rank == 0 else None
    whole = comm.bcast(whole, root=0)
    sub = {"all": comm, "fewer": comm.Split(0 if comm.rank < n - 1 else 1, comm.rank),
           "one": comm.Split(comm.rank, 0)}[ranks]
    if ranks != "fewer" or comm.rank < n - 1:
        lo, hi = _rows(2 * n, sub.size, sub.rank, layout)
        counting = CountingComm(sub)
        template = {"u": Block(np.full((hi - lo, 3), -1.0), (lo, 0), shape), "v": Block(np.zeros((hi - lo, 3)),
                                                                                        (lo, 0), shape)}
        if ragged:
            template["p"] = Ragged()
        out = hpcckpt.load(template, path, comm=counting)
        calls = [c for c in counting.calls if c in COLLECTIVES]
        aligned = all(x % 2 == 0 for q in range(sub.size) for x in _rows(2 * n, sub.size, q, layout))
        saved_rows = [q * (q + 1) // 2 for q in range(n + 1)]  # the table's saved chunk boundaries
        split_on_saved = all(saved_rows[-1] * q // sub.size in saved_rows for q in range(sub.size))
        own_chunks = aligned and (layout != "halo" or sub.size == 1) and (not ragged or split_on_saved)
        expected = metadata_way + (["alltoall", "allgather"] if ragged and not metadata_way else
                                   (["Scan"] if ragged else []) + (["alltoall"] if own_chunks else
                                                                  ["alltoall", "alltoall"]))
        assert calls == expected, calls
        assert np.array_equal(out["u"].local, whole[lo:hi]) and np.array_equal(out["v"].local, np.ones((hi - lo, 3)))
        if ragged:
            rows = np.concatenate(sub.allgather(out["p"].local))
            assert np.array_equal(rows, np.concatenate([np.arange(r + 1.0) for r in range(n)]))
    if sub is not comm:
        sub.Free()


def test_a_restart_on_the_saved_decomposition_makes_one_collective_more_than_its_metadata(comm, mpi_tmp,
                                                                                          metadata_way):
    """A 2-D grid saved in several chunks per rank and loaded on the same blocks, some ranks casting to float32,
    and the same checkpoint loaded without a template (rows split evenly: the saved ones here): every rank
    reads all it needs itself, so the load is the metadata (read by each rank, or broadcast) and the directory's
    first alltoall, exact."""
    n, r = comm.size, comm.rank
    shape = (4 * n, 6)
    g = global_array(shape, np.float64, seed=11)
    box = ((4 * r, 0), (4 * r + 4, 6))
    path = os.path.join(mpi_tmp, "ck")
    hpcckpt.save({"u": Block(_local(g, box), box[0], shape), "t": 5}, path, comm=comm, chunk_bytes=2 * 6 * 8)
    counting = CountingComm(comm)
    out = np.zeros((4, 6), np.float32 if r % 2 else np.float64)
    got = hpcckpt.load({"u": Block(out, box[0], shape), "t": None}, path, comm=counting, cast=True)
    assert [c for c in counting.calls if c in COLLECTIVES] == metadata_way + ["alltoall"], counting.calls
    assert np.array_equal(out, _local(g, box).astype(out.dtype)) and got["t"] == 5
    counting.calls.clear()
    got = hpcckpt.load(None, path, comm=counting)
    assert [c for c in counting.calls if c in COLLECTIVES] == metadata_way + ["alltoall"], counting.calls
    assert np.array_equal(got["u"].local, _local(g, box))


def test_a_restore_on_a_few_ranks_lists_on_rank_0_and_reads_the_metadata_on_every_rank(comm, mpi_tmp, monkeypatch):
    """Checkpointer.restore on the saved decomposition: rank 0's listing (a broadcast without the metadata),
    then each rank reads the metadata itself (as hpcckpt.load does on a few ranks) and the directory's
    alltoall; exact.  Newest metadata damaged on one rank's view: every rank skips to the older version."""
    from hpcckpt.loading import load as loading

    reads = []
    real = loading.version_metadata
    monkeypatch.setattr(loading, "version_metadata", lambda *a, **kw: (reads.append(a[0]), real(*a, **kw))[1])
    n, r = comm.size, comm.rank
    shape = (2 * n, 3)
    counting = CountingComm(comm)
    with hpcckpt.Checkpointer(os.path.join(mpi_tmp, "root"), comm=counting, track_failures=False) as ck:
        for step in (1, 2):
            ck.save({"u": Block(np.full((2, 3), 10.0 * step + r), (2 * r, 0), shape)}, step=step)
        counting.calls.clear()
        out = np.zeros((2, 3))
        ck.restore({"u": Block(out, (2 * r, 0), shape)})
        seen = comm.allgather(([c for c in counting.calls if c in COLLECTIVES], len(reads)))
        assert seen == [(["bcast", "alltoall"], 1)] * n, seen
        assert np.array_equal(out, np.full((2, 3), 20.0 + r))
        newest = os.path.join(os.path.dirname(reads[0]), os.path.basename(reads[0]), "metadata.json")
        comm.Barrier()
        if r == n - 1:  # what the last rank reads of the newest version is damaged (rank 0 lists it as committed)
            monkeypatch.setattr(loading, "version_metadata", lambda d, *a, **kw: (
                real(d, *a, **kw) if os.path.join(d, "metadata.json") != newest else real(newest + ".none")))
        with pytest.warns(UserWarning, match="skipping unusable version") if r == 0 else contextlib.nullcontext():
            ck.restore({"u": Block(out, (2 * r, 0), shape)})
        assert np.array_equal(out, np.full((2, 3), 10.0 + r))


def test_one_rank_needing_a_part_from_another_takes_the_second_exchange(comm, mpi_tmp):
    """Every rank on its saved rows but the last two, whose boundary moves up a row: the last rank needs a row of
    a chunk the rank before it reads (it holds the chunk's centre), so the directory's second alltoall runs, on
    every rank, and the row arrives exact."""
    path, shape = _saved(comm, mpi_tmp)
    n, r = comm.size, comm.rank
    whole = comm.bcast(hpcckpt.open(path).read("u") if r == 0 else None, root=0)
    lo, hi = 2 * r + (r == n - 1), 2 * r + 2 + (r == n - 2)
    counting = CountingComm(comm)
    template = {"u": Block(np.full((hi - lo, 3), -1.0), (lo, 0), shape),
                "v": Block(np.zeros((hi - lo, 3)), (lo, 0), shape)}
    out = hpcckpt.load(template, path, comm=counting)
    assert [c for c in counting.calls if c in COLLECTIVES] == ["alltoall", "alltoall"], counting.calls
    assert np.array_equal(out["u"].local, whole[lo:hi]) and np.array_equal(out["v"].local, np.ones((hi - lo, 3)))


def test_an_overlapping_cast_load_reads_after_the_plan_and_agrees_once_more(comm, mpi_tmp):
    """The one case the directory cannot serve from its early reads: a rank needs part of a chunk that only
    ranks holding it wholly in a cast target read (they cannot send it in the stored dtype).  It reads that part
    itself after the plan, and the load agrees once more (4 collectives); the data is exact."""
    path, shape = _saved(comm, mpi_tmp)
    n, r = comm.size, comm.rank
    whole = comm.bcast(hpcckpt.open(path).read("u") if r == 0 else None, root=0)
    lo, hi = _rows(2 * n, n, r, "halo")
    counting = CountingComm(comm)
    template = {"u": Block(np.zeros((hi - lo, 3), np.float32 if r % 2 == 0 else np.float64), (lo, 0), shape),
                "v": Block(np.zeros((hi - lo, 3)), (lo, 0), shape)}
    out = hpcckpt.load(template, path, comm=counting, cast=True)
    calls = [c for c in counting.calls if c in COLLECTIVES]
    assert calls == ["alltoall", "alltoall", "allgather"], calls
    assert np.array_equal(out["u"].local, whole[lo:hi].astype(out["u"].local.dtype))


@pytest.mark.parametrize("layout", ["same", "reshard"])
def test_a_corrupt_chunk_read_by_one_rank_fails_the_load_on_every_rank(comm, mpi_tmp, layout):
    """The reads come before the directory's exchanges and no agreement follows them: a bad checksum found by
    one rank (its own chunk; in a reshard, a shared chunk it reads for another rank) must still be the same
    CorruptCheckpointError on every rank, with no rank left waiting."""
    from hpcckpt import CorruptCheckpointError
    from hpcckpt.storage.metadata_file import read_metadata

    path, shape = _saved(comm, mpi_tmp)
    n = comm.size
    sub = comm if layout == "same" else comm.Split(0 if comm.rank < n - 1 else 1, comm.rank)
    if comm.rank == 0:
        chunks = read_metadata(path).variables["u"].chunks
        k = n - 1  # the same layout: the last rank's own chunk
        if layout == "reshard":  # a chunk (2 rows) split between two of the n - 1 ranks: read by one, sent on
            k = next(((e - 1) // 2 for e in (2 * n * (r + 1) // (n - 1) for r in range(n - 1)) if e % 2), k)
        victim = os.path.join(path, read_metadata(path).files[int(chunks.file[k])])
        with open(victim, "r+b") as f:
            f.seek(int(chunks.offset[k]))
            b = f.read(1)
            f.seek(int(chunks.offset[k]))
            f.write(bytes([b[0] ^ 1]))
    comm.Barrier()
    if layout == "same" or comm.rank < n - 1:
        lo, hi = _rows(2 * n, sub.size, sub.rank, "split")
        template = {"u": Block(np.zeros((hi - lo, 3)), (lo, 0), shape), "v": Block(np.zeros((hi - lo, 3)), (lo, 0),
                                                                                    shape)}
        with pytest.raises(CorruptCheckpointError, match="fails its checksum"):
            hpcckpt.load(template, path, comm=sub)
    if sub is not comm:
        sub.Free()


@pytest.mark.parametrize("ragged", [False, True])
@pytest.mark.parametrize("problem", ["missing", "corrupt"])
def test_metadata_one_rank_cannot_read_fails_the_load_on_every_rank(comm, mpi_tmp, monkeypatch, ragged, problem):
    """Each rank reads the metadata itself (a few ranks): when one rank cannot (a missing file, a failed check:
    here made so on the last rank alone), it still enters the load's first alltoall, which is the first
    collective of both ways (the directory's, and the Ragged requests'), and every rank raises its error."""
    from hpcckpt import CheckpointError, CorruptCheckpointError
    from hpcckpt.loading import load as loading

    path, shape = _saved(comm, mpi_tmp, ragged)
    r, n = comm.rank, comm.size
    if r == n - 1:
        def unreadable(directory, storage, expect_step=None):
            if problem == "missing":
                raise CheckpointError(f"no committed checkpoint at {directory!r} (metadata.json is missing)")
            raise CorruptCheckpointError(f"{directory}/metadata.json fails its checksum")
        monkeypatch.setattr(loading, "version_metadata", unreadable)
    template = {"u": Block(np.zeros((2, 3)), (2 * r, 0), shape), "v": Block(np.zeros((2, 3)), (2 * r, 0), shape)}
    if ragged:
        template["p"] = Ragged()
    cls, text = (CheckpointError, "is missing") if problem == "missing" else (CorruptCheckpointError, "checksum")
    with pytest.raises(cls, match=f"on 1 of {n} ranks: rank {n - 1}: .*{text}"):
        hpcckpt.load(template, path, comm=comm)


def test_a_failure_inside_the_directory_fails_the_load_on_every_rank(comm, mpi_tmp, monkeypatch):
    """The directory's second round runs (the rows are shifted off the saved chunks) and breaks on one rank."""
    from hpcckpt import CheckpointError
    from hpcckpt.loading import plan as load_plan

    path, shape = _saved(comm, mpi_tmp)
    r = comm.rank
    if r == comm.size - 1:
        def broken(*args):
            raise RuntimeError("directory broke")
        monkeypatch.setattr(load_plan, "decide", broken)
    lo, hi = _rows(2 * comm.size, comm.size, r, "shifted")
    template = {"u": Block(np.zeros((hi - lo, 3)), (lo, 0), shape), "v": Block(np.zeros((hi - lo, 3)), (lo, 0),
                                                                                 shape)}
    with pytest.raises(CheckpointError, match=f"rank {comm.size - 1}: RuntimeError: directory broke"):
        hpcckpt.load(template, path, comm=comm)


def test_strided_parts_are_sent_in_place_and_exact(comm, mpi_tmp, monkeypatch):
    """A 3-D array saved split along its last axis and loaded with a halo along it: the parts other ranks hold
    are strided in the sender's memory (its target, or a chunk it holds), sent as MPI subarrays without a copy."""
    from hpcckpt.loading import load as loading

    n, r = comm.size, comm.rank
    shape = (3, 4, 4 * n)
    g = global_array(shape, np.float64, seed=3)
    lo2, hi2 = 4 * r, 4 * r + 4
    path = os.path.join(mpi_tmp, "ck")
    hpcckpt.save({"u": Block(np.ascontiguousarray(g[:, :, lo2:hi2]), (0, 0, lo2), shape)}, path, comm=comm,
                 chunk_bytes=int(np.prod(shape[:2])) * 4 * 8 // 2)  # two chunks per rank, split along axis 0
    strided = []
    exchange = loading._exchange

    def counted(comm_, meta, targets, shared, outgoing):
        strided.append(sum(not s[tuple(slice(x, y) for x, y in zip(a, b))].flags.c_contiguous
                           for _, s, a, b in outgoing))
        return exchange(comm_, meta, targets, shared, outgoing)

    monkeypatch.setattr(loading, "_exchange", counted)
    for halo in (1, 2):
        lo, hi = (0, 0, max(lo2 - halo, 0)), (3, 4, min(hi2 + halo, 4 * n))
        out = np.full(tuple(b - a for a, b in zip(lo, hi)), -1.0)
        hpcckpt.load({"u": Block(out, lo, shape)}, path, comm=comm)
        assert np.array_equal(out, g[tuple(slice(a, b) for a, b in zip(lo, hi))])
    assert sum(comm.allgather(sum(strided))) > 0  # the subarray path was taken
