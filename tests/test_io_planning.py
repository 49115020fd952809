"""Pure planning of the I/O strategies: shared chunk reads, aggregator groups, auto choice."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcckpt.planning import plan_shared_reads
from hpcckpt.regions import intersect, volume
from hpcckpt.transport.aggregated import aggregator_groups
from hpcckpt.transport.auto import SMALL_BYTES, choose_strategy
from hpcckpt.transport.topology import layout_from_ids, simulated_layout


def _cuts(draw, n, parts):
    inner = sorted(draw(st.lists(st.integers(0, n), min_size=parts - 1, max_size=parts - 1)))
    return [0, *inner, n]


@st.composite
def layouts(draw):
    """1-D global length, chunk cuts (the save) and rank cuts (the load)."""
    n = draw(st.integers(1, 60))
    chunk_cuts = _cuts(draw, n, draw(st.integers(1, 8)))
    rank_cuts = _cuts(draw, n, draw(st.integers(1, 6)))
    return n, chunk_cuts, rank_cuts


@settings(max_examples=200, deadline=None)
@given(layouts())
def test_each_needed_byte_is_read_once_and_delivered_exactly(layout):
    n, chunk_cuts, rank_cuts = layout
    chunks = [(a, b) for a, b in zip(chunk_cuts, chunk_cuts[1:]) if b > a]
    starts = np.array([[a] for a, _ in chunks], np.int64)
    stops = np.array([[b] for _, b in chunks], np.int64)
    boxes = [((a,), (b,)) if b > a else None for a, b in zip(rank_cuts, rank_cuts[1:])]
    plan = plan_shared_reads(starts, stops, boxes)
    delivered = np.zeros(n, int)
    reads = np.zeros(len(chunks), int)
    for k, (a, b) in enumerate(chunks):
        users = [r for r, box in enumerate(boxes) if box and intersect((a,), (b,), *box)]
        if len(users) > 1:
            reader, parts = plan[k]
            assert reader in users and sorted(r for r, _, _ in parts) == users
            sizes = {r: volume(np.subtract(hi, lo)) for r, lo, hi in parts}
            assert sizes[reader] == max(sizes.values()), "the rank with the largest part reads the chunk"
            for _, lo, hi in parts:
                delivered[lo[0]:hi[0]] += 1
        else:
            assert k not in plan
            for r in users:
                lo, hi = intersect((a,), (b,), *boxes[r])
                delivered[lo[0]:hi[0]] += 1
        reads[k] = 1 if users else 0
    assert np.all(delivered == 1), "every element reaches exactly one rank once"
    assert np.all(reads <= 1)


@given(st.lists(st.integers(0, 3), min_size=1, max_size=20), st.one_of(st.none(), st.integers(1, 25)))
def test_aggregator_groups_partition_the_ranks(ids, count):
    layout = layout_from_ids(ids)
    groups = aggregator_groups(layout.node_of, count)
    flat = [r for g in groups for r in g]
    assert sorted(flat) == list(range(len(ids)))
    if count is None:
        assert len(groups) == layout.nnodes
        assert all(len({layout.node_of[r] for r in g}) == 1 for g in groups)
    else:
        assert len(groups) == min(count, len(ids))


def test_simulated_layout_numbers_nodes_in_rank_order():
    assert simulated_layout(5, 2).node_of == (0, 0, 1, 1, 2)
    assert layout_from_ids(["b", "a", "b", "c"]).node_of == (0, 1, 0, 2)


def test_auto_rule():
    assert choose_strategy(1, 1e9, 1, []) == "file-per-rank"
    assert choose_strategy(16, SMALL_BYTES / 2, 4, []) == "file-per-rank"  # nothing measured: the safe choice
    fpr_only = [{"strategy": "file-per-rank", "nranks": 16, "bytes_per_rank": SMALL_BYTES / 2, "gbps": 1.0}]
    assert choose_strategy(16, SMALL_BYTES / 2, 4, fpr_only) == "aggregated"  # small writes: try it once
    assert choose_strategy(16, SMALL_BYTES / 2, 1, fpr_only) == "file-per-rank"  # one rank per node: nothing to gain
    measured = fpr_only + [{"strategy": "aggregated", "nranks": 16, "bytes_per_rank": SMALL_BYTES / 2, "gbps": 0.5}]
    assert choose_strategy(16, SMALL_BYTES / 2, 4, measured) == "file-per-rank"  # the measurement decides
    assert choose_strategy(4, 128e6, 4, []) == "file-per-rank"
    history = [{"strategy": "shared-file", "nranks": 4, "bytes_per_rank": 100e6, "gbps": 3.0},
               {"strategy": "file-per-rank", "nranks": 4, "bytes_per_rank": 120e6, "gbps": 1.0}]
    assert choose_strategy(4, 128e6, 4, history) == "shared-file"
    assert choose_strategy(8, 128e6, 4, history) == "file-per-rank"  # other scale: measurements do not apply
    assert choose_strategy(4, 1e9, 4, history) == "file-per-rank"  # other size
