"""Tracked output files, the I/O: what a save records of them, and the collective rollback of a restore.

A save calls :meth:`FileTracker.capture` on every rank between writing its
data and the commit: rank 0 records the shared files, each rank the files of
its ``{rank}`` patterns; blocks of in-place files that changed since the
previous save go into the version's ``tracked/`` files, and the records
reach rank 0 with the other commit parts, so they commit with the state
(docs/format.md section 9).  Nothing here writes to the tracked files during a
save: they are only read.

A restore calls :func:`rollback`: rank 0 reads the records, each file is
checked by the rank ``record rank % ranks`` (all checks agreed first: a file
missing or replaced means a CheckpointError on every rank and no file
touched), and only then is each file changed by one atomic step: a
truncation (append-only), a rename of a fully written and fsynced temporary
copy over it (in place), or an unlink (a literal path that did not exist).  A
kill at any instant therefore leaves every file at its old or its restored
content; a later restore (the restart) completes the rollback, since every
step is idempotent.
"""

from __future__ import annotations

import glob
import os
import stat

from hpcckpt.core.checksum import checksum
from hpcckpt.core.warn import warn
from hpcckpt.mpi.collective import agree, allgather_checked, bcast_checked
from hpcckpt.errors import CheckpointError, CorruptCheckpointError
from hpcckpt.root.file_manifest import (DEFAULT_BLOCK_BYTES, Pattern, Record, block_count, block_span, parse_manifest, patterns,
                            recorder, registered_location, registration_of, reuse, root_form, tail_span,
                            tracked_file)
from hpcckpt.core.checksum import raw_hash
from hpcckpt.storage.metadata_file import read_metadata
from hpcckpt.storage.opening import create_new, create_replacing, open_regular
from hpcckpt.storage.posix import confined_path, fsync_path, write_all

#: The suffix of the temporary copy an in-place rollback writes next to the file before renaming it over.
ROLLBACK_SUFFIX = ".hpcckpt-rollback"


class FileTracker:
    """The files a Checkpointer tracks, and what their previous save stored (for incremental in-place records).

    ``index``: path -> ``(block_bytes, [(hash, blob in root form, offset)])``
    of every in-place file of the chain base (the version saved or restored
    last); ``pending``: this rank's records of a save not yet committed;
    ``owners``: the rank count whose per-rank files are recorded, the largest
    the job has had (a job that shrank keeps recording the files of the ranks
    that left: rank ``i % n`` of ``n`` records rank ``i``'s, the rank that
    rolls them back, file_manifest.recorder).
    """

    def __init__(self, files=None):
        self.patterns: list[Pattern] = patterns(files)
        self.index: dict = {}
        self.pending: list[Record] = []
        self.owners = 0

    @classmethod
    def following(cls, registered: list[Pattern], owners: int = 0) -> "FileTracker":
        """A tracker of the files another rank's tracker registered (a rank that joined a resized job)."""
        tracker = cls()
        tracker.patterns = list(registered)
        tracker.owners = owners
        return tracker

    def ranks_seen(self, nranks: int) -> None:
        """The job runs on ``nranks`` ranks now: their per-rank files are recorded as well."""
        self.owners = max(self.owners, nranks)

    def track(self, files, mode: str = "append", block_bytes: int = DEFAULT_BLOCK_BYTES) -> None:
        self.patterns.extend(patterns(files, mode, block_bytes))

    def capture(self, rank: int, version_dir: str, fsync: bool, nranks: int) -> list[Record]:
        """This rank's records of the save into ``version_dir`` on ``nranks`` ranks (rank 0: the shared files;
        every rank: the per-rank files of the ranks it records, :attr:`owners`); writes the changed in-place
        blocks there."""
        self.ranks_seen(nranks)
        self.pending = []
        blob = _Blob(os.path.join(version_dir, tracked_file(rank)), tracked_file(rank), fsync)
        mine = [o for o in range(self.owners) if recorder(o, nranks) == rank]
        try:
            for p in self.patterns:
                for owner in mine if p.per_rank else [0] if rank == 0 else []:
                    for path in _expand(p.names(owner), p.literal):
                        self.pending.append(self._record(path, owner, p, blob))
        finally:
            blob.close()
        return self.pending

    def _record(self, path: str, rank: int, p: Pattern, blob: "_Blob") -> Record:
        try:
            fd = open_regular(path, follow=False)
        except FileNotFoundError:
            return Record(path=path, rank=rank, mode="absent")
        except CorruptCheckpointError as exc:
            if os.path.islink(path):
                raise CheckpointError(f"tracked file {path!r} is a symbolic link, and a restore never writes "
                                      f"through one: register the file it points to, {os.path.realpath(path)!r}"
                                      ) from None
            raise CheckpointError(f"tracked file {path!r} is not a regular file: {exc}") from None
        try:
            size = os.fstat(fd).st_size
            if p.mode == "append":
                start, n = tail_span(size, p.block_bytes)
                return Record(path=path, rank=rank, mode="append", size=size, tail_bytes=p.block_bytes,
                              tail=checksum(os.pread(fd, n, start)))
            old_bb, old_blocks = self.index.get(path, (None, None))
            spans = [block_span(i, size, p.block_bytes) for i in range(block_count(size, p.block_bytes))]
            hashes = [raw_hash(os.pread(fd, n, o)) for o, n in spans]  # one block in memory at a time
            places = reuse(hashes, old_blocks if old_bb == p.block_bytes else None)
            blocks = [(h, *(where if where is not None else blob.append(os.pread(fd, n, o))))
                      for h, (o, n), where in zip(hashes, spans, places)]
            return Record(path=path, rank=rank, mode="inplace", size=size, block_bytes=p.block_bytes, blocks=blocks)
        finally:
            os.close(fd)

    def committed(self, version_name: str) -> None:
        """The save whose records are pending committed as ``version_name``: they are the next save's base."""
        self.remember(self.pending, version_name)
        self.pending = []

    def remember(self, records: list[Record], version_name: str) -> None:
        """``records`` are those of ``version_name`` (restored, or committed by this rank): the next save's
        in-place base, and the per-rank files recorded there are recorded from now on."""
        self.owners = max([self.owners] + [r.rank + 1 for r in records])
        self.index = {r.path: (r.block_bytes, [(h, root_form(b, version_name), o) for h, b, o in r.blocks])
                      for r in records if r.mode == "inplace"}


