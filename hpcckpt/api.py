"""The one-call entry points: save, load and open a single checkpoint directory.

The save and open machinery is imported when first called: a restart that only
loads (a fresh process: ``import hpcckpt``, one ``load``) imports the load path
alone (bench/latency.py, "restart").
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from hpcckpt.mpi.collective import agree, on_root, resolve_comm
from hpcckpt.errors import CheckpointError
from hpcckpt.loading.load import load_version
from hpcckpt.core.names import DATA_DIR, METADATA_FILE, parse_version_name
from hpcckpt.storage import POSIX, PosixStorage, Storage
from hpcckpt.storage.s3 import storage_for

if TYPE_CHECKING:
    from hpcckpt.options import SaveResult
    from hpcckpt.loading.view import CheckpointView


def save(state, path, comm=None, *, step: int | None = None, overwrite: bool = False, storage: Storage = POSIX,
         **options) -> SaveResult:
    """Collectively write ``state`` as one complete, committed checkpoint directory at ``path``.

    ``state``: a dict, a Stateful object (``state_dict()``) or a callable
    returning the dict, read now (hpcckpt.stateful; nested dicts of Blocks are
    stored as ``"group/name"``).

    ``overwrite=True`` replaces an existing checkpoint there (it is deleted
    before the new one is written; use a Checkpointer to keep the old one until
    the new one is committed).  ``storage``: where the checkpoint lives
    (hpcckpt.storage: POSIX directories by default; a MemoryStorage holds it
    in this process).  Other options: see SaveOptions.

    A ``path`` named like a Checkpointer's version (``step-<12 digits>[.rN]``)
    is a version of that step (docs/format.md section 1): ``step`` must be that
    step, else the save is refused before anything is written.
    """
    from hpcckpt.saving.run import SaveRequest, Series, save_now

    comm = resolve_comm(comm)
    path = os.fspath(path)
    storage = storage_for(path, storage)
    # agreed before anything is removed: an invalid option on one rank fails every rank alike (one allgather);
    # options valid but different between ranks are caught by the plan stage's digest (hpcckpt/mpi/agreement.py)
    opts = agree(comm, f"save of {path!r}", lambda: _save_options(path, step, options))
    agree(comm, f"save of {path!r}", lambda: on_root(comm, lambda: _clear_target(path, overwrite, storage)))
    return save_now(comm, Series(storage=storage), SaveRequest(state, step, opts, directory=path))[0]


def _save_options(path: str, step: int | None, options: dict):
    """The SaveOptions of ``options``; CheckpointError for invalid ones, or when ``path``'s name is a version name
    of another step than ``step`` (a reader would refuse that version: docs/format.md section 1)."""
    from hpcckpt.options import SaveOptions

    named = parse_version_name(os.path.basename(os.path.normpath(path)))
    if named is not None and step != named.step:
        raise CheckpointError(f"{path!r} is named for step {named.step}: pass step={named.step} (a directory with "
                              f"that name holds that step; got step={step})")
    return SaveOptions.from_kwargs(**options)


def _clear_target(path: str, overwrite: bool, storage: Storage) -> None:
    """Make ``path`` absent: remove an interrupted save, or an old checkpoint with overwrite; never user files."""
    if not storage.exists(path):
        return
    try:
        entries = set(storage.listdir(path))
    except (NotADirectoryError, FileNotFoundError):  # a file, or a link to nothing
        raise CheckpointError(f"{path!r} exists and is not a directory") from None
    committed = METADATA_FILE in entries
    if committed and not overwrite:
        raise CheckpointError(f"{path!r} already holds a checkpoint; pass overwrite=True to replace it")
    foreign = {e for e in entries if e != DATA_DIR and not e.startswith(METADATA_FILE)}
    if foreign:
        raise CheckpointError(f"{path!r} exists and holds files that are not hpcckpt's ({sorted(foreign)[:3]})")
    if committed:
        storage.remove(os.path.join(path, METADATA_FILE))  # uncommit first: a crash now leaves a partial, not a mix
    storage.remove(path)


def load(state, path, comm=None, *, strict: bool | str = True, storage: Storage = POSIX, cast: bool = False) -> dict:
    """Collectively fill the Blocks of ``state`` in place from the checkpoint at ``path``.

    Works whatever decomposition and number of ranks the data was saved with.
    Returns the state with Ragged rows and replicated values restored (nested
    as the template is; a Stateful template gets ``load_state_dict`` with it).
    ``strict=False`` allows the checkpoint to hold variables the template omits
    (they are skipped); ``strict="rest"`` returns them too, as ``state=None``
    gives them.  ``state=None``: no template; every variable is returned by
    its stored name, a Block variable as this rank's even share of the first
    axis, Ragged rows split as by ``Ragged()`` (docs/api.md).
    ``cast=True`` fills a Block or Ragged whose dtype differs from the stored
    one by numpy same_kind casting (hpcckpt.loading.load.cast_allowed: e.g. float64
    into float32, int64 into int32; never float to int or complex to real).
    A plain HDF5 file as ``path`` fills the template from its datasets and root
    attributes of the same names (docs/hdf5.md).
    """
    path = os.fspath(path)
    storage = storage_for(path, storage)
    if storage is POSIX and os.path.isfile(path):  # checkpoints are directories: a file is HDF5 from elsewhere
        from hpcckpt.hdf5 import load_hdf5

        if state is None or strict == "rest":
            raise CheckpointError(f"{path!r} is an HDF5 file: loading it needs a template that names what to read "
                                  "(no state=None or strict='rest')")

        return load_hdf5(state, path, resolve_comm(comm), strict=strict, cast=cast)
    return load_version(state, path, resolve_comm(comm), strict=strict, storage=storage, cast=cast,
                        shared_directory=True)


def open(path, storage: Storage = POSIX) -> CheckpointView:  # noqa: A001 - the public name
    """A read-only view of the checkpoint at ``path`` for one plain Python process (no MPI needed).

    ``path``: a version directory, its ``metadata.json``, or a Checkpointer
    root (its newest committed version is opened, as the CLI does).
    ``view["u"]`` is a lazy array (hpcckpt.loading.view.VariableView).
    """
    from hpcckpt.root.catalog import list_versions, resolve_version
    from hpcckpt.loading.view import CheckpointView

    path = os.fspath(path)
    storage = storage_for(path, storage)
    if isinstance(storage, PosixStorage):
        if os.path.basename(path) == METADATA_FILE and os.path.isfile(path):
            path = os.path.dirname(path) or "."
        path, entry = resolve_version(path)
        if entry is None and not os.path.isfile(os.path.join(path, METADATA_FILE)) and list_versions(path):
            raise CheckpointError(f"{path} is a checkpoint root with no committed version yet")
    return CheckpointView(path, storage)
