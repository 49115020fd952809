"""Bandwidth measured by earlier saves under a Checkpointer root (``ROOT/.hpcckpt-io.json``).

Read by ``strategy="auto"``; written by rank 0 after each save.  The file is
advisory: a missing, malformed or unreadable file (a FIFO or a directory in its
place included: it is opened without blocking) is treated as empty, and a
failed write is one warning on rank 0, never an error (``collective.best_effort``).
"""

from __future__ import annotations

import json
import math
import os

from ..collective import best_effort
from ..errors import CheckpointError
from ..storage.posix import atomic_write, read_bounded

FILE_NAME = ".hpcckpt-io.json"
KEEP = 50


def read(root: str | None) -> list[dict]:
    if root is None:
        return []
    try:
        doc = json.loads(read_bounded(os.path.join(root, FILE_NAME), 1 << 20))
        rows = doc["saves"]
    except (OSError, CheckpointError, ValueError, KeyError, TypeError, RecursionError):
        return []
    return [r for r in rows if isinstance(r, dict) and _valid(r)] if isinstance(rows, list) else []


def _valid(row: dict) -> bool:
    return (isinstance(row.get("strategy"), str) and type(row.get("nranks")) is int
            and all(isinstance(row.get(k), (int, float)) and math.isfinite(row[k]) and row[k] >= 0
                    for k in ("bytes_per_rank", "gbps")))


def record(root: str | None, strategy: str, nranks: int, total_bytes: int, seconds: float) -> None:
    """Append one measurement (best effort: an unwritable root only loses the measurement, with a warning)."""
    if root is None or seconds <= 0 or total_bytes <= 0:
        return
    rows = read(root)[-(KEEP - 1):]
    rows.append({"strategy": strategy, "nranks": nranks, "bytes_per_rank": total_bytes / nranks,
                 "gbps": total_bytes / seconds / 1e9})
    best_effort(f"recording the bandwidth of a save in {os.path.join(root, FILE_NAME)}",
                lambda: atomic_write(os.path.join(root, FILE_NAME), json.dumps({"saves": rows}).encode(), fsync=False))
