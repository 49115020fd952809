"""The Storage interface: where the bytes of a version live, and the operations the save and load paths make.

One instance serves a whole save or load; every method takes full paths (a
version directory, its ``data/`` files, its ``metadata.json``), as
:mod:`hpcckpt.core.names` composes them.
"""

from __future__ import annotations

import errno
from abc import ABC, abstractmethod
from dataclasses import dataclass

#: The kinds :meth:`Storage.stat` reports (``Stat.kind``).
FILE, DIRECTORY, LINK = "file", "directory", "link"
#: Every kind, in the words a message uses for it ("is a FIFO").
KIND_WORDS = {FILE: "a regular file", DIRECTORY: "a directory", LINK: "a symbolic link", "fifo": "a FIFO",
              "socket": "a socket", "character device": "a character device", "block device": "a block device",
              "other": "not a plain file"}


@dataclass(frozen=True)
class Stat:
    """What :meth:`Storage.stat` found at a path.

    ``kind``: a key of KIND_WORDS.  ``size``: bytes (of a file; whatever the
    backend reports for anything else).  ``identity``: tells this object from
    another one later put at the same path (POSIX: device and inode; an object
    store: its version tag), comparable only within one process.  ``modified``:
    changes when the object is rewritten in place (POSIX: mtime in ns).
    ``target``: for a symbolic link looked at without following it, what it
    points to (None when unreadable or not a link).  ``tag``: where the
    backend has conditional writes, what names this very content of the
    object (an object store's ETag; :meth:`Storage.write_if_unchanged`),
    else None.
    """

    kind: str
    size: int
    identity: tuple
    modified: int = 0
    target: str | None = None
    tag: str | None = None

    def describe(self) -> str:
        """What it is, in words: 'a FIFO', 'a directory', ..."""
        return KIND_WORDS.get(self.kind, KIND_WORDS["other"])


