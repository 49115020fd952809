"""Bandwidth measured by earlier saves under a Checkpointer root (``ROOT/.hpcckpt-io.json``).

Read by ``strategy="auto"``; recorded by rank 0 after each such save.  While a
Checkpointer holds its root the measurements are kept in this process's memory
and the file is rewritten at most every WRITE_SECONDS, and at close (a code
saving small states every second does not pay a write per save).  The file is
advisory: a missing, malformed or unreadable file (a FIFO or a directory in its
place included: it is opened without blocking) is treated as empty, and a
failed write is one warning on rank 0, never an error (``collective.best_effort``).
The file is read and written through the root's Storage (POSIX by default).
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field

from hpcckpt.mpi.collective import best_effort
from hpcckpt.errors import CheckpointError
from hpcckpt.storage import POSIX, Storage

FILE_NAME = ".hpcckpt-io.json"
KEEP = 50
#: Seconds between two writes of the file by one process (the measurements in between wait in memory).
WRITE_SECONDS = 30.0


@dataclass
class Held:
    """A root's measurements as this process knows them (the file's, then its own), when it last wrote, and the
    storage the root lives in."""

    rows: list
    written: float
    unwritten: bool = False
    storage: Storage = field(default=POSIX, repr=False)


#: root -> its measurements, from the first record until flush(forget=True) (Checkpointer.close).
_HELD: dict[str, Held] = {}


def read(root: str | None, storage: Storage = POSIX) -> list[dict]:
    """The measurements recorded under ``root``: this process's own when it holds some, else the file's."""
    if root is None:
        return []
    held = _HELD.get(root)
    return list(held.rows) if held is not None else read_file(root, storage)


def read_file(root: str, storage: Storage = POSIX) -> list[dict]:
    """The measurements in ``root``'s file in ``storage`` (none when it is missing or not valid)."""
    try:
        doc = json.loads(storage.read_file(os.path.join(root, FILE_NAME), 1 << 20))
        rows = doc["saves"]
    except (OSError, CheckpointError, ValueError, KeyError, TypeError, RecursionError):
        return []
    return [r for r in rows if isinstance(r, dict) and _valid(r)] if isinstance(rows, list) else []


def _valid(row: dict) -> bool:
    return (isinstance(row.get("strategy"), str) and type(row.get("nranks")) is int
            and all(isinstance(row.get(k), (int, float)) and math.isfinite(row[k]) and row[k] >= 0
                    for k in ("bytes_per_rank", "gbps")))


def record(root: str | None, strategy: str, nranks: int, total_bytes: int, seconds: float,
           storage: Storage = POSIX) -> None:
    """Append one measurement; the file (in ``storage``) is rewritten when WRITE_SECONDS have passed since this
    process last wrote it (at once the first time)."""
    if root is None or seconds <= 0 or total_bytes <= 0:
        return
    held = _HELD.get(root)
    if held is None:
        held = _HELD[root] = Held(read_file(root, storage), -math.inf, storage=storage)
    row = {"strategy": strategy, "nranks": nranks, "bytes_per_rank": total_bytes / nranks,
           "gbps": total_bytes / seconds / 1e9}
    held.rows = held.rows[-(KEEP - 1):] + [row]
    held.unwritten = True
    if time.monotonic() - held.written >= WRITE_SECONDS:
        flush(root)


def flush(root: str, forget: bool = False) -> None:
    """Write the measurements not yet in ``root``'s file (best effort: an unwritable root only loses them, with
    a warning); ``forget``: then drop them from memory (the Checkpointer lets the root go)."""
    held = _HELD.pop(root, None) if forget else _HELD.get(root)
    if held is None or not held.unwritten:
        return
    held.written, held.unwritten = time.monotonic(), False
    best_effort(f"recording the bandwidth of a save in {os.path.join(root, FILE_NAME)}",
                lambda: held.storage.atomic_write(os.path.join(root, FILE_NAME),
                                                  json.dumps({"saves": held.rows}).encode(), fsync=False))