class _Blob:
    """The tracked/ file of one rank in a new version, created at its first block."""

    def __init__(self, path: str, name: str, fsync: bool):
        self.path, self.name, self.fsync = path, name, fsync
        self.handle: int | None = None
        self.offset = 0

    def append(self, data: bytes) -> tuple[str, int]:
        if self.handle is None:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            self.handle = create_new(self.path)
        write_all(self.handle, data)
        self.offset += len(data)
        return self.name, self.offset - len(data)

    def close(self) -> None:
        if self.handle is None:
            return
        try:
            if self.fsync:
                os.fsync(self.handle)
        finally:
            os.close(self.handle)
            self.handle = None
        if self.fsync:
            fsync_path(os.path.dirname(self.path))


def _expand(name: str, literal: bool) -> list[str]:
    """The paths a normalised registration names now: a literal path as it is; a glob's matching regular
    files (not symbolic links) whose directory lies inside the glob's fixed leading directories, sorted."""
    if literal:
        return [name]
    location = registered_location(name)
    return sorted(p for p in (os.path.normpath(m) for m in glob.glob(name))
                  if _is_regular(p) and _inside(os.path.dirname(p) or ".", location))


def _is_regular(path: str) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _inside(directory: str, location: str) -> bool:
    """Whether ``directory`` resolves (symbolic links followed) to ``location`` or below it."""
    real, top = os.path.realpath(directory), os.path.realpath(location)
    return real == top or real.startswith(top.rstrip("/") + "/")


def records_of(version_dir: str) -> list[Record]:
    """The validated records of a committed version (empty when it tracked no file)."""
    doc = read_metadata(version_dir).extra.get("files")
    return [] if doc is None else parse_manifest(doc)


def rollback(comm, version_dir: str, registered: list[Pattern]) -> list[Record]:
    """Collective: bring every file that ``version_dir`` recorded and the application registers now
    (``registered``) back to its content there; the records acted on.

    The metadata is untrusted: a record of a path no current registration
    covers (file_manifest.registration_of), or whose directory resolves
    outside its registration's location through a symbolic link, is reported
    in a warning and ignored.  Every rank checks its files and prepares their
    temporary copies; only when all ranks succeeded does any file change
    (otherwise the copies are removed and every rank raises the same
    CheckpointError).  Three collectives: the records' broadcast, the
    allgather of the preparations (with the paths each rank leaves alone),
    the agreement on the changes.
    """
    what = f"rollback of the tracked files of {version_dir!r}"
    recorded = bcast_checked(comm, what, lambda: records_of(version_dir))
    covered = [(r, registration_of(r, registered)) for r in recorded]
    if comm.Get_rank() == 0:
        _warn_ignored(version_dir, [r.path for r, p in covered if p is None], "no registration of this run "
                      "covers them")
    covered = [(r, p) for r, p in covered if p is not None]
    mine = [(r, p) for r, p in covered if recorder(r.rank, comm.Get_size()) == comm.Get_rank()]
    actions: list = []
    escaped: list[str] = []

    def prepare_mine() -> list[str]:
        for r, p in mine:  # one by one: a failure leaves the earlier ones to discard
            if _inside(os.path.dirname(r.path) or ".", registered_location(p.names(r.rank))):
                actions.append(_prepare(version_dir, r))
            else:
                escaped.append(r.path)
        return escaped

    try:
        escaped_by_rank = allgather_checked(comm, what, prepare_mine)
    except CheckpointError:
        for action in actions:
            _discard(action)
        raise
    _warn_ignored(version_dir, escaped, "their directory resolves outside the registered one")
    agree(comm, what, lambda: [_apply(a) for a in actions])
    ignored = set(path for paths in escaped_by_rank for path in paths)
    return [r for r, _ in covered if r.path not in ignored]


