"""POSIX file operations with the durability and confinement rules hpcckpt relies on.

Writes go straight from the caller's buffers to the file (``os.write`` on a
memoryview: no copy), reads go straight into the target (``os.preadv``), files
and the directories that name them are fsynced before a version is committed,
and every name read from metadata is resolved inside the checkpoint directory.
"""

from __future__ import annotations

import os
import stat
from typing import Iterable

import numpy as np

from hpcckpt.core.checksum import PIECE
from hpcckpt.errors import CheckpointError, CorruptCheckpointError
from hpcckpt.format.metadata import check_relative_path
from hpcckpt.core.names import DATA_DIR, METADATA_FILE, split_reference
from hpcckpt.storage.base import DIRECTORY, FILE, LINK, Stat, Storage, check_position
from hpcckpt.storage.opening import create_new, create_replacing, open_for_sync, open_regular

#: Largest single os.write/os.preadv call (Linux moves at most ~2 GiB per call anyway).
_MAX_IO = 1 << 30
#: One step of a file-to-file copy in the kernel.
_COPY_STEP = 8 << 20


def write_all(fd: int, buffer, hasher=None) -> int:
    """Write every byte of ``buffer`` to ``fd`` (looping over short writes); return the count.

    The bytes go a cache-sized step at a time, hashed or not: with several ranks
    writing at once, 256 KiB writes beat 1 MiB ones (docs/incremental.md,
    "Benchmark").  The steps end at multiples of the step size in the file, so
    that after a write that starts inside a page (a chunk placed by
    :func:`phase_gap`) no write ends inside one and the next refills it.  With
    ``hasher`` (checksum.new_hasher), each step is also hashed right after it is
    written, instead of in a second pass.
    """
    view = _bytes(buffer)
    total = len(view)
    for lo, hi in _steps(total, PIECE - _position(fd) % PIECE):
        done = lo
        while done < hi:
            done += os.write(fd, view[done:hi])
        if hasher is not None:
            hasher.update(view[lo:hi])
    return total


def _steps(total: int, first: int):
    """``(lo, hi)`` ranges that cut ``[0, total)``: the first ``first`` bytes long, every other :data:`PIECE`."""
    bounds = [0, *range(min(first, total), total, PIECE), total]
    return [(lo, hi) for lo, hi in zip(bounds, bounds[1:]) if hi > lo]


def _position(fd: int) -> int:
    """The file position of ``fd`` (0 where it has none)."""
    try:
        return os.lseek(fd, 0, os.SEEK_CUR)
    except OSError:
        return 0


def _bytes(buffer) -> memoryview:
    view = memoryview(buffer)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def read_exact(fd: int, offset: int, buffer, name: str, hasher=None) -> None:
    """Fill ``buffer`` from ``fd`` at ``offset``; CorruptCheckpointError if the file ends first.

    With ``hasher``, each cache-sized step is hashed right after it is read.
    """
    view = _bytes(buffer)
    read_segments(fd, offset, view, name, [(len(view), hasher)])


def read_segments(fd: int, offset: int, buffer, name: str, segments) -> None:
    """Fill ``buffer`` from ``fd`` at ``offset``, hashing each of its consecutive segments into its own hasher.

    ``segments``: ``(nbytes, hasher or None)`` pairs that cut ``buffer`` from
    its start (several chunks stored back to back, read in one pass).  Each
    step (:func:`_read_steps`: up to :data:`_READ_STEP` bytes), never
    straddling two segments, is hashed right after it is read, while it is in
    cache.  CorruptCheckpointError if the file ends first.

    When the target lies a short distance past the file's bytes in page
    offset (:func:`_short_distance`: a numpy array of the malloc'd kind, 16
    bytes into its page, read from a page-aligned chunk), the kernel's copy
    runs at about half speed; each hashed step but the last is then read
    :data:`_SHIFT` bytes further on in the buffer (into the part that the
    next steps fill later) and moved back in userspace while it is in cache.
    """
    view = _bytes(buffer)
    total = len(view)
    shift = _SHIFT if total > _READ_STEP and _short_distance(view, offset) else 0
    move = _memmove(view) if shift else None
    lo = 0
    for nbytes, hasher in segments:
        end = lo + nbytes
        steps = _read_steps(offset, lo, end) if hasher is not None else _whole_steps(lo, end)
        for a, b in steps:
            s = shift if hasher is not None and b + shift <= total else 0
            done = a
            while done < b:
                n = os.preadv(fd, [view[done + s:b + s]], offset + done)
                if n == 0:
                    raise CorruptCheckpointError(f"{name} is truncated: wanted {total} bytes at offset {offset}, "
                                                 f"the file ends after {done}")
                done += n
            if s:
                move(a, a + s, b - a)
            if hasher is not None:
                hasher.update(view[a:b])
        lo = end


