"""hpcckpt: parallelism-agnostic checkpoint/restart for MPI codes written in Python.

Public names only; see README.md and docs/ for the guide and the on-disk format.
"""

from . import codecs  # hpcckpt.codecs.Lossy(...)
from .api import load, open, save
from .errors import CheckpointError, CorruptCheckpointError, TemplateMismatchError
from .state import Block, PerRank, Ragged
from .log import configure_from_env as _configure_logging

__version__ = "0.1.0"

_configure_logging()

#: Public names imported on first use (PEP 562): a restart that only loads does not import the save side,
#: the Checkpointer, the policies and the adapters (about half of the package; bench/latency.py, "restart").
_LAZY = {"Checkpointer": ("checkpointer", "Checkpointer"), "SaveResult": ("options", "SaveResult"),
         "policy": ("policy", None), "adapters": ("adapters", None), "report_errors": ("report", "report_errors"),
         "redistribute": ("redistribution", "redistribute")}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'hpcckpt' has no attribute {name!r}")
    from importlib import import_module

    module, attr = _LAZY[name]
    found = import_module(f".{module}", __name__)
    value = found if attr is None else getattr(found, attr)
    globals()[name] = value  # later lookups are plain attribute reads
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


__all__ = ["Block", "Ragged", "PerRank", "save", "load", "open", "Checkpointer", "SaveResult", "CheckpointError",
           "CorruptCheckpointError", "TemplateMismatchError", "adapters", "redistribute", "report_errors", "codecs",
           "policy", "__version__"]
