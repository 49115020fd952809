"""L2: moving whole data files between ranks over MPI (partner copies at save, rebuilds at restore).

``transfer`` runs in the foreground (it calls MPI), streams each file in
rounds of ``ROUND_BYTES`` so memory stays bounded, and always completes its
message protocol even when a file cannot be read or written on this rank (it
sends zeros and raises afterwards), so the caller's ``agree`` turns a failure
into the same CheckpointError everywhere and no rank waits forever.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from hpcckpt.mpi.collective import agree
from hpcckpt.errors import CheckpointError
from hpcckpt.core.names import rank_file
from hpcckpt.storage.base import Storage
from hpcckpt.levels.base import Level, check_int
from hpcckpt.transport.topology import NodeLayout

ROUND_BYTES = 32 << 20
_TAG = 7321


def transfer(storage: Storage, comm, moves: list[tuple[int, int, str, int]], src_dir: str, dst_dir: str,
             fsync: bool = True, round_bytes: int = ROUND_BYTES) -> int:
    """Copy file ``name`` (``size`` bytes) from ``src_dir`` on rank ``src`` to ``dst_dir`` on rank ``dst``.

    ``moves`` is a list of ``(src, dst, name, size)``, the same on every rank
    (ranks not named do nothing and send nothing).  Each file arrives as
    ``name.part`` in ``storage``, renamed into place once whole.  Returns the
    bytes this rank received.
    """
    from mpi4py import MPI

    rank = comm.Get_rank()
    sends = [m for m in moves if m[0] == rank and m[3] > 0]
    recvs = [m for m in moves if m[1] == rank and m[3] > 0]
    error: BaseException | None = None
    fin: dict[int, int | None] = {}
    fout: dict[int, int | None] = {}
    for i, (_, _, name, _) in enumerate(sends):
        try:
            fin[i] = storage.open_read(os.path.join(src_dir, name))[0]
        except (OSError, CheckpointError) as exc:
            error = error or exc
            fin[i] = None
    for i, (_, _, name, _) in enumerate(recvs):
        try:
            path = os.path.join(dst_dir, name)
            storage.make_directories(os.path.dirname(path))
            fout[i] = storage.create_replacing(path + ".part")
        except (OSError, CheckpointError) as exc:
            error = error or exc
            fout[i] = None
    received = 0
    rounds = max([-(-m[3] // round_bytes) for m in sends + recvs] or [0])
    try:
        for k in range(rounds):
            lo = k * round_bytes
            requests, keep, incoming = [], [], []
            for i, (_, dst, name, size) in enumerate(sends):
                if lo >= size:
                    continue
                buf = np.zeros(min(round_bytes, size - lo), np.uint8)
                if fin[i] is not None and error is None:
                    try:
                        storage.read_segments(fin[i], lo, buf, os.path.join(src_dir, name), [(buf.nbytes, None)])
                    except Exception as exc:  # noqa: BLE001 - finish the protocol, raise afterwards
                        error = exc
                keep.append(buf)
                requests.append(comm.Isend([buf, MPI.BYTE], dest=dst, tag=_TAG))
            for i, (src, _, _, size) in enumerate(recvs):
                if lo >= size:
                    continue
                buf = np.empty(min(round_bytes, size - lo), np.uint8)
                requests.append(comm.Irecv([buf, MPI.BYTE], source=src, tag=_TAG))
                incoming.append((i, buf))
            MPI.Request.Waitall(requests)
            for i, buf in incoming:
                if fout[i] is not None and error is None:
                    try:
                        storage.append(fout[i], buf)
                        received += buf.nbytes
                    except OSError as exc:
                        error = exc
    finally:
        for handle in fin.values():
            if handle is not None:
                storage.close_read(handle)
        for i, handle in fout.items():
            if handle is None:
                continue
            storage.close(handle, fsync and error is None)
            path = os.path.join(dst_dir, recvs[i][2])
            if error is None:
                storage.replace(path + ".part", path)
            else:
                _unlink(storage, path + ".part")
    if error is not None:
        raise error
    return received


def _unlink(storage: Storage, path: str) -> None:
    try:
        storage.remove_file(path)
    except OSError:
        pass


def partners(layout: NodeLayout) -> list[int] | None:
    """partner[r]: the rank with r's position on the next node (None when there is a single node)."""
    n = layout.nnodes
    if n < 2:
        return None
    out = []
    for r, node in enumerate(layout.node_of):
        here = layout.ranks_on(node)
        there = layout.ranks_on((node + 1) % n)
        out.append(there[here.index(r) % len(there)])
    return out


@dataclass(frozen=True)
class PartnerOptions:
    """``partner_every=k`` (0: never) sends every k-th checkpoint to the partner node."""

    partner_every: int | None = None

    def __post_init__(self):
        check_int("partner_every", self.partner_every, 0, optional=True)


class PartnerLevel(Level):
    """L2: each rank's data file copied into the node directory of its partner on the next node.

    With derived intervals every checkpoint gets a partner copy.  Its restore
    half is the moves that every node-local restore makes: a file missing at
    its owner is taken from whichever node holds it.
    """

    key = "partner"
    label = "L2"
    title = "partner copies"
    recovers = "any lost node"
    Options = PartnerOptions
    derived_every = 1

    def __init__(self, options=None):
        super().__init__(options)
        self.partners: list[int] | None = None  # partner[r], once started on a layout of two or more nodes

    def start(self, node) -> None:
        self.partners = partners(node.layout)

    def available(self, node) -> bool:
        return self.partners is not None

    def protect(self, node, directory: str, sizes: list[int], fsync: bool, what: str):
        comm = node.comm
        moves = [(r, self.partners[r], rank_file(r), sizes[r]) for r in range(comm.Get_size())]
        agree(comm, what + " (partner copies)", lambda: transfer(self.storage, comm, moves, directory, directory,
                                                                 fsync))
        return list(self.partners)
