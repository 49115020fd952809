"""A distributed directory of the chunks for the load plan: exchanges bounded by what each rank needs.

Instead of every rank receiving every rank's requests (an allgather that grows
with the rank count), each chunk of a variable has a directory rank
(:func:`directory_of`: chunks in id order, dealt out in contiguous runs).
Two sparse exchanges (an alltoall each, empty for most pairs):

1. every rank sends each directory the parts of its target boxes that fall in
   that directory's chunks (found through the chunk index), and rank 0 its
   signature (the names and kinds it loads); a rank whose template failed sends
   its failure to every rank instead;
2. each directory checks that the parts of each of its chunks cover the chunk
   (the chunks tile the array, so this is the covering of the whole array;
   parts may overlap: every rank reads its own region), picks the reader of each shared chunk (the
   largest part, lowest rank on ties) and tells every user the reader and, the
   reader only, every user's part; rank 0 also checks the signatures.  (Each
   rank's own block lies inside the array: hpcckpt.state.block_box checks it
   with the template.)  A
   problem found goes to every rank, and every rank raises the one from the
   lowest rank that found one.

A rank receives O(the chunks it touches + the chunks it directs) parts, plus a
few bytes per rank for the empty slots of the alltoall; rank 0 receives every
rank's signature (as the save's gather does).  Blocks only: a Ragged table's
row offsets depend on every rank's row count (loading.py plans checkpoints
that hold one with the allgather of hpcckpt.read_plan).  Pure: the MPI calls
are loading.py's.
"""

from __future__ import annotations

import numpy as np

from .metadata import Metadata
from .regions import covering_problem, volume


def directory_of(chunk: int, nchunks: int, nranks: int) -> int:
    """The directory rank of chunk ``chunk`` of a variable with ``nchunks`` chunks."""
    return chunk * nranks // nchunks


def directed(rank: int, nchunks: int, nranks: int) -> range:
    """The chunks ``rank`` directs: those ``k`` with ``directory_of(k) == rank``."""
    return range((rank * nchunks + nranks - 1) // nranks, ((rank + 1) * nchunks + nranks - 1) // nranks)


def parts_for_directories(meta: Metadata, boxes: dict, nranks: int) -> dict[int, list]:
    """Round 1: ``{directory rank: [(name, chunk, lo, hi), ...]}``, the parts of this rank's boxes per chunk."""
    out: dict[int, list] = {}
    for name in sorted(boxes):
        lo, hi = boxes[name]
        chunks = meta.variables[name].chunks
        ks = chunks.index().query(lo, hi)
        if not len(ks):
            continue
        a = np.maximum(chunks.start[ks], np.asarray(lo, np.int64)).tolist()
        b = np.minimum(chunks.stop[ks], np.asarray(hi, np.int64)).tolist()
        for k, pa, pb in zip(ks.tolist(), a, b):
            out.setdefault(directory_of(k, len(chunks), nranks), []).append((name, k, tuple(pa), tuple(pb)))
    return out


def signature_problem(signatures: list) -> str | None:
    """Rank 0: why the ranks' ``((name, kind), ...)`` differ (the messages of loading.plan_reads), or None."""
    first = dict(signatures[0])
    for rank, sig in enumerate(signatures):
        sig = dict(sig)
        if set(sig) != set(first):
            diff = sorted(set(sig) ^ set(first))
            return (f"the template's distributed names differ between ranks: rank {rank} and rank 0 disagree on "
                    f"{diff[:5]}")
        for name in sorted(sig):
            if sig[name] != first[name]:
                return f"variable {name!r} is a Block on some ranks and Ragged on others"
    return None


def decide(meta: Metadata, names: list, received: list, rank: int, nranks: int) -> tuple[str | None, dict]:
    """Round 2 on a directory: ``(problem, {user rank: [(name, chunk, reader, parts), ...]})``.

    ``names``: the variables loaded (this rank's template: rank 0 checks that
    every rank loads the same); ``received``: round 1's part lists, by sender.
    Every chunk this rank directs must be covered by the parts it received
    (no part at all is a gap).  A shared chunk's users all learn its reader;
    the reader gets every part, the others their own.
    """
    got: dict = {}
    for sender, parts in enumerate(received):
        for name, k, lo, hi in parts or ():
            got.setdefault((name, k), []).append((sender, lo, hi))
    out: dict[int, list] = {}
    for name in sorted(names):
        chunks = meta.variables[name].chunks
        for k in directed(rank, len(chunks), nranks):
            parts = got.get((name, k), [])
            c0, c1 = chunks.start[k].tolist(), chunks.stop[k].tolist()
            problem = _chunk_problem(parts, c0, c1)
            if problem is not None:
                where = ", ".join(f"{a}:{b}" for a, b in zip(c0, c1))
                return (f"variable {name!r}: the template's blocks do not cover the array: {problem} (within the "
                        f"stored chunk [{where}])"), {}
            if len(parts) < 2:
                continue
            sizes = [volume(b - a for a, b in zip(lo, hi)) for _, lo, hi in parts]
            reader = parts[max(range(len(parts)), key=lambda i: (sizes[i], -parts[i][0]))][0]
            for part in parts:
                out.setdefault(part[0], []).append((name, k, reader, parts if part[0] == reader else [part]))
    return None, out


def _chunk_problem(parts: list, c0: list, c1: list) -> str | None:
    """Why ``parts`` (``(rank, lo, hi)``, inside the chunk ``[c0, c1)``) do not cover it, or None (they may overlap)."""
    extent = [b - a for a, b in zip(c0, c1)]
    if not parts:
        if volume(extent) == 0:
            return None
        where = ", ".join(f"{a}:{b}" for a, b in zip(c0, c1))
        return f"no block covers its {volume(extent)} elements: there is a gap at [{where}], which is in none of them"
    if len(parts) <= _FEW and _tile_few(parts, volume(extent)):
        return None
    origin = np.asarray(c0, np.int64)
    starts = np.asarray([lo for _, lo, _ in parts], np.int64).reshape(len(parts), len(c0)) - origin
    stops = np.asarray([hi for _, _, hi in parts], np.int64).reshape(len(parts), len(c0)) - origin
    return covering_problem(starts, stops, extent, label="the block of rank", ids=[r for r, _, _ in parts],
                            origin=c0)


_FEW = 16  # parts of one chunk checked pairwise in plain Python (faster than numpy for a handful)


def _tile_few(parts: list, total: int) -> bool:
    """Whether a few parts inside a chunk of ``total`` elements tile it: no two overlap and they cover it."""
    if sum(volume(b - a for a, b in zip(lo, hi)) for _, lo, hi in parts) != total:
        return False
    for i, (_, lo, hi) in enumerate(parts):
        for _, lo2, hi2 in parts[i + 1:]:
            if all(a < d and c < b for a, b, c, d in zip(lo, hi, lo2, hi2)) and all(
                    a < b for a, b in zip(lo, hi)) and all(c < d for c, d in zip(lo2, hi2)):
                return False
    return True


def shared_from_assignments(assignments: list, names) -> dict:
    """This rank's ``shared`` (as read_plan.rank_reads gives it) from round 2's assignments, by sender."""
    shared: dict = {name: {} for name in names}
    for items in assignments:
        for name, k, reader, parts in items or ():
            shared[name][k] = (reader, parts)
    return shared
