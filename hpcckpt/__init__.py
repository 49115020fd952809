"""hpcckpt: parallelism-agnostic checkpoint/restart for MPI codes written in Python.

Public names only; see README.md and docs/ for the guide and the on-disk format.
"""

from . import adapters, codecs, policy  # hpcckpt.adapters.block(u), hpcckpt.codecs.Lossy(...), hpcckpt.policy.daly(...)
from .api import load, open, save
from .checkpointer import Checkpointer
from .errors import CheckpointError, CorruptCheckpointError, TemplateMismatchError
from .options import SaveResult
from .redistribution import redistribute
from .state import Block, PerRank, Ragged
from .log import configure_from_env as _configure_logging

__version__ = "0.1.0"

_configure_logging()

__all__ = ["Block", "Ragged", "PerRank", "save", "load", "open", "Checkpointer", "SaveResult", "CheckpointError",
           "CorruptCheckpointError", "TemplateMismatchError", "redistribute", "adapters", "codecs", "policy",
           "__version__"]
