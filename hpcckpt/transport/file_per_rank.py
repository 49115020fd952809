"""File-per-rank (N-N) transport: each rank writes its own chunks into one file of its own.

The file name is opaque to readers: the metadata maps each chunk (a global box)
to a file, byte offset and length, so the same data can be read back by any
number of ranks.
"""

from __future__ import annotations

import os

from hpcckpt.core.checksum import hexdigest, new_hasher
from hpcckpt.core.names import rank_file
from hpcckpt.storage import POSIX, Storage
from hpcckpt.transport.base import Transport, TransportContext, Written
from hpcckpt.transport.throttle import write_turn


class SequentialFile:
    """A new data file written front to back; opened lazily so that a rank with nothing creates nothing."""

    def __init__(self, directory: str, name: str, fsync: bool, storage: Storage = POSIX):
        self.directory, self.name, self.fsync, self.storage = directory, name, fsync, storage
        self.fd = None  # the storage's handle once the file exists
        self.offset = 0

    def append(self, buffer, hasher=None, continues: bool = False) -> int:
        """Write ``buffer`` at the end (hashing it on the way when given a hasher); return its offset.

        It starts after the unused bytes the storage asks for there (:meth:`Storage.gap_before`), unless it
        ``continues`` the bytes appended last (a later slice of one chunk, which must follow them directly).
        """
        if self.fd is None:
            self.fd = self.storage.create(os.path.join(self.directory, self.name))
        gap = 0 if continues else self.storage.gap_before(self.offset, buffer)
        if gap:
            self.offset += self.storage.append(self.fd, bytes(gap))
        start = self.offset
        self.offset += self.storage.append(self.fd, buffer, hasher)
        return start

    def close(self) -> None:
        """fsync (if asked) and close; safe to call twice and after a failure."""
        fd, self.fd = self.fd, None
        if fd is not None:
            self.storage.close(fd, self.fsync)


def store_piece(target: SequentialFile, piece, out: Written) -> None:
    """Append one Piece to ``target`` and record its row in ``out``; a piece without a checksum is checksummed
    while it is written (one pass over the bytes, not two)."""
    if piece.checksum is None:
        hasher = new_hasher()
        offset = target.append(piece.payload, hasher)
        piece.checksum = hexdigest(hasher)
    else:
        offset = target.append(piece.payload)
    out.add(piece.header(), target.name, offset)


def write_file_per_rank(ctx: TransportContext, pieces) -> Written:
    """Write this rank's pieces into ``data/part-<rank>.bin``, one wave of ``max_writers`` at a time.

    Pieces that come without a checksum are checksummed while they are written.
    """
    rank = ctx.comm.Get_rank()
    out = Written()
    target = SequentialFile(ctx.directory, rank_file(rank), ctx.fsync, ctx.storage or POSIX)
    with write_turn(ctx.comm, list(range(ctx.comm.Get_size())), ctx.max_writers):
        try:
            for piece in pieces:
                store_piece(target, piece, out)
        finally:
            target.close()
    return out


class FilePerRank(Transport):
    """The ``file-per-rank`` strategy: :func:`write_file_per_rank`."""

    name = "file-per-rank"
    hashes_while_writing = True

    def write(self, ctx: TransportContext, pieces) -> Written:
        return write_file_per_rank(ctx, pieces)
