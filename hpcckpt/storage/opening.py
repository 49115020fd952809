"""The one place hpcckpt opens files: every open of a file under a root, a node-local or persistent-memory
directory, or a tracked file goes through these functions.

What holds for every descriptor they return:

* The open never blocks: ``O_NONBLOCK`` is set for the open itself (a FIFO
  opened for reading would otherwise wait for a writer, one opened for writing
  for a reader) and cleared again once the object is known to be a regular file.
* The object is checked with ``fstat`` on the descriptor (not on the name, which
  may change in between): a FIFO, device, socket or directory is refused with a
  CorruptCheckpointError naming what it is.
* New files are created exclusively (``O_EXCL``) and never through a symbolic
  link (``O_NOFOLLOW``): a name planted in advance cannot redirect a write.
* ``follow=False`` also refuses a symbolic link as the last component of an
  existing file, for callers that must act on the file the name itself is.
* Descriptors are close-on-exec.

A missing file raises FileNotFoundError (the caller says which file it was);
any other failure to open is a CheckpointError.
"""

from __future__ import annotations

import os
import stat

from hpcckpt.errors import CheckpointError, CorruptCheckpointError

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)


def open_regular(path: str, *, write: bool = False, follow: bool = True) -> int:
    """Open the existing regular file ``path``: read-only, or read-write with ``write``.

    ``follow=False``: a symbolic link at ``path`` itself is refused
    (CorruptCheckpointError), so the file changed is the one the name names.
    """
    flags = (os.O_RDWR if write else os.O_RDONLY) | os.O_NONBLOCK | _CLOEXEC | (0 if follow else _NOFOLLOW)
    fd = _open(path, flags)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise CorruptCheckpointError(f"{path} is not a regular file ({file_kind(mode)})")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def create_new(path: str, mode: int = 0o644, readable: bool = False) -> int:
    """Create ``path`` for writing (and reading, with ``readable``: a shared map needs both); FileExistsError
    if anything (a link included) already has that name, and any other OSError as ``os.open`` raises it (the
    caller says what it was creating)."""
    access = os.O_RDWR if readable else os.O_WRONLY
    return os.open(path, access | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, mode)


def create_replacing(path: str, mode: int = 0o644, readable: bool = False) -> int:
    """Create ``path`` for writing, first removing whatever name a stale attempt left there.

    For temporary and partial files that are renamed into place later: the old
    name is unlinked (which never follows a link: a planted link is removed, its
    target untouched) and the file created exclusively, so a writer only ever
    writes into a file it created itself.  A directory at ``path`` is refused.
    """
    try:
        return create_new(path, mode, readable)
    except FileExistsError:
        pass
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except IsADirectoryError:
        raise CorruptCheckpointError(f"{path} is a directory, not a file hpcckpt left") from None
    except OSError as exc:
        raise CheckpointError(f"cannot replace {path}: {exc.strerror}") from None
    try:
        return create_new(path, mode, readable)
    except FileExistsError:
        raise CheckpointError(f"{path} was created by someone else while hpcckpt replaced it") from None


def open_for_sync(path: str) -> int:
    """A read-only descriptor of the regular file or directory ``path``, to fsync it."""
    fd = _open(path, os.O_RDONLY | os.O_NONBLOCK | _CLOEXEC)
    mode = os.fstat(fd).st_mode
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        os.close(fd)
        raise CorruptCheckpointError(f"{path} is not a regular file or directory ({file_kind(mode)})")
    return fd


def open_directory(path: str) -> int:
    """A read-only descriptor of the directory ``path`` (not through a link)."""
    return _open(path, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | os.O_NONBLOCK | _CLOEXEC)


def _open(path: str, flags: int) -> int:
    try:
        return os.open(path, flags)
    except (FileNotFoundError, NotADirectoryError):
        raise FileNotFoundError(2, "No such file or directory", path) from None
    except IsADirectoryError:
        raise CorruptCheckpointError(f"{path} is a directory, not a regular file") from None
    except OSError as exc:
        if flags & _NOFOLLOW and os.path.islink(path):
            raise CorruptCheckpointError(f"{path} is a symbolic link, not a regular file") from None
        raise CheckpointError(f"cannot open {path}: {exc.strerror}") from None


def file_kind(mode: int) -> str:
    """What a non-regular file is, in words."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return "not a plain file"
