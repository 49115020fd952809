"""Aggregated (N-M) transport: ranks stream their chunks over MPI to M aggregators.

Each aggregator writes one large sequential file (``data/agg-<rank>.bin``).
Senders stream (header, payload) messages, the payload cut into slices of at
most ``aggregator_buffer`` bytes; the aggregator writes its own pieces, then
each member's in rank order (:func:`_aggregate`), holding at most one slice
plus ``aggregator_buffer`` bytes of pieces that came before their turn.  The
checksum is the sender's, over the whole piece.  Default: one aggregator per node (the node's first
rank), or ``aggregators=M`` contiguous groups of ranks.

Failure safety: a sender that fails still sends its end marker; an aggregator
whose write fails keeps receiving (and discarding) until every member is done.
Only then does the failure surface, so nobody is left blocked in a send.
"""

from __future__ import annotations

import numpy as np

from hpcckpt.errors import CheckpointError
from hpcckpt.core.names import aggregator_file
from hpcckpt.storage import POSIX
from hpcckpt.transport.base import Transport, TransportContext, Written
from hpcckpt.transport.file_per_rank import SequentialFile
from hpcckpt.transport.throttle import write_turn

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
    """Write this aggregator's own pieces, then every member's, in rank order, into one sequential file.

    The file holds each rank's pieces together, in group order, whatever the
    order they arrive in: a rank's rows are then one run of the file, read in
    one pass on a restart on the saved decomposition (in arrival order the
    ranks' pieces would interleave: docs/performance.md, "Aggregated files in
    rank order").
    A member whose turn has not come waits in its send.  That costs nothing
    when its pieces are views of its arrays; when the save compresses
    (``ctx.encoded``), the members would compress one after the other, so the
    pieces that members finish before their turn are received too, into
    buffers of at most ``aggregator_buffer`` bytes in all (:class:`_Waiting`),
    and written at their turn; a piece that does not fit waits with its
    sender (its header is taken, its bytes stay unsent until that member's
    turn).  An aggregator holds at most one slice plus ``aggregator_buffer``
    bytes of waiting pieces (docs/performance.md, "Aggregated files in rank
    order", compares waiting in the send with buffering).
    """
    from mpi4py import MPI

    comm = ctx.comm
    out = Written()
    target = SequentialFile(ctx.directory, aggregator_file(comm.Get_rank()), ctx.fsync, ctx.storage or POSIX)
    writer = _Writer(target, out)
    try:
        for piece in pieces:
            out.add(piece.header(), target.name, target.append(piece.payload))
    except Exception as exc:  # noqa: BLE001 - keep serving the members, report afterwards
        writer.failure = exc
    slices = np.empty(ctx.aggregator_buffer, np.uint8)
    waiting = _Waiting(ctx.aggregator_buffer if ctx.encoded else 0)
    status = MPI.Status()
    for member in members:
        for header, data in waiting.take(member):
            if data is None:  # its bytes are still with the member: stream them now
                writer.stream(comm, member, header, slices)
            else:
                writer.write(header, data)
        while member not in waiting.finished:
            source = MPI.ANY_SOURCE if waiting.has_room() else member
            header = comm.recv(source=source, tag=_HEADER, status=status)
            sender = status.Get_source()
            if header is None:
                waiting.finished.add(sender)
            elif sender == member:
                writer.stream(comm, member, header, slices)
            else:
                waiting.hold(comm, sender, header)
    try:
        target.close()
    except Exception as exc:  # noqa: BLE001
        writer.failure = writer.failure or exc
    if writer.failure is not None:
        raise writer.failure
    return out


class _Writer:
    """The aggregator's file and chunk rows; after a failed write it keeps receiving but writes nothing."""

    def __init__(self, target: SequentialFile, out: Written):
        self.target, self.out, self.failure = target, out, None

    def write(self, header: tuple, data) -> None:
        """Append one whole piece (received earlier) and record its row."""
        if self.failure is None:
            try:
                self.out.add(header, self.target.name, self.target.append(data))
            except Exception as exc:  # noqa: BLE001 - drain the rest, report afterwards
                self.failure = exc

    def stream(self, comm, source: int, header: tuple, slices: np.ndarray) -> None:
        """Receive the piece ``header`` announces from ``source`` slice by slice into the file."""
        offset = self.target.offset
        nbytes = header[3]
        for lo in range(0, nbytes, len(slices)):
            part = slices[:min(len(slices), nbytes - lo)]
            comm.Recv(part, source=source, tag=_DATA)
            if self.failure is None:
                try:
                    start = self.target.append(part, continues=lo > 0)  # the piece's slices back to back
                    if lo == 0:
                        offset = start  # after the gap the storage leaves before the piece
                except Exception as exc:  # noqa: BLE001 - drain the rest, report afterwards
                    self.failure = exc
        if self.failure is None:
            self.out.add(header, self.target.name, offset)


class _Waiting:
    """Members' pieces that arrived before their sender's turn, in arrival order per member.

    A piece is received whole into a buffer of its own while the buffers hold
    at most ``budget`` bytes; otherwise only its header is kept and its bytes
    stay with the sender (blocked in its send until its turn), which then
    sends nothing more before them.
    """

    def __init__(self, budget: int):
        self.budget, self.held = budget, 0
        self.pieces: dict[int, list] = {}  # member -> [(header, bytes or None: still with the member)]
        self.finished: set[int] = set()  # members whose end marker came

    def has_room(self) -> bool:
        return self.held < self.budget

    def hold(self, comm, sender: int, header: tuple) -> None:
        nbytes = header[3]
        data = None
        if self.held + nbytes <= self.budget:
            data = np.empty(nbytes, np.uint8)
            if nbytes:  # a piece of at most one slice (the budget is the slice size): one message
                comm.Recv(data, source=sender, tag=_DATA)
            self.held += nbytes
        self.pieces.setdefault(sender, []).append((header, data))

    def take(self, member: int) -> list:
        """The pieces of ``member`` that came before its turn; their buffers are the caller's now."""
        taken = self.pieces.pop(member, [])
        self.held -= sum(len(d) for _, d in taken if d is not None)
        return taken


class Aggregated(Transport):
    """The ``aggregated`` strategy: :func:`write_aggregated`."""

    name = "aggregated"
    needs_node_layout = True
    needs_shared_paths = True

    def write(self, ctx: TransportContext, pieces) -> Written:
        return write_aggregated(ctx, pieces)
