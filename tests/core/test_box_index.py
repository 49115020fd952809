"""The spatial index of the load plan (hpcckpt.core.box_index) and one rank's part of the plan (hpcckpt.loading.read_plan):
the same answers as the brute-force region arithmetic they replace, for grids and for any other layout."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from decompositions import decompositions
from hpcckpt.core.box_index import BoxIndex, tiling_problem_indexed
from hpcckpt.errors import TemplateMismatchError
from hpcckpt.format.metadata import ChunkTable, Metadata, Variable
from hpcckpt.core.planning import plan_shared_reads
from hpcckpt.loading.directory import (FIELD, HOLDS, NEEDS, WHOLE, WHOLE_UNSENDABLE, all_self_sufficient,
                                    box_fingerprint, chunk_roles, decide, fast_summary, parts_for_directories,
                                    shared_from_assignments)
from hpcckpt.loading.read_plan import encode_requests, rank_reads, target_boxes
from hpcckpt.core.regions import covering_problem, overlapping, tiling_problem


def _arrays(boxes, ndim):
    starts = np.asarray([b[0] for b in boxes], np.int64).reshape(len(boxes), ndim)
    stops = np.asarray([b[1] for b in boxes], np.int64).reshape(len(boxes), ndim)
    return starts, stops


@st.composite
def any_boxes(draw, max_ndim=3, side=8):
    """Boxes anywhere (overlapping, empty, partly outside [0, side)): the index must not assume a tiling."""
    ndim = draw(st.integers(0, max_ndim))
    boxes = []
    for _ in range(draw(st.integers(0, 12))):
        lo = tuple(draw(st.integers(-2, side)) for _ in range(ndim))
        hi = tuple(a + draw(st.integers(-1, 5)) for a in lo)
        boxes.append((lo, hi))
    return ndim, boxes


@st.composite
def queries(draw, ndim, side=8):
    lo = tuple(draw(st.integers(-2, side)) for _ in range(ndim))
    return lo, tuple(a + draw(st.integers(0, 6)) for a in lo)


@settings(max_examples=300, deadline=None)
@given(st.one_of(any_boxes(), decompositions().map(lambda d: (len(d[0]), d[1]))), st.data())
def test_query_finds_exactly_the_overlapping_boxes(case, data):
    ndim, boxes = case
    starts, stops = _arrays(boxes, ndim)
    index = BoxIndex(starts, stops)
    for _ in range(4):
        q = data.draw(queries(ndim))
        assert index.query(*q).tolist() == overlapping(starts, stops, *q).tolist()


@settings(max_examples=300, deadline=None)
@given(st.one_of(decompositions(), any_boxes().map(lambda c: (tuple([6] * c[0]), c[1]))))
def test_indexed_tiling_check_agrees_with_the_sweep(case):
    shape, boxes = case
    starts, stops = _arrays(boxes, len(shape))
    assert tiling_problem_indexed(starts, stops, shape, "box") == tiling_problem(starts, stops, shape, "box")
    if BoxIndex(starts, stops).tiles(shape):
        assert tiling_problem(starts, stops, shape) is None


def test_a_grid_decomposition_is_indexed_as_a_grid_and_an_irregular_one_is_not():
    grid = [((i, j), (i + 1, j + 2)) for i in range(3) for j in (0, 2)]
    assert BoxIndex(*_arrays(grid, 2)).is_grid and BoxIndex(*_arrays(grid, 2)).tiles((3, 4))
    assert not BoxIndex(*_arrays(grid, 2)).tiles((3, 5))  # a grid, but not of the whole array
    bricks = [((0, 0), (1, 2)), ((0, 2), (1, 4)), ((1, 0), (2, 1)), ((1, 1), (2, 4))]  # staggered rows
    index = BoxIndex(*_arrays(bricks, 2))
    assert not index.is_grid and tiling_problem_indexed(*_arrays(bricks, 2), (2, 4)) is None
    assert index.query((1, 0), (2, 2)).tolist() == [2, 3]


def _meta(shape, chunks):
    ndim = len(shape)
    starts, stops = _arrays(chunks, ndim)
    n = len(chunks)
    table = ChunkTable(np.zeros(n, np.int64), np.zeros(n, np.int64), np.prod(stops - starts, axis=1) * 8,
                       ["0" * 16] * n, starts, stops - starts)
    var = Variable("u", "block", np.dtype(np.float64), tuple(shape), table)
    return Metadata(step=0, files=["f"], variables={"u": var}, values={}, nranks=1, created="")


@settings(max_examples=200, deadline=None)
@given(decompositions(), st.data())
def test_each_rank_plans_its_part_of_the_whole_plan(saved, data):
    shape, chunks = saved
    _, targets = data.draw(decompositions(shape=shape))
    meta = _meta(shape, chunks)
    encoded = [encode_requests({"u": ("block", lo, hi)}) for lo, hi in targets]
    per_rank = target_boxes(encoded, meta)
    whole = plan_shared_reads(meta.variables["u"].chunks.start, meta.variables["u"].chunks.stop, targets)
    for rank, (lo, hi) in enumerate(targets):
        boxes, shared = rank_reads(meta, per_rank, rank)
        assert boxes == {"u": (tuple(lo), tuple(hi))}
        assert shared["u"] == {k: v for k, v in whole.items() if rank in [p[0] for p in v[1]]}


def test_ragged_rows_and_bad_templates_get_the_errors_of_the_whole_plan():
    meta = _meta((10, 2), [((0, 0), (4, 2)), ((4, 0), (10, 2))])
    meta.variables["u"].kind = "ragged"
    per_rank = target_boxes([encode_requests({"u": ("ragged", None)})] * 3, meta)
    assert [rank_reads(meta, per_rank, r)[0]["u"] for r in range(3)] == [
        ((0, 0), (3, 2)), ((3, 0), (6, 2)), ((6, 0), (10, 2))]
    assert rank_reads(meta, per_rank, 1)[1]["u"] == {0: (0, [(0, (0, 0), (3, 2)), (1, (3, 0), (4, 2))]),
                                                     1: (2, [(1, (4, 0), (6, 2)), (2, (6, 0), (10, 2))])}
    with pytest.raises(TemplateMismatchError, match="ask for 9 rows"):
        target_boxes([encode_requests({"u": ("ragged", 4)}), encode_requests({"u": ("ragged", 5)})], meta)
    with pytest.raises(TemplateMismatchError, match="Block on some ranks and Ragged on others"):
        target_boxes([encode_requests({"u": ("ragged", 10)}), encode_requests({"u": ("block", (0, 0), (0, 0))})],
                     meta)
    with pytest.raises(TemplateMismatchError, match="names differ between ranks"):
        target_boxes([encode_requests({"u": ("ragged", 10)}), encode_requests({})], meta)
    meta.variables["u"].kind = "block"
    overlapping = target_boxes([encode_requests({"u": ("block", (0, 0), (6, 2))}),
                                encode_requests({"u": ("block", (5, 0), (10, 2))})], meta)  # fine on load
    assert [rank_reads(meta, overlapping, r)[0]["u"] for r in range(2)] == [((0, 0), (6, 2)), ((5, 0), (10, 2))]
    with pytest.raises(TemplateMismatchError, match=r"do not cover the array: .* gap at \[4:5, 0:2\]"):
        target_boxes([encode_requests({"u": ("block", (0, 0), (4, 2))}),
                      encode_requests({"u": ("block", (5, 0), (10, 2))})], meta)


@st.composite
def inside_boxes(draw, shape):
    """A few boxes inside ``shape`` (overlapping, leaving gaps, or tiling by chance)."""
    boxes = []
    for _ in range(draw(st.integers(1, 5))):
        lo = tuple(draw(st.integers(0, s)) for s in shape)
        boxes.append((lo, tuple(draw(st.integers(a, s)) for a, s in zip(lo, shape))))
    return boxes


def _directory_plan(meta, targets, nranks, sendable=frozenset({"u"})):
    """Both exchanges of the chunk directory, run here for every rank: (first problem, roles per rank, shared per
    rank, reread)."""
    roles = [chunk_roles(meta, {"u": box}, sendable) for box in targets]
    sent = [parts_for_directories(meta, r, nranks) for r in roles]
    problems, replies, reread = [], [[None] * nranks for _ in range(nranks)], False
    for d in range(nranks):
        problem, out, again = decide(meta, ["u"], [s.get(d) for s in sent], d, nranks)
        problems.append(problem)
        reread |= again
        for user, items in out.items():
            replies[user][d] = items
    problem = next((p for p in problems if p), None)
    return problem, [r["u"] for r in roles], [shared_from_assignments(replies[r], ["u"])["u"] for r in range(nranks)], \
        reread


def _fill_by_plan(g, meta, targets, roles, shared):
    """Every rank's target as the load would fill it from the plan: what it reads itself (its roles but NEEDS,
    and a chunk it is its own sender of), and the parts each sender sends it."""
    chunks = meta.variables["u"].chunks
    out = []
    for rank, (lo, hi) in enumerate(targets):
        t = np.full(tuple(b - a for a, b in zip(lo, hi)), np.nan)
        for k, a, b, role in roles[rank]:
            if role == NEEDS:
                sender, parts = shared[rank][k]
                assert parts == [(rank, a, b)]
                if sender != rank:  # the sender read it and lists this rank's part
                    role_there = {kk: r for kk, _, _, r in roles[sender]}[k]
                    assert role_there in (HOLDS, WHOLE) and (rank, a, b) in shared[sender][k][1]
            else:
                assert (role in (WHOLE, WHOLE_UNSENDABLE)) == (a == tuple(chunks.start[k]) and
                                                             b == tuple(chunks.stop[k]))
            t[tuple(slice(x - y, z - y) for x, z, y in zip(a, b, lo))] = g[tuple(slice(x, z) for x, z in zip(a, b))]
        out.append(t)
    return out


@settings(max_examples=200, deadline=None)
@given(decompositions(max_ndim=2), st.data())
def test_the_chunk_directory_finds_every_bad_template_and_plans_the_good_ones(saved, data):
    """Every rank gets its whole box, each part from a rank that read the chunk; a template that tiles the array
    (no overlap) reads each chunk once, by the rank holding its centre, and never needs a read after the plan."""
    shape, chunks = saved
    tiles = data.draw(st.booleans())
    targets = data.draw(decompositions(shape=shape).map(lambda d: d[1]) if tiles else inside_boxes(shape))
    sendable = frozenset({"u"}) if data.draw(st.booleans()) else frozenset()
    meta = _meta(shape, chunks)
    problem, roles, shared, reread = _directory_plan(meta, targets, len(targets), sendable)
    expected = covering_problem(*_arrays(targets, len(shape)), shape)  # a load template's blocks may overlap
    assert (problem is None) == (expected is None), (problem, expected)
    if problem is None:
        g = np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape)
        for (lo, hi), t in zip(targets, _fill_by_plan(g, meta, targets, roles, shared)):
            assert np.array_equal(t, g[tuple(slice(a, b) for a, b in zip(lo, hi))])
        if tiles:
            readers = {}
            for rank in range(len(targets)):
                for k, _, _, role in roles[rank]:
                    if role != NEEDS:
                        readers.setdefault(k, []).append(rank)
            touched = {k for r in roles for k, _, _, _ in r}
            assert all(len(readers.get(k, [])) == 1 for k in touched), readers
            assert not reread
    else:
        assert "do not cover the array" in problem and "gap" in problem


@settings(max_examples=300, deadline=None)
@given(decompositions(), st.data())
def test_box_fingerprints_add_up_to_the_array_exactly_when_the_boxes_tile_it(saved, data):
    """Tilings (empty boxes among them) always match; overlaps, gaps, or both at once (a box given twice and
    another left out) never do in these draws (a miss is a root of a nonzero polynomial: read_directory)."""
    shape, boxes = saved
    if data.draw(st.booleans()):
        boxes = data.draw(inside_boxes(shape))
    elif len(boxes) > 1 and data.draw(st.booleans()):
        boxes = boxes[:-1] + boxes[:1]  # the first box twice, the last one missing
    total = [sum(f) % FIELD for f in zip(*[box_fingerprint("u", lo, hi) for lo, hi in boxes])]
    tiles = tiling_problem(*_arrays(boxes, len(shape)), shape) is None
    assert (total == list(box_fingerprint("u", (0,) * len(shape), shape))) == tiles
    if all(shape):  # each variable has its own bases (an empty array's fingerprint is 0)
        assert box_fingerprint("u", (0,) * len(shape), shape) != box_fingerprint("v", (0,) * len(shape), shape)


@settings(max_examples=200, deadline=None)
@given(decompositions(max_ndim=2), st.data())
def test_the_first_exchange_ends_the_plan_exactly_when_no_rank_needs_a_part(saved, data):
    """all_self_sufficient over every rank's fast_summary: True exactly when the targets tile the array and every
    rank reads all it needs itself (no NEEDS role: on the saved decomposition, or any tiling by whole chunks);
    a target that leaves a gap or overlaps, or ranks that load different names, take the second exchange.  A
    rank sends a summary only when all its chunks are whole in its box."""
    shape, chunks = saved
    targets = data.draw(st.one_of(st.just(chunks), decompositions(shape=shape).map(lambda d: d[1]),
                                  inside_boxes(shape)))
    meta = _meta(shape, chunks)
    roles = [chunk_roles(meta, {"u": box}, {"u"}) for box in targets]
    signatures = [(("u", "block"),)] * len(targets)
    if len(targets) > 1 and data.draw(st.booleans()):
        signatures[-1] = (("u", "block"), ("w", "block"))
    summaries = [fast_summary(meta, {"u": box}, r, sig, rank)
                 for rank, (box, r, sig) in enumerate(zip(targets, roles, signatures))]
    self_sufficient = all(role != NEEDS for r in roles for _, _, _, role in r["u"])
    tiles = tiling_problem(*_arrays(targets, len(shape)), shape) is None
    same_names = len(set(signatures)) == 1
    assert all_self_sufficient(summaries) == (self_sufficient and tiles and same_names)
    assert [s is not None for s in summaries] == [all(role in (WHOLE, WHOLE_UNSENDABLE) for _, _, _, role in r["u"])
                                                  for r in roles]
    if targets is chunks and same_names:
        assert all_self_sufficient(summaries)
