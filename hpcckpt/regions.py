"""Pure N-d box arithmetic: overlaps, tiling checks, splits.

A box is a half-open region ``[start, stop)`` in each dimension of a global
array, given as two integer sequences.  Many boxes are held as two ``(n, ndim)``
int64 arrays so that the questions asked on every load (which stored chunks
overlap my target?) are answered with vectorised numpy instead of Python loops.

Nothing here knows about MPI, files or dtypes: it is the arithmetic that the
planning of saves and loads is built from, and it is tested exhaustively with
hypothesis.
"""

from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np

Box = tuple[tuple[int, ...], tuple[int, ...]]


def volume(extent: Sequence[int]) -> int:
    """Number of elements in a box of the given extent (1 for 0-d)."""
    n = 1
    for e in extent:
        n *= int(e)
    return n


def intersect(a_start, a_stop, b_start, b_stop) -> Box | None:
    """The intersection of two boxes, or None when it is empty."""
    start = tuple(max(int(x), int(y)) for x, y in zip(a_start, b_start))
    stop = tuple(min(int(x), int(y)) for x, y in zip(a_stop, b_stop))
    if any(lo >= hi for lo, hi in zip(start, stop)):
        return None
    return start, stop


def overlapping(starts: np.ndarray, stops: np.ndarray, q_start, q_stop) -> np.ndarray:
    """Indices of the boxes ``[starts[i], stops[i])`` that share an element with the query box."""
    if len(starts) == 0:
        return np.zeros(0, dtype=np.int64)
    q_start = np.asarray(q_start, dtype=np.int64)
    q_stop = np.asarray(q_stop, dtype=np.int64)
    if starts.shape[1] == 0:  # 0-d arrays: the single element overlaps everything non-empty
        return np.arange(len(starts))
    hit = np.all((starts < q_stop) & (stops > q_start), axis=1)
    hit &= np.all(stops > starts, axis=1) & bool(np.all(q_stop > q_start))
    return np.nonzero(hit)[0]


def shared_parts(starts: np.ndarray, stops: np.ndarray, q_start, q_stop) -> list[tuple[int, Box]]:
    """``(i, (lo, hi))`` for each box ``i`` that shares elements with the query box, and the part it shares.

    When the boxes tile an array, the parts tile the query box's intersection
    with it: what a rank receives from (or sends to) the ranks of another
    decomposition (hpcckpt.redistribute).
    """
    return [(i, intersect(starts[i], stops[i], q_start, q_stop))
            for i in overlapping(starts, stops, q_start, q_stop).tolist()]


def tiling_problem(starts: np.ndarray, stops: np.ndarray, shape: Sequence[int], label: str = "box") -> str | None:
    """Why the boxes do not tile ``shape`` exactly, or None when they do.

    Tiling means: every box lies inside the shape, no two non-empty boxes share
    an element, and together they cover every element.  Empty boxes are allowed
    anywhere inside the bounds (a rank may hold nothing).  The overlap test is a
    sweep along axis 0, so the usual slab and grid decompositions cost
    O(n log n) rather than O(n^2).  ``label`` names a box in the message
    ("the block of rank" gives "the block of rank 3 [0:5, 0:4] ...").
    """
    shape_arr = np.asarray(shape, dtype=np.int64)
    starts = _as_boxes(starts, len(shape_arr))
    stops = _as_boxes(stops, len(shape_arr))
    if len(starts) and (np.any(starts < 0) or np.any(stops < starts) or np.any(stops > shape_arr)):
        bad = int(np.nonzero(np.any((starts < 0) | (stops < starts) | (stops > shape_arr), axis=1))[0][0])
        return f"{label} {bad} [{_fmt(starts[bad], stops[bad])}] lies outside the global shape {tuple(shape_arr.tolist())}"
    extents = stops - starts
    vols = np.prod(extents, axis=1) if len(shape_arr) else np.ones(len(starts), dtype=np.int64)
    nonempty = np.nonzero(vols > 0)[0]
    if len(shape_arr) == 0:
        if len(nonempty) > 1:
            return f"{label} {int(nonempty[0])} and {label} {int(nonempty[1])} overlap"
    else:
        pair = _first_overlap(starts[nonempty], stops[nonempty])
        if pair is not None:
            i, j = (int(nonempty[k]) for k in pair)
            return (f"{label} {i} [{_fmt(starts[i], stops[i])}] and {label} {j} "
                    f"[{_fmt(starts[j], stops[j])}] overlap")
    total = volume(shape_arr.tolist())
    covered = int(vols.sum())
    if covered != total:
        return f"together they cover {covered} of {total} elements: there is a gap"
    return None


def _as_boxes(values, ndim: int) -> np.ndarray:
    """``values`` as an ``(n, ndim)`` int64 array (``reshape(-1, 0)`` cannot infer n for 0-d arrays)."""
    arr = np.asarray(values, dtype=np.int64)
    if arr.ndim == 2:
        return arr.reshape(arr.shape[0], ndim)
    return arr.reshape(-1, ndim) if ndim else arr.reshape(0, 0)


def _first_overlap(starts: np.ndarray, stops: np.ndarray) -> tuple[int, int] | None:
    """Positions of one pair of overlapping non-empty boxes, or None."""
    order = np.argsort(starts[:, 0], kind="stable")
    active: list[int] = []
    for idx in order.tolist():
        s0 = starts[idx, 0]
        active = [a for a in active if stops[a, 0] > s0]
        if active:
            act = np.asarray(active)
            hit = np.all((starts[act] < stops[idx]) & (stops[act] > starts[idx]), axis=1)
            if hit.any():
                return int(act[np.argmax(hit)]), idx
        active.append(idx)
    return None


def _fmt(start, stop) -> str:
    return ", ".join(f"{int(a)}:{int(b)}" for a, b in zip(start, stop))


def contiguous_pieces(extent: Sequence[int], itemsize: int, max_bytes: int) -> Iterator[Box]:
    """Split a box of ``extent`` (local coordinates) into pieces of at most ``max_bytes``.

    Each piece is a run of whole trailing sub-arrays, so a piece of a C-ordered
    array is one contiguous range of memory: it can be written straight from
    the caller's buffer and read straight back into it.  A single element larger
    than ``max_bytes`` still forms a piece of its own.
    """
    extent = tuple(int(e) for e in extent)
    if volume(extent) == 0:
        return
    yield from _pieces((), extent, itemsize, max(int(max_bytes), 1))


def _pieces(prefix: tuple[int, ...], extent: tuple[int, ...], itemsize: int, max_bytes: int) -> Iterator[Box]:
    if not extent:
        yield prefix, tuple(p + 1 for p in prefix)
        return
    row_bytes = volume(extent[1:]) * itemsize
    n0 = extent[0]
    if row_bytes <= max_bytes or len(extent) == 1:
        rows = max(1, max_bytes // max(row_bytes, 1))
        tail_start = (0,) * (len(extent) - 1)
        for lo in range(0, n0, rows):
            hi = min(n0, lo + rows)
            yield prefix + (lo,) + tail_start, tuple(p + 1 for p in prefix) + (hi,) + extent[1:]
        return
    for i in range(n0):
        yield from _pieces(prefix + (i,), extent[1:], itemsize, max_bytes)


def even_rows(total: int, nparts: int, part: int) -> tuple[int, int]:
    """Rows ``[part*T//n, (part+1)*T//n)`` of an even split of ``total`` rows into ``nparts``."""
    return part * total // nparts, (part + 1) * total // nparts
