"""A distributed directory of the chunks for the load plan: exchanges bounded by what each rank needs.

Instead of every rank receiving every rank's requests (an allgather that grows
with the rank count), each chunk of a variable has a directory rank
(:func:`directory_of`: chunks in id order, dealt out in contiguous runs).

Who reads a chunk is decided by each rank alone, from the metadata and its own
box (:func:`chunk_roles`), so that every rank reads before any exchange and a
failed read travels in the first one: a rank reads every chunk that lies wholly
inside its box (``WHOLE``) and every chunk it shares whose centre element (per
axis ``(start + stop - 1) // 2``) lies in its box (``HOLDS``: it keeps the
chunk to send the other users their parts); it receives its part of any other
chunk (``NEEDS``).  The blocks of a template that tiles the array hold each
centre exactly once, so each shared chunk is read once, by the rank holding
its centre.  Two sparse exchanges (an alltoall each, empty for most pairs):

1. every rank sends each directory the parts of its target boxes that fall in
   that directory's chunks with its role there, and rank 0 its signature (the
   names and kinds it loads); a rank whose template or reads failed sends its
   failure to every rank instead;
2. each directory checks that the parts of each of its chunks cover the chunk
   (the chunks tile the array, so this is the covering of the whole array;
   parts may overlap: every rank reads its own region), picks the sender of
   each chunk that a ``NEEDS`` rank uses (the lowest rank that read it and can
   send it) and tells the sender every such part and each of those users the
   sender; rank 0 also checks the signatures.  (Each rank's own block lies
   inside the array: hpcckpt.state.block_box checks it with the template.)  A
   problem found goes to every rank, and every rank raises the one from the
   lowest rank that found one.

The first exchange also answers, on every rank alike, whether the second is
needed at all (:func:`fast_summary`, :func:`all_self_sufficient`): when
every rank's boxes are unions of whole chunks (``WHOLE`` roles only: a
restart on the same decomposition) and the ranks' boxes tile every array
(checked through a fingerprint of the boxes, :func:`box_fingerprint`), no
rank needs a part from another: every rank already holds its data and the
load ends after one exchange.

Only a template whose blocks overlap can leave a needed chunk without a sender:
when the only ranks that read it hold it wholly in a target they cannot send
from (a cast dtype, a device array), the users read it themselves after the
plan (``reread``: the load then needs an agreement after those reads).

A rank receives O(the chunks it touches + the chunks it directs) parts, plus a
few bytes per rank for the empty slots of the alltoall; rank 0 receives every
rank's signature (as the save's gather does).  A Ragged table's rows are a
box like a Block's once each rank knows them (load_plan.scan_rows, one scan
of a few numbers per table: hpcckpt.loading.ragged_rows).  Pure: the MPI calls are
loading/plan.py's.
"""

from __future__ import annotations

import numpy as np
import xxhash

from hpcckpt.format.metadata import Metadata
from hpcckpt.core.regions import covering_problem, volume


def directory_of(chunk: int, nchunks: int, nranks: int) -> int:
    """The directory rank of chunk ``chunk`` of a variable with ``nchunks`` chunks."""
    return chunk * nranks // nchunks


