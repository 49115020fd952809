"""hpcckpt's logger: silent by default, switched on by the application or the environment.

``logging.getLogger("hpcckpt").setLevel(logging.INFO)`` (with a handler) or
``HPCCKPT_LOG_LEVEL=INFO`` in the environment: rank 0 then logs one line per
save and load with bytes, seconds, bandwidth, strategy and the slowest rank.
"""

from __future__ import annotations

import os
import sys


class _Logger:
    """The ``logging.getLogger("hpcckpt")`` logger, made on first use that can reach a handler.

    ``import logging`` is not part of a fresh process's ``import hpcckpt`` (a
    restart that loads once; bench/latency.py, "restart").  Until the
    application has imported logging (which it needs to give any logger a
    handler or a level) or set HPCCKPT_LOG_LEVEL, a record of hpcckpt's could
    reach no handler: the logger has a NullHandler, so not even logging's
    last-resort handler prints it.  Such records are dropped without importing
    logging; from then on every call is the real logger's.
    """

    _METHODS = frozenset({"debug", "info", "warning", "error", "exception", "critical", "log"})

    def __getattr__(self, name: str):
        if name in self._METHODS and "logging" not in sys.modules:
            return _drop
        return getattr(real_logger(), name)


def _drop(*args, **kwargs) -> None:
    """A record that no handler could receive (see _Logger)."""


def real_logger():
    """The "hpcckpt" logger of the logging module, with its NullHandler (added once)."""
    import logging

    found = logging.getLogger("hpcckpt")
    if not any(isinstance(h, logging.NullHandler) for h in found.handlers):
        found.addHandler(logging.NullHandler())
    return found


logger = _Logger()


def configure_from_env() -> None:
    """Honour HPCCKPT_LOG_LEVEL (a level name such as INFO or DEBUG) with a stderr handler."""
    level = os.environ.get("HPCCKPT_LOG_LEVEL", "").strip().upper()
    if not level:
        return
    import logging

    if not isinstance(logging.getLevelName(level), int):
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("hpcckpt %(levelname)s: %(message)s"))
    found = real_logger()
    found.addHandler(handler)
    found.setLevel(level)