#: The page size that the copy distance is measured against.
_PAGE = 4096
#: The bytes :func:`read_segments` reads and hashes per step: within a core's cache, and 4 times fewer system
#: calls and hash calls than :data:`PIECE` (the write step), which several ranks loading at once gain from
#: (bench/load_phases.py).
_READ_STEP = 1 << 20
#: The first step of a run: a cold read waits for its first step before any readahead has begun, so a run
#: starts small and doubles its steps up to :data:`_READ_STEP`.
_FIRST_READ_STEP = 1 << 18


def _read_steps(offset: int, start: int, stop: int):
    """The ``(a, b)`` ranges of a buffer's bytes ``[start, stop)``, read from its file at ``offset + a``, that
    :func:`read_segments` reads and hashes one at a time: the first at most :data:`_FIRST_READ_STEP` long,
    each next one up to twice as long as the one before, at most :data:`_READ_STEP`, and every one after
    the first starting on a page of the file (a read that starts inside a page, as a chunk stored at its
    memory's page phase does, would otherwise make every step straddle a page, which slows cold reads)."""
    step, a = _FIRST_READ_STEP, start
    while a < stop:
        b = min(a + step - (offset + a) % _PAGE, stop)
        yield a, b
        step, a = min(2 * step, _READ_STEP), b


def _whole_steps(start: int, stop: int):
    """``[start, stop)`` in ranges of at most :data:`_MAX_IO` bytes (reads that nothing hashes)."""
    return ((a, min(a + _MAX_IO, stop)) for a in range(start, stop, _MAX_IO))


#: How far :func:`read_segments` reads a step past its place when the copy's distance is short.
_SHIFT = 2048


def _short_distance(view: memoryview, offset: int) -> bool:
    """Whether the kernel copies a read at ``offset`` into ``view`` over a short distance: the target's
    address minus the file offset, modulo the page size, between 1 and 63 bytes (there the copy, ``rep
    movsb`` on x86, runs at about half speed on this machine: docs/performance.md, "Loads by phase")."""
    address = _address(view)
    return address is not None and 0 < (address - offset) % _PAGE < 64


#: Chunks smaller than this are stored where they fall (:func:`phase_gap`).
_PHASED_MIN = 2 * PIECE


def phase_gap(position: int, buffer) -> int:
    """How many bytes to leave unused at ``position`` of a file before storing ``buffer``, so that its first
    byte lands at the same offset within a page as it has in memory (0 for a buffer under
    :data:`_PHASED_MIN` bytes or of unknown address).

    A load into the same memory, or into a fresh numpy array of the same size (which the allocator places
    at the same offset into its page), then copies from the page cache at distance 0 modulo the page size,
    at the kernel copy's full speed and without :func:`read_segments`'s move.  The format lets files hold
    bytes no chunk refers to (docs/format.md, "Data layout"), and a reader takes each chunk's offset from
    the metadata, so files written either way read alike.
    """
    view = _bytes(buffer)
    address = _address(view) if len(view) >= _PHASED_MIN else None
    return 0 if address is None else (address - position) % _PAGE


def _address(view: memoryview) -> int | None:
    """The address of ``view``'s first byte (read-only buffers too), or None for an empty one."""
    return np.frombuffer(view, np.uint8).ctypes.data if len(view) else None


