"""Save and load planning (hpcckpt.core.planning) over random uneven N-d decompositions; no MPI, no I/O.

Summaries are built the way a save builds them (state.summarize_for_save on real
Block/Ragged objects), so the rank-local validation in state.py is covered too.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcckpt import Block, Ragged, TemplateMismatchError
from hpcckpt.core.encoding import dtype_to_json
from hpcckpt.core.planning import plan_rows, plan_save
from hpcckpt.state import summarize_for_save
from decompositions import decompositions

SETTINGS = settings(max_examples=120, deadline=None)
DTYPES = [np.float64, np.int32, np.complex64, np.bool_, np.dtype([("a", "<i4"), ("b", ">f8", (2,))])]


def block_of(shape, box, dtype=np.float64):
    start, stop = box
    return Block(np.zeros(tuple(b - a for a, b in zip(start, stop)), dtype), offset=start, global_shape=shape)


def summaries_for(rank_states):
    return [{name: summarize_for_save(name, v) for name, v in s.items()} for s in rank_states]


def empty_norm(box, shape):
    """The box state.block_box reports for a block: empty ones collapse to a point inside the bounds."""
    start, stop = box
    if any(b == a for a, b in zip(start, stop)):
        p = tuple(min(a, n) for a, n in zip(start, shape))
        return p, p
    return tuple(start), tuple(stop)


@SETTINGS
@given(decompositions(), st.sampled_from(DTYPES))
def test_plan_save_accepts_random_decompositions(dec, dtype):
    shape, boxes = dec
    ranks = [{"u": block_of(shape, box, dtype), "v": block_of(shape, boxes[(i + 1) % len(boxes)], dtype)}
             for i, box in enumerate(boxes)]
    variables, planned, _ = plan_save(summaries_for(ranks))
    assert set(variables) == {"u", "v"}
    for name in ("u", "v"):
        assert variables[name].kind == "block"
        assert variables[name].shape == shape
        assert variables[name].dtype == dtype_to_json(np.dtype(dtype))
    for i, box in enumerate(boxes):
        assert planned[i]["u"] == empty_norm(box, shape)
        assert planned[i]["v"] == empty_norm(boxes[(i + 1) % len(boxes)], shape)


def _ranks(dec, dtype=np.float64):
    shape, boxes = dec
    return shape, boxes, [{"field": block_of(shape, box, dtype), "other": block_of(shape, box)} for box in boxes]


@SETTINGS
@given(decompositions(), st.data())
def test_dtype_mismatch_names_variable(dec, data):
    shape, boxes, ranks = _ranks(dec)
    if len(boxes) == 1:  # a second rank holding nothing
        boxes.append(((0,) * len(shape), (0,) * len(shape)))
        ranks.append({"field": block_of(shape, boxes[1]), "other": block_of(shape, boxes[1])})
    bad = data.draw(st.integers(0, len(boxes) - 1))
    ranks[bad]["field"] = block_of(shape, boxes[bad], np.float32)
    with pytest.raises(TemplateMismatchError, match="variable 'field': dtype differs"):
        plan_save(summaries_for(ranks))


@SETTINGS
@given(decompositions(), st.data())
def test_global_shape_mismatch_names_variable(dec, data):
    shape, boxes, ranks = _ranks(dec)
    bad = data.draw(st.integers(0, len(boxes) - 1))
    start, stop = boxes[bad]
    ranks[bad]["field"] = Block(np.zeros(tuple(b - a for a, b in zip(start, stop))), offset=start,
                                global_shape=tuple(n + 1 for n in shape))
    with pytest.raises(TemplateMismatchError, match="variable 'field'"):
        plan_save(summaries_for(ranks))


@SETTINGS
@given(decompositions(), st.data())
def test_overlap_names_variable(dec, data):
    shape, boxes, ranks = _ranks(dec)
    if 0 in shape:
        return
    start = tuple(data.draw(st.integers(0, n - 1)) for n in shape)
    stop = tuple(data.draw(st.integers(a + 1, n)) for a, n in zip(start, shape))
    ranks.append({"field": block_of(shape, (start, stop)), "other": block_of(shape, (start, start))})
    with pytest.raises(TemplateMismatchError, match=r"variable 'field': blocks do not tile .* overlap"):
        plan_save(summaries_for(ranks))


@SETTINGS
@given(decompositions(), st.data())
def test_gap_names_variable(dec, data):
    shape, boxes, ranks = _ranks(dec)
    nonempty = [i for i, (a, b) in enumerate(boxes) if all(y > x for x, y in zip(a, b))]
    if not nonempty:
        return
    bad = data.draw(st.sampled_from(nonempty))
    ranks[bad]["other"] = block_of(shape, (boxes[bad][0], boxes[bad][0]))  # this rank now holds nothing
    with pytest.raises(TemplateMismatchError, match=r"variable 'other': blocks do not tile .* gap"):
        plan_save(summaries_for(ranks))


def test_block_outside_global_shape_is_rejected_locally():
    with pytest.raises(TemplateMismatchError, match="variable 'u'.*does not fit"):
        summarize_for_save("u", Block(np.zeros((3, 3)), offset=(2, 0), global_shape=(4, 3)))
    with pytest.raises(TemplateMismatchError, match="variable 'u'.*dimensions"):
        summarize_for_save("u", Block(np.zeros((3, 3)), offset=(0,), global_shape=(4, 3)))
    with pytest.raises(TemplateMismatchError, match="variable 'u'.*does not fit"):
        summarize_for_save("u", Block(np.zeros((3,)), offset=(-1,), global_shape=(4,)))
    with pytest.raises(TemplateMismatchError, match="variable 'u'.*integers"):
        summarize_for_save("u", Block(np.zeros((3,)), offset=(0.5,), global_shape=(4,)))
    with pytest.raises(TemplateMismatchError, match="variable 'u'.*numpy or CuPy array"):
        summarize_for_save("u", Block([1, 2, 3], offset=(0,), global_shape=(3,)))
    with pytest.raises(TemplateMismatchError, match="variable 'u'.*objects"):
        summarize_for_save("u", Block(np.zeros(3, object), offset=(0,), global_shape=(3,)))


def test_names_and_kinds_must_agree():
    a = {"u": Block(np.zeros(2), (0,), (4,))}
    b = {"u": Block(np.zeros(2), (2,), (4,)), "w": Block(np.zeros(2), (0,), (2,))}
    with pytest.raises(TemplateMismatchError, match=r"names differ between ranks: 'w' is given on rank 1 but not on "
                                                    "rank 0"):
        plan_save(summaries_for([a, b]))
    c = {"u": Ragged(np.zeros(2))}
    with pytest.raises(TemplateMismatchError, match="variable 'u' is a Block on some ranks and Ragged on others"):
        plan_save(summaries_for([a, c]))


@SETTINGS
@given(st.lists(st.one_of(st.none(), st.integers(0, 5)), min_size=1, max_size=6),
       st.lists(st.integers(0, 3), max_size=2), st.sampled_from(DTYPES))
def test_ragged_offsets(rows, trailing, dtype):
    if all(r is None for r in rows):
        rows = rows[:-1] + [0]
    ranks = [{"p": Ragged(None if r is None else np.zeros((r, *trailing), dtype))} for r in rows]
    variables, boxes, _ = plan_save(summaries_for(ranks))
    counts = [r or 0 for r in rows]
    assert variables["p"].kind == "ragged"
    assert variables["p"].shape == (sum(counts), *trailing)
    assert variables["p"].dtype == dtype_to_json(np.dtype(dtype))
    lo = 0
    for rank, c in enumerate(counts):
        assert boxes[rank]["p"] == ((lo,) + (0,) * len(trailing), (lo + c,) + tuple(trailing))
        lo += c


def test_ragged_errors():
    with pytest.raises(TemplateMismatchError, match="variable 'p': Ragged has no rows on any rank"):
        plan_save(summaries_for([{"p": Ragged()}, {"p": Ragged()}]))
    with pytest.raises(TemplateMismatchError, match="variable 'p': Ragged rows differ"):
        plan_save(summaries_for([{"p": Ragged(np.zeros((2, 3)))}, {"p": Ragged(np.zeros((2, 4)))}]))
    with pytest.raises(TemplateMismatchError, match="variable 'p': Ragged rows differ"):
        plan_save(summaries_for([{"p": Ragged(np.zeros((2, 3)))}, {"p": Ragged(np.zeros((2, 3), np.int64))}]))
    with pytest.raises(TemplateMismatchError, match="variable 'p': Ragged rows need at least one axis"):
        summarize_for_save("p", Ragged(np.float64(1.0)))


@given(st.integers(0, 1000), st.integers(1, 8))
def test_plan_rows_even_split(total, n):
    ranges = plan_rows([None] * n, total, "p")
    assert ranges == [(r * total // n, (r + 1) * total // n) for r in range(n)]


@given(st.lists(st.integers(0, 50), min_size=1, max_size=8))
def test_plan_rows_explicit_counts(counts):
    ranges = plan_rows(counts, sum(counts), "p")
    assert [b - a for a, b in ranges] == counts
    assert ranges[0][0] == 0 and ranges[-1][1] == sum(counts)
    assert all(ranges[i][1] == ranges[i + 1][0] for i in range(len(ranges) - 1))


@given(st.lists(st.integers(0, 50), min_size=1, max_size=8), st.integers(1, 5))
def test_plan_rows_bad_sum(counts, delta):
    with pytest.raises(TemplateMismatchError, match=f"variable 'p': the ranks ask for {sum(counts)} rows"):
        plan_rows(counts, sum(counts) + delta, "p")


def test_plan_rows_other_errors():
    with pytest.raises(TemplateMismatchError, match="variable 'p': some ranks give Ragged"):
        plan_rows([None, 3], 3, "p")
    with pytest.raises(TemplateMismatchError, match="variable 'p': a negative"):
        plan_rows([-1, 4], 3, "p")
