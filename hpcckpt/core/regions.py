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


def tiling_problem(starts: np.ndarray, stops: np.ndarray, shape: Sequence[int], label: str = "box",
                   ids: Sequence[int] | None = None, origin: Sequence[int] | None = None) -> str | None:
    """Why the boxes do not tile ``shape`` exactly, or None when they do.

    Tiling means: every box lies inside the shape, no two non-empty boxes share
    an element, and together they cover every element.  Empty boxes are allowed
    anywhere inside the bounds (a rank may hold nothing).  The overlap test is a
    sweep along axis 0, so the usual slab and grid decompositions cost
    O(n log n) rather than O(n^2).  ``label`` names a box in the message
    ("the block of rank" gives "the block of rank 3 [0:5, 0:4] ..."); a gap
    is named by one missing box in global indices (:func:`missing_box`).
    ``ids``: the number the message gives box i (default i); ``origin``: added
    to the coordinates it prints (boxes given relative to a part of a larger
    array).
    """
    shape_arr = np.asarray(shape, dtype=np.int64)
    starts = _as_boxes(starts, len(shape_arr))
    stops = _as_boxes(stops, len(shape_arr))
    ids, shift = _naming(len(starts), len(shape_arr), ids, origin)
    problem = _bounds_problem(starts, stops, shape_arr, label, ids, shift)
    if problem is not None:
        return problem
    extents = stops - starts
    vols = np.prod(extents, axis=1) if len(shape_arr) else np.ones(len(starts), dtype=np.int64)
    nonempty = np.nonzero(vols > 0)[0]
    if len(shape_arr) == 0:
        if len(nonempty) > 1:
            return f"{label} {ids[int(nonempty[0])]} and {label} {ids[int(nonempty[1])]} overlap"
    else:
        pair = _first_overlap(starts[nonempty], stops[nonempty])
        if pair is not None:
            i, j = (int(nonempty[k]) for k in pair)
            return (f"{label} {ids[i]} [{_fmt(starts[i] + shift, stops[i] + shift)}] and {label} {ids[j]} "
                    f"[{_fmt(starts[j] + shift, stops[j] + shift)}] overlap")
    total = volume(shape_arr.tolist())
    covered = int(vols.sum())
    if covered != total:
        return _gap_text(starts, stops, shape_arr, covered, total, shift)
    return None


def _naming(n: int, ndim: int, ids, origin) -> tuple[list, np.ndarray]:
    """The numbers the messages give n boxes and the shift added to the coordinates they print."""
    ids = list(range(n)) if ids is None else [int(i) for i in ids]
    return ids, np.zeros(ndim, np.int64) if origin is None else np.asarray(origin, np.int64)


def _bounds_problem(starts: np.ndarray, stops: np.ndarray, shape_arr: np.ndarray, label: str, ids: list,
                    shift: np.ndarray) -> str | None:
    if len(starts) and (np.any(starts < 0) or np.any(stops < starts) or np.any(stops > shape_arr)):
        bad = int(np.nonzero(np.any((starts < 0) | (stops < starts) | (stops > shape_arr), axis=1))[0][0])
        return (f"{label} {ids[bad]} [{_fmt(starts[bad] + shift, stops[bad] + shift)}] lies outside the global "
                f"shape {tuple(shape_arr.tolist())}")
    return None


def overlap_pair(starts: np.ndarray, stops: np.ndarray) -> tuple[int, int] | None:
    """Indices of two non-empty boxes that share an element (the first found), or None."""
    ndim = starts.shape[1] if starts.ndim == 2 else 0
    starts, stops = _as_boxes(starts, ndim), _as_boxes(stops, ndim)
    vols = np.prod(stops - starts, axis=1) if ndim else np.ones(len(starts), dtype=np.int64)
    nonempty = np.nonzero(vols > 0)[0]
    if ndim == 0:
        return (int(nonempty[0]), int(nonempty[1])) if len(nonempty) > 1 else None
    pair = _first_overlap(starts[nonempty], stops[nonempty])
    return None if pair is None else (int(nonempty[pair[0]]), int(nonempty[pair[1]]))


def covering_problem(starts: np.ndarray, stops: np.ndarray, shape: Sequence[int], label: str = "box",
                     ids: Sequence[int] | None = None, origin: Sequence[int] | None = None) -> str | None:
    """Why the boxes do not cover ``shape``, or None when they do; boxes may overlap (unlike :func:`tiling_problem`).

    Every box must lie inside the shape and together they must cover every
    element; the message of a gap names one missing box in global indices.
    ``ids`` and ``origin`` as for :func:`tiling_problem`.
    """
    problem = tiling_problem(starts, stops, shape, label, ids, origin)
    if problem is None:  # the usual case, at the cost of a tiling check
        return None
    shape_arr = np.asarray(shape, dtype=np.int64)
    starts, stops = _as_boxes(starts, len(shape_arr)), _as_boxes(stops, len(shape_arr))
    ids, shift = _naming(len(starts), len(shape_arr), ids, origin)
    outside = _bounds_problem(starts, stops, shape_arr, label, ids, shift)
    if outside is not None or overlap_pair(starts, stops) is None:
        return outside or problem  # outside the shape, or a gap without any overlap
    if missing_box(starts, stops, shape_arr) is None:
        return None
    owned = owned_parts(starts, stops)
    covered = sum(volume(np.subtract(b, a).tolist()) for parts in owned for a, b in parts)
    return _gap_text(starts, stops, shape_arr, covered, volume(shape_arr.tolist()), shift)


