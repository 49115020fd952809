"""An in-memory Storage: versions as bytes in a dict, for tests and for staging a checkpoint without a file system.

One process only (``shared_paths`` is False: only the file-per-rank transport
runs over it), nothing durable.  The same confinement rules as POSIX: names
from metadata stay inside their version, references only reach committed
sibling versions.
"""

from __future__ import annotations

import errno
import itertools
import os
import posixpath

from hpcckpt.errors import CheckpointError, CorruptCheckpointError
from hpcckpt.format.metadata import check_relative_path
from hpcckpt.core.names import DATA_DIR, METADATA_FILE, split_reference
from hpcckpt.storage.base import DIRECTORY, FILE, Stat, Storage, check_position, hash_segments

#: Identities of memory objects: unique across every MemoryStorage of the process (Stat.identity).
_SERIAL = itertools.count(1)


class _Appender:
    """A file being written: its path, the bytes so far, and where the next append writes (after the bytes
    appended so far, as a POSIX descriptor's position: write_at does not move it)."""

    def __init__(self, path: str, data: bytearray):
        self.path, self.data, self.position = path, data, 0


def _byte_view(buffer) -> memoryview:
    view = memoryview(buffer)
    return view if view.ndim == 1 and view.format == "B" else view.cast("B")


def _write(data: bytearray, offset: int, view: memoryview) -> None:
    """Put ``view`` at ``offset`` of ``data``, zero-filling any gap before it."""
    if offset > len(data):
        data.extend(bytes(offset - len(data)))
    data[offset:offset + len(view)] = view