def _warn_ignored(version_dir: str, paths: list[str], why: str) -> None:
    if paths:
        shown = ", ".join(repr(p) for p in paths[:5]) + (f" and {len(paths) - 5} more" if len(paths) > 5 else "")
        warn(f"hpcckpt: {version_dir!r} records tracked files that this restore leaves alone ({why}): "
             f"{shown}")


def _prepare(version_dir: str, r: Record):
    """Check one file against its record; the action that rolls it back (None: it already is as recorded)."""
    if r.mode == "absent":
        try:
            mode = os.lstat(r.path).st_mode
        except FileNotFoundError:
            return None
        if not stat.S_ISREG(mode):
            raise CheckpointError(f"tracked file {r.path!r} did not exist at this version and is now not a "
                                  "regular file: left alone")
        return ("remove", r.path)
    try:
        fd = open_regular(r.path, follow=False)  # a link in the file's place is never written through
    except FileNotFoundError:
        raise CheckpointError(f"tracked file {r.path!r} is missing: it cannot be rolled back") from None
    except CorruptCheckpointError as exc:
        raise CheckpointError(f"tracked file {r.path!r} was replaced by something else: {exc}") from None
    try:
        st = os.fstat(fd)
        if r.mode == "append":
            return _prepare_append(fd, st, r)
        return _prepare_inplace(version_dir, fd, st, r)
    finally:
        os.close(fd)


def _prepare_append(fd: int, st, r: Record):
    size = st.st_size
    if size < r.size:
        raise CheckpointError(f"tracked file {r.path!r} is shorter ({size} bytes) than at this version "
                              f"({r.size}): it was truncated or replaced")
    start, n = tail_span(r.size, r.tail_bytes)
    if checksum(os.pread(fd, n, start)) != r.tail:
        raise CheckpointError(f"tracked file {r.path!r} was rewritten or replaced: its bytes [{start}, {r.size}) "
                              "differ from this version's (it is registered as append-only)")
    return ("truncate", r.path, r.size, (st.st_dev, st.st_ino)) if size > r.size else None


def _prepare_inplace(version_dir: str, fd: int, st, r: Record):
    spans = [block_span(i, r.size, r.block_bytes) for i in range(len(r.blocks))]
    if st.st_size == r.size and all(raw_hash(os.pread(fd, n, o)) == h for (o, n), (h, _, _) in zip(spans, r.blocks)):
        return None
    target = r.path
    tmp = os.path.join(os.path.dirname(target), "." + os.path.basename(target) + ROLLBACK_SUFFIX)
    out = create_replacing(tmp, stat.S_IMODE(st.st_mode))
    roots: dict = {}
    sources: dict = {}  # blob -> open descriptor, for this file's rebuild
    try:
        for (_, n), (h, blob, offset) in zip(spans, r.blocks):
            if blob not in sources:
                sources[blob] = open_regular(confined_path(version_dir, blob, roots))
            data = os.pread(sources[blob], n, offset)
            if len(data) != n or raw_hash(data) != h:
                raise CorruptCheckpointError(f"a stored block of tracked file {r.path!r} in {blob} is damaged")
            write_all(out, data)
        os.fsync(out)
    except BaseException:
        os.close(out)
        os.unlink(tmp)
        raise
    finally:
        for fd in sources.values():
            os.close(fd)
    os.close(out)
    return ("replace", tmp, target)


def _apply(action) -> None:
    """One atomic change of one file, made durable."""
    if action is None:
        return
    kind, path = action[0], action[1]
    if kind == "truncate":
        fd = open_regular(path, write=True, follow=False)
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != action[3]:
                raise CheckpointError(f"tracked file {path!r} was replaced while it was rolled back: left alone")
            os.ftruncate(fd, action[2])
            os.fsync(fd)
        finally:
            os.close(fd)
        return
    if kind == "replace":
        path = action[2]
        os.replace(action[1], path)
    else:
        os.unlink(path)
    fsync_path(os.path.dirname(path) or ".")


def _discard(action) -> None:
    """Undo a prepared action that will not be applied: remove its temporary copy."""
    if action is not None and action[0] == "replace":
        try:
            os.unlink(action[1])
        except OSError:
            pass
