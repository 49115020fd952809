"""hpcckpt: parallelism-agnostic checkpoint/restart for MPI codes written in Python.

Public names only; see README.md and docs/ for the guide and the on-disk format.
"""

from hpcckpt import codecs  # hpcckpt.codecs.Lossy(...)
from hpcckpt.api import load, open, save
from hpcckpt.errors import CheckpointError, CorruptCheckpointError, TemplateMismatchError
from hpcckpt.state import Block, PerRank, Ragged
from hpcckpt.core.log import configure_from_env as _configure_logging

__version__ = "0.1.0"

_configure_logging()

#: Public names imported on first use (PEP 562): a restart that only loads does not import the save side,
#: the Checkpointer, the policies and the adapters (about half of the package; bench/latency.py, "restart").
_LAZY = {"Checkpointer": ("checkpointer", "Checkpointer"), "SaveResult": ("options", "SaveResult"),
         "policy": ("policy", None), "adapters": ("adapters", None), "report_errors": ("mpi.report", "report_errors"),
         "redistribute": ("loading.redistribution", "redistribute")}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'hpcckpt' has no attribute {name!r}")
    from importlib import import_module

    module, attr = _LAZY[name]
    found = import_module(f".{module}", __name__)
    value = found if attr is None else getattr(found, attr)
    globals()[name] = value  # later lookups are plain attribute reads
    return value


#: Short module names that scripts may import (``hpcckpt.catalog``), and the modules in the package's wings they
#: stand for.
_MOVED = {"catalog": "root.catalog", "collective": "mpi.collective", "regions": "core.regions",
          "report": "mpi.report", "halt": "root.halt", "rootlock": "root.lock", "metadata": "format.metadata",
          "names": "core.names", "redistribution": "loading.redistribution", "view": "loading.view"}


class _MovedModules:
    """Import finder: ``import hpcckpt.catalog`` gives the module ``hpcckpt.root.catalog`` (the same
    module object, so both names see one state)."""

    @staticmethod
    def find_spec(fullname, path=None, target=None):
        prefix, _, old = fullname.partition(".")
        if prefix != __name__ or old not in _MOVED:
            return None
        from importlib.util import spec_from_loader

        return spec_from_loader(fullname, _MovedModules)

    @staticmethod
    def create_module(spec):
        from importlib import import_module

        return import_module(f"{__name__}.{_MOVED[spec.name.partition('.')[2]]}")

    @staticmethod
    def exec_module(module):
        """The module is the moved one, already executed."""


import sys as _sys  # noqa: E402 - the finder is installed once the package itself is imported

_sys.meta_path.insert(0, _MovedModules)


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


__all__ = ["Block", "Ragged", "PerRank", "save", "load", "open", "Checkpointer", "SaveResult", "CheckpointError",
           "CorruptCheckpointError", "TemplateMismatchError", "adapters", "redistribute", "report_errors", "codecs",
           "policy", "__version__"]
