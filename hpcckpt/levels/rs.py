"""Reed-Solomon parity across groups of ranks on distinct nodes: any m lost members of each group are rebuilt.

The shard layout (which member holds which data segment and check block of
which stripe) is levels/rs_layout.py; the arithmetic is levels/rs_coder.py's
(ISA-L's systematic Cauchy Reed-Solomon code over GF(2^8), through PyECLib),
on blocks that this module moves over MPI:

* encoding, per round of ``ROUND_BYTES`` rows of every segment: each member
  sends its k segments to the k stripe leaders (one ``Alltoallv``), each
  leader encodes its stripe's m check blocks, keeps the first and sends the
  others to their holders (a second ``Alltoallv``, none when m = 1);
* rebuilding: each member that lost a data segment receives the k surviving
  shards of that stripe (one ``Alltoallv`` per round) and decodes it.

Every shard's xxh3 checksum is recorded in the metadata (``extra.levels.rs``),
so a restore detects a damaged shard (data segment or check block) before
using it and counts it as erased, like a lost one.  Every exchange completes
even when a file cannot be read or written on this rank (zeros are sent, the
error raised afterwards), so the caller's ``agree`` gives every rank the same
CheckpointError and none waits forever.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import xxhash

from hpcckpt.mpi.collective import agree
from hpcckpt.errors import CheckpointError
from hpcckpt.core.names import rank_file, rs_parity_file
from hpcckpt.storage.base import Storage
from hpcckpt.levels.base import Level, Lost, check_int
from hpcckpt.levels.fetch import inventory
from hpcckpt.levels.parity import close_all, parity_groups, read_clipped, settle_rebuilt
from hpcckpt.levels import rs_coder
from hpcckpt.levels.rs_layout import data_stripe, holder, leader, parity_stripe, rebuild_plan, segment_bytes

#: Rows of each segment moved per round (memory per rank: about 2 (k + m) times this).  Smaller rounds send
#: more, smaller messages, larger ones hold more memory; the figures behind 1 MiB are in docs/performance.md
#: ("Levels and erasure codes", bench/levels.py --rs-round-kib).
ROUND_BYTES = 1 << 20


def _alltoallv(gcomm, sends: dict[int, list], recv_counts: dict[int, int]) -> tuple[np.ndarray, dict[int, np.ndarray]]:
    """Send the concatenated buffers ``sends[dest]`` to each dest; ``(all bytes received, those of each source)``.

    The received bytes are placed in the order of ``recv_counts``' keys (a
    stripe leader's k segments arrive as one stripe, in position order).
    """
    from mpi4py import MPI

    g = gcomm.Get_size()
    scounts = [sum(b.nbytes for b in sends.get(d, ())) for d in range(g)]
    rcounts = [recv_counts.get(s, 0) for s in range(g)]
    sbuf = np.concatenate([np.concatenate(sends[d]) for d in range(g) if scounts[d]] or [np.empty(0, np.uint8)])
    rbuf = np.empty(sum(rcounts), np.uint8)
    rdis = dict(zip(recv_counts, np.cumsum([0] + list(recv_counts.values())[:-1]).tolist()))
    sdis = np.cumsum([0] + scounts[:-1]).tolist()
    gcomm.Alltoallv([sbuf, (scounts, sdis), MPI.BYTE], [rbuf, (rcounts, [rdis.get(s, 0) for s in range(g)]), MPI.BYTE])
    return rbuf, {s: rbuf[rdis[s]:rdis[s] + n] for s, n in recv_counts.items() if n}


def keep_from_damaged_copy(storage: Storage, data_path: str, out, size: int) -> None:
    """Start the rebuilt file ``out`` (a handle of ``storage``) as a copy of the damaged ``data_path`` when it
    still has the right ``size`` (only its damaged stripes are rewritten then); leave it empty otherwise."""
    try:
        fd, held = storage.open_read(data_path)
    except (FileNotFoundError, CheckpointError):
        return
    try:
        if held == size:
            storage.append_from(out, fd, size, data_path)
    finally:
        storage.close_read(fd)


def encode(storage: Storage, gcomm, code: tuple[int, int], data_path: str, size: int, sizes: list[int],
           out_path: str, fsync: bool = True, round_bytes: int = ROUND_BYTES) -> tuple[int, list[str], list[str]]:
    """Collective over the group: write this member's m check blocks of the ``code`` ``(k, m)`` (``rs_group``)
    to ``out_path`` (both files in ``storage``).

    Returns ``(S, checksums of my k data segments, checksums of my m check blocks)``.
    """
    (k, m), g, j = code, gcomm.Get_size(), gcomm.Get_rank()
    seg = segment_bytes(sizes, k)
    mine = (j - k) % g  # the stripe this member leads
    data_hash = [xxhash.xxh3_64() for _ in range(k)]
    parity_hash = [xxhash.xxh3_64() for _ in range(m)]
    error = None
    fd = out = None
    try:
        fd = storage.open_read(data_path)[0] if size > 0 else None
    except (OSError, CheckpointError) as exc:
        error = exc
    try:
        storage.make_directories(os.path.dirname(out_path))
        out = storage.create_replacing(out_path)
        storage.truncate(out, m * seg)
    except (OSError, CheckpointError) as exc:
        error = error or exc
    try:
        for a in range(0, seg, round_bytes):
            r = min(round_bytes, seg - a)
            sends = {}
            for q in range(k):
                part = np.zeros(r, np.uint8)
                if error is None:
                    try:
                        read_clipped(storage, fd, size, q * seg + a, part)
                    except OSError as exc:
                        error = exc
                data_hash[q].update(part)
                sends[leader(g, k, data_stripe(g, j, q))] = [part]
            stripe, _ = _alltoallv(gcomm, sends, {holder(g, mine, q): r for q in range(k)})
            try:
                blocks = rs_coder.encode(k, m, stripe)
            except Exception as exc:  # noqa: BLE001 - finish the exchanges, raise afterwards
                error = error or exc
                blocks = [bytes(r)] * m
            fro = [leader(g, k, parity_stripe(g, k, j, t)) for t in range(m)]  # who encodes my check block t
            _, got = _alltoallv(gcomm, {holder(g, mine, k + t): [np.frombuffer(blocks[t], np.uint8)]
                                        for t in range(1, m)}, {fro[t]: r for t in range(1, m)})
            for t in range(m):
                block = blocks[0] if t == 0 else got[fro[t]]
                parity_hash[t].update(block)
                if out is not None and error is None:
                    try:
                        storage.write_at(out, t * seg + a, block)
                    except OSError as exc:
                        error = exc
        if out is not None and fsync and error is None:
            storage.sync(out)
    finally:
        close_all(storage, [fd], [out])
    if error is not None:
        raise error
    return seg, [h.hexdigest() for h in data_hash], [h.hexdigest() for h in parity_hash]


def damaged_shards(storage: Storage, member: int, code: tuple[int, int], seg: int, data_path: str | None, size: int,
                   parity_path: str | None, expected: tuple[list[str], list[str]],
                   round_bytes: int = ROUND_BYTES) -> list[tuple]:
    """The shards of ``member`` whose bytes (files in ``storage``) do not match their recorded checksums (local;
    no MPI); ``code``: ``(k, m)``.

    A path of None (the file is missing or has the wrong size) makes all its shards count as damaged.
    """
    k, m = code
    out = []
    for kind, path, count, limit in (("data", data_path, k, size), ("parity", parity_path, m, m * seg)):
        if path is None:
            out.extend((member, kind, i) for i in range(count))
            continue
        fd = storage.open_read(path)[0] if limit > 0 else None
        try:
            for i in range(count):
                h = xxhash.xxh3_64()
                for a in range(0, seg, round_bytes):
                    part = np.empty(min(round_bytes, seg - a), np.uint8)
                    read_clipped(storage, fd, limit, i * seg + a, part)
                    h.update(part)
                if h.hexdigest() != expected[0 if kind == "data" else 1][i]:
                    out.append((member, kind, i))
        finally:
            close_all(storage, [fd], [])
    return out


def rebuild(storage: Storage, gcomm, code: tuple[int, int], seg: int, tasks: list, data_path: str, size: int,
            parity_path: str, fsync: bool = True, round_bytes: int = ROUND_BYTES) -> None:
    """Collective over the group: run the ``tasks`` of :func:`rs_layout.rebuild_plan` (``code``: ``(k, m)``).

    A member with tasks rewrites its data file ``data_path`` (``size`` bytes,
    as recorded): the segments it still has are kept, the others decoded.
    Every member sends the shards the tasks take from it (``parity_path``:
    its check blocks).  Every file is in ``storage``.
    """
    (k, m), g, j = code, gcomm.Get_size(), gcomm.Get_rank()
    mine = [t for t in tasks if t[1] == j]
    error = None
    fd = pfd = out = None
    try:
        if any(holder(g, s, q) == j and q < k for s, _, sources in tasks for q in sources):
            fd = storage.open_read(data_path)[0] if size > 0 else None
        if any(holder(g, s, q) == j and q >= k for s, _, sources in tasks for q in sources):
            pfd = storage.open_read(parity_path)[0] if seg > 0 else None
        if mine:
            storage.make_directories(os.path.dirname(data_path))
            out = storage.create_replacing(data_path + ".part")
            keep_from_damaged_copy(storage, data_path, out, size)
    except (OSError, CheckpointError) as exc:
        error = exc
    try:
        for a in range(0, seg, round_bytes):
            r = min(round_bytes, seg - a)
            sends: dict[int, list] = {}
            for s, x, sources in tasks:
                for q in sources:
                    if holder(g, s, q) != j:
                        continue
                    part = np.zeros(r, np.uint8)
                    if error is None:
                        try:
                            if q < k:
                                read_clipped(storage, fd, size, q * seg + a, part)
                            else:
                                read_clipped(storage, pfd, m * seg, (q - k) * seg + a, part)
                        except OSError as exc:
                            error = exc
                    sends.setdefault(x, []).append(part)
            counts: dict[int, int] = {}
            for s, _, sources in mine:
                for q in sources:
                    counts[holder(g, s, q)] = counts.get(holder(g, s, q), 0) + r
            _, got = _alltoallv(gcomm, sends, counts)
            used = dict.fromkeys(got, 0)
            for s, _, sources in mine:
                blocks = []
                for q in sources:
                    h = holder(g, s, q)
                    blocks.append(memoryview(got[h][used[h]:used[h] + r]))
                    used[h] += r
                q = (j - s) % g
                offset = q * seg + a
                n = max(0, min(r, size - offset))
                if n and out is not None and error is None:
                    try:
                        segment = rs_coder.decode(k, m, blocks, sources, q)
                        storage.write_at(out, offset, memoryview(segment)[:n])
                    except Exception as exc:  # noqa: BLE001 - finish the exchanges, raise afterwards
                        error = exc
        if out is not None and error is None:
            storage.truncate(out, size)
            if fsync:
                storage.sync(out)
    finally:
        close_all(storage, [fd, pfd], [out])
    settle_rebuilt(storage, data_path if mine else None, error)


@dataclass(frozen=True)
class ReedSolomonOptions:
    """``rs_every=k`` (0: never) computes Reed-Solomon parity for every k-th checkpoint in groups of at least
    ``k + m`` ranks on distinct nodes, ``rs_group=(k, m)`` (default (6, 2): SCR's set of 8 tolerating 2
    failures)."""

    rs_every: int | None = None
    rs_group: tuple[int, int] = (6, 2)

    def __post_init__(self):
        check_int("rs_every", self.rs_every, 0, optional=True)
        try:
            k, m = self.rs_group
            ok = all(isinstance(v, int) and not isinstance(v, bool) for v in (k, m)) and k >= 1 and m >= 1 \
                and k + m <= 256
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise CheckpointError(f"rs_group must be (k, m): integers k >= 1 data and m >= 1 check shards with "
                                  f"k + m <= 256, got {self.rs_group!r}")
        object.__setattr__(self, "rs_group", (k, m))


class ReedSolomonLevel(Level):
    """Reed-Solomon parity over groups of at least k + m ranks on distinct nodes (``rs_group=(k, m)``)."""

    key = "rs"
    label = "RS"
    title = "Reed-Solomon parity"
    recovers = "m members per group"
    Options = ReedSolomonOptions

    def __init__(self, options=None):
        super().__init__(options)
        self.groups: list[list[int]] = []  # the Reed-Solomon groups, once started

    def settings(self, every: int) -> dict:
        return {"rs_every": every, "rs_group": list(self.options.rs_group)}

    def start(self, node) -> None:
        """Refuses on every rank, when asked for, if one rank lacks the coding library."""
        if self.given_every:
            why = next((w for w in node.comm.allgather(rs_coder.missing()) if w is not None), None)
            if why is not None:
                raise CheckpointError(why)
        self.groups = parity_groups(node.layout, sum(self.options.rs_group), least=sum(self.options.rs_group))

    def available(self, node) -> bool:
        return bool(self.groups)

    def unavailable(self, node) -> str:
        return (f"rs_group={self.options.rs_group} needs {sum(self.options.rs_group)} nodes, this run has "
                f"{node.layout.nnodes}: Reed-Solomon parity protects nothing and is skipped")

    def protect(self, node, directory: str, sizes: list[int], fsync: bool, what: str):
        k, m = self.options.rs_group
        gcomm, mine = node.group_comm(self.groups)
        rank = node.rank

        def encode_mine():
            if mine is None:
                return None
            group = self.groups[mine]
            return encode(self.storage, gcomm, (k, m), os.path.join(directory, rank_file(rank)), sizes[rank],
                          [sizes[r] for r in group], os.path.join(directory, rs_parity_file(rank)), fsync)

        done = node.comm.allgather(agree(node.comm, what + " (Reed-Solomon parity)", encode_mine))
        return {"coder": rs_coder.CODER, "k": k, "m": m, "groups": self.groups,
                "segment": [done[g[0]][0] for g in self.groups],
                "checksums": [[[done[r][1], done[r][2]] for r in g] for g in self.groups]}

    def plan_rebuild(self, description, lost: Lost):
        """The lost ranks: whether their groups can be rebuilt is known only once the survivors checked their
        shards (:func:`restore`)."""
        return list(lost.ranks), None

    def rebuild(self, comm, description, plan, directory: str, sizes: list, what: str) -> None:
        inv = comm.allgather(inventory(self.storage, directory))  # with the copies just moved in
        restore(self.storage, comm, description, sizes, inv, plan, directory, what)


def restore(storage: Storage, comm, info: dict, sizes: list[int], inv: list[dict[str, int]], lost: list[int],
            vdir: str, what: str) -> None:
    """Collective: rebuild the data files of the ``lost`` ranks (and of any whose shards turn out damaged) in
    the version directory ``vdir`` of ``storage``.

    ``info``: the version's ``extra.levels.rs``; ``inv``: every rank's
    inventory of the version directory (after partner copies were moved in).
    Raises the same CheckpointError on every rank when a group lost more than
    m shards of one stripe, or when another code made the check blocks (a
    version without ``coder`` was written by the level's earlier zfec coder).
    """
    from mpi4py import MPI

    coder = info.get("coder", "zfec")
    if coder != rs_coder.CODER:
        raise CheckpointError(f"its Reed-Solomon check blocks were made by the {coder!r} code, this hpcckpt "
                              f"decodes {rs_coder.CODER!r} only")
    k, m, rank = int(info["k"]), int(info["m"]), comm.Get_rank()
    groups = [list(g) for g in info["groups"]]
    outside = [r for r in lost if not any(r in g for g in groups)]
    if outside:
        raise CheckpointError(f"rank(s) {outside} are lost and belong to no Reed-Solomon group")
    hit = [gi for gi, g in enumerate(groups) if any(r in g for r in lost)]
    mine = next((gi for gi in hit if rank in groups[gi]), None)

    def check():
        if mine is None or rank in lost:
            return []
        gi = mine
        seg, pos = int(info["segment"][gi]), groups[gi].index(rank)
        data = os.path.join(vdir, rank_file(rank))
        parity = os.path.join(vdir, rs_parity_file(rank))
        data_ok = int(sizes[rank]) == 0 or inv[rank].get(rank_file(rank)) == int(sizes[rank])
        parity_ok = seg == 0 or inv[rank].get(rs_parity_file(rank)) == m * seg
        expected = info["checksums"][gi][pos]
        return damaged_shards(storage, pos, (k, m), seg, data if data_ok else None, int(sizes[rank]),
                              parity if parity_ok else None, (expected[0], expected[1]))

    damaged = comm.allgather(agree(comm, what + " (checking Reed-Solomon shards)", check))
    plans = {}
    for gi in hit:
        group = groups[gi]
        erased = {(group.index(r), kind, i) for r in lost if r in group
                  for kind, count in (("data", k), ("parity", m)) for i in range(count)}
        erased |= {tuple(s) for r in group for s in damaged[r]}
        tasks, why = rebuild_plan(len(group), k, m, erased, group)
        if why is not None:
            bad = sorted({group[s[0]] for s in erased if group[s[0]] not in lost})
            raise CheckpointError(f"rank(s) {sorted(r for r in lost if r in group)} of Reed-Solomon group {group} "
                                  f"are lost" + (f" and rank(s) {bad} hold damaged shards" if bad else "")
                                  + f": {why}")
        plans[gi] = tasks
    gcomm = comm.Split(MPI.UNDEFINED if mine is None else mine, 0 if mine is None else groups[mine].index(rank))
    try:
        def run():
            if mine is None:
                return
            seg = int(info["segment"][mine])
            rebuild(storage, gcomm, (k, m), seg, plans[mine], os.path.join(vdir, rank_file(rank)), int(sizes[rank]),
                    os.path.join(vdir, rs_parity_file(rank)))
        agree(comm, what + " (Reed-Solomon rebuild)", run)
    finally:
        if gcomm != MPI.COMM_NULL:
            gcomm.Free()
