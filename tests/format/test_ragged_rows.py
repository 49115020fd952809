"""A Ragged table's rows from one scan of tallies (hpcckpt.loading.ragged_rows) against planning.plan_rows; no MPI, no I/O.

The scan is simulated as MPI_Scan computes it (the inclusive sum of the ranks' tallies, rank by rank), each
rank's range taken from it as the load takes it, and the last rank's check compared with plan_rows: the same
ranges whenever plan_rows accepts the requests, its exact message whenever it refuses them.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcckpt import TemplateMismatchError
from hpcckpt.core.planning import plan_rows
from hpcckpt.loading.ragged_rows import row_range, rows_problem, tally

SETTINGS = settings(max_examples=300, deadline=None)


def scanned(requests: list, names: list, shapes: dict) -> tuple[list, str | None]:
    """Every rank's rows ``{name: (lo, hi)}`` and the last rank's problem, from the inclusive scan of the tallies."""
    mine = [tally(r, names) for r in requests]
    scan = np.cumsum(np.stack(mine), axis=0)
    n = len(requests)
    rows = []
    for rank, r in enumerate(requests):
        before = (scan[rank] - mine[rank]).reshape(len(names), -1)
        rows.append({name: row_range(r[name][1], before[i], shapes[name][0], rank, n)
                     for i, name in enumerate(names) if r is not None and r.get(name, ("block",))[0] == "ragged"})
    return rows, rows_problem(names, scan[-1], shapes, n)


def reference(requests: list, names: list, shapes: dict) -> tuple[list | None, str | None]:
    """plan_rows per name in order: every rank's ranges, or the first name's message."""
    out = [{} for _ in requests]
    for name in names:
        try:
            ranges = plan_rows([r[name][1] for r in requests], shapes[name][0], name)
        except TemplateMismatchError as exc:
            return None, str(exc)
        for rank, rng in enumerate(ranges):
            out[rank][name] = rng
    return out, None


counts = st.one_of(st.none(), st.integers(-3, 12))


@st.composite
def ragged_loads(draw):
    """1-3 Ragged tables of 0-40 rows on 1-9 ranks, each rank asking an even split or a count (often valid)."""
    nranks = draw(st.integers(1, 9))
    names = [f"t{i}" for i in range(draw(st.integers(1, 3)))]
    shapes = {name: (draw(st.integers(0, 40)), draw(st.integers(1, 3))) for name in names}
    per_rank = [{} for _ in range(nranks)]
    for name in names:
        kind = draw(st.sampled_from(["split", "counts", "any"]))
        if kind == "split":
            asks = [None] * nranks
        elif kind == "counts":  # counts that add up: cut points of the rows
            cuts = sorted(draw(st.lists(st.integers(0, shapes[name][0]), min_size=nranks - 1, max_size=nranks - 1)))
            edges = [0] + cuts + [shapes[name][0]]
            asks = [b - a for a, b in zip(edges, edges[1:])]
        else:
            asks = draw(st.lists(counts, min_size=nranks, max_size=nranks))
        for rank, rows in enumerate(asks):
            per_rank[rank][name] = ("ragged", rows)
    return per_rank, names, shapes


@SETTINGS
@given(ragged_loads())
def test_the_scan_gives_plan_rows_ranges_or_its_exact_message(load):
    requests, names, shapes = load
    rows, problem = scanned(requests, names, shapes)
    want, message = reference(requests, names, shapes)
    assert problem == message
    if message is None:
        assert rows == want
    for rank_rows in rows:  # valid or not, every range lies inside its table: the ranks can go on to the error
        for name, (lo, hi) in rank_rows.items():
            assert 0 <= lo <= hi <= shapes[name][0]


@SETTINGS
@given(ragged_loads(), st.data())
def test_a_table_some_rank_does_not_ask_ragged_rows_of_is_left_to_the_signature_check(load, data):
    """A rank that loads the table as a Block, omits it, or whose template failed adds nothing: the scan does
    not judge that table (rank 0's signature check, or the failure, is the error), only the others."""
    requests, names, shapes = load
    victim = data.draw(st.integers(0, len(requests) - 1))
    dropped = data.draw(st.sampled_from(names))
    how = data.draw(st.sampled_from(["block", "omitted", "failed"]))
    changed = [dict(r) for r in requests]
    if how == "failed":
        changed[victim] = None
    elif how == "omitted":
        del changed[victim][dropped]
    else:
        changed[victim][dropped] = ("block", (0, 0), shapes[dropped])
    _, problem = scanned(changed, names, shapes)
    if how == "failed":  # every table lacks that rank's tally
        assert problem is None
    else:
        assert problem == reference(requests, [n for n in names if n != dropped], shapes)[1]


def test_the_tally_of_one_rank():
    """Four numbers per table: rows asked by a count, a count asked, an even split asked, a negative count (any
    negative count adds -1 rows: no int64 overflow, and the negative count is refused whatever its size)."""
    got = tally({"a": ("ragged", 5), "b": ("ragged", None), "c": ("ragged", -2), "d": ("block", (0,), (3,)),
                 "f": ("ragged", -10**30)}, ["a", "b", "c", "d", "e", "f"])
    assert got.tolist() == [5, 1, 0, 0, 0, 0, 1, 0, -1, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, -1, 1, 0, 1]
    assert tally(None, ["a"]).tolist() == [0, 0, 0, 0]


@pytest.mark.parametrize("rows, want", [(None, (3, 6)), (4, (7, 11)), (-2, (7, 7)), (20, (7, 12))])
def test_a_range_stays_inside_the_table(rows, want):
    """Rank 1 of 4 over 12 rows; the ranks before it asked 7: a split, a count, and invalid counts clipped."""
    assert row_range(rows, np.array([7, 1, 0, 0]), 12, 1, 4) == want
