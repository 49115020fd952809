"""Deduplication at many ranks: every block key has one owner rank, which alone finds its duplicates (pure).

An incremental save stores identical blocks of one version once: the first
occurrence (lowest rank, then that rank's order) is written, every later one
points at it (incremental.duplicates).  Handing every rank every rank's keys
(one allgather) costs each rank O(P x keys per rank) received.  Here instead
each key has an owner, :func:`owner` (a stable 64-bit hash of its content hash
modulo P: the same on every rank and in every run), every occurrence of a key
goes to its owner, in the sender's order, and the owner, which therefore sees
all of them, applies the same rule and sends back which are duplicates.  A rank
receives the keys it owns and the verdicts of its own keys, plus one small slot
from each rank: the exchange is two alltoalls (saving/selection.py runs them).

The first alltoall also carries each sender's byte counts in every slot, so every rank holds every rank's counts and decides
the version's kind (incremental.choose_kind) by itself, with no third
collective; the keys travel flagged reusable (the base already stores them)
or new, so the owner decides for either kind: an incremental version
deduplicates its new keys only, a full one writes the reusable blocks too and
deduplicates them all.

Slots of the first alltoall (one per owner): ``(counts,)``, or ``(counts,
keys, flags)`` when the sender has keys for that owner (``flags``: one byte per
key, 1 for reusable).  Slots of the second (one per sender): None (no
duplicate among the keys it sent) or the flags of its keys (one byte each, 1
for a duplicate).  A failure (of a sender's hashing, of an owner's verdicts)
takes the place of every slot of its rank: collective.alltoall_payloads.
"""

from __future__ import annotations

import xxhash

#: The owners' exchange replaces the allgather from this communicator size on (the same decision on every rank,
#: without communication): below it the allgather receives less than about 1 MiB per rank and is one collective
#: where the owners' exchange is two (measured: docs/performance.md, "Many ranks").  Tests lower it.
OWNERS_FROM_RANKS = 4096


def uses_owners(nranks: int) -> bool:
    """Whether a communicator of ``nranks`` ranks deduplicates through the owners (:data:`OWNERS_FROM_RANKS`)."""
    return nranks >= OWNERS_FROM_RANKS


def owner(key: tuple, nranks: int) -> int:
    """The rank that decides every occurrence of ``key`` (content hash, raw length, codec key): XXH3-64 of the
    content hash's text modulo ``nranks``."""
    return xxhash.xxh3_64_intdigest(key[0].encode()) % nranks


def route(keys: list, nranks: int) -> dict[int, list[int]]:
    """``{owner: positions}``: where each of this rank's keys goes, the positions in this rank's order."""
    out: dict[int, list[int]] = {}
    for i, key in enumerate(keys):
        out.setdefault(owner(key, nranks), []).append(i)
    return out


def key_parts(keys: list, reusable: list, positions: dict) -> dict[int, tuple[list, bytes]]:
    """``{owner: (keys, flags)}`` for :func:`key_slot`: each owner's keys in this rank's order, flagged reusable."""
    return {o: ([keys[i] for i in pos], bytes(1 if reusable[i] else 0 for i in pos)) for o, pos in positions.items()}


def key_slot(counts: tuple, part: tuple | None = None) -> tuple:
    """What this rank sends to one owner in the first alltoall: its ``counts``, and its ``part`` for that owner
    (:func:`key_parts`) when it has one."""
    return (counts,) if part is None else (counts, *part)


def read_key_slots(received: list) -> tuple[list, dict]:
    """``(counts, inbox)`` from the first alltoall's slots, by sender: each sender's counts, and ``{sender:
    (keys, flags)}`` of the senders that sent keys."""
    counts = [slot[0] for slot in received]
    inbox = {s: (slot[1], slot[2]) for s, slot in enumerate(received) if len(slot) > 1}
    return counts, inbox


def verdicts(inbox: dict, full: bool) -> dict[int, bytes]:
    """The owner's decision: ``{sender: flags}`` (one byte per key it sent, 1 for a duplicate), for the senders
    with at least one duplicate.

    The rule of incremental.duplicates over the keys the owner holds: in rank
    order, then each rank's order, a key seen before is a duplicate.  ``full``:
    the version is full, so reusable keys are written too and take part; an
    incremental version writes only new keys (reusable ones are never
    duplicates: they are not written at all).
    """
    seen: set = set()
    out = {}
    for sender in sorted(inbox):
        keys, reusable = inbox[sender]
        flags = bytearray(len(keys))
        for i, (key, again) in enumerate(zip(keys, reusable, strict=True)):
            if again and not full:
                continue
            if key in seen:
                flags[i] = 1
            else:
                seen.add(key)
        if any(flags):
            out[sender] = bytes(flags)
    return out


def verdict_slots(decided: dict, nranks: int) -> list:
    """The second alltoall's slots, by sender: its flags from :func:`verdicts`, or None."""
    return [decided.get(s) for s in range(nranks)]


def read_verdict_slots(received: list) -> dict:
    """``{owner: flags}`` from the second alltoall's slots, by owner: the owners that found duplicates among
    this rank's keys."""
    return {o: slot for o, slot in enumerate(received) if slot is not None}


def reassemble(positions: dict, replies: dict, reusable: list, full: bool) -> list[bool]:
    """This rank's duplicate flags in its own order, one per key the version may write: every key of a full
    version, the new (not reusable) ones of an incremental one (as incremental.duplicates gives them).

    ``positions``: :func:`route`'s; ``replies``: :func:`read_verdict_slots`'s.
    """
    dup = [False] * len(reusable)
    for o, flags in replies.items():
        for i, flag in zip(positions[o], flags, strict=True):
            dup[i] = bool(flag)
    return [d for d, again in zip(dup, reusable) if full or not again]
