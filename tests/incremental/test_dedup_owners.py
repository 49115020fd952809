"""The owners' deduplication exchange (hpcckpt.incremental.dedup_owners), simulated over P ranks without MPI, against
incremental.duplicates (the allgather way) as the reference."""

from __future__ import annotations

import pickle

from hypothesis import given, settings, strategies as st

from hpcckpt.incremental import dedup_owners
from hpcckpt.incremental.rules import duplicates

KEYS = st.tuples(st.sampled_from(["a" * 32, "b" * 32, "0123456789abcdef" * 2, "mix128:" + "c" * 32]),
                 st.sampled_from([8, 64]), st.sampled_from(["none", '[{"id":"zstd"},"<f8"]']))
RANKS = st.lists(st.lists(st.tuples(KEYS, st.booleans()), max_size=8), min_size=1, max_size=6)


def exchange(per_rank: list, counts: list, full_of) -> tuple[list, list]:
    """Both alltoalls over every rank, as saving/selection.py makes them (pickled, as mpi4py sends them): ``(counts
    every rank read, each rank's duplicate flags)``; ``full_of(counts)`` decides the kind on each rank."""
    p = len(per_rank)
    sent, positions = [], []
    for r, items in enumerate(per_rank):
        keys, reusable = [k for k, _ in items], [f for _, f in items]
        positions.append(dedup_owners.route(keys, p))
        parts = dedup_owners.key_parts(keys, reusable, positions[r])
        sent.append([pickle.dumps(dedup_owners.key_slot(counts[r], parts.get(o))) for o in range(p)])
    read, replies = [], []
    for o in range(p):
        got, inbox = dedup_owners.read_key_slots([pickle.loads(sent[s][o]) for s in range(p)])
        assert all(dedup_owners.owner(k, p) == o for keys, _ in inbox.values() for k in keys)  # only its own keys
        read.append(got)
        decided = dedup_owners.verdicts(inbox, full_of(got))
        replies.append([pickle.dumps(x) for x in dedup_owners.verdict_slots(decided, p)])
    flags = []
    for r, items in enumerate(per_rank):
        back = dedup_owners.read_verdict_slots([pickle.loads(replies[o][r]) for o in range(p)])
        flags.append(dedup_owners.reassemble(positions[r], back, [f for _, f in items], full_of(read[r])))
    return read, flags


@given(per_rank=RANKS, full=st.booleans())
@settings(max_examples=300, deadline=None)
def test_owners_find_the_duplicates_the_allgather_finds(per_rank, full):
    """Random keys per rank, repeated within and across ranks, flagged reusable at random: every rank's flags
    equal incremental.duplicates over the keys the version writes (all of a full one, the new ones otherwise)."""
    p = len(per_rank)
    counts = [(100 + r, r, 0, 0) for r in range(p)]
    read, flags = exchange(per_rank, counts, lambda got: full)
    assert all(got == counts for got in read)  # every rank holds every rank's counts: the same kind everywhere
    written = [[k for k, again in items if full or not again] for items in per_rank]
    assert flags == [duplicates(written, r) for r in range(p)]


@given(per_rank=RANKS)
@settings(max_examples=100, deadline=None)
def test_the_kind_each_rank_decides_from_the_counts_is_the_same_and_governs_the_verdicts(per_rank):
    p = len(per_rank)
    counts = [(10, 9 if r == p - 1 else 0, 0, 0) for r in range(p)]  # the last rank changed most of its bytes
    kinds = []

    def full_of(got):
        total, changed = sum(c[0] for c in got), sum(c[1] for c in got)
        kinds.append(changed / total > 0.5 / p)
        return kinds[-1]

    _, flags = exchange(per_rank, counts, full_of)
    assert len(set(kinds)) == 1
    written = [[k for k, again in items if kinds[0] or not again] for items in per_rank]
    assert flags == [duplicates(written, r) for r in range(p)]


@given(key=KEYS, p=st.integers(1, 70000))
def test_owner_is_a_rank_and_the_same_for_equal_content_hashes(key, p):
    o = dedup_owners.owner(key, p)
    assert 0 <= o < p and o == dedup_owners.owner((key[0], key[1] + 1, "other"), p)


def test_owner_is_stable_across_runs():
    """XXH3-64 of the content hash's text, a fixed function (not Python's hash(), which differs between
    processes and would split a key's occurrences between owners)."""
    assert dedup_owners.owner(("0123456789abcdef" * 2, 8, "none"), 1 << 62) == 0x1121d5b6c0ac055 % (1 << 62)


def test_keys_spread_over_the_owners():
    keys = [(f"{k:032x}", 8, "none") for k in range(20000)]
    load = [len(pos) for pos in dedup_owners.route(keys, 16).values()]
    assert len(load) == 16 and max(load) < 1.1 * 20000 / 16


def test_slots_of_both_alltoalls_read_back_what_was_sent():
    """(A failure takes the place of every slot of its rank: collective.alltoall_payloads, tested with it.)"""
    slots = [dedup_owners.key_slot((1, 0, 0, 0)), dedup_owners.key_slot((2, 1, 0, 0), (["k"], b"\x00"))]
    counts, inbox = dedup_owners.read_key_slots([pickle.loads(pickle.dumps(s)) for s in slots])
    assert counts == [(1, 0, 0, 0), (2, 1, 0, 0)] and inbox == {1: (["k"], b"\x00")}
    back = [pickle.loads(pickle.dumps(s)) for s in dedup_owners.verdict_slots({1: b"\x01"}, 3)]
    assert dedup_owners.read_verdict_slots(back) == {1: b"\x01"}


def test_threshold():
    assert not dedup_owners.uses_owners(dedup_owners.OWNERS_FROM_RANKS - 1)
    assert dedup_owners.uses_owners(dedup_owners.OWNERS_FROM_RANKS)