def _memmove(view: memoryview):
    """``move(dst, src, n)``: libc's memmove between byte positions of ``view`` (overlapping allowed)."""
    import ctypes

    base = _address(view)
    memmove = ctypes.memmove
    return lambda dst, src, n: memmove(base + dst, base + src, n)


def copy_data(src: int, dst: int, size: int, name: str, pace=None) -> int:
    """Copy bytes ``[0, size)`` of descriptor ``src`` to the position of descriptor ``dst``; the count copied.

    In the kernel where it can (``copy_file_range``, else ``sendfile``), a
    step at a time; ``pace(done)`` is called after each step (a bandwidth cap
    sleeps there).  OSError naming ``name`` if the source ends first.
    """
    done = 0
    while done < size:
        n = _copy_some(src, dst, done, min(_COPY_STEP, size - done))
        if n <= 0:
            raise OSError(f"{name} shrank while being copied ({done} of {size} bytes)")
        done += n
        if pace is not None:
            pace(done)
    return done


def _copy_some(src: int, dst: int, offset: int, count: int) -> int:
    if hasattr(os, "copy_file_range"):
        try:
            return os.copy_file_range(src, dst, count, offset)
        except OSError:
            pass  # across file systems on old kernels: fall back
    if hasattr(os, "sendfile"):
        return os.sendfile(dst, src, offset, count)
    return os.write(dst, os.pread(src, count, offset))


def read_bounded(path: str, limit: int) -> bytes:
    """The whole content of the regular file ``path``, refusing more than ``limit`` bytes.

    Bounded by the bytes actually read, not by the size the file reports
    (``/proc`` files and some devices report 0): at most ``limit + 1`` bytes are
    ever read into memory.  CorruptCheckpointError when the file is longer.
    Each read asks for the size the file reports (plus one byte, to see its end),
    never for ``limit``: ``os.read`` allocates what it is asked for.
    """
    data = _read_from_start(path, limit + 1, lambda fd: min(_MAX_IO, max(os.fstat(fd).st_size + 1, 1 << 16)))
    if len(data) > limit:
        raise CorruptCheckpointError(f"{path} is longer than {limit} bytes, more than any real one")
    return data


def _read_from_start(path: str, nbytes: int, step) -> bytes:
    """Up to ``nbytes`` from the start of the regular file ``path`` (opened without blocking: opening.py), each
    read asking for at most ``step(fd)`` bytes; CheckpointError if a read fails."""
    fd = open_regular(path)
    try:
        chunks, total = [], 0
        most = step(fd)
        while total < nbytes:
            piece = os.read(fd, min(most, nbytes - total))
            if not piece:
                break
            chunks.append(piece)
            total += len(piece)
    except OSError as exc:
        raise CheckpointError(f"cannot read {path}: {exc.strerror}") from None
    finally:
        os.close(fd)
    return b"".join(chunks)