class MemoryStorage(Storage):
    """Files and directories held in memory; paths are normalised POSIX paths."""

    durable = False
    shared_files = False

    def __init__(self):
        self.files: dict[str, bytearray] = {}
        self.dirs: set[str] = {"/"}
        self.ids: dict[str, int] = {"/": next(_SERIAL)}  # path -> identity of the object there (Stat.identity)

    @staticmethod
    def _norm(path: str) -> str:
        return posixpath.normpath(posixpath.join("/", os.fspath(path)))

    def _makedirs(self, path: str) -> None:
        while path not in self.dirs:
            if path in self.files:
                raise NotADirectoryError(path)
            self.dirs.add(path)
            self.ids[path] = next(_SERIAL)
            path = posixpath.dirname(path)

    def _put(self, path: str, data: bytearray) -> bytearray:
        """Make ``data`` the new file ``path`` (a new object: a new identity)."""
        self.files[path] = data
        self.ids[path] = next(_SERIAL)
        return data

    def _parent_is_directory(self, path: str, original: str) -> None:
        if posixpath.dirname(path) not in self.dirs:
            raise FileNotFoundError(2, "No such file or directory", original)

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
        self._parent_is_directory(p, path)
        return _Appender(p, self._put(p, bytearray()))

    def append(self, handle: _Appender, buffer, hasher=None) -> int:
        view = _byte_view(buffer)
        _write(handle.data, handle.position, view)
        handle.position += len(view)
        if hasher is not None:
            hasher.update(view)
        return len(view)

    def close(self, handle: _Appender, fsync: bool) -> None:
        pass

    def atomic_write(self, path: str, data: bytes, fsync: bool = True) -> None:
        p = self._norm(path)
        self._parent_is_directory(p, path)
        if p in self.dirs:
            raise IsADirectoryError(path)
        self._put(p, bytearray(data))  # one assignment: readers see the old bytes or the new

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
            del self.files[q], self.ids[q]
        for q in [q for q in self.dirs if q == p or q.startswith(prefix)]:
            self.dirs.discard(q)
            del self.ids[q]

    # ------------------------------------------------------------- root
    def stat(self, path: str, follow: bool = False) -> Stat | None:
        p = self._norm(path)
        if p in self.files:
            return Stat(FILE, len(self.files[p]), (self.ids[p],))
        if p in self.dirs:
            return Stat(DIRECTORY, 0, (self.ids[p],))
        parent = posixpath.dirname(p)
        while parent not in self.dirs:  # no links here: ``follow`` changes nothing
            if parent in self.files:
                raise NotADirectoryError(20, "Not a directory", path)
            parent = posixpath.dirname(parent)
        return None

    def realpath(self, path: str) -> str:
        return self._norm(path)

    def make_directories(self, path: str) -> None:
        p = self._norm(path)
        if p in self.files:
            raise FileExistsError(17, "File exists", path)
        self._makedirs(p)

    def replace(self, source: str, target: str) -> None:
        src, dst = self._norm(source), self._norm(target)
        if src == dst and self.exists(src):
            return
        if src in self.files:
            self._parent_is_directory(dst, target)
            if dst in self.dirs:
                raise IsADirectoryError(21, "Is a directory", target)
            self.files[dst], self.ids[dst] = self.files.pop(src), self.ids.pop(src)
        elif src in self.dirs:
            self._replace_directory(src, dst, target)
        else:
            raise FileNotFoundError(2, "No such file or directory", source)

    def _replace_directory(self, src: str, dst: str, target: str) -> None:
        if src == "/" or dst.startswith(src + "/"):
            raise OSError(errno.EINVAL, "Invalid argument", target)
        self._parent_is_directory(dst, target)
        if dst in self.files:
            raise NotADirectoryError(20, "Not a directory", target)
        if dst in self.dirs:
            if self.listdir(dst):
                raise OSError(errno.ENOTEMPTY, "Directory not empty", target)
            self.remove_directory(dst)

        def moved(q: str) -> str:
            return dst + q[len(src):]

        for q in [q for q in self.files if q.startswith(src + "/")]:
            self.files[moved(q)], self.ids[moved(q)] = self.files.pop(q), self.ids.pop(q)
        for q in [q for q in self.dirs if q == src or q.startswith(src + "/")]:
            self.dirs.discard(q)
            self.dirs.add(moved(q))
            self.ids[moved(q)] = self.ids.pop(q)

    def link(self, source: str, target: str) -> None:
        src, dst = self._norm(source), self._norm(target)
        if src in self.dirs:
            raise PermissionError(errno.EPERM, "Operation not permitted", source)
        if src not in self.files:
            raise FileNotFoundError(2, "No such file or directory", source)
        if self.exists(dst):
            raise FileExistsError(17, "File exists", target)
        self._parent_is_directory(dst, target)
        self.files[dst], self.ids[dst] = self.files[src], self.ids[src]  # one object, two names

    def remove_file(self, path: str) -> None:
        p = self._norm(path)
        if p in self.dirs:
            raise IsADirectoryError(21, "Is a directory", path)
        if p not in self.files:
            raise FileNotFoundError(2, "No such file or directory", path)
        del self.files[p], self.ids[p]

    def remove_directory(self, path: str) -> None:
        p = self._norm(path)
        if p in self.files:
            raise NotADirectoryError(20, "Not a directory", path)
        if p not in self.dirs:
            raise FileNotFoundError(2, "No such file or directory", path)
        if self.listdir(p):
            raise OSError(errno.ENOTEMPTY, "Directory not empty", path)
        if p == "/":
            raise CheckpointError("refusing to remove the whole memory storage")
        self.dirs.discard(p)
        del self.ids[p]

    def remove_tree(self, path: str) -> None:
        p = self._norm(path)
        if p in self.files:
            raise NotADirectoryError(20, "Not a directory", path)
        self.remove(p)

    def read_head(self, path: str, nbytes: int) -> bytes:
        data, _ = self.open_read(path)
        return bytes(data[:nbytes])

    def sync(self, handle: _Appender) -> None:
        pass

    def names_handle(self, path: str, handle: _Appender) -> bool:
        return self.files.get(self._norm(path)) is handle.data

    # ------------------------------------------------------- files written in place
    def create_replacing(self, path: str) -> _Appender:
        p = self._norm(path)
        if p in self.dirs:
            raise CorruptCheckpointError(f"{path} is a directory, not a file hpcckpt left")
        if p in self.files:
            self.remove_file(p)
        return self.create(path)

    def write_at(self, handle: _Appender, offset: int, buffer) -> None:
        check_position(offset, "offset")
        _write(handle.data, offset, _byte_view(buffer))

    def truncate(self, handle: _Appender, size: int) -> None:
        check_position(size, "size")
        data = handle.data
        if size > len(data):
            data.extend(bytes(size - len(data)))
        del data[size:]

    def append_from(self, handle: _Appender, source: bytearray, size: int, name: str, pace=None) -> int:
        if len(source) < size:
            raise OSError(f"{name} shrank while being copied ({len(source)} of {size} bytes)")
        self.append(handle, memoryview(source)[:size])
        if pace is not None:
            pace(size)
        return size

    def read_at(self, handle: bytearray, offset: int, buffer) -> int:
        check_position(offset, "offset")
        view = _byte_view(buffer)
        got = memoryview(handle)[offset:offset + len(view)]
        view[:len(got)] = got
        return len(got)
