"""Where each Reed-Solomon shard of a group lives, and which shards rebuild which (pure: no MPI, no I/O).

A group has g >= k + m members on distinct nodes.  Each member's data file,
zero-padded, is cut into k segments of S bytes.  There are g stripes; stripe s
has k + m positions, position q held by member ``(s + q) mod g``:

* positions 0..k-1 are data: member j's segment q sits in stripe ``(j - q) mod g``;
* positions k..k+m-1 are the m Reed-Solomon check blocks of the stripe's k data
  segments; member j holds check block t (at offset ``t * S`` of its parity
  file) of stripe ``(j - k - t) mod g``.

So every member holds at most one shard of each stripe, and losing any m
members erases at most m shards of every stripe: each stripe, hence every
file, is recoverable from k surviving shards.  Each member stores m * S =
m/k of its file as parity (the least any code tolerating m losses can).

A shard is named ``(member, kind, index)`` with kind ``"data"`` (index: the
segment q) or ``"parity"`` (index: the check block t).
"""

from __future__ import annotations


def segment_bytes(sizes: list[int], k: int) -> int:
    """S: the segment (and check block) size of a group whose data files have these sizes."""
    return -(-max(sizes) // k) if sizes and max(sizes) > 0 else 0


def holder(g: int, stripe: int, position: int) -> int:
    """The member holding ``position`` of ``stripe``."""
    return (stripe + position) % g


def shard_at(g: int, k: int, stripe: int, position: int) -> tuple[int, str, int]:
    """The shard ``(member, kind, index)`` at ``position`` of ``stripe``."""
    j = holder(g, stripe, position)
    return (j, "data", position) if position < k else (j, "parity", position - k)


def data_stripe(g: int, member: int, segment: int) -> int:
    """The stripe that member's data segment enters (at position ``segment``)."""
    return (member - segment) % g


def parity_stripe(g: int, k: int, member: int, block: int) -> int:
    """The stripe whose check block ``block`` (position ``k + block``) the member holds."""
    return (member - k - block) % g


def leader(g: int, k: int, stripe: int) -> int:
    """The member that encodes ``stripe``: the holder of its first check block."""
    return holder(g, stripe, k)


def check_shape(g: int, k: int, m: int) -> None:
    """Raise ValueError unless a group of g members can hold a (k, m) code."""
    if k < 1 or m < 1 or k + m > g or k + m > 256:
        raise ValueError(f"a Reed-Solomon group of {g} members cannot hold k={k} data and m={m} check shards")


def rebuild_plan(g: int, k: int, m: int, erased: set, ranks: list[int] | None = None
                 ) -> tuple[list[tuple[int, int, list[int]]] | None, str | None]:
    """``(tasks, None)`` or ``(None, why)``: how to rebuild every erased data segment of the group.

    ``erased``: the shards ``(member, kind, index)`` that are lost or damaged.
    A task ``(stripe, target, sources)``: member ``target`` rebuilds its data
    segment in ``stripe`` from the shards at the k ``sources`` positions
    (surviving data positions first: decoding them is a copy).  Erased check
    blocks are not rebuilt (a restore needs the data files only).  ``ranks``
    (the group's ranks) names the members in the reason.
    """
    check_shape(g, k, m)
    tasks = []
    for s in range(g):
        gone = [q for q in range(k + m) if shard_at(g, k, s, q) in erased]
        if len(gone) > m:
            shards = ", ".join(f"rank {j if ranks is None else ranks[j]}'s {kind} {i}"
                               for j, kind, i in (shard_at(g, k, s, q) for q in gone))
            return None, (f"stripe {s} lost {len(gone)} shards ({shards}): a (k={k}, m={m}) Reed-Solomon code "
                          f"rebuilds at most {m} per stripe")
        sources = [q for q in range(k + m) if q not in gone][:k]
        tasks.extend((s, holder(g, s, q), sources) for q in gone if q < k)
    return tasks, None
