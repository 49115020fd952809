"""L3: XOR parity across a group of ranks on distinct nodes (SCR's distributed XOR scheme).

In a group of g ranks, each data file D_j (zero-padded) is cut into g-1
segments of S bytes.  Member i stores the parity segment

    P_i = XOR over j != i of  D_j[segment (i - j - 1) mod g]

so each segment of each file enters exactly one parity segment, held by
another member.  When member x is lost, its segment (i - x - 1) mod g equals
P_i XOR the other members' matching segments: one XOR-reduce to x rebuilds it.
Encoding is one ``Reduce_scatter_block(BXOR)`` per round, rebuilding one
``Reduce(BXOR)`` per round; both stream in rounds of ``ROUND_BYTES`` per
segment (g * round bytes of memory per rank).  Any one loss per group is
recoverable; two losses in one group are not (levels/rs.py's Reed-Solomon level is).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from hpcckpt.mpi.collective import agree
from hpcckpt.errors import CheckpointError
from hpcckpt.core.names import parity_file, rank_file
from hpcckpt.storage.base import Storage
from hpcckpt.levels.base import Level, Lost, check_int
from hpcckpt.transport.topology import NodeLayout

ROUND_BYTES = 16 << 20


def segment_bytes(sizes: list[int]) -> int:
    """S for a group whose files have these sizes."""
    g = len(sizes)
    return -(-max(sizes) // (g - 1)) if sizes and max(sizes) > 0 else 0


def read_clipped(storage: Storage, handle, size: int, offset: int, out: np.ndarray) -> None:
    """Fill ``out`` with the bytes at ``offset`` of the file ``handle`` (of ``storage.open_read``; None: an
    empty file) reads, zeros past the end of its ``size`` bytes; OSError when the file ends before them."""
    out[:] = 0
    n = max(0, min(out.nbytes, size - offset))
    if n and handle is not None:
        got = storage.read_at(handle, offset, out[:n])
        if got != n:
            raise OSError(f"short read: {got} of {n} bytes at offset {offset}")


def encode(storage: Storage, gcomm, data_path: str, size: int, sizes: list[int], out_path: str,
           fsync: bool = True) -> int:
    """Collective over the group communicator: write this member's parity segment to ``out_path`` (both files
    in ``storage``); return S."""
    from mpi4py import MPI

    g, pos = gcomm.Get_size(), gcomm.Get_rank()
    seg = segment_bytes(sizes)
    error = None
    fd = None
    out = None
    try:
        fd = storage.open_read(data_path)[0] if size > 0 else None
    except (OSError, CheckpointError) as exc:
        error = exc
    try:
        storage.make_directories(os.path.dirname(out_path))
        out = storage.create_replacing(out_path)
    except (OSError, CheckpointError) as exc:
        error = error or exc
    try:
        for a in range(0, seg, ROUND_BYTES):
            r = min(ROUND_BYTES, seg - a)
            send = np.zeros(g * r, np.uint8)
            for i in range(g):
                if i != pos and error is None:
                    try:
                        read_clipped(storage, fd, size, ((i - pos - 1) % g) * seg + a, send[i * r:(i + 1) * r])
                    except OSError as exc:
                        error = exc
            recv = np.empty(r, np.uint8)
            gcomm.Reduce_scatter_block([send, MPI.BYTE], [recv, MPI.BYTE], op=MPI.BXOR)
            if out is not None and error is None:
                try:
                    storage.append(out, recv)
                except OSError as exc:
                    error = exc
        if out is not None and fsync and error is None:
            storage.sync(out)
    finally:
        close_all(storage, [fd], [out])
    if error is not None:
        raise error
    return seg


def rebuild(storage: Storage, gcomm, lost: int, data_path: str, size: int, parity_path: str, seg: int,
            lost_size: int, out_path: str, fsync: bool = True) -> None:
    """Collective over the group: rebuild member ``lost``'s data file into ``out_path`` on that member.

    Survivors pass their own data file and parity segment; the lost member
    passes its target path (``data_path``/``parity_path`` unused there).  Every
    file is in ``storage``.
    """
    from mpi4py import MPI

    g, pos = gcomm.Get_size(), gcomm.Get_rank()
    error = None
    fd = pfd = out = None
    try:
        if pos == lost:
            storage.make_directories(os.path.dirname(out_path))
            out = storage.create_replacing(out_path + ".part")
        else:
            fd = storage.open_read(data_path)[0] if size > 0 else None
            pfd = storage.open_read(parity_path)[0] if seg > 0 else None
    except (OSError, CheckpointError) as exc:
        error = exc
    try:
        for a in range(0, seg, ROUND_BYTES):
            r = min(ROUND_BYTES, seg - a)
            send = np.zeros(g * r, np.uint8)
            if pos != lost and error is None:
                try:
                    for i in range(g):
                        if i == lost:
                            continue
                        part = send[i * r:(i + 1) * r]
                        if i == pos:
                            read_clipped(storage, pfd, seg, a, part)
                        else:
                            read_clipped(storage, fd, size, ((i - pos - 1) % g) * seg + a, part)
                except OSError as exc:
                    error = exc
            recv = np.empty(g * r, np.uint8) if pos == lost else None
            gcomm.Reduce([send, MPI.BYTE], [recv, MPI.BYTE] if recv is not None else None, op=MPI.BXOR, root=lost)
            if out is not None and error is None:
                for i in range(g):
                    if i == lost:
                        continue
                    offset = ((i - lost - 1) % g) * seg + a
                    n = max(0, min(r, lost_size - offset))
                    if n:
                        storage.write_at(out, offset, recv[i * r:i * r + n])
        if out is not None and error is None:
            storage.truncate(out, lost_size)
            if fsync:
                storage.sync(out)
    finally:
        close_all(storage, [fd, pfd], [out])
    settle_rebuilt(storage, out_path if out is not None else None, error)


def close_all(storage: Storage, reading: list, writing: list) -> None:
    """Close the handles of ``storage`` a level's exchange opened (None: not opened), those ``reading`` files
    (of open_read) first, then those ``writing`` (of create_replacing, never fsynced here)."""
    for handle in reading:
        if handle is not None:
            storage.close_read(handle)
    for handle in writing:
        if handle is not None:
            storage.close(handle, fsync=False)


def settle_rebuilt(storage: Storage, path: str | None, error: BaseException | None) -> None:
    """After a rebuild wrote ``path + ".part"`` in ``storage`` (None: this rank rebuilt nothing): move it into
    place, or remove it and raise ``error`` (the rebuild's, kept until every rank finished its exchanges)."""
    if path is not None:
        if error is None:
            storage.replace(path + ".part", path)
        else:
            try:
                storage.remove_file(path + ".part")
            except OSError:
                pass
    if error is not None:
        raise error


def parity_groups(layout: NodeLayout, size: int, least: int = 2) -> list[list[int]]:
    """Groups of ``size`` ranks (a last group shorter than ``least`` joins the previous), each on distinct nodes.

    Ranks with the same position on their node form the candidates, taken
    node by node, so no group holds two ranks of one node.  Ranks in no group
    (fewer than ``least`` candidates: a single node for XOR parity, fewer than
    k + m nodes for Reed-Solomon) get no parity.
    """
    by_position: dict[int, list[int]] = {}
    for node in range(layout.nnodes):
        for pos, r in enumerate(layout.ranks_on(node)):
            by_position.setdefault(pos, []).append(r)
    groups = []
    for _, ranks in sorted(by_position.items()):
        chunks = [ranks[i:i + size] for i in range(0, len(ranks), size)]
        if len(chunks) > 1 and len(chunks[-1]) < least:
            chunks[-2].extend(chunks.pop())
        groups.extend(c for c in chunks if len(c) >= least)
    return groups


def xor_plan(parity: dict, lost: Lost):
    """(XOR rebuilds, None) or (None, why) for the ``lost`` ranks: one ``(group index, group, lost member,
    segment size, lost file size)`` per group that lost a member."""
    rebuild, sizes, inv = [], lost.sizes, lost.inventories
    for gi, group in enumerate(parity["groups"]):
        gone = [o for o in lost.ranks if o in group]
        if not gone:
            continue
        if len(gone) > 1:
            return None, (f"rank(s) {gone} of parity group {group} are lost together: XOR parity rebuilds at most "
                          "one member per group")
        x, seg = gone[0], int(parity["segment"][gi])
        for j in group:
            if j == x:
                continue
            has_data = int(sizes[j]) == 0 or inv[j].get(rank_file(j)) == int(sizes[j]) or any(
                m[1] == j for m in lost.moves)
            if not has_data or (seg and inv[j].get(parity_file(j)) != seg):
                return None, (f"rank {x} of parity group {group} is lost and rank {j}'s "
                              f"{'data' if not has_data else 'parity'} is missing too")
        rebuild.append((gi, list(group), x, seg, int(sizes[x])))
    ungrouped = [o for o in lost.ranks if not any(o in g for g in parity["groups"])]
    if ungrouped:
        return None, f"rank(s) {ungrouped} are lost and belong to no parity group"
    return rebuild, None


@dataclass(frozen=True)
class ParityOptions:
    """``parity_every=k`` (0: never) computes XOR parity for every k-th checkpoint in groups of
    ``parity_group`` ranks on distinct nodes (default 8, as SCR)."""

    parity_every: int | None = None
    parity_group: int = 8

    def __post_init__(self):
        check_int("parity_every", self.parity_every, 0, optional=True)
        check_int("parity_group", self.parity_group, 2)


class ParityLevel(Level):
    """L3: XOR parity over groups of ranks on distinct nodes (one segment stored by each member)."""

    key = "parity"
    label = "L3"
    title = "XOR parity"
    recovers = "one member per group"
    Options = ParityOptions

    def __init__(self, options=None):
        super().__init__(options)
        self.groups: list[list[int]] = []  # the parity groups, once started

    def settings(self, every: int) -> dict:
        return {"parity_every": every, "parity_group": self.options.parity_group}

    def start(self, node) -> None:
        self.groups = parity_groups(node.layout, self.options.parity_group)

    def available(self, node) -> bool:
        return bool(self.groups)

    def protect(self, node, directory: str, sizes: list[int], fsync: bool, what: str):
        gcomm, mine = node.group_comm(self.groups)
        rank = node.rank

        def encode_mine():
            if mine is None:
                return None
            group = self.groups[mine]
            return encode(self.storage, gcomm, os.path.join(directory, rank_file(rank)), sizes[rank],
                          [sizes[r] for r in group], os.path.join(directory, parity_file(rank)), fsync)

        segs = node.comm.allgather(agree(node.comm, what + " (XOR parity)", encode_mine))
        return {"groups": self.groups, "segment": [segs[g[0]] for g in self.groups]}

    def plan_rebuild(self, description, lost: Lost):
        return xor_plan(description, lost)

    def rebuild(self, comm, description, plan, directory: str, sizes: list, what: str) -> None:
        """Each group that lost a member XOR-reduces its segments to it, over a group communicator split here."""
        from mpi4py import MPI

        rank = comm.Get_rank()
        mine = next((r for r in plan if rank in r[1]), None)
        gcomm = comm.Split(MPI.UNDEFINED if mine is None else mine[0], 0 if mine is None else mine[1].index(rank))
        try:
            def run():
                if mine is None:
                    return
                _, group, x, seg, lost_size = mine
                rebuild(self.storage, gcomm, group.index(x), os.path.join(directory, rank_file(rank)), int(sizes[rank]),
                        os.path.join(directory, parity_file(rank)), seg, lost_size,
                        os.path.join(directory, rank_file(x)))
            agree(comm, what + " (XOR parity)", run)
        finally:
            if gcomm != MPI.COMM_NULL:
                gcomm.Free()