class Storage(ABC):
    """A storage backend.  POSIX directories (storage/posix.py) are the default; storage/memory.py the second.

    Call order of one save:

    1. rank 0: ``make_version(directory)``: the new version's directory and
       its ``data/``; fails (FileExistsError) when it exists, so two writers
       never share one.
    2. every rank that writes a data file of its own: ``create(path)`` (fails
       when the file exists), ``append(handle, buffer, hasher)`` for each
       chunk, in order (returns the bytes written; ``hasher`` gets them too),
       each after the unused bytes ``gap_before(position, buffer)`` asks for,
       then ``close(handle, fsync)`` (also after a failure; twice is harmless).
    3. rank 0, the commit (storage/commit.py): ``sync_directory(data dir)``, then
       ``atomic_write(metadata path, bytes, fsync)`` (readers see no file or
       the whole one), then ``sync_directory(parent of the version)``.

    Call order of one load (any number of processes, read-only):

    1. ``read_file(metadata path, limit)``: the whole file, at most ``limit``
       bytes (CorruptCheckpointError beyond), FileNotFoundError when absent.
    2. for each data file named in the metadata: ``resolve(directory, name,
       roots)`` (the path it denotes, confined to the version or, for a
       reference ``@VERSION/...``, to a committed sibling version: else
       CorruptCheckpointError), ``open_read(path)`` -> ``(handle, size)``,
       ``read_segments(handle, offset, buffer, name, segments)`` for each run
       of chunks, ``close_read(handle)``.

    Errors: missing files raise FileNotFoundError from ``open_read`` and
    ``read_file``; everything else that a bad or damaged checkpoint causes is a
    CheckpointError (CorruptCheckpointError for damage).

    Capability flags, read instead of testing class names:

    * ``durable``: ``fsync=True`` makes written bytes survive a crash of the
      machine (POSIX: yes; memory: no).
    * ``shared_paths``: a file one process wrote is seen by every other
      process at the same path, so a transport may write one file for
      several ranks (aggregated: an aggregator writes its group's chunks) and
      another rank reads it at a load; with False only file-per-rank runs.
    * ``shared_files``: several processes write into one file at once, each
      at its own offsets (shared-file, through MPI-IO or pwrite); an object
      store has one writer per object, so False there.  Also read by the
      load: where it holds, each rank of a small job reads the metadata
      itself instead of receiving rank 0's broadcast (a read is cheap there,
      unlike a request per rank on an object store).
    * ``conditional_writes``: :meth:`write_if_unchanged` works (an object
      store's ``If-Match``); the writer lock is then a lease
      (hpcckpt.root.lock).

    Call order of a Checkpointer root's bookkeeping (rank 0 only; see the
    methods under "root" below for what each guarantees):

    * the root itself: ``make_directories(root)``; its versions:
      ``listdir(root)``, ``stat(entry)`` and ``realpath`` (an entry that is a
      link out of the root is no version), ``is_file(metadata path)``.
    * retention: ``remove_file(metadata path)`` (uncommit, newest first),
      then ``remove_tree(version)``.
    * the writer lock: ``create(lock)``, ``append``, ``sync`` (kept open
      while held), ``names_handle`` + ``remove_file`` + ``close`` to release;
      a lock found there: ``stat``, ``read_file``, ``listdir`` (a directory),
      ``replace`` aside, ``link`` back, ``remove_file``, ``remove_directory``.
    * the halt file: ``exists``, ``read_head``, ``atomic_write``, ``remove_file``.
    * the failure and bandwidth histories: ``read_file``, ``atomic_write``,
      ``replace`` (a malformed file set aside).

    Call order of the node-local levels (hpcckpt.levels: partner copies, parity, rebuilds, the flush to the
    root; see the methods under "files written in place"):

    * a file: ``make_directories(parent)``, ``create_replacing(path)`` (or of
      ``path.part``), then ``append``, ``write_at``, ``truncate`` and
      ``append_from`` (the bytes of a file opened by ``open_read``), ``sync``
      and ``close``; a ``.part`` is then moved into place by ``replace``, or
      removed by ``remove_file`` after a failure.
    * a source: ``open_read``, ``read_at`` (fewer bytes where the file ends)
      or ``read_segments`` (exactly), ``close_read``.
    * a version's inventory: ``listdir`` and ``stat``; what a failed attempt
      left: ``discard_tree``.

    A new backend subclasses this and passes ``hpcckpt.testing.StorageTests``.
    """

    durable: bool = False
    shared_paths: bool = False
    shared_files: bool = False
    conditional_writes: bool = False

    # ----------------------------------------------------------------- save
    @abstractmethod
    def make_version(self, directory: str) -> None:
        """Create ``directory`` and its ``data/``; FileExistsError when ``directory`` exists."""

    @abstractmethod
    def create(self, path: str):
        """A handle for appending to the new file ``path``; FileExistsError when it exists."""

    @abstractmethod
    def append(self, handle, buffer, hasher=None) -> int:
        """Append every byte of ``buffer`` (any contiguous buffer); update ``hasher`` with them; the count."""

    def gap_before(self, position: int, buffer) -> int:
        """How many unused bytes a writer leaves at ``position`` of a new file before appending the chunk
        ``buffer``, where the backend reads or writes faster for it (files may hold bytes no chunk refers
        to): 0 here."""
        return 0

    @abstractmethod
    def close(self, handle, fsync: bool) -> None:
        """Finish a file made by :meth:`create` or :meth:`create_replacing` (made durable first when ``fsync``)."""

    @abstractmethod
    def atomic_write(self, path: str, data: bytes, fsync: bool = True) -> None:
        """Replace ``path`` by ``data`` so that readers see the old content or all of the new."""

    @abstractmethod
    def sync_directory(self, path: str) -> None:
        """Make the entries of directory ``path`` durable (nothing to do where ``durable`` is False)."""

    # ----------------------------------------------------------------- load
    @abstractmethod
    def read_file(self, path: str, limit: int) -> bytes:
        """The whole content of ``path``, refusing more than ``limit`` bytes (CorruptCheckpointError)."""

    @abstractmethod
    def resolve(self, directory: str, name: str, roots: dict | None = None) -> str:
        """The path of data file ``name`` of the version at ``directory``, confined to it (or to a committed
        sibling, for a reference); ``roots``: a dict kept across calls, for resolving each version once."""

    @abstractmethod
    def open_read(self, path: str) -> tuple:
        """``(handle, size)`` of the regular file ``path``; FileNotFoundError when absent."""

    @abstractmethod
    def read_segments(self, handle, offset: int, buffer, name: str, segments) -> None:
        """Fill ``buffer`` from ``offset``; ``segments``: ``(nbytes, hasher or None)`` that cut ``buffer``,
        each hashed as it is read; CorruptCheckpointError if the file ends first."""

    @abstractmethod
    def close_read(self, handle) -> None:
        """Release a handle of :meth:`open_read`."""

    # ------------------------------------------------------- bookkeeping
    @abstractmethod
    def exists(self, path: str) -> bool:
        """Whether anything (file or directory) is at ``path``."""

    @abstractmethod
    def listdir(self, path: str) -> list[str]:
        """The names in directory ``path`` (FileNotFoundError when absent, NotADirectoryError for a file)."""

    @abstractmethod
    def remove(self, path: str) -> None:
        """Remove the file or the whole directory tree at ``path`` (nothing when absent)."""

    # ------------------------------------------------------------- root
    @abstractmethod
    def stat(self, path: str, follow: bool = False) -> Stat | None:
        """What is at ``path`` (a :class:`Stat`), or None when nothing is.

        ``follow=False`` looks at a symbolic link itself, ``follow=True`` at
        what it points to (None for a dangling one).  NotADirectoryError when
        something on the way to ``path`` is not a directory; any other failure
        to look (no permission, I/O error) is an OSError too.  Never opens the
        object, so a FIFO or a device is looked at without blocking.
        """

    def is_file(self, path: str) -> bool:
        """Whether ``path`` is a regular file, links followed (False for anything that cannot be looked at)."""
        return self._kind(path) == FILE

    def is_directory(self, path: str) -> bool:
        """Whether ``path`` is a directory, links followed (False for anything that cannot be looked at)."""
        return self._kind(path) == DIRECTORY

    def _kind(self, path: str) -> str | None:
        try:
            st = self.stat(path, follow=True)
        except OSError:
            return None
        return None if st is None else st.kind

    @abstractmethod
    def realpath(self, path: str) -> str:
        """The canonical absolute form of ``path``: symbolic links resolved (where the backend has any),
        ``.`` and ``..`` removed; whether anything is there does not matter."""

    @abstractmethod
    def make_directories(self, path: str) -> None:
        """Make the directory ``path`` and any missing parents; nothing when it is a directory already,
        FileExistsError when something else has that name."""

    @abstractmethod
    def replace(self, source: str, target: str) -> None:
        """Rename ``source`` (any kind, a link itself and not its target) to ``target`` in one step, replacing
        a file at ``target``: readers see the old ``target`` or the new one, never neither.
        FileNotFoundError when ``source`` is absent."""

    @abstractmethod
    def link(self, source: str, target: str) -> None:
        """Give the object at ``source`` (a link itself, not followed) the second name ``target``, never
        replacing anything: FileExistsError when ``target`` is taken, FileNotFoundError when ``source`` is
        absent.  (A backend without hard links may copy the bytes; ``source`` stays as it was.)"""

    @abstractmethod
    def remove_file(self, path: str) -> None:
        """Remove the one name ``path`` (a file, a link itself, a FIFO: anything but a directory).
        FileNotFoundError when absent, IsADirectoryError (or another OSError) for a directory, which stays."""

    @abstractmethod
    def remove_directory(self, path: str) -> None:
        """Remove the empty directory ``path`` (never a link to one).  FileNotFoundError when absent,
        NotADirectoryError for anything else, OSError with errno ENOTEMPTY when it holds anything."""

    @abstractmethod
    def remove_tree(self, path: str) -> None:
        """Remove the directory ``path`` and everything under it; links inside are removed, never followed.
        Nothing when absent, and an entry another remover deleted meanwhile is no error; an OSError for
        anything that resists and for ``path`` itself being a link (only a real directory tree is removed)."""

    @abstractmethod
    def read_head(self, path: str, nbytes: int) -> bytes:
        """Up to ``nbytes`` from the start of the regular file ``path`` (fewer when it is shorter, the rest never
        read).  Never blocks: a FIFO, device or directory there is a CorruptCheckpointError naming what it is;
        FileNotFoundError when absent; CheckpointError for any other failure."""

    @abstractmethod
    def sync(self, handle) -> None:
        """Make the bytes written to ``handle`` (of :meth:`create` or :meth:`create_replacing`) durable, keeping
        it open (nothing to do where ``durable`` is False)."""

    @abstractmethod
    def names_handle(self, path: str, handle) -> bool:
        """Whether ``path`` still names the very file ``handle`` (of :meth:`create`, still open) writes, not
        another object put there since (False when nothing is there)."""

    # ------------------------------------------------------- files written in place
    @abstractmethod
    def create_replacing(self, path: str):
        """A handle, as :meth:`create` gives, for the new file ``path``, first removing whatever name a stale
        attempt left there, so a writer only ever writes into a file it created itself: a link there is
        removed, never followed; a directory there is a CorruptCheckpointError and stays."""

    @abstractmethod
    def write_at(self, handle, offset: int, buffer) -> None:
        """Write every byte of ``buffer`` at ``offset`` of the file ``handle`` (of :meth:`create` or
        :meth:`create_replacing`) writes, past its end too (a gap reads as zeros).  Where :meth:`append`
        writes next does not move: right after the bytes appended so far.  OSError (EINVAL) for a negative
        ``offset``."""

    @abstractmethod
    def truncate(self, handle, size: int) -> None:
        """Make the file ``handle`` (of :meth:`create` or :meth:`create_replacing`) writes ``size`` bytes long:
        cut, or extended with zeros.  OSError (EINVAL) for a negative ``size``."""

    @abstractmethod
    def append_from(self, handle, source, size: int, name: str, pace=None) -> int:
        """Append bytes ``[0, size)`` of the file ``source`` (a handle of :meth:`open_read`) to ``handle``; the
        count.  ``pace(done)`` is called after each step with the bytes copied so far (a bandwidth cap sleeps
        there).  OSError naming ``name`` when ``source`` ends first."""

    @abstractmethod
    def read_at(self, handle, offset: int, buffer) -> int:
        """Fill ``buffer`` from ``offset`` of the file ``handle`` (of :meth:`open_read`) reads; the count read,
        fewer only where the file ends first (0 at or past its end).  OSError (EINVAL) for a negative
        ``offset``."""

    def write_if_unchanged(self, path: str, data: bytes, seen: Stat) -> bool:
        """Replace the file at ``path`` by a new one holding ``data``, in one step, only if it is still the
        object ``seen`` (a :class:`Stat` of it with a ``tag``) held: of two writers that saw the same object,
        exactly one succeeds.  False, writing nothing, when it changed or is gone.  Only where
        ``conditional_writes`` (NotImplementedError elsewhere)."""
        raise NotImplementedError(f"{type(self).__name__} has no conditional writes")

    def discard_tree(self, path: str) -> None:
        """Remove what can be removed of the directory tree at ``path``; never raises.  For what a failed or
        abandoned attempt left (a version discarded, a flush that failed, spool files): whatever resists is an
        uncommitted leftover a later save or ``hpcckpt gc`` clears."""
        try:
            self.remove_tree(path)
        except OSError:
            pass