def _gap_text(starts, stops, shape_arr, covered: int, total: int, shift: np.ndarray) -> str:
    gap = missing_box(starts, stops, shape_arr)
    where = (f" at [{_fmt(np.add(gap[0], shift), np.add(gap[1], shift))}], which is in none of them"
             if gap is not None and len(shape_arr) else "")
    return f"together they cover {covered} of {total} elements: there is a gap{where}"


def missing_box(starts: np.ndarray, stops: np.ndarray, shape: Sequence[int]) -> Box | None:
    """A box of ``shape`` (global indices) that no box covers, or None when the boxes cover it all.

    Boxes may overlap.  A sweep along axis 0 (then recursively along the
    others over the boxes spanning each slab); used on the error path and for
    overlapping load templates.
    """
    shape = tuple(int(s) for s in shape)
    starts, stops = _as_boxes(starts, len(shape)), _as_boxes(stops, len(shape))
    if volume(shape) == 0:
        return None
    return _uncovered(starts, stops, (0,) * len(shape), shape)


def _uncovered(starts: np.ndarray, stops: np.ndarray, lo: tuple, hi: tuple) -> Box | None:
    if not lo:
        return None if len(starts) else ((), ())
    keep = overlapping(starts, stops, lo, hi)
    starts, stops = starts[keep], stops[keep]
    if not len(starts):
        return lo, hi
    cuts = np.unique(np.clip(np.concatenate([starts[:, 0], stops[:, 0], [lo[0], hi[0]]]), lo[0], hi[0]))
    for a, b in zip(cuts[:-1].tolist(), cuts[1:].tolist()):
        span = (starts[:, 0] <= a) & (stops[:, 0] >= b)
        sub = _uncovered(starts[span, 1:], stops[span, 1:], lo[1:], hi[1:])
        if sub is not None:
            return (a,) + sub[0], (b,) + sub[1]
    return None


def subtract(start, stop, cut_start, cut_stop) -> list[Box]:
    """The box ``[start, stop)`` less ``[cut_start, cut_stop)``: disjoint boxes (at most two per axis)."""
    inter = intersect(start, stop, cut_start, cut_stop)
    if inter is None:
        return [(tuple(int(x) for x in start), tuple(int(x) for x in stop))]
    lo, hi = [int(x) for x in start], [int(x) for x in stop]
    out = []
    for axis, (a, b) in enumerate(zip(*inter)):
        if lo[axis] < a:
            out.append((tuple(lo), tuple(hi[:axis] + [a] + hi[axis + 1:])))
            lo[axis] = a
        if hi[axis] > b:
            out.append((tuple(lo[:axis] + [b] + lo[axis + 1:]), tuple(hi)))
            hi[axis] = b
    return out


def owned_parts(starts: np.ndarray, stops: np.ndarray) -> list[list[Box]]:
    """For boxes that may overlap: the disjoint parts each box owns, every element owned by the lowest box holding it.

    ``result[i]``: the parts of box i that no box before it holds.  Together
    they cover the union of the boxes exactly once.  Identical boxes are
    grouped first (an array replicated over part of a process grid: only the
    first of each group owns anything), so the usual cases cost O(n log n).
    """
    ndim = starts.shape[1] if np.ndim(starts) == 2 else 0
    starts, stops = _as_boxes(starts, ndim), _as_boxes(stops, ndim)
    out: list[list[Box]] = [[] for _ in range(len(starts))]
    leaders: list[int] = []
    seen: set = set()
    for i in range(len(starts)):
        box = (tuple(starts[i].tolist()), tuple(stops[i].tolist()))
        if volume(np.subtract(box[1], box[0]).tolist()) == 0 or box in seen:
            continue
        seen.add(box)
        parts = [box]
        earlier = np.asarray(leaders, dtype=np.int64)
        for j in earlier[overlapping(starts[earlier], stops[earlier], *box)].tolist() if len(earlier) else []:
            parts = [p for part in parts for p in subtract(*part, starts[j], stops[j])]
            if not parts:
                break
        out[i] = parts
        leaders.append(i)
    return out


def shared_regions(starts: np.ndarray, stops: np.ndarray, owned: list[list[Box]]) -> list[list[Box]]:
    """For each box, the regions whose copies are compared: its intersections with the parts others own.

    Region R = (box i) & (a part P owned by box o) is listed for box i and for
    box o whenever two or more boxes hold it (i != o, or a box identical to
    i).  Comparing each listed region's copies with the owner's compares every
    copy of every element with the one that is saved.
    """
    ndim = starts.shape[1] if np.ndim(starts) == 2 else 0
    starts, stops = _as_boxes(starts, ndim), _as_boxes(stops, ndim)
    parts = [(o, p) for o, ps in enumerate(owned) for p in ps]
    out: list[set] = [set() for _ in range(len(starts))]
    if not parts:
        return [[] for _ in out]
    p_starts = np.asarray([p[0] for _, p in parts], np.int64).reshape(len(parts), ndim)
    p_stops = np.asarray([p[1] for _, p in parts], np.int64).reshape(len(parts), ndim)
    groups: dict = {}
    for i in range(len(starts)):
        box = (tuple(starts[i].tolist()), tuple(stops[i].tolist()))
        if volume(np.subtract(box[1], box[0]).tolist()):
            groups.setdefault(box, []).append(i)
    for box, members in groups.items():
        for k in overlapping(p_starts, p_stops, *box).tolist():
            owner, (a, b) = parts[k]
            region = intersect(box[0], box[1], a, b) if ndim else ((), ())
            holders = set(members) | {owner}
            if len(holders) > 1:
                for h in holders:
                    out[h].add(region)
    return [sorted(s) for s in out]


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
