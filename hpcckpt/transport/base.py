"""What every transport consumes and returns.

A transport receives this rank's encoded pieces (payload bytes already
checksummed) and makes them durable somewhere under the version directory;
it returns the rows that the metadata needs.  A transport that exchanges
messages must finish its protocol even when something fails on this rank
(and then raise), so that no other rank waits forever; the caller turns the
exception into an agreed CheckpointError on every rank.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Piece:
    """One chunk ready to store: its global box, its stored bytes and their checksum."""

    variable: str
    start: tuple[int, ...]
    count: tuple[int, ...]
    payload: np.ndarray  # flat uint8, C-contiguous (a view of the caller's memory when possible)
    checksum: str | None  # None: the transport computes it while writing (file-per-rank does)

    @property
    def nbytes(self) -> int:
        return int(self.payload.nbytes)

    def header(self) -> tuple:
        return self.variable, self.start, self.count, self.nbytes, self.checksum


@dataclass
class Written:
    """Rows of the chunk index this rank is responsible for, and the bytes it wrote itself."""

    rows: list[tuple] = field(default_factory=list)  # (variable, file, offset, nbytes, checksum, start, count)
    nbytes: int = 0

    def add(self, piece_header: tuple, file: str, offset: int) -> None:
        variable, start, count, nbytes, digest = piece_header
        self.rows.append((variable, file, offset, nbytes, digest, tuple(start), tuple(count)))
        self.nbytes += nbytes


@dataclass
class TransportContext:
    """Everything a transport needs besides the pieces."""

    comm: object
    directory: str
    layout: object  # NodeLayout
    max_writers: int | None = None
    aggregators: int | None = None
    aggregator_buffer: int = 64 << 20
    mpiio_hints: dict = field(default_factory=dict)
    fsync: bool = True
    storage: object = None  # a hpcckpt.storage.Storage; None: POSIX
    encoded: bool = False  # some pieces are compressed on their way (the aggregated transport's waiting buffers)


class Transport(ABC):
    """How the pieces of all ranks reach storage; one instance per strategy, registered under its ``name``.

    Call order, for one save (every call made by every rank of ``ctx.comm``):

    1. ``write(ctx, pieces)`` (all ranks, collectively): consume this rank's
       pieces (an iterator: they are produced, and encoded, as the transport
       asks for them), make them durable under ``ctx.directory`` (fsynced when
       ``ctx.fsync``), and return the ``Written`` rows this rank reports: the
       pieces it stored itself, wherever they came from.  A transport that
       exchanges messages finishes its protocol even when something fails on
       this rank (the pieces iterator raising included), then raises; the save
       turns that into one CheckpointError on every rank.

    The save then gathers every rank's rows and commits the version (storage/commit.py).

    Capability flags, read by the save instead of testing names:

    * ``hashes_while_writing``: pieces may come with ``checksum=None``; the
      transport fills it in while it writes (one pass over the bytes).
    * ``needs_node_layout``: ``ctx.layout`` must be the communicator's
      NodeLayout (the save computes it, collectively, once per communicator).
    * ``needs_shared_paths``: one file holds several ranks' chunks, so the
      storage must show every process the files by path
      (``Storage.shared_paths``).
    * ``needs_shared_files``: several ranks write into one file at once
      (``Storage.shared_files``).

    A new transport subclasses this, registers an instance with
    ``hpcckpt.transport.register``, and passes ``hpcckpt.testing.TransportTests``.
    """

    name: str = ""
    hashes_while_writing: bool = False
    needs_node_layout: bool = False
    needs_shared_paths: bool = False
    needs_shared_files: bool = False

    def fits(self, storage) -> bool:
        """Whether ``storage`` (a hpcckpt.storage.Storage) holds the files this transport writes."""
        return (storage.shared_paths or not self.needs_shared_paths) and \
            (storage.shared_files or not self.needs_shared_files)

    @abstractmethod
    def write(self, ctx: TransportContext, pieces) -> Written:
        """Store this rank's ``pieces``; the rows of the chunk index this rank reports (see the class docstring)."""
