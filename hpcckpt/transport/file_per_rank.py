"""File-per-rank (N-N) transport: each rank writes its own chunks into one file of its own.

The file name is opaque to readers: the metadata maps each chunk (a global box)
to a file, byte offset and length, so the same data can be read back by any
number of ranks.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..arrays import byte_view
from ..checksum import checksum
from ..storage.posix import create_exclusive, write_all


@dataclass
class WrittenFile:
    """What one rank wrote: the file name (None if it had nothing) and one row per chunk."""

    name: str | None
    rows: list[tuple] = field(default_factory=list)  # (variable, offset, nbytes, checksum, start, count)
    nbytes: int = 0


def write_rank_file(directory: str, name: str, pieces, fsync: bool = True) -> WrittenFile:
    """Write ``pieces`` ((variable, global start, count, C-contiguous array) tuples) into ``directory/name``.

    Each piece is checksummed and written from the caller's memory; the file
    is fsynced before returning.  A rank without pieces creates no file.
    """
    out = WrittenFile(name=None)
    fd = None
    try:
        for variable, start, count, arr in pieces:
            data = byte_view(arr)
            if fd is None:
                fd = create_exclusive(os.path.join(directory, name))
                out.name = name
            out.rows.append((variable, out.nbytes, int(data.nbytes), checksum(data), tuple(start), tuple(count)))
            out.nbytes += write_all(fd, data)
        if fd is not None and fsync:
            os.fsync(fd)
    finally:
        if fd is not None:
            os.close(fd)
    return out