def directed(rank: int, nchunks: int, nranks: int) -> range:
    """The chunks ``rank`` directs: those ``k`` with ``directory_of(k) == rank``."""
    return range((rank * nchunks + nranks - 1) // nranks, ((rank + 1) * nchunks + nranks - 1) // nranks)


#: A rank's role in a chunk its box touches (:func:`chunk_roles`).
NEEDS = 0  # it receives its part from the chunk's sender
HOLDS = 1  # it shares the chunk, holds its centre: reads it whole, keeps it, can send
WHOLE = 2  # the chunk lies wholly in its box: read into the target, which can send from it
WHOLE_UNSENDABLE = 3  # the same, into a target it cannot send from (a cast dtype, a device array)


def centre(start, stop):
    """The centre element of the boxes ``[start, stop)``, per axis (numpy arrays or integers)."""
    return (start + stop - 1) // 2


def chunk_roles(meta: Metadata, boxes: dict, sendable=frozenset()) -> dict[str, list]:
    """``{name: [(chunk, lo, hi, role), ...]}``: this rank's part of each chunk its box touches, and its role.

    ``boxes``: ``{name: (start, stop)}``; ``sendable``: the names whose target
    holds the stored dtype in host memory (a ``WHOLE`` chunk can be sent from
    it).  Decided from the metadata and this rank's box alone (the module
    docstring), so every rank can read before the plan's exchanges.
    """
    out: dict[str, list] = {}
    for name in sorted(boxes):
        lo, hi = (np.asarray(x, np.int64) for x in boxes[name])
        chunks = meta.variables[name].chunks
        ks = chunks.index().query(lo, hi)
        c0, c1 = chunks.start[ks], chunks.stop[ks]
        a, b = np.maximum(c0, lo), np.minimum(c1, hi)
        mid = centre(c0, c1)
        whole = np.all((a == c0) & (b == c1), axis=1)
        holds = np.all((mid >= lo) & (mid < hi), axis=1)
        roles = np.where(whole, WHOLE if name in sendable else WHOLE_UNSENDABLE, np.where(holds, HOLDS, NEEDS))
        out[name] = [(k, tuple(pa), tuple(pb), role) for k, pa, pb, role in
                     zip(ks.tolist(), a.tolist(), b.tolist(), roles.tolist())]
    return out


def parts_for_directories(meta: Metadata, roles: dict, nranks: int) -> dict[int, list]:
    """Round 1: ``{directory rank: [(name, chunk, lo, hi, role), ...]}`` from :func:`chunk_roles`'s answer."""
    out: dict[int, list] = {}
    for name in sorted(roles):
        nchunks = len(meta.variables[name].chunks)
        for k, lo, hi, role in roles[name]:
            out.setdefault(directory_of(k, nchunks, nranks), []).append((name, k, lo, hi, role))
    return out


def signature_problem(signatures: list) -> str | None:
    """Rank 0: why the ranks' ``((name, kind), ...)`` differ (the messages of loading.plan_reads), or None."""
    if all(sig == signatures[0] for sig in signatures):  # the usual answer, in tuple comparisons alone
        return None
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


def decide(meta: Metadata, names: list, received: list, rank: int, nranks: int) -> tuple[str | None, dict, bool]:
    """Round 2 on a directory: ``(problem, {user rank: [(name, chunk, sender, parts), ...]}, reread)``.

    ``names``: the variables loaded (this rank's template: rank 0 checks that
    every rank loads the same); ``received``: round 1's part lists, by sender.
    Every chunk this rank directs must be covered by the parts it received
    (no part at all is a gap).  For a chunk that a ``NEEDS`` rank uses, the
    sender (the lowest rank that read it and can send it) gets every such
    part, and each such user its own with the sender; without a sender the
    users are named their own senders (they read it after the plan) and
    ``reread`` is True.
    """
    got: dict = {}
    for sender, parts in enumerate(received):
        for name, k, lo, hi, role in parts or ():
            got.setdefault((name, k), []).append((sender, lo, hi, role))
    out: dict[int, list] = {}
    reread = False
    for name in sorted(names):
        chunks = meta.variables[name].chunks
        for k in directed(rank, len(chunks), nranks):
            parts = got.get((name, k), [])
            c0, c1 = chunks.start[k].tolist(), chunks.stop[k].tolist()
            problem = _chunk_problem([p[:3] for p in parts], c0, c1)
            if problem is not None:
                where = ", ".join(f"{a}:{b}" for a, b in zip(c0, c1))
                return (f"variable {name!r}: the template's blocks do not cover the array: {problem} (within the "
                        f"stored chunk [{where}])"), {}, False
            needs = [p[:3] for p in parts if p[3] == NEEDS]
            if not needs:
                continue
            sender = next((p[0] for p in parts if p[3] in (HOLDS, WHOLE)), None)
            if sender is None:
                reread = True
            else:
                out.setdefault(sender, []).append((name, k, sender, needs))
            for part in needs:
                out.setdefault(part[0], []).append((name, k, part[0] if sender is None else sender, [part]))
    return None, out, reread


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


#: The prime field of :func:`box_fingerprint` (2**61 - 1, a Mersenne prime).
FIELD = (1 << 61) - 1


def _base(name: str, axis: int, which: int) -> int:
    """A fixed element of the field, neither 0 nor 1, for one axis of variable ``name`` (the same on every rank)."""
    return 2 + xxhash.xxh3_64_intdigest(f"{which}\0{axis}\0{name}".encode("utf-8", "surrogatepass")) % (FIELD - 2)


def box_fingerprint(name: str, start, stop) -> tuple[int, int]:
    """Two fingerprints of the box ``[start, stop)`` of variable ``name``: ``prod_d (z_d**stop_d - z_d**start_d)``
    mod :data:`FIELD`, for two fixed sets of bases ``z`` (:func:`_base`).

    ``(z**b - z**a) = (z - 1) * sum_{a <= x < b} z**x``, so the sum over boxes
    of their fingerprints is ``prod_d (z_d - 1)`` times the polynomial
    ``sum_e c(e) z**e`` over the elements ``e``, ``c(e)`` the number of boxes
    holding ``e``; it equals the whole array's fingerprint exactly when every
    ``c(e)`` is 1 (the boxes tile the array) or when the bases are a root of
    the difference, a nonzero polynomial of degree at most the sum of the
    extents: for any template that does not tile, a chance of at most
    ``(sum of extents / 2**61)**2`` with the two sets (Schwartz-Zippel).  An
    empty box gives 0.  O(ndim) work whatever the box.
    """
    out = []
    for which in (0, 1):
        f = 1
        for axis, (a, b) in enumerate(zip(start, stop)):
            z = _base(name, axis, which)
            f = f * (pow(z, int(b), FIELD) - pow(z, int(a), FIELD)) % FIELD
        out.append(f)
    return out[0], out[1]


def fast_summary(meta: Metadata, boxes: dict, roles: dict, signature: tuple, rank: int) -> int | None:
    """What this rank tells every rank in the first exchange so that all can tell whether the second is needed:
    one int packing a 64-bit digest of ``signature`` and two fingerprints (61 bits each: about 38 bytes
    pickled), or None unless every chunk its boxes touch lies wholly in them.

    A rank that shares a chunk (``NEEDS``, or ``HOLDS``) rules the short way out in any case: in a tiling
    the other users of a shared chunk need their parts, and a template that does not tile takes the second
    exchange anyway; so in a reshard most slots stay None (a few bytes each).

    The fingerprints are the sums of :func:`box_fingerprint` of this rank's
    boxes, minus (on rank 0) the whole arrays' of the names it loads: they sum
    to zero over the ranks when the ranks' boxes tile every array
    (:func:`all_self_sufficient`).  0-d variables are left out (every rank
    holds the one element: they are covered whenever a rank loads them, and
    the digests make every rank load the same names).
    """
    if any(role in (NEEDS, HOLDS) for name in roles for _, _, _, role in roles[name]):
        return None
    f0 = f1 = 0
    for name in sorted(boxes):
        shape = meta.variables[name].shape
        if not shape:
            continue
        g0, g1 = box_fingerprint(name, *boxes[name])
        f0, f1 = f0 + g0, f1 + g1
        if rank == 0:
            g0, g1 = box_fingerprint(name, (0,) * len(shape), shape)
            f0, f1 = f0 - g0, f1 - g1
    digest = xxhash.xxh3_64_intdigest(repr(signature).encode("utf-8", "surrogatepass"))
    return (digest << 122) | (f0 % FIELD) << 61 | (f1 % FIELD)


_FINGERPRINT_MASK = (1 << 61) - 1


def all_self_sufficient(summaries: list) -> bool:
    """Whether the load is complete after the first exchange: every rank's :func:`fast_summary` is set (none needs
    a part from another), the ranks load the same names and kinds (equal digests), and their boxes tile every
    array (the fingerprints sum to zero).  The same answer on every rank: it is a function of what all received.
    """
    if not summaries or any(s is None for s in summaries) or len({s >> 122 for s in summaries}) != 1:
        return False
    return (sum((s >> 61) & _FINGERPRINT_MASK for s in summaries) % FIELD == 0
            and sum(s & _FINGERPRINT_MASK for s in summaries) % FIELD == 0)
