"""Shared-file (N-1) transport: one file written with MPI-IO collective writes.

Each rank's pieces go to a contiguous region of ``data/shared.bin`` whose start
is the exclusive prefix sum of the ranks' byte counts.  Writes are collective
(``Write_at_all``) in rounds, one piece per rank per round; a rank with fewer
pieces, or one whose write failed, joins the remaining rounds with empty
writes, so the collective calls always match.  MPI-IO hints (cb_nodes,
cb_buffer_size, striping_factor, striping_unit, ...) pass through ``mpiio_hints``.
"""

from __future__ import annotations

import os

import numpy as np

from hpcckpt.core.names import SHARED_FILE
from hpcckpt.transport.base import Transport, TransportContext, Written



def write_shared_file(ctx: TransportContext, pieces) -> Written:
    from mpi4py import MPI

    from hpcckpt.mpi.collective import SerialComm
    from hpcckpt.mpi.watchdog import unwrapped

    comm = MPI.COMM_SELF if isinstance(ctx.comm, SerialComm) else ctx.comm
    failure = None
    try:
        mine = list(pieces)  # sizes must be known before the offsets (views: no copy of plain data)
    except Exception as exc:  # noqa: BLE001 - still take part in the collective calls below
        failure, mine = exc, []
    local = sum(p.nbytes for p in mine)
    base = comm.exscan(local) or 0
    rounds = comm.allreduce(len(mine), op=MPI.MAX)
    if comm.allreduce(local) == 0:
        if failure is not None:
            raise failure
        return Written()
    info = MPI.Info.Create()
    for key, value in ctx.mpiio_hints.items():
        info.Set(str(key), str(value))
    path = os.path.join(ctx.directory, SHARED_FILE)
    fh = MPI.File.Open(unwrapped(comm), path, MPI.MODE_WRONLY | MPI.MODE_CREATE | MPI.MODE_EXCL, info)
    info.Free()
    out = Written()
    empty = np.empty(0, np.uint8)
    offset = base
    try:
        for i in range(rounds):
            piece = mine[i] if i < len(mine) and failure is None else None
            try:
                fh.Write_at_all(offset, piece.payload if piece is not None else empty)
            except Exception as exc:  # noqa: BLE001 - keep matching the other ranks' calls
                failure = failure or exc
                continue
            if piece is not None:
                out.add(piece.header(), SHARED_FILE, offset)
                offset += piece.nbytes
        if ctx.fsync:
            fh.Sync()
    finally:
        fh.Close()
    if failure is not None:
        raise failure
    return out


class SharedFile(Transport):
    """The ``shared-file`` strategy: :func:`write_shared_file`."""

    name = "shared-file"
    needs_shared_paths = True
    needs_shared_files = True

    def write(self, ctx: TransportContext, pieces) -> Written:
        return write_shared_file(ctx, pieces)
