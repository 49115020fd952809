"""The versions under a Checkpointer root: naming, listing, retention and garbage collection.

A version lives in ``ROOT/step-<12 digits>`` and is committed exactly when its
``metadata.json`` exists.  Saving a step that already has a committed version
(as happens after a restart) writes ``step-<12 digits>.r<N>``; the newest
revision of a step supersedes the older ones.  Anything else in the root is
left alone (the writer lock ``.hpcckpt-lock`` of :mod:`hpcckpt.root.lock` among
it).  One writer per root at a time (one job); readers may run any time.

A version directory must lie directly inside the root: an entry whose real path
(symbolic links resolved) is elsewhere -- a link out of the root -- is not a
version, the same confinement ``@`` references get.

Every access goes through the root's Storage (POSIX by default): each
:class:`VersionEntry` carries the storage it was listed from, so retention
and garbage collection remove it there.
"""

from __future__ import annotations

import json
import os
import queue
import threading
from dataclasses import dataclass, field

from hpcckpt.core.warn import warn
from hpcckpt.errors import CheckpointError
from hpcckpt.format.metadata import MAX_METADATA_BYTES
from hpcckpt.core.names import MAX_VERSION_STEP, METADATA_FILE, parse_version_name, split_reference, version_name
from hpcckpt.storage import POSIX, Storage
from hpcckpt.storage.base import DIRECTORY, LINK


@dataclass(frozen=True)
class VersionEntry:
    """One version directory under a root (``storage``: where it lives)."""

    name: str
    path: str
    step: int
    revision: int
    committed: bool
    storage: Storage = field(default=POSIX, compare=False, repr=False)

    @property
    def order(self) -> tuple[int, int]:
        return self.step, self.revision


def check_step(step) -> int:
    """``step`` if a version name can hold it (an int in [0, 10^12)), else CheckpointError."""
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= MAX_VERSION_STEP:
        raise CheckpointError(f"step must be an integer in [0, {MAX_VERSION_STEP}], got {step!r}")
    return step


def list_versions(root: str, storage: Storage = POSIX) -> list[VersionEntry]:
    """All version directories under ``root`` in ``storage``, oldest first (an absent root has none).

    An entry whose real path is not directly inside the real root is skipped.
    """
    try:
        names = storage.listdir(root)
    except FileNotFoundError:
        return []
    real_root = storage.realpath(root)
    out = []
    for name in names:
        parsed = parse_version_name(name)
        path = os.path.join(root, name)
        if parsed and _directly_inside(storage, path, real_root):
            out.append(VersionEntry(name, path, parsed.step, parsed.revision,
                                    storage.is_file(os.path.join(path, METADATA_FILE)), storage))
    return sorted(out, key=lambda e: e.order)


def _directly_inside(storage: Storage, path: str, real_root: str) -> bool:
    """Whether the entry ``path`` of a root is a directory whose real path lies directly inside ``real_root``.

    A plain directory (one stat, not following a link) is real_root/its name;
    only a symbolic link needs resolving (realpath walks every component: 5-20
    stats, at every save's retention)."""
    try:
        st = storage.stat(path)
    except OSError:
        return False
    if st is None:
        return False
    if st.kind == DIRECTORY:
        return True
    return st.kind == LINK and storage.is_directory(path) and os.path.dirname(storage.realpath(path)) == real_root


def current(entries: list[VersionEntry]) -> list[VersionEntry]:
    """The committed versions that count: the newest revision of each step, oldest step first."""
    by_step: dict[int, VersionEntry] = {}
    for e in entries:
        if e.committed:
            by_step[e.step] = e  # entries are sorted, so the newest revision wins
    return [by_step[s] for s in sorted(by_step)]


def resolve_version(path: str, storage: Storage = POSIX) -> tuple[str, VersionEntry | None]:
    """The version directory ``path`` names: ``(path, None)`` when it holds a ``metadata.json`` (or is not a
    root with a committed version), else ``(newest committed version, its entry)`` when it is a root."""
    if storage.is_file(os.path.join(path, METADATA_FILE)):
        return path, None
    live = current(list_versions(path, storage))
    if live:
        return live[-1].path, live[-1]
    return path, None  # read_metadata names the missing metadata.json


def new_version_name(entries: list[VersionEntry], step: int) -> str:
    """A fresh directory name for ``step`` that sorts after every existing revision of it."""
    revisions = [e.revision for e in entries if e.step == step]
    return version_name(step, max(revisions) + 1 if revisions else 0)


