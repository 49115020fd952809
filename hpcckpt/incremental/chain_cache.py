"""The base of an incremental save: which version it builds on, and that version's block index on every rank.

Rank 0 resolves the base (an explicit ``base``, the version a Checkpointer
saved or restored last, or the newest committed one under the root) inside the
plan stage's allreduce, in which the ranks' reports of the indexes they hold
are intersected.  The indexes of the last two versions this process saved or read are
kept here, so a Checkpointer's repeated incremental saves never ship an index:
only a first save (or one after a restore) broadcasts it from rank 0.
"""

from __future__ import annotations

import errno
import os

from hpcckpt.mpi.collective import bcast_checked
from hpcckpt.errors import CheckpointError
from hpcckpt.incremental.rules import ChainIndex
from hpcckpt.format.metadata import Metadata
from hpcckpt.core.names import METADATA_FILE, is_reference_version
from hpcckpt.storage import POSIX, Storage

#: ``{(real path, metadata stamp): ChainIndex}``, newest last: the version saved last and its predecessor
#: (a save on an explicit base, as ``hpcckpt.save(..., base=...)`` repeated on one base).
_INDEXES: dict = {}
_ENTRIES = 2


def held() -> list:
    """The keys of the indexes this process holds (what a rank reports in the plan stage)."""
    return list(_INDEXES)


def committed(directory: str, meta: Metadata, storage: Storage = POSIX) -> tuple:
    """Rank 0, after committing ``meta`` at ``directory`` (in ``storage``): ``(key, index)``, what the commit
    broadcasts."""
    key = (storage.realpath(directory), stamp(directory, storage))
    return key, ChainIndex.from_metadata(meta, os.path.basename(key[0]))


def remember(key, index: ChainIndex) -> None:
    """Keep the index of a version (every rank, from the commit's broadcast)."""
    _keep(key, index)


def _keep(key, index: ChainIndex) -> None:
    _INDEXES.pop(key, None)
    _INDEXES[key] = index
    while len(_INDEXES) > _ENTRIES:
        _INDEXES.pop(next(iter(_INDEXES)))


def index_of(directory: str | None, storage: Storage = POSIX) -> ChainIndex | None:
    """The index of the committed version at ``directory`` (in ``storage``) if this process holds it, else None
    (no MPI)."""
    if directory is None:
        return None
    try:
        return _INDEXES.get((storage.realpath(directory), stamp(directory, storage)))
    except OSError:
        return None


def stamp(directory: str, storage: Storage = POSIX) -> tuple:
    """What tells two commits of one directory apart: the metadata file's identity (POSIX: device and inode),
    modification time and size; FileNotFoundError when the version is not committed."""
    path = os.path.join(directory, METADATA_FILE)
    st = storage.stat(path, follow=True)
    if st is None:
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)
    return st.identity, st.modified, st.size


def chosen_base(explicit, chain_base: str | None, parent: str | None = None, storage: Storage = POSIX):
    """The base an incremental save names: ``explicit`` (the ``base`` option), else ``chain_base`` (the version a
    Checkpointer saved or restored last) while it is still committed in ``storage`` and, given ``parent``, lies
    in that directory; else None (:func:`resolve_base` then takes the newest committed one)."""
    if explicit is not None:
        return explicit
    if chain_base is None or not storage.is_file(os.path.join(chain_base, METADATA_FILE)):
        return None
    if parent is not None and os.path.dirname(storage.realpath(chain_base)) != storage.realpath(parent):
        return None
    return chain_base


def resolve_base(directory: str, base, io_root: str | None, storage: Storage = POSIX) -> tuple | None:
    """Rank 0: the key of the base version (``base`` if given, else the newest committed under ``io_root``), or None.

    ``directory``: the new version's path in ``storage`` (it need not exist
    yet).  ``base`` must be a committed sibling of it whose name can be
    referenced (docs/format.md, references).
    """
    parent = os.path.dirname(storage.realpath(directory))
    if base is not None:
        base = os.fspath(base)
        if not storage.is_file(os.path.join(base, METADATA_FILE)):
            raise CheckpointError(f"base {base!r} is not a committed checkpoint")
        if os.path.dirname(storage.realpath(base)) != parent:
            raise CheckpointError(f"base {base!r} must be a sibling of {directory!r} (the same parent directory)")
        if not is_reference_version(os.path.basename(storage.realpath(base))):
            raise CheckpointError(f"base {base!r}: its name must be letters, digits and _.+- to be referenced")
    elif io_root is not None:
        from hpcckpt.root.catalog import current, list_versions

        name = os.path.basename(os.path.normpath(directory))
        live = [e for e in current(list_versions(io_root, storage)) if e.name != name]
        base = live[-1].path if live else None
    if base is None:
        return None
    return storage.realpath(base), stamp(base, storage)


def base_index(comm, what: str, key, held_by_all, storage: Storage = POSIX) -> ChainIndex | None:
    """Collective when some rank lacks it: the index of the base ``key`` (rank 0's) on every rank, or None.

    ``held_by_all``: the keys every rank holds (the intersection of what the
    ranks reported from :func:`held`, the same on every rank).  When every
    rank holds the index, no message is sent; otherwise rank 0 reads it from
    ``storage`` (or takes it from its cache) and broadcasts it.
    """
    if key is None:
        return None
    if key not in held_by_all:
        def read():
            from hpcckpt.storage.metadata_file import read_metadata

            index = _INDEXES.get(key)
            return index if index is not None else ChainIndex.from_metadata(read_metadata(key[0], storage),
                                                                            os.path.basename(key[0]))

        _keep(key, bcast_checked(comm, what, read))
    index = _INDEXES[key]
    _keep(key, index)
    return index
