"""POSIX file operations with the durability and confinement rules hpcckpt relies on.

Writes go straight from the caller's buffers to the file (``os.write`` on a
memoryview: no copy), reads go straight into the target (``os.preadv``), files
and the directories that name them are fsynced before a version is committed,
and every name read from metadata is resolved inside the checkpoint directory.
"""

from __future__ import annotations

import os
from typing import Iterable

from ..checksum import PIECE
from ..errors import CorruptCheckpointError
from ..metadata import METADATA_FILE, check_relative_path, split_reference

#: Largest single os.write/os.preadv call (Linux moves at most ~2 GiB per call anyway).
_MAX_IO = 1 << 30


def write_all(fd: int, buffer, hasher=None) -> int:
    """Write every byte of ``buffer`` to ``fd`` (looping over short writes); return the count.

    With ``hasher`` (checksum.new_hasher), the bytes are also hashed, a cache-sized
    step at a time right after they are written, instead of in a second pass.
    """
    view = _bytes(buffer)
    total = len(view)
    step = PIECE if hasher is not None else _MAX_IO
    for lo in range(0, total, step):
        hi = min(lo + step, total)
        done = lo
        while done < hi:
            done += os.write(fd, view[done:hi])
        if hasher is not None:
            hasher.update(view[lo:hi])
    return total


def _bytes(buffer) -> memoryview:
    view = memoryview(buffer)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def read_exact(fd: int, offset: int, buffer, name: str, hasher=None) -> None:
    """Fill ``buffer`` from ``fd`` at ``offset``; CorruptCheckpointError if the file ends first.

    With ``hasher``, each cache-sized step is hashed right after it is read.
    """
    view = _bytes(buffer)
    total = len(view)
    step = PIECE if hasher is not None else _MAX_IO
    for lo in range(0, total, step):
        hi = min(lo + step, total)
        done = lo
        while done < hi:
            n = os.preadv(fd, [view[done:hi]], offset + done)
            if n == 0:
                raise CorruptCheckpointError(f"{name} is truncated: wanted {total} bytes at offset {offset}, "
                                             f"the file ends after {done}")
            done += n
        if hasher is not None:
            hasher.update(view[lo:hi])


def fsync_path(path: str) -> None:
    """fsync a file or a directory by name (a directory fsync makes new entries in it durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str, data: bytes, fsync: bool = True) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one, never a part."""
    tmp = f"{path}.tmp-{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        write_all(fd, data)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    if fsync:
        fsync_path(os.path.dirname(path) or ".")


def create_exclusive(path: str) -> int:
    """Open a new file for writing; fails if it exists, so two writers never share a file by mistake."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)


def confined_path(directory: str, name: str) -> str:
    """The absolute path of data file ``name`` inside ``directory``; refuses anything that escapes it.

    A reference ``@NAME/path`` (incremental saves) resolves inside the sibling
    version ``NAME`` of ``directory`` (same parent), which must be a committed
    checkpoint directory; it may not leave that version either.
    """
    check_relative_path(name)
    ref = split_reference(name)
    if ref is not None:
        parent = os.path.dirname(os.path.realpath(directory))
        sibling = os.path.realpath(os.path.join(parent, ref[0]))
        if os.path.dirname(sibling) != parent:
            raise CorruptCheckpointError(f"data file {name!r} refers to a version outside {parent}")
        if not os.path.isfile(os.path.join(sibling, METADATA_FILE)):
            raise CorruptCheckpointError(f"data file {name!r} refers to {sibling}, which is not a committed version "
                                         "(removed or never committed)")
        directory, name = sibling, ref[1]
    root = os.path.realpath(directory)
    full = os.path.realpath(os.path.join(root, name))
    if not full.startswith(root + os.sep):
        raise CorruptCheckpointError(f"data file {name!r} resolves outside the checkpoint directory")
    return full


def sizes(directory: str, names: Iterable[str]) -> list[int]:
    """Sizes of the named data files; CorruptCheckpointError naming the first that is missing."""
    out = []
    for name in names:
        path = confined_path(directory, name)
        try:
            out.append(os.stat(path).st_size)
        except FileNotFoundError:
            raise CorruptCheckpointError(f"data file {path} is missing") from None
    return out
