"""One rank's part of a load plan: its target boxes and the shared chunks it reads or receives.

Every rank gets every rank's requests (one allgather of a compact form:
:func:`encode_requests`), checks them alike (names, kinds, covering, Ragged row
counts: the same inputs, so the same answer or the same error on every rank)
and then plans only its own part: the chunks its boxes touch, found through the
chunk table's spatial index, and for each of those the ranks that share it,
found through an index of the ranks' boxes (hpcckpt.core.box_index).  The answer
is :func:`hpcckpt.core.planning.plan_shared_reads` restricted to the chunks this
rank touches, at a cost of O(ranks) vectorised numpy plus O(the chunks it
touches), instead of every rank planning every rank's reads (O(ranks x
chunks)).  No MPI and no I/O; tested against plan_shared_reads with hypothesis.
"""

from __future__ import annotations

import numpy as np

from hpcckpt.core.box_index import BoxIndex
from hpcckpt.errors import TemplateMismatchError
from hpcckpt.format.metadata import Metadata
from hpcckpt.core.planning import common_names, plan_rows
from hpcckpt.core.regions import covering_problem, volume


def encode_requests(requests: dict) -> tuple[tuple, np.ndarray]:
    """A rank's requests (loading.check_template's) as ``(signature, int64 vector)`` for the allgather.

    ``signature``: ``((name, kind), ...)`` sorted by name; the vector holds,
    per name in that order, a Block's start and stop, or a Ragged's row count
    (:data:`EVEN_SPLIT` for an even split; any negative count as -1, which the
    checks refuse whatever its size, and which fits int64).  About 8 bytes per
    number instead of a pickled dict of tuples per variable.
    """
    signature, numbers = [], []
    for name in sorted(requests):
        request = requests[name]
        signature.append((name, request[0]))
        if request[0] == "block":
            numbers.extend(request[1])
            numbers.extend(request[2])
        else:
            numbers.append(EVEN_SPLIT if request[1] is None else max(request[1], -1))
    return tuple(signature), np.asarray(numbers, np.int64)


#: The number :func:`encode_requests` sends for ``Ragged()`` (no row count: an even split).
EVEN_SPLIT = int(np.iinfo(np.int64).min)


def target_boxes(encoded: list[tuple[tuple, np.ndarray]], meta: Metadata) -> dict[str, tuple]:
    """Every rank's target box per variable: ``{name: (starts, stops, index)}``, ``(nranks, ndim)`` arrays and
    their :class:`~hpcckpt.core.box_index.BoxIndex`.

    Checks what :func:`hpcckpt.loading.load.plan_reads` checks (the ranks name the
    same variables with the same kinds, Blocks cover each array (they may
    overlap), Ragged row counts add up) and raises the same
    TemplateMismatchError.  A grid of Blocks that tiles the array is checked in
    O(ranks) through its index; other layouts go through
    :func:`hpcckpt.core.regions.covering_problem`.
    """
    signature = encoded[0][0]
    for rank, (sig, _) in enumerate(encoded):
        if sig != signature:
            _signature_problem([dict(s) for s, _ in encoded], rank)
    numbers = np.stack([vec for _, vec in encoded]) if encoded else np.zeros((0, 0), np.int64)
    out, at = {}, 0
    for name, kind in signature:
        shape = meta.variables[name].shape
        nd = len(shape)
        if kind == "block":
            starts, stops = numbers[:, at:at + nd], numbers[:, at + nd:at + 2 * nd]
            at += 2 * nd
            index = BoxIndex(starts, stops)
            problem = None if index.tiles(shape) else covering_problem(starts, stops, shape, label="the block of rank")
            if problem is not None:  # overlapping template blocks are fine: every rank reads its region
                raise TemplateMismatchError(f"variable {name!r}: the template's blocks do not cover the array: "
                                            f"{problem}")
        else:
            rows = numbers[:, at].tolist()
            at += 1
            ranges = np.asarray(plan_rows([None if r == EVEN_SPLIT else r for r in rows], shape[0], name),
                                np.int64).reshape(len(rows), 2)
            starts = np.zeros((len(rows), nd), np.int64)
            stops = np.tile(np.asarray(shape, np.int64), (len(rows), 1))
            starts[:, 0], stops[:, 0] = ranges[:, 0], ranges[:, 1]
            index = BoxIndex(starts, stops)
        out[name] = (starts, stops, index)
    return out


def _signature_problem(signatures: list[dict], rank: int) -> None:
    """The error for ranks that disagree on the names or kinds of the variables they load."""
    common_names(signatures, "template's distributed")
    name = next(n for n, k in sorted(signatures[rank].items()) if signatures[0][n] != k)
    raise TemplateMismatchError(f"variable {name!r} is a Block on some ranks and Ragged on others")


def rank_reads(meta: Metadata, targets: dict, rank: int) -> tuple[dict, dict]:
    """``(boxes, shared)`` of ``rank``: its global box per variable and the shared chunks it touches.

    ``shared[name]`` is ``{chunk: (reader, [(rank, lo, hi), ...])}`` as
    :func:`hpcckpt.core.planning.plan_shared_reads` gives it, for the chunks this
    rank's box overlaps that another rank's box overlaps too.
    """
    boxes, shared = {}, {}
    for name, (starts, stops, ranks) in targets.items():
        boxes[name] = (tuple(starts[rank].tolist()), tuple(stops[rank].tolist()))
        shared[name] = _shared_chunks(meta.variables[name].chunks, starts, stops, ranks, rank)
    return boxes, shared


def _shared_chunks(chunks, starts: np.ndarray, stops: np.ndarray, ranks: BoxIndex, rank: int) -> dict:
    """The chunks of ``chunks`` that ``rank`` and at least one other rank overlap, with their reader and parts."""
    touched = chunks.index().query(starts[rank], stops[rank])
    plan = {}
    c_start, c_stop = chunks.start, chunks.stop
    for k in touched.tolist():
        users = ranks.query(c_start[k], c_stop[k])
        if len(users) < 2:
            continue
        lo = np.maximum(starts[users], c_start[k]).tolist()
        hi = np.minimum(stops[users], c_stop[k]).tolist()
        parts = [(u, tuple(a), tuple(b)) for u, a, b in zip(users.tolist(), lo, hi)]
        sizes = [volume(b - a for a, b in zip(p[1], p[2])) for p in parts]
        reader = parts[max(range(len(parts)), key=lambda i: (sizes[i], -parts[i][0]))][0]
        plan[k] = (reader, parts)
    return plan
