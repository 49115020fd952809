"""The exceptions hpcckpt raises on purpose.

Every error the library raises deliberately is a ``CheckpointError`` so that an
application can catch one type; the subclasses let callers (and ``restore``)
tell a damaged checkpoint from a template that does not fit it.
"""


class CheckpointError(Exception):
    """Base class of every error hpcckpt raises on purpose."""


class CorruptCheckpointError(CheckpointError):
    """The data or metadata on disk is truncated, malformed or fails its checksum."""


class TemplateMismatchError(CheckpointError):
    """The state template given to load/restore does not fit the checkpoint."""