def copy_through_buffer(source: Storage, fi, target: Storage, fo, size: int, name: str, pace, step: int) -> int:
    """:meth:`Storage.append_from` by reading and appending: bytes ``[0, size)`` of ``fi`` (a handle of
    ``source.open_read``) appended to ``fo`` (of ``target``) through one buffer of ``step`` bytes, ``pace(done)``
    after each step; the count.  OSError (EIO) naming ``name`` when ``fi`` ends first.  For copies between two
    storages, and for a storage whose reads and writes go through memory anyway (an object store)."""
    buf = memoryview(bytearray(min(size, step)))
    done = 0
    while done < size:
        n = source.read_at(fi, done, buf[:min(len(buf), size - done)])
        if n == 0:
            raise OSError(errno.EIO, f"{name} shrank while being copied ({done} of {size} bytes)")
        target.append(fo, buf[:n])
        done += n
        if pace is not None:
            pace(done)
    return done


def check_position(value: int, what: str) -> None:
    """OSError (EINVAL) naming ``what`` when ``value`` (an offset or a size in a file) is negative, as POSIX
    refuses one, so that every backend refuses it alike, even for an empty buffer."""
    if value < 0:
        raise OSError(errno.EINVAL, f"negative {what}: {value}")


def hash_segments(view: memoryview, segments) -> None:
    """Feed each consecutive ``(nbytes, hasher or None)`` segment of ``view``, already filled, to its hasher:
    the checksums of a backend that fills the buffer in one copy (memory, a mapped image)."""
    lo = 0
    for nbytes, hasher in segments:
        if hasher is not None:
            hasher.update(view[lo:lo + nbytes])
        lo += nbytes
