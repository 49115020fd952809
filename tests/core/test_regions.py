"""Pure box arithmetic (hpcckpt.core.regions): property tests against brute-force references."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcckpt.core.regions import contiguous_pieces, covering_problem, even_rows, intersect, missing_box, overlap_pair, \
    overlapping, owned_parts, shared_parts, shared_regions, subtract, tiling_problem, volume
from decompositions import covered_count, decompositions, shapes

SETTINGS = settings(max_examples=150, deadline=None)


@st.composite
def box_in(draw, shape):
    start, stop = [], []
    for n in shape:
        a = draw(st.integers(0, n))
        b = draw(st.integers(a, n))
        start.append(a)
        stop.append(b)
    return tuple(start), tuple(stop)


def cells(box):
    start, stop = box
    return set(itertools.product(*[range(a, b) for a, b in zip(start, stop)]))


@SETTINGS
@given(st.data())
def test_intersect_matches_cell_sets(data):
    shape = data.draw(shapes(min_ndim=1, max_ndim=3, max_side=5))
    a, b = data.draw(box_in(shape)), data.draw(box_in(shape))
    got = intersect(a[0], a[1], b[0], b[1])
    expected = cells(a) & cells(b)
    if not expected:
        assert got is None
    else:
        assert cells(got) == expected
        assert all(lo < hi for lo, hi in zip(*got))


def test_intersect_examples():
    assert intersect((0, 0), (4, 4), (2, 3), (6, 9)) == ((2, 3), (4, 4))
    assert intersect((0,), (2,), (2,), (4,)) is None  # touching is not overlapping
    assert intersect((), (), (), ()) == ((), ())  # 0-d: the single element


@SETTINGS
@given(st.data())
def test_overlapping_matches_brute_force(data):
    shape = data.draw(shapes(min_ndim=1, max_ndim=3, max_side=5))
    boxes = data.draw(st.lists(box_in(shape), max_size=8))
    query = data.draw(box_in(shape))
    starts = np.asarray([b[0] for b in boxes], np.int64).reshape(len(boxes), len(shape))
    stops = np.asarray([b[1] for b in boxes], np.int64).reshape(len(boxes), len(shape))
    got = overlapping(starts, stops, *query).tolist()
    expected = [i for i, b in enumerate(boxes) if cells(b) & cells(query)]
    assert got == expected


def test_overlapping_zero_d_and_empty_inputs():
    assert overlapping(np.zeros((0, 2), np.int64), np.zeros((0, 2), np.int64), (0, 0), (1, 1)).tolist() == []
    assert overlapping(np.zeros((1, 0), np.int64), np.zeros((1, 0), np.int64), (), ()).tolist() == [0]


def _arrays(boxes, ndim):
    starts = np.asarray([b[0] for b in boxes], np.int64).reshape(len(boxes), ndim)
    stops = np.asarray([b[1] for b in boxes], np.int64).reshape(len(boxes), ndim)
    return starts, stops


@SETTINGS
@given(decompositions())
def test_tiling_accepts_every_grid_decomposition(dec):
    shape, boxes = dec
    assert tiling_problem(*_arrays(boxes, len(shape)), shape) is None


@SETTINGS
@given(decompositions(), st.data())
def test_tiling_detects_gaps(dec, data):
    shape, boxes = dec
    nonempty = [i for i, b in enumerate(boxes) if volume(np.subtract(b[1], b[0]))]
    if not nonempty:
        return
    drop = data.draw(st.sampled_from(nonempty))
    rest = [b for i, b in enumerate(boxes) if i != drop]
    problem = tiling_problem(*_arrays(rest, len(shape)), shape)
    assert problem is not None and "gap" in problem
    if shape:  # the region named is one that the dropped box alone covered
        gap = missing_box(*_arrays(rest, len(shape)), shape)
        assert gap is not None and cells(gap) and cells(gap) <= cells(boxes[drop])
        assert f"[{', '.join(f'{a}:{b}' for a, b in zip(*gap))}]" in problem


@SETTINGS
@given(decompositions(), st.data())
def test_tiling_detects_overlaps(dec, data):
    shape, boxes = dec
    if volume(shape) == 0:
        return
    extra = data.draw(box_in(shape))
    if not cells(extra):
        return
    boxes = boxes + [extra]
    problem = tiling_problem(*_arrays(boxes, len(shape)), shape, label="the block of rank")
    assert problem is not None and "overlap" in problem
    assert f"the block of rank {len(boxes) - 1}" in problem


@SETTINGS
@given(st.data())
def test_tiling_matches_painting_reference(data):
    """Arbitrary boxes (maybe out of bounds): tiling_problem is None exactly when painting gives all ones."""
    shape = data.draw(shapes(min_ndim=1, max_ndim=3, max_side=4))
    raw = data.draw(st.lists(st.tuples(st.lists(st.integers(-1, 5), min_size=len(shape), max_size=len(shape)),
                                       st.lists(st.integers(-1, 5), min_size=len(shape), max_size=len(shape))),
                             max_size=6))
    boxes = [(tuple(a), tuple(b)) for a, b in raw]
    problem = tiling_problem(*_arrays(boxes, len(shape)), shape)
    in_bounds = all(all(0 <= x <= y <= n for x, y, n in zip(a, b, shape)) for a, b in boxes)
    exact = in_bounds and bool(np.all(covered_count(shape, boxes) == 1))
    assert (problem is None) == exact, (shape, boxes, problem)
    if not in_bounds:
        assert "outside" in problem


def test_tiling_messages():
    shape = (4, 4)
    assert "outside the global shape (4, 4)" in tiling_problem(*_arrays([((0, 0), (5, 4))], 2), shape)
    assert "outside" in tiling_problem(*_arrays([((-1, 0), (4, 4))], 2), shape)
    assert "outside" in tiling_problem(*_arrays([((2, 0), (1, 4))], 2), shape)  # stop < start
    msg = tiling_problem(*_arrays([((0, 0), (3, 4)), ((2, 0), (4, 4))], 2), shape, label="the block of rank")
    assert msg == "the block of rank 0 [0:3, 0:4] and the block of rank 1 [2:4, 0:4] overlap"
    assert tiling_problem(*_arrays([((0, 0), (2, 4))], 2), shape) == \
        "together they cover 8 of 16 elements: there is a gap at [2:4, 0:4], which is in none of them"
    # empty boxes anywhere inside the bounds are fine, even "inside" another box
    assert tiling_problem(*_arrays([((0, 0), (4, 4)), ((2, 2), (2, 2)), ((4, 4), (4, 4))], 2), shape) is None
    # no boxes at all tile an empty array
    assert tiling_problem(np.zeros((0, 2)), np.zeros((0, 2)), (0, 3)) is None
    assert tiling_problem(np.zeros((0, 2)), np.zeros((0, 2)), (1, 3)) is not None
    # 0-d arrays: exactly one (non-empty) box
    assert tiling_problem(np.zeros((1, 0)), np.zeros((1, 0)), ()) is None
    assert "overlap" in tiling_problem(np.zeros((2, 0)), np.zeros((2, 0)), ())
    assert "gap" in tiling_problem(np.zeros((0, 0)), np.zeros((0, 0)), ())


@SETTINGS
@given(shapes(min_ndim=0, max_ndim=4, max_side=5), st.sampled_from([1, 2, 3, 8, 16]), st.integers(1, 300))
def test_contiguous_pieces_tile_the_box(extent, itemsize, max_bytes):
    pieces = list(contiguous_pieces(extent, itemsize, max_bytes))
    n = volume(extent)
    if n == 0:
        assert pieces == []
        return
    # pieces are disjoint and cover the box
    assert tiling_problem(*_arrays(pieces, len(extent)), extent) is None
    strides = np.array([volume(extent[i + 1:]) for i in range(len(extent))], np.int64)
    positions = []
    for start, stop in pieces:
        count = tuple(b - a for a, b in zip(start, stop))
        size = volume(count)
        assert size >= 1
        assert size * itemsize <= max_bytes or size == 1
        # contiguous in C order: the flat indices of its elements form one run
        flat = sorted(int(np.dot(c, strides)) for c in itertools.product(*[range(a, b) for a, b in zip(start, stop)]))
        assert flat == list(range(flat[0], flat[0] + size))
        positions.append(flat[0])
    assert positions == sorted(positions)  # pieces come in memory order


def test_contiguous_pieces_examples():
    # a whole small array is one piece
    assert list(contiguous_pieces((3, 4), 8, 1000)) == [((0, 0), (3, 4))]
    # rows that fit: runs of whole rows
    assert list(contiguous_pieces((5, 4), 8, 64)) == [((0, 0), (2, 4)), ((2, 0), (4, 4)), ((4, 0), (5, 4))]
    # one element bigger than max_bytes still forms a piece
    assert list(contiguous_pieces((2,), 16, 4)) == [((0,), (1,)), ((1,), (2,))]
    # 0-d: one element
    assert list(contiguous_pieces((), 8, 1)) == [((), ())]
    assert list(contiguous_pieces((0, 5), 8, 8)) == []


@given(st.integers(0, 10**6), st.integers(1, 64))
def test_even_rows_partition(total, nparts):
    ranges = [even_rows(total, nparts, p) for p in range(nparts)]
    assert ranges[0][0] == 0 and ranges[-1][1] == total
    for (a, b), (c, _) in zip(ranges, ranges[1:]):
        assert b == c
    sizes = [b - a for a, b in ranges]
    assert max(sizes) - min(sizes) <= 1
    for p, (a, b) in enumerate(ranges):
        assert (a, b) == (p * total // nparts, (p + 1) * total // nparts)


@pytest.mark.parametrize("extent", [(0,), (3, 0, 2), ()])
def test_volume(extent):
    assert volume(extent) == int(np.prod(extent))


# ---- overlapping boxes: replicated Blocks and overlapping load templates

@SETTINGS
@given(st.data())
def test_subtract_matches_cell_sets(data):
    shape = data.draw(shapes(min_ndim=0, max_ndim=3, max_side=5))
    a, b = data.draw(box_in(shape)), data.draw(box_in(shape))
    parts = subtract(a[0], a[1], b[0], b[1])
    got = [cells(p) for p in parts]
    union = set().union(*got)
    assert union == cells(a) - cells(b)
    assert sum(len(c) for c in got) == len(union)  # disjoint
    assert len(parts) <= max(1, 2 * len(shape))


@SETTINGS
@given(st.data())
def test_owned_parts_cover_the_union_once_and_the_lowest_holder_owns(data):
    shape = data.draw(shapes(min_ndim=0, max_ndim=3, max_side=5))
    boxes = data.draw(st.lists(box_in(shape), min_size=1, max_size=7))
    if data.draw(st.booleans()):  # the replicated case: copies of the same boxes on several ranks
        boxes = boxes + data.draw(st.lists(st.sampled_from(boxes), max_size=5))
    starts, stops = _arrays(boxes, len(shape))
    owned = owned_parts(starts, stops)
    held = [cells(b) if volume(np.subtract(b[1], b[0])) else set() for b in boxes]
    seen: set = set()
    for i, parts in enumerate(owned):
        mine = [cells(p) for p in parts]
        assert all(c and c <= held[i] for c in mine)
        for c in mine:
            assert not (c & seen)  # every element owned once
            seen |= c
            for cell in c:  # by the lowest box that holds it
                assert min(j for j, h in enumerate(held) if cell in h) == i
    assert seen == set().union(*held)


@SETTINGS
@given(st.data())
def test_shared_regions_compare_every_copy_with_the_saved_one(data):
    shape = data.draw(shapes(min_ndim=0, max_ndim=2, max_side=5))
    boxes = data.draw(st.lists(box_in(shape), min_size=1, max_size=5))
    boxes = boxes + data.draw(st.lists(st.sampled_from(boxes), max_size=3))
    starts, stops = _arrays(boxes, len(shape))
    owned = owned_parts(starts, stops)
    shared = shared_regions(starts, stops, owned)
    held = [cells(b) if volume(np.subtract(b[1], b[0])) else set() for b in boxes]
    owner = {cell: i for i, parts in enumerate(owned) for p in parts for cell in cells(p)}
    for i, regions in enumerate(shared):
        for reg in regions:
            c = cells(reg)
            assert c and c <= held[i]
            o = {owner[cell] for cell in c}
            assert len(o) == 1  # a region lies in one owner's part
            o = o.pop()
            assert reg in shared[o]  # the owner hashes the same region
        # every element this box shares with another box is in one of its regions, compared with the owner's
        others = set().union(*(h for j, h in enumerate(held) if j != i)) if len(held) > 1 else set()
        covered = set().union(*(cells(r) for r in regions)) if regions else set()
        assert held[i] & others <= covered
    # an element held by one box only is never hashed
    single = {c for c in set().union(*held) if sum(c in h for h in held) == 1}
    assert not any(single & cells(r) for regions in shared for r in regions)


@SETTINGS
@given(st.data())
def test_covering_problem_and_missing_box_match_cell_sets(data):
    shape = data.draw(shapes(min_ndim=0, max_ndim=3, max_side=4))
    boxes = data.draw(st.lists(box_in(shape), max_size=6))
    if data.draw(st.booleans()):
        boxes = boxes + [((0,) * len(shape), tuple(shape))]
    starts, stops = _arrays(boxes, len(shape))
    union = set().union(*(cells(b) for b in boxes)) if boxes else set()
    everything = cells(((0,) * len(shape), tuple(shape)))
    gap = missing_box(starts, stops, shape)
    problem = covering_problem(starts, stops, shape, label="the block of rank")
    if union >= everything:
        assert gap is None and problem is None
    else:
        assert gap is not None and cells(gap) and not (cells(gap) & union) and cells(gap) <= everything
        assert problem is not None and "gap" in problem
    pair = overlap_pair(starts, stops)
    nonempty = [cells(b) if volume(np.subtract(b[1], b[0])) else set() for b in boxes]
    assert (pair is not None) == any(nonempty[i] & nonempty[j] for i in range(len(boxes))
                                     for j in range(i + 1, len(boxes)))


def test_covering_problem_refuses_boxes_outside_even_when_they_overlap():
    msg = covering_problem(*_arrays([((0, 0), (4, 4)), ((0, 0), (5, 4))], 2), (4, 4), label="the block of rank")
    assert msg == "the block of rank 1 [0:5, 0:4] lies outside the global shape (4, 4)"


@given(st.data())
def test_shared_parts_of_one_tiling_tile_every_box_of_another(data):
    """What redistribute relies on: a target box receives each of its elements from exactly one source box."""
    shape, sources = data.draw(decompositions())
    _, targets = data.draw(decompositions(shape=shape))
    s_starts = np.asarray([b[0] for b in sources], np.int64).reshape(len(sources), len(shape))
    s_stops = np.asarray([b[1] for b in sources], np.int64).reshape(len(sources), len(shape))
    for t_start, t_stop in targets:
        parts = shared_parts(s_starts, s_stops, t_start, t_stop)
        for i, (lo, hi) in parts:
            assert intersect(sources[i][0], sources[i][1], t_start, t_stop) == (lo, hi)
        extent = [b - a for a, b in zip(t_start, t_stop)]
        local = np.asarray([[a - o for a, o in zip(lo, t_start)] for _, (lo, _) in parts], np.int64)
        local_hi = np.asarray([[b - o for b, o in zip(hi, t_start)] for _, (_, hi) in parts], np.int64)
        assert tiling_problem(local, local_hi, extent) is None
