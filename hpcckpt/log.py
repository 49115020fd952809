"""hpcckpt's logger: silent by default, switched on by the application or the environment.

``logging.getLogger("hpcckpt").setLevel(logging.INFO)`` (with a handler) or
``HPCCKPT_LOG_LEVEL=INFO`` in the environment: rank 0 then logs one line per
save and load with bytes, seconds, bandwidth, strategy and the slowest rank.
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger("hpcckpt")
logger.addHandler(logging.NullHandler())


def configure_from_env() -> None:
    """Honour HPCCKPT_LOG_LEVEL (a level name such as INFO or DEBUG) with a stderr handler."""
    level = os.environ.get("HPCCKPT_LOG_LEVEL", "").strip().upper()
    if not level or not isinstance(logging.getLevelName(level), int):
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("hpcckpt %(levelname)s: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(level)
