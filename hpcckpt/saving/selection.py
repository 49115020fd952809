"""The select stage of every save: which of this rank's data is written, and what is pointed at instead.

A full save writes every array whole (the transform stage cuts it into
chunks).  An incremental save cuts each variable along the global block grid,
hashes every block and writes only the blocks whose content the chain does not
hold yet; the rules are incremental/rules.py's and incremental/dedup_owners.py's (pure), this
module runs them across the ranks: every rank's changed and total bytes (the
full/incremental policy) and the blocks' keys (deduplication within the
version) travel in one allgather (:func:`by_allgather`, plus one of every key
when a version with reusable blocks turns full), or, from
dedup_owners.OWNERS_FROM_RANKS ranks on, in two alltoalls through the keys'
owners (:func:`by_owners`), so that what a rank receives does not grow with
the number of keys of all ranks.

Both give a :class:`Selection`: the items to write, ``(variable, global
start, array, cut)``, plus, for an incremental-capable save, the rows that
point into older versions and the content hashes the commit records.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import xxhash

from hpcckpt.core import blockhash
from hpcckpt.incremental import dedup_owners
from hpcckpt.mpi.agreement import HASH_FAILED
from hpcckpt.core.arrays import byte_view, local_pieces
from hpcckpt.core.checksum import checksum_from_xxh3_128
from hpcckpt.mpi.collective import allgather_checked, allgather_payloads, alltoall_payloads, attempt
from hpcckpt.core.devices import to_host
from hpcckpt.core.encoding import dtype_from_json
from hpcckpt.incremental.rules import HASH_ALGORITHM, ChainIndex, choose_kind, duplicates, hash_pieces
from hpcckpt.core.names import rank_file
from hpcckpt.options import SaveOptions
from hpcckpt.saving.plan import PlanCache


@dataclass
class Selection:
    """What this rank writes in one save.

    ``items``: ``(variable, global start, array, cut)``; ``info``: the
    version's ``extra.incremental`` (None for a plain full save, which records
    no hashes); ``hashes``: ``{(variable, start): content hash}`` of the items;
    ``refs``: rows into older versions; ``dups``: blocks identical to one
    written in this version; ``digests``: checksums known from the content
    hash (uncompressed host blocks), by ``(variable, start)``; ``replicas``:
    this rank's digest of each region of a replicated Block that other ranks
    hold too, by ``(variable, start, stop)`` (compared at the commit:
    agreement.replica_mismatch).
    """

    items: list
    info: dict | None = None
    hashes: dict = field(default_factory=dict)
    refs: list = field(default_factory=list)
    dups: list = field(default_factory=list)
    digests: dict = field(default_factory=dict)
    replicas: dict = field(default_factory=dict)

    @property
    def kind(self) -> str:
        return "full" if self.info is None else self.info["kind"]

    def commit_part(self, rows: list):
        """What this rank sends to the commit with its written ``rows``."""
        if self.info is None:
            return rows
        return {"written": rows, "hashes": self.hashes, "refs": self.refs, "dups": self.dups}

    def with_items(self, items: list) -> "Selection":
        """The same selection over other arrays (the staged copies of these items)."""
        return Selection(items, self.info, self.hashes, self.refs, self.dups, self.digests, self.replicas)


def select_full(arrays: dict, starts: dict, replicas: dict | None = None) -> Selection:
    """Every non-empty array of this rank, whole, at its box start (no MPI); of a replicated Block, the parts
    this rank owns (``replicas``: the plan's ``{name: (owned, shared)}``), with the digests of its shared regions."""
    replicas = replicas or {}
    return Selection([(name, start, arr, True) for name, start, arr in written_parts(arrays, starts, replicas)],
                     replicas=replica_digests(arrays, starts, replicas))


def written_parts(arrays: dict, starts: dict, replicas: dict) -> list:
    """``(variable, global start, array)`` this rank writes: each array whole, or for a replicated Block a view
    of each box it owns (the lowest rank holding an element writes it: regions.owned_parts)."""
    out = []
    for name, arr in sorted(arrays.items()):
        if arr is None or not arr.size:
            continue
        if name not in replicas:
            out.append((name, tuple(starts[name]), arr))
            continue
        out.extend((name, tuple(lo), region_view(arr, starts[name], lo, hi)) for lo, hi in replicas[name][0])
    return out


def region_view(arr, start, lo, hi):
    """The part ``[lo, hi)`` (global) of the local array ``arr`` whose box starts at ``start``: a view."""
    return arr[tuple(slice(a - s, b - s) for a, b, s in zip(lo, hi, start)) + (Ellipsis,)]


def replica_digests(arrays: dict, starts: dict, replicas: dict) -> dict:
    """``{(variable, start, stop): digest}`` of this rank's copy of every shared region of its replicated Blocks.

    Never raises: a copy that cannot be hashed gets ``HASH_FAILED`` and the
    reason, which fails the commit on every rank (agreement.replica_mismatch).
    """
    out = {}
    for name, (_, shared) in sorted(replicas.items()):
        for lo, hi in shared:
            try:
                out[(name, tuple(lo), tuple(hi))] = region_digest(region_view(arrays[name], starts[name], lo, hi))
            except Exception as exc:  # noqa: BLE001 - reported at the commit, on every rank alike
                out[(name, tuple(lo), tuple(hi))] = f"{HASH_FAILED}{type(exc).__name__}: {exc}"
    return out


def region_digest(arr) -> str:
    """xxh3_128 of an array's elements in C order, read in pieces (no copy of a C-contiguous host array; a
    device array's pieces are copied to the host, so host and device copies of equal data agree)."""
    h = xxhash.xxh3_128()
    for _, _, piece in local_pieces(arr, 8 << 20):
        h.update(byte_view(to_host(piece)))
    return h.hexdigest()


def select_changed(comm, what: str, arrays: dict, plan: PlanCache, options: SaveOptions, index: ChainIndex | None,
                   per_rank_files: bool = False, precopied: dict | None = None,
                   probed: frozenset | None = None) -> Selection:
    """Collective: the blocks of this rank that the chain does not hold, and what the others point at.

    ``plan``: the agreed plan: this rank's boxes, the variables, their codecs and
    this rank's parts of replicated Blocks.

    One allgather (every rank's changed and total bytes, and the keys of its
    new blocks for deduplication), plus one more when the policy turns a
    version with reusable blocks into a full one; from
    dedup_owners.OWNERS_FROM_RANKS ranks on (with ``dedup``), two alltoalls
    through the keys' owners instead, whatever the kind.  ``per_rank_files``
    (multi-level saves): a rank reuses only blocks of its own rank file and
    nothing is deduplicated across ranks, so every block a rank reads back on
    its node is on that node.  ``precopied``: blocks this rank already wrote into files of this version ahead
    of the call (pre-copy, hpcckpt.saving.precopy), ``{Key: Location}`` with the file relative to the version: a
    block found there is not written again (it counts as changed for the policy: it is new to the chain).
    ``probed``: keys of blocks pre-copy's probes saw (hashed, not written): the bytes of changed blocks with
    one of them are counted, ``info["probed_bytes"]``, so that pre-copy learns what changed since its probes.
    """
    rank = comm.Get_rank()
    pre = precopied or {}
    if per_rank_files and index is not None:
        index = index.restricted(rank_file(rank))
    dedup = options.dedup and not per_rank_files
    dtypes = {n: dtype_from_json(v.dtype) for n, v in plan.variables.items()}
    replicas = plan.replicas or {}
    starts = {n: b[0] for n, b in plan.boxes.items()}
    entries, failure = attempt(lambda: hash_pieces(written_parts(arrays, starts, replicas), plan.variables, dtypes,
                                                   plan.codecs, options.block_bytes, index))
    entries = entries or []
    seen = probed or frozenset()
    counts = (sum(e[5] for e in entries), sum(e[5] for e in entries if e[6] is None),
              sum(e[5] for e in entries if e[4] in pre), sum(e[5] for e in entries if e[6] is None and e[4] in seen))
    candidates = [e for e in entries if e[4] not in pre]  # a pre-copied block is already written in this version
    keys = [e[4] for e in candidates] if dedup else None
    reusable = [e[6] is not None for e in candidates]
    depth = index.depth if index is not None and len(index) else None
    decide = lambda sums: choose_kind(depth, sums[1], sums[0], options.max_chain,  # noqa: E731
                                      options.full_threshold)
    exchange = by_owners if dedup and dedup_owners.uses_owners(comm.Get_size()) else by_allgather
    sums, (kind, reason), dup = exchange(comm, what, failure, counts, keys, reusable, decide)
    total_bytes, changed_bytes, precopied_bytes, probed_bytes = sums
    if kind == "full":
        entries = [e[:6] + (None,) for e in entries]
    own = [e for e in entries if e[6] is None and e[4] in pre]
    new = [e for e in entries if e[6] is None and e[4] not in pre]
    dup = [False] * len(new) if dup is None else dup
    to_write = [e for e, d in zip(new, dup) if not d]
    info = {"kind": kind, "base": index.name if kind == "incremental" else None,
            "depth": index.depth + 1 if kind == "incremental" else 0, "reason": reason,
            "hash": HASH_ALGORITHM, "block_bytes": options.block_bytes, "total_bytes": total_bytes,
            "changed_bytes": changed_bytes}
    if precopied is not None:
        info["precopied_bytes"] = precopied_bytes
    if probed is not None:
        info["probed_bytes"] = probed_bytes
    return Selection(items=[(e[0], tuple(e[1]), e[3], False) for e in to_write], info=info,
                     hashes={(e[0], tuple(e[1])): e[4][0] for e in to_write},
                     refs=[(e[0], *e[6], e[1], e[2], e[4][0]) for e in entries if e[6] is not None]
                     + [(e[0], *pre[e[4]], e[1], e[2], e[4][0]) for e in own],
                     dups=[(e[0], e[4], e[1], e[2], e[4][0]) for e, d in zip(new, dup) if d],
                     digests=known_digests(to_write), replicas=replica_digests(arrays, starts, replicas))


def by_allgather(comm, what: str, failure, counts: tuple, keys: list | None, reusable: list, decide) -> tuple:
    """Collective, the policy and deduplication by allgather: ``(sums of every rank's counts, decide(sums), this
    rank's duplicate flags or None)``; below :data:`dedup_owners.OWNERS_FROM_RANKS` ranks, or without ``dedup``.

    ``counts``: this rank's (total, changed, pre-copied, probed) bytes; ``keys``: the keys the version may write
    (None: no deduplication) and ``reusable``: which of them the base holds; ``decide(sums)``: ``(kind,
    reason)``.  One allgather of the counts and the new keys, plus one of every key when the version turns
    full while some rank has reusable blocks (they are written after all).
    """
    new = None if keys is None else [k for k, again in zip(keys, reusable) if not again]
    everyone = allgather_payloads(comm, what, failure, (counts, new, any(reusable)))
    sums = tuple(map(sum, zip(*(m[0] for m in everyone))))
    kind, reason = decide(sums)
    if keys is None:
        return sums, (kind, reason), None
    keys_per_rank = [m[1] for m in everyone]
    if kind == "full" and any(m[2] for m in everyone):
        keys_per_rank = allgather_checked(comm, what, lambda: keys)
    return sums, (kind, reason), duplicates(keys_per_rank, comm.Get_rank())


def by_owners(comm, what: str, failure, counts: tuple, keys: list, reusable: list, decide) -> tuple:
    """Collective, the policy and deduplication through the keys' owners (hpcckpt.incremental.dedup_owners): what
    :func:`by_allgather` returns, in two alltoalls whatever the kind, each rank receiving the keys it owns, the
    verdicts on its own and one small slot per rank (every rank's counts, so each decides the kind itself)."""
    size = comm.Get_size()
    positions = dedup_owners.route(keys, size) if failure is None else {}
    parts = dedup_owners.key_parts(keys, reusable, positions)
    everyone, inbox = dedup_owners.read_key_slots(alltoall_payloads(
        comm, what, failure, [dedup_owners.key_slot(counts, parts.get(o)) for o in range(size)]))
    sums = tuple(map(sum, zip(*everyone)))
    kind, reason = decide(sums)
    slots, owner_failure = attempt(lambda: dedup_owners.verdict_slots(dedup_owners.verdicts(inbox, kind == "full"),
                                                                      size))
    replies = dedup_owners.read_verdict_slots(alltoall_payloads(comm, what, owner_failure, slots))
    return sums, (kind, reason), dedup_owners.reassemble(positions, replies, reusable, kind == "full")


def known_digests(entries) -> dict:
    """The chunk checksums known from the content hash of hashed blocks (``hash_pieces`` entries), by
    ``(variable, start)``: uncompressed host blocks, whose xxh3_128 is their checksum's source."""
    digests = {}
    for e in entries:
        content, _, ck = e[4]
        if ck == "none" and not content.startswith(f"{blockhash.NAME}:"):  # raw bytes hashed with xxh3_128
            digests[(e[0], tuple(e[1]))] = checksum_from_xxh3_128(content, e[5])
    return digests
