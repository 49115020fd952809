"""Pure planning of the I/O strategies: shared chunk reads, aggregator groups, auto choice."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcckpt.core.planning import plan_shared_reads
from hpcckpt.core.regions import intersect, volume
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


@st.composite
def grids_2d(draw):
    """A 2-D array cut into a grid of chunks (the save) and into rank boxes, some empty or None (the load)."""
    shape = (draw(st.integers(1, 12)), draw(st.integers(1, 12)))
    rows, cols = _cuts(draw, shape[0], draw(st.integers(1, 4))), _cuts(draw, shape[1], draw(st.integers(1, 4)))
    chunks = [((a, c), (b, d)) for a, b in zip(rows, rows[1:]) for c, d in zip(cols, cols[1:]) if b > a and d > c]
    boxes = []
    for _ in range(draw(st.integers(1, 5))):
        lo = (draw(st.integers(0, shape[0])), draw(st.integers(0, shape[1])))
        hi = (draw(st.integers(lo[0], shape[0])), draw(st.integers(lo[1], shape[1])))
        boxes.append(draw(st.sampled_from([None, (lo, hi)])))
    return chunks, boxes


@settings(max_examples=200, deadline=None)
@given(grids_2d())
def test_shared_reads_list_every_rank_of_every_shared_chunk_with_its_part(case):
    chunks, boxes = case
    starts = np.array([c[0] for c in chunks], np.int64)
    stops = np.array([c[1] for c in chunks], np.int64)
    plan = plan_shared_reads(starts, stops, boxes)
    for k, (lo, hi) in enumerate(chunks):
        parts = [(r, *intersect(lo, hi, *box)) for r, box in enumerate(boxes) if box and intersect(lo, hi, *box)]
        if len(parts) > 1:
            reader, got = plan[k]
            assert got == parts
            sizes = [volume(np.subtract(b, a)) for _, a, b in parts]
            assert reader == parts[sizes.index(max(sizes))][0]
        else:
            assert k not in plan


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


def test_auto_keeps_the_strategy_in_use_unless_another_is_clearly_faster():
    def row(strategy, gbps):
        return {"strategy": strategy, "nranks": 4, "bytes_per_rank": 1e6, "gbps": gbps}

    close = [row("file-per-rank", 1.0), row("aggregated", 1.05)]
    assert choose_strategy(4, 1e6, 2, close) == "aggregated"  # in use, and the other is not 10% better
    assert choose_strategy(4, 1e6, 2, close + [row("aggregated", 0.95)]) == "aggregated"
    assert choose_strategy(4, 1e6, 2, close + [row("aggregated", 0.5)]) == "file-per-rank"  # median now clearly lower
    assert choose_strategy(4, 1e6, 2, [row("aggregated", 1.0), row("file-per-rank", 1.2)]) == "file-per-rank"


_ROWS = st.lists(st.fixed_dictionaries({
    "strategy": st.sampled_from(["file-per-rank", "aggregated", "shared-file"]), "nranks": st.integers(1, 40),
    "bytes_per_rank": st.floats(1, 1e9), "gbps": st.floats(0.01, 100)}), max_size=8)


@given(st.lists(st.integers(0, 5), min_size=1, max_size=40), st.one_of(st.none(), st.integers(1, 50)),
       st.floats(1, 1e10), _ROWS)
def test_auto_on_a_store_of_one_writer_per_file_writes_the_fewest_objects(ids, count, bytes_per_rank, history):
    """Where several ranks cannot write one file (an object store) auto never picks shared-file, ignores the
    measurements, and picks aggregated exactly when its groups (one file each) are fewer than the ranks."""
    layout = layout_from_ids(ids)
    nranks = len(ids)
    chosen = choose_strategy(nranks, bytes_per_rank, layout.max_ranks_per_node, history, shared_files=False,
                             aggregators=count)
    files = len(aggregator_groups(layout.node_of, count))
    assert chosen == ("aggregated" if files < nranks else "file-per-rank")


def test_each_storage_is_offered_the_strategies_whose_files_it_holds():
    """POSIX holds every strategy's files; an object store one writer per object (no shared-file); memory, seen
    by one process only, file-per-rank alone."""
    from hpcckpt.storage import POSIX, MemoryStorage
    from hpcckpt.storage.s3 import S3Storage
    from hpcckpt.transport import TRANSPORTS

    def fitting(storage):
        return [name for name, t in TRANSPORTS.items() if t.fits(storage)]

    assert fitting(POSIX) == ["file-per-rank", "aggregated", "shared-file"]
    assert fitting(S3Storage()) == ["file-per-rank", "aggregated"]
    assert fitting(MemoryStorage()) == ["file-per-rank"]


def test_memory_storage_refuses_aggregated_with_the_strategies_it_holds():
    import hpcckpt
    from hpcckpt.errors import CheckpointError
    from hpcckpt.storage import MemoryStorage

    storage = MemoryStorage()
    with pytest.raises(CheckpointError, match="'aggregated' writes files shared between ranks, which MemoryStorage "
                                              "does not hold: use file-per-rank$"):
        hpcckpt.save({"u": hpcckpt.Block(np.arange(4.0))}, "/memory/v", storage=storage, strategy="aggregated")
    assert not storage.exists("/memory/v")
