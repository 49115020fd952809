"""Aggregated (N-M) transport: ranks stream their chunks over MPI to M aggregators.

Each aggregator writes one large sequential file (``data/agg-<rank>.bin``).
Senders stream (header, payload) messages, the payload cut into slices of at
most ``aggregator_buffer`` bytes, so an aggregator never holds more than one
slice; its own pieces are written directly.  The checksum is the sender's,
over the whole piece.  Default: one aggregator per node (the node's first
rank), or ``aggregators=M`` contiguous groups of ranks.

Failure safety: a sender that fails still sends its end marker; an aggregator
whose write fails keeps receiving (and discarding) until every member is done.
Only then does the failure surface, so nobody is left blocked in a send.
"""

from __future__ import annotations

import numpy as np

from ..errors import CheckpointError
from ..names import aggregator_file
from .base import Transport, TransportContext, Written
from .file_per_rank import SequentialFile
from .throttle import write_turn

_HEADER, _DATA = 7302, 7303


def aggregator_groups(node_of: tuple[int, ...], count: int | None) -> list[list[int]]:
    """Groups of ranks, each served by its first rank: one group per node by default, else ``count``
    contiguous groups (at most one per rank).  Pure; every rank computes the same answer."""
    n = len(node_of)
    if count is None:
        nodes: dict[int, list[int]] = {}
        for r, node in enumerate(node_of):
            nodes.setdefault(node, []).append(r)
        return list(nodes.values())
    if count < 1:
        raise CheckpointError(f"aggregators must be at least 1, got {count}")
    m = min(count, n)
    return [list(range(g * n // m, (g + 1) * n // m)) for g in range(m)]


def write_aggregated(ctx: TransportContext, pieces) -> Written:
    """Send this rank's pieces to its aggregator, or, on an aggregator, write everyone's."""
    comm = ctx.comm
    rank = comm.Get_rank()
    groups = aggregator_groups(ctx.layout.node_of, ctx.aggregators)
    group = next(g for g in groups if rank in g)
    leader = group[0]
    if rank != leader:
        _send_all(comm, leader, pieces, ctx.aggregator_buffer)
        return Written()
    with write_turn(comm, [g[0] for g in groups], ctx.max_writers):
        return _aggregate(ctx, pieces, group[1:])


def _send_all(comm, leader: int, pieces, slice_bytes: int) -> None:
    failure = None
    try:
        for piece in pieces:
            comm.send(piece.header(), dest=leader, tag=_HEADER)
            for lo in range(0, piece.nbytes, slice_bytes):
                comm.Send(piece.payload[lo:lo + slice_bytes], dest=leader, tag=_DATA)
    except Exception as exc:  # noqa: BLE001 - the aggregator must still get our end marker
        failure = exc
    comm.send(None, dest=leader, tag=_HEADER)
    if failure is not None:
        raise failure


def _aggregate(ctx: TransportContext, pieces, members: list[int]) -> Written:
    from mpi4py import MPI

    comm = ctx.comm
    out = Written()
    target = SequentialFile(ctx.directory, aggregator_file(comm.Get_rank()), ctx.fsync)
    failure = None
    try:
        for piece in pieces:
            out.add(piece.header(), target.name, target.append(piece.payload))
    except Exception as exc:  # noqa: BLE001 - keep serving the members, report afterwards
        failure = exc
    buffer = np.empty(ctx.aggregator_buffer, np.uint8)
    pending = set(members)
    status = MPI.Status()
    while pending:
        header = comm.recv(source=MPI.ANY_SOURCE, tag=_HEADER, status=status)
        source = status.Get_source()
        if header is None:
            pending.discard(source)
            continue
        nbytes = header[3]
        offset = target.offset
        for lo in range(0, nbytes, ctx.aggregator_buffer):
            part = buffer[:min(ctx.aggregator_buffer, nbytes - lo)]
            comm.Recv(part, source=source, tag=_DATA)
            if failure is None:
                try:
                    target.append(part)
                except Exception as exc:  # noqa: BLE001 - drain the rest, report afterwards
                    failure = exc
        if failure is None:
            out.add(header, target.name, offset)
    try:
        target.close()
    except Exception as exc:  # noqa: BLE001
        failure = failure or exc
    if failure is not None:
        raise failure
    return out


class Aggregated(Transport):
    """The ``aggregated`` strategy: :func:`write_aggregated`."""

    name = "aggregated"
    needs_node_layout = True

    def write(self, ctx: TransportContext, pieces) -> Written:
        return write_aggregated(ctx, pieces)
