"""An in-memory Storage: versions as bytes in a dict, for tests and for staging a checkpoint without a file system.

One process only (``shared_files`` is False: only the file-per-rank transport
runs over it), nothing durable.  The same confinement rules as POSIX: names
from metadata stay inside their version, references only reach committed
sibling versions.
"""

from __future__ import annotations

import os
import posixpath

from hpcckpt.errors import CheckpointError, CorruptCheckpointError
from hpcckpt.format.metadata import check_relative_path
from hpcckpt.core.names import DATA_DIR, METADATA_FILE, split_reference
from hpcckpt.storage.base import Storage, hash_segments


class _Appender:
    """A file being written: its path and the bytes so far."""

    def __init__(self, path: str, data: bytearray):
        self.path, self.data = path, data


class MemoryStorage(Storage):
    """Files and directories held in memory; paths are normalised POSIX paths."""

    durable = False
    shared_files = False

    def __init__(self):
        self.files: dict[str, bytearray] = {}
        self.dirs: set[str] = {"/"}

    @staticmethod
    def _norm(path: str) -> str:
        return posixpath.normpath(posixpath.join("/", os.fspath(path)))

    def _makedirs(self, path: str) -> None:
        while path not in self.dirs:
            if path in self.files:
                raise NotADirectoryError(path)
            self.dirs.add(path)
            path = posixpath.dirname(path)

    # ----------------------------------------------------------------- save
    def make_version(self, directory: str) -> None:
        d = self._norm(directory)
        if self.exists(d):
            raise FileExistsError(directory)
        self._makedirs(posixpath.join(d, DATA_DIR))

    def create(self, path: str) -> _Appender:
        p = self._norm(path)
        if self.exists(p):
            raise FileExistsError(path)
        if posixpath.dirname(p) not in self.dirs:
            raise FileNotFoundError(path)
        self.files[p] = bytearray()
        return _Appender(p, self.files[p])

    def append(self, handle: _Appender, buffer, hasher=None) -> int:
        view = memoryview(buffer).cast("B") if memoryview(buffer).ndim != 1 or memoryview(buffer).format != "B" \
            else memoryview(buffer)
        handle.data += view
        if hasher is not None:
            hasher.update(view)
        return len(view)

    def close(self, handle: _Appender, fsync: bool) -> None:
        pass

    def atomic_write(self, path: str, data: bytes, fsync: bool = True) -> None:
        p = self._norm(path)
        if posixpath.dirname(p) not in self.dirs:
            raise FileNotFoundError(path)
        if p in self.dirs:
            raise IsADirectoryError(path)
        self.files[p] = bytearray(data)  # one assignment: readers see the old bytes or the new

    def sync_directory(self, path: str) -> None:
        if self._norm(path) not in self.dirs:
            raise FileNotFoundError(path)

    # ----------------------------------------------------------------- load
    def read_file(self, path: str, limit: int) -> bytes:
        data, _ = self.open_read(path)
        if len(data) > limit:
            raise CorruptCheckpointError(f"{path} is longer than {limit} bytes, more than any real one")
        return bytes(data)

    def resolve(self, directory: str, name: str, roots: dict | None = None) -> str:
        check_relative_path(name)
        own = self._norm(directory)
        ref = split_reference(name)
        if ref is None:
            root, rest = own, name
        else:
            root, rest = self._norm(posixpath.join(posixpath.dirname(own), ref[0])), ref[1]
            if posixpath.dirname(root) != posixpath.dirname(own):
                raise CorruptCheckpointError(f"data file {name!r} refers to a version outside {posixpath.dirname(own)}")
            if posixpath.join(root, METADATA_FILE) not in self.files:
                raise CorruptCheckpointError(f"data file {name!r} refers to {root}, which is not a committed version "
                                             "(removed or never committed)")
        full = self._norm(posixpath.join(root, rest))
        if not full.startswith(root + "/"):
            raise CorruptCheckpointError(f"data file {rest!r} resolves outside the checkpoint directory")
        return full

    def open_read(self, path: str) -> tuple[bytearray, int]:
        p = self._norm(path)
        if p in self.dirs:
            raise CorruptCheckpointError(f"{path} is a directory, not a regular file")
        if p not in self.files:
            raise FileNotFoundError(path)
        return self.files[p], len(self.files[p])

    def read_segments(self, handle: bytearray, offset: int, buffer, name: str, segments) -> None:
        view = memoryview(buffer).cast("B")
        end = offset + len(view)
        if end > len(handle):
            raise CorruptCheckpointError(f"{name} is truncated: wanted {len(view)} bytes at offset {offset}, "
                                         f"the file ends after {max(0, len(handle) - offset)}")
        view[:] = memoryview(handle)[offset:end]
        hash_segments(view, segments)

    def close_read(self, handle) -> None:
        pass

    # ------------------------------------------------------- bookkeeping
    def exists(self, path: str) -> bool:
        p = self._norm(path)
        return p in self.files or p in self.dirs

    def listdir(self, path: str) -> list[str]:
        p = self._norm(path)
        if p in self.files:
            raise NotADirectoryError(path)
        if p not in self.dirs:
            raise FileNotFoundError(path)
        prefix = p.rstrip("/") + "/"
        return sorted({q[len(prefix):].split("/")[0] for q in (*self.files, *self.dirs)
                       if q.startswith(prefix) and q != p})

    def remove(self, path: str) -> None:
        p = self._norm(path)
        if p == "/":
            raise CheckpointError("refusing to remove the whole memory storage")
        prefix = p + "/"
        for q in [q for q in self.files if q == p or q.startswith(prefix)]:
            del self.files[q]
        self.dirs -= {q for q in self.dirs if q == p or q.startswith(prefix)}