def fsync_path(path: str) -> None:
    """fsync a file or a directory by name (a directory fsync makes new entries in it durable)."""
    fd = open_for_sync(path)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str, data: bytes, fsync: bool = True) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one, never a part; a
    failure leaves the old file and no temporary one."""
    tmp = f"{path}.tmp-{os.getpid()}"
    fd = create_replacing(tmp)
    try:
        try:
            write_all(fd, data)
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if fsync:
        fsync_path(os.path.dirname(path) or ".")


def confined_path(directory: str, name: str, roots: dict | None = None) -> str:
    """The absolute path of data file ``name`` inside ``directory``; refuses anything that escapes it.

    A reference ``@NAME/path`` (incremental saves) resolves inside the sibling
    version ``NAME`` of ``directory`` (same parent), which must be a committed
    checkpoint directory; it may not leave that version either.  ``roots``: a
    dict the caller keeps across calls (a reader opening the files of many
    versions), so that each version directory is resolved and checked once.
    """
    check_relative_path(name)
    ref = split_reference(name)
    key = ref[0] if ref is not None else None
    root = roots.get(key) if roots is not None else None
    if root is None:
        own = (roots.get(None) if roots is not None else None) or os.path.realpath(directory)
        root = own if key is None else _sibling_root(own, key, name)
        if roots is not None:
            roots[None], roots[key] = own, root
    full = _resolve_inside(root, ref[1] if ref is not None else name)
    if not full.startswith(root + os.sep):
        name = ref[1] if ref is not None else name
        raise CorruptCheckpointError(f"data file {name!r} resolves outside the checkpoint directory")
    return full


def _sibling_root(own: str, version: str, name: str) -> str:
    """The real path of the committed version ``version`` next to the version at real path ``own``.

    ``name`` (the reference being resolved) is only for the error messages.
    """
    parent = os.path.dirname(own)
    sibling = _resolve_inside(parent, version)
    if os.path.dirname(sibling) != parent:
        raise CorruptCheckpointError(f"data file {name!r} refers to a version outside {parent}")
    if not os.path.isfile(os.path.join(sibling, METADATA_FILE)):
        raise CorruptCheckpointError(f"data file {name!r} refers to {sibling}, which is not a committed version "
                                     "(removed or never committed)")
    return sibling


def _resolve_inside(root: str, name: str) -> str:
    """``os.path.realpath(root/name)`` for a real ``root`` and a normalised relative ``name``, cheaply.

    Only the components of ``name`` can be symbolic links, so when none is (one
    lstat each) the joined path is already the real one; otherwise realpath
    resolves it.  A component that cannot be examined (missing, not a
    directory) ends the walk, as it does for realpath: nothing below it exists.
    """
    path = root
    for part in name.split("/"):
        path = os.path.join(path, part)
        try:
            if stat.S_ISLNK(os.lstat(path).st_mode):
                return os.path.realpath(os.path.join(root, name))
        except OSError:
            break
    return os.path.join(root, name)


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


#: Stat.kind of each file type.
_KINDS = {stat.S_IFREG: FILE, stat.S_IFDIR: DIRECTORY, stat.S_IFLNK: LINK, stat.S_IFIFO: "fifo",
          stat.S_IFSOCK: "socket", stat.S_IFCHR: "character device", stat.S_IFBLK: "block device"}


def read_head(path: str, nbytes: int) -> bytes:
    """Up to ``nbytes`` from the start of the regular file ``path`` (opened without blocking, see opening.py)."""
    return _read_from_start(path, nbytes, lambda fd: nbytes)


def remove_tree(path: str) -> None:
    """``shutil.rmtree`` of ``path``, where an entry deleted meanwhile (by retention's thread, or a ``hpcckpt gc``
    run beside it) is what was wanted; any other error propagates (a link at ``path`` itself is one)."""
    import shutil  # here: shutil (with bz2 and lzma) stays out of a restart's import, which never removes

    shutil.rmtree(path, onerror=_already_gone)


def _already_gone(function, path, exc_info) -> None:
    if not issubclass(exc_info[0], FileNotFoundError):
        raise exc_info[1]


def flock_exclusive(fd: int) -> bool:
    """Take the exclusive ``flock`` of the open file ``fd`` without waiting; whether it was taken (False where
    another process holds it or the file system has no flock).

    POSIX only, and not part of Storage: the kernel drops a flock when its
    process dies, which is how the writer lock (hpcckpt.root.lock) tells a
    holder whose pid was reused from a live one; an object store has no such
    thing and its locks go without.
    """
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    return True


def flock_free(path: str) -> bool:
    """Whether nobody holds the ``flock`` of the regular file ``path`` (False where flock is not supported, the
    file is gone or is something else: a link at ``path`` itself is not followed)."""
    try:
        fd = open_regular(path, follow=False)
    except (OSError, CheckpointError):
        return False
    try:
        return flock_exclusive(fd)
    finally:
        os.close(fd)


class PosixStorage(Storage):
    """POSIX directories: the default Storage (the functions above, behind the interface of storage/base.py)."""

    durable = True
    shared_paths = True
    shared_files = True

    def make_version(self, directory: str) -> None:
        os.makedirs(os.path.join(directory, DATA_DIR), exist_ok=False)

    def create(self, path: str) -> int:
        return create_new(path)

    def append(self, handle: int, buffer, hasher=None) -> int:
        return write_all(handle, buffer, hasher)

    def close(self, handle: int, fsync: bool) -> None:
        try:
            if fsync:
                os.fsync(handle)
        finally:
            os.close(handle)

    def atomic_write(self, path: str, data: bytes, fsync: bool = True) -> None:
        atomic_write(path, data, fsync)

    def sync_directory(self, path: str) -> None:
        fsync_path(path)

    def read_file(self, path: str, limit: int) -> bytes:
        return read_bounded(path, limit)

    def resolve(self, directory: str, name: str, roots: dict | None = None) -> str:
        return confined_path(directory, name, roots)

    def open_read(self, path: str) -> tuple[int, int]:
        fd = open_regular(path)
        return fd, os.fstat(fd).st_size

    def read_segments(self, handle: int, offset: int, buffer, name: str, segments) -> None:
        read_segments(handle, offset, buffer, name, segments)

    def gap_before(self, position: int, buffer) -> int:
        return phase_gap(position, buffer)

    def close_read(self, handle: int) -> None:
        os.close(handle)

    def exists(self, path: str) -> bool:
        return os.path.lexists(path)

    def listdir(self, path: str) -> list[str]:
        return os.listdir(path)

    def remove(self, path: str) -> None:
        if os.path.isdir(path) and not os.path.islink(path):
            import shutil  # here: shutil (with bz2 and lzma) stays out of a restart's import, which never removes

            shutil.rmtree(path)
        elif os.path.lexists(path):
            os.unlink(path)

    # ------------------------------------------------------------- root
    def stat(self, path: str, follow: bool = False) -> Stat | None:
        try:
            st = os.stat(path) if follow else os.lstat(path)
        except FileNotFoundError:
            return None
        kind = _KINDS.get(stat.S_IFMT(st.st_mode), "other")
        return Stat(kind, st.st_size, (st.st_dev, st.st_ino), st.st_mtime_ns,
                    _link_target(path) if kind == LINK else None)

    def realpath(self, path: str) -> str:
        return os.path.realpath(path)

    def make_directories(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def replace(self, source: str, target: str) -> None:
        os.replace(source, target)

    def link(self, source: str, target: str) -> None:
        os.link(source, target, follow_symlinks=False)

    def remove_file(self, path: str) -> None:
        os.unlink(path)

    def remove_directory(self, path: str) -> None:
        os.rmdir(path)

    def remove_tree(self, path: str) -> None:
        remove_tree(path)

    def read_head(self, path: str, nbytes: int) -> bytes:
        return read_head(path, nbytes)

    def sync(self, handle: int) -> None:
        os.fsync(handle)

    def names_handle(self, path: str, handle: int) -> bool:
        try:
            st = os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            return False
        mine = os.fstat(handle)
        return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)

    # ------------------------------------------------------- files written in place
    def create_replacing(self, path: str) -> int:
        return create_replacing(path)

    def write_at(self, handle: int, offset: int, buffer) -> None:
        check_position(offset, "offset")
        view = _bytes(buffer)
        done = 0
        while done < len(view):
            done += os.pwrite(handle, view[done:done + _MAX_IO], offset + done)

    def truncate(self, handle: int, size: int) -> None:
        os.ftruncate(handle, size)

    def append_from(self, handle: int, source: int, size: int, name: str, pace=None) -> int:
        return copy_data(source, handle, size, name, pace)

    def read_at(self, handle: int, offset: int, buffer) -> int:
        check_position(offset, "offset")
        view = _bytes(buffer)
        done = 0
        while done < len(view):
            n = os.preadv(handle, [view[done:done + _MAX_IO]], offset + done)
            if n == 0:
                break
            done += n
        return done

    def discard_tree(self, path: str) -> None:
        """``shutil.rmtree`` ignoring errors: it goes on past an entry that resists, removing all the rest."""
        import shutil  # here: shutil (with bz2 and lzma) stays out of a restart's import, which never removes

        shutil.rmtree(path, ignore_errors=True)


def _link_target(path: str) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None


#: The default storage of every save and load.
POSIX = PosixStorage()