class KnownNames:
    """Every version name a root may hold, the same on every rank of a Checkpointer: rank 0's listing when a save
    last planned collectively (handed to every rank with the plan), plus each version committed since.

    What a save planned without a collective (saving/run.py: checked at the
    commit) names its version from on every rank, with no listing: kept as
    the highest revision of each step, so that, as :func:`new_version_name`,
    a new version sorts after every revision of its step and no name is taken
    twice.  ``revisions`` is None until a listing came (the next save then
    plans collectively); a failed save forgets them, so the next one lists
    again.
    """

    def __init__(self, root: str):
        self.root = root
        self.revisions: dict | None = None  # step -> highest revision

    @staticmethod
    def revisions_of(names) -> dict:
        """``{step: highest revision}`` of the version directory names among ``names``."""
        out: dict = {}
        for name in names:
            parsed = parse_version_name(name)
            if parsed is not None and parsed.revision >= out.get(parsed.step, -1):
                out[parsed.step] = parsed.revision
        return out

    def adopt(self, revisions: dict | None) -> None:
        """What rank 0 listed (:meth:`revisions_of`; None: unknown)."""
        self.revisions = None if revisions is None else dict(revisions)

    def add(self, name: str) -> None:
        if self.revisions is not None:
            for step, revision in self.revisions_of([name]).items():
                self.revisions[step] = max(revision, self.revisions.get(step, -1))

    def forget(self) -> None:
        self.revisions = None

    def taken(self, name: str) -> bool:
        """Whether ``name`` is a version these names hold (one committed or listed before), not a newer one:
        the directory of a save other ranks have started already is never taken yet."""
        parsed = parse_version_name(name)
        return self.revisions is not None and parsed is not None and \
            parsed.revision <= self.revisions.get(parsed.step, -1)

    def next_path(self, step: int) -> str:
        """The directory a new version of ``step`` takes under the root (the revisions must be known)."""
        revision = self.revisions.get(step)
        return os.path.join(self.root, version_name(step, 0 if revision is None else revision + 1))


def removable(entries: list[VersionEntry], keep: int | None) -> list[VersionEntry]:
    """What garbage collection removes: uncommitted leftovers, superseded revisions, and beyond ``keep``."""
    live = current(entries)
    kept = {e.name for e in (live[-keep:] if keep else live)}
    if any(e.committed and e.name not in kept for e in entries):
        kept = protected(entries, kept)  # never the data a kept incremental version references
    return [e for e in entries if e.name not in kept]


def retained(entries: list[VersionEntry], keep: int | None) -> list[VersionEntry]:
    """The committed versions retention keeps (``current`` less what :func:`removable` takes), oldest first.

    What a rank's own listing reports: rank 0 applies retention after a save
    has returned on the other ranks, so a rank listing meanwhile still finds
    versions about to go; this answer is the same before and after.
    """
    gone = {e.name for e in removable(entries, keep)}
    return [e for e in current(entries) if e.name not in gone]


def remove_versions(entries: list[VersionEntry]) -> list[str]:
    """Delete the given version directories (each from its own storage); warn (do not fail) for any that resist.

    Crash safety: every version is first uncommitted (:func:`uncommit_versions`),
    and only then are the directories deleted (:func:`delete_directories`).  A
    kill at any instant leaves neither a "committed" version with missing data
    nor one referencing an uncommitted one; the leftovers are uncommitted
    directories, removed by the next save or gc.
    """
    return delete_directories(uncommit_versions(entries))


def uncommit_versions(entries: list[VersionEntry]) -> list[VersionEntry]:
    """Unlink the metadata.json of each version, newest first (incremental versions reference older ones);
    the entries now uncommitted, which :func:`delete_directories` may delete.  Warns for one that resists, and
    then keeps every older one committed too (the one that resisted may reference it)."""
    done = []
    for e in sorted(entries, key=lambda e: e.order, reverse=True):
        try:
            e.storage.remove_file(os.path.join(e.path, METADATA_FILE))
        except FileNotFoundError:
            pass
        except OSError as exc:
            warn(f"hpcckpt: could not remove {e.path}: {exc}")
            break
        done.append(e)
    return done


def delete_directories(entries: list[VersionEntry]) -> list[str]:
    """Delete the directories of uncommitted versions; the names deleted (warns for one that resists).

    A file deleted meanwhile (by retention's thread, or a ``hpcckpt gc`` run
    beside it) is what was wanted (Storage.remove_tree).
    """
    removed = []
    for e in entries:
        try:
            e.storage.remove_tree(e.path)
            removed.append(e.name)
        except OSError as exc:
            warn(f"hpcckpt: could not remove {e.path}: {exc}")
    return removed


