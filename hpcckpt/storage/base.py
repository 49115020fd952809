"""The Storage interface: where the bytes of a version live, and the operations the save and load paths make.

One instance serves a whole save or load; every method takes full paths (a
version directory, its ``data/`` files, its ``metadata.json``), as
:mod:`hpcckpt.core.names` composes them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod


class Storage(ABC):
    """A storage backend.  POSIX directories (storage/posix.py) are the default; storage/memory.py the second.

    Call order of one save:

    1. rank 0: ``make_version(directory)``: the new version's directory and
       its ``data/``; fails (FileExistsError) when it exists, so two writers
       never share one.
    2. every rank that writes a data file of its own: ``create(path)`` (fails
       when the file exists), ``append(handle, buffer, hasher)`` for each
       chunk, in order (returns the bytes written; ``hasher`` gets them too),
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
    * ``shared_files``: other processes see the files by path, so the
      transports that write one file from many ranks (aggregated,
      shared-file, through MPI-IO or pwrite) can use it; with False only
      file-per-rank runs.

    A new backend subclasses this and passes ``hpcckpt.testing.StorageTests``.
    """

    durable: bool = False
    shared_files: bool = False

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

    @abstractmethod
    def close(self, handle, fsync: bool) -> None:
        """Finish a file made by :meth:`create` (made durable first when ``fsync``)."""

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


def hash_segments(view: memoryview, segments) -> None:
    """Feed each consecutive ``(nbytes, hasher or None)`` segment of ``view``, already filled, to its hasher:
    the checksums of a backend that fills the buffer in one copy (memory, a mapped image)."""
    lo = 0
    for nbytes, hasher in segments:
        if hasher is not None:
            hasher.update(view[lo:lo + nbytes])
        lo += nbytes
