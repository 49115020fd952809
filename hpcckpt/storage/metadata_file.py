"""Reading a version's ``metadata.json`` from disk: safely (a regular file, bounded), then checked and validated.

The one place every reader (load, ``hpcckpt.open``, the CLI, incremental
bases, compaction, level restores) gets a version's metadata from, so that the
rules of docs/format.md section 6, check 0, are applied once, and so is the
rule of section 1 that a directory named for a step holds that step, however
it is reached (through its root or opened by its own path).
"""

from __future__ import annotations

import os

from hpcckpt.errors import CheckpointError, CorruptCheckpointError
from hpcckpt.format.metadata import MAX_METADATA_BYTES, Metadata, parse
from hpcckpt.core.names import METADATA_FILE, parse_version_name
from hpcckpt.storage import POSIX, PosixStorage, Storage


def read_metadata(directory: str, storage: Storage = POSIX) -> Metadata:
    """Read, check and validate ``directory/metadata.json``; CheckpointError if there is no committed version."""
    path = os.path.join(directory, METADATA_FILE)
    return check_named_step(directory, parse(read_metadata_bytes(directory, storage), source=path), storage)


def read_metadata_reused(directory: str, storage: Storage = POSIX) -> Metadata:
    """:func:`read_metadata` for the collective load: the bytes are read and compared every time, the parse
    and validation are skipped when they are the bytes of one of the last few versions this process parsed.

    A committed version is immutable, and equal bytes parse to equal Metadata, so this changes no answer; it
    takes the parse off every repeated load of a small version.  Only metadata of
    at most REUSE_MAX_BYTES is kept (REUSE_ENTRIES of them).  The Metadata returned is shared between the
    loads that get it: the load path only reads it (chain compaction, which rewrites one, uses
    :func:`read_metadata`).
    """
    data = read_metadata_bytes(directory, storage)
    meta = _PARSED.get(data)
    if meta is None:
        meta = parse(data, source=os.path.join(directory, METADATA_FILE))
        if len(data) <= REUSE_MAX_BYTES:
            if len(_PARSED) >= REUSE_ENTRIES:
                del _PARSED[next(iter(_PARSED))]  # the oldest
            _PARSED[data] = meta
    return check_named_step(directory, meta, storage)


REUSE_MAX_BYTES = 1 << 20
REUSE_ENTRIES = 8
_PARSED: dict[bytes, Metadata] = {}  # metadata bytes -> their Metadata (read_metadata_reused)


def read_metadata_bytes(directory: str, storage: Storage = POSIX) -> bytes:
    """The raw bytes of ``directory/metadata.json``, read safely (a regular file, at most MAX_METADATA_BYTES).

    Not yet checked: :func:`hpcckpt.format.metadata.parse` checks its seal.
    """
    path = os.path.join(directory, METADATA_FILE)
    try:
        return storage.read_file(path, MAX_METADATA_BYTES)
    except FileNotFoundError:
        try:
            storage.listdir(directory)
        except NotADirectoryError:
            raise CheckpointError(f"{directory!r} is not a checkpoint directory") from None
        except OSError:
            pass
        raise CheckpointError(f"no committed checkpoint at {directory!r} ({METADATA_FILE} is missing)") from None


def check_named_step(directory: str, meta: Metadata, storage: Storage = POSIX) -> Metadata:
    """``meta``, read from ``directory``, when the step its name claims is the metadata's (docs/format.md 1).

    The names: the last component of ``directory`` as given and, on POSIX,
    of its real path (symbolic links resolved); each that is a version name
    (``step-<12 digits>[.rN]``) must name ``meta.step``.  Any other name
    claims nothing.  CorruptCheckpointError otherwise: a version copied or
    renamed under another step's name is damaged whether its root lists it
    or a caller opens it directly.
    """
    names = {os.path.basename(os.path.normpath(directory))}
    if isinstance(storage, PosixStorage):
        names.add(os.path.basename(os.path.realpath(directory)))
    for name in sorted(names):
        parsed = parse_version_name(name)
        if parsed is not None:
            check_step(directory, meta, parsed.step)
    return meta


def check_step(directory: str, meta: Metadata, step: int) -> None:
    """CorruptCheckpointError unless the metadata read from ``directory`` holds ``step``."""
    if meta.step != step:
        raise CorruptCheckpointError(f"{directory!r} is named for step {step} but its metadata holds step {meta.step}")
