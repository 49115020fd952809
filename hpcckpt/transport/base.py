"""What every transport consumes and returns.

A transport receives this rank's encoded pieces (payload bytes already
checksummed) and makes them durable somewhere under the version directory;
it returns the rows that the metadata needs.  A transport that exchanges
messages must finish its protocol even when something fails on this rank
(and then raise), so that no other rank waits forever; the caller turns the
exception into an agreed CheckpointError on every rank.
"""

from __future__ import annotations

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
