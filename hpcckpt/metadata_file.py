"""Reading a version's ``metadata.json`` from disk: safely (a regular file, bounded), then checked and validated.

The one place every reader (load, ``hpcckpt.open``, the CLI, incremental
bases, compaction, level restores) gets a version's metadata from, so that the
rules of docs/format.md section 6, check 0, are applied once.
"""

from __future__ import annotations

import os

from .errors import CheckpointError
from .metadata import MAX_METADATA_BYTES, Metadata, parse
from .names import METADATA_FILE
from .storage import POSIX, Storage


def read_metadata(directory: str, storage: Storage = POSIX) -> Metadata:
    """Read, check and validate ``directory/metadata.json``; CheckpointError if there is no committed version."""
    path = os.path.join(directory, METADATA_FILE)
    return parse(read_metadata_bytes(directory, storage), source=path)


def read_metadata_bytes(directory: str, storage: Storage = POSIX) -> bytes:
    """The raw bytes of ``directory/metadata.json``, read safely (a regular file, at most MAX_METADATA_BYTES).

    Not yet checked: :func:`hpcckpt.metadata.parse` checks its seal.
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