class Retirement:
    """Retention off a save's critical path: versions uncommitted at once, their directories deleted on a thread.

    Rank 0 of a Checkpointer, after each commit: :meth:`retire` unlinks the
    metadata.json of the versions retention removes (they are no versions any
    more the moment it returns: what a kill would leave anyway) and queues
    their directories (unlinking every data file: the slow part) for one
    worker thread, started at the first retirement and kept while saves come
    (no thread is started per save), so the save returns without waiting.  :meth:`wait` returns once every queued
    directory is deleted and stops the worker; a save that lists the root
    calls it first, and so does close.  A directory the thread could not
    delete (or whose deletion the end of the process cut short: the worker
    is a daemon) is an uncommitted leftover, removed by a later save or
    ``hpcckpt gc``.
    """

    def __init__(self):
        self._thread: threading.Thread | None = None
        self._queue: queue.SimpleQueue | None = None

    def retire(self, entries: list[VersionEntry]) -> None:
        """Uncommit ``entries`` now, delete their directories in the background (after those queued before)."""
        gone = uncommit_versions(entries)
        if gone:
            if self._thread is None:
                self._queue = queue.SimpleQueue()
                self._thread = threading.Thread(target=_delete_queued, args=(self._queue,), name="hpcckpt-retention",
                                                daemon=True)
                self._thread.start()
            self._queue.put(gone)

    def wait(self) -> None:
        """Return once the directories handed over are deleted (the worker stops; the next retire starts one)."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = self._queue = None


def _delete_queued(work: queue.SimpleQueue) -> None:
    """Retirement's worker: delete each queued list of directories, in order, until None comes."""
    for entries in iter(work.get, None):
        delete_directories(entries)


def gc(root: str, keep: int | None = None, storage: Storage = POSIX) -> list[str]:
    """Remove uncommitted leftovers and superseded revisions (and, with ``keep``, older versions)."""
    if keep is not None and keep < 1:
        raise CheckpointError(f"keep must be at least 1, got {keep}")
    return remove_versions(removable(list_versions(root, storage), keep))


#: (storage, metadata.json path) -> ((identity, mtime, size), names it references): retention runs after every
#: save.
_REFS_CACHE: dict = {}


def referenced(version_path: str, storage: Storage = POSIX) -> set[str]:
    """Names of the sibling versions whose data ``version_path`` references (empty when unreadable): its
    chunks' and its tracked output files' (``extra["files"]``, hpcckpt.root.file_manifest)."""
    path = os.path.join(version_path, METADATA_FILE)
    key = (id(storage), path)
    try:
        st = storage.stat(path, follow=True)
        if st is None:
            return set()
        stamp = (st.identity, st.modified, st.size)
        if _REFS_CACHE.get(key, (None,))[0] == stamp:
            return _REFS_CACHE[key][1]
        raw = storage.read_file(path, MAX_METADATA_BYTES)
    except (OSError, CheckpointError):  # unreadable or damaged: it is not a committed version to protect
        return set()
    names: set[str] = set()
    if b'"@' in raw:  # most versions reference nothing: skip the parse
        try:
            doc = json.loads(raw)
            files = list(doc.get("files", []))
            tracked = doc.get("extra", {}).get("files")  # the stored blocks of tracked output files
            files += tracked.get("blobs", []) if isinstance(tracked, dict) else []
        except (ValueError, AttributeError, RecursionError, TypeError):
            files = []
        for f in files if isinstance(files, list) else []:
            ref = split_reference(f) if isinstance(f, str) else None
            if ref is not None:
                names.add(ref[0])
    if len(_REFS_CACHE) > 4096:
        _REFS_CACHE.clear()
    _REFS_CACHE[key] = (stamp, names)
    return names


def protected(entries, kept: set[str]) -> set[str]:
    """``kept`` plus every version a kept version references, and so on (the closure).

    A kept version's references are direct (it points at the version that
    holds each block), but a version kept for its data stays a committed
    version that ``steps()`` lists and a restore or ``compact`` reads whole,
    so the versions it references are kept too.  The chain is at most
    ``max_chain`` deep, which bounds what this keeps.
    """
    by_name = {e.name: e for e in entries if e.committed}
    out = set(kept)
    todo = [n for n in kept if n in by_name]
    while todo:
        entry = by_name[todo.pop()]
        for ref in referenced(entry.path, entry.storage):
            if ref not in out:
                out.add(ref)
                if ref in by_name:
                    todo.append(ref)
    return out
