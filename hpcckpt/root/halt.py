"""The halt file ``ROOT/.hpcckpt-halt``: ask a running job to checkpoint and exit, without signals.

Why: a signal needs the job's processes (or the batch system) at hand; a file
needs only the shared file system.  SCR's "halt file" idea: ``hpcckpt halt
ROOT --reason TEXT`` writes it, and the job writing ``ROOT`` sees it at its
next ``maybe_save``/``should_save`` decision (rank 0 looks: one ``stat``, its
answer rides on the decision's allreduce), saves a final checkpoint, and
``should_exit()`` turns True on every rank.  The job removes the file when it
closes after honouring it, so the next run of the same command continues;
a job that dies before that leaves it in place and its rerun halts again.

Any file at that path asks for a halt (``touch`` works); its first line, if
any, is the reason shown to the user.  The file is reached through the
root's Storage (POSIX by default).
"""

from __future__ import annotations

import os

from hpcckpt.errors import CheckpointError
from hpcckpt.storage import POSIX, Storage

HALT_NAME = ".hpcckpt-halt"
#: The longest reason carried to the ranks and printed.
MAX_REASON = 200


def halt_path(root: str) -> str:
    return os.path.join(os.fspath(root), HALT_NAME)


def requested(root: str, storage: Storage = POSIX) -> str | None:
    """The reason of a halt request under ``root`` ('' when it gives none), or None when there is none."""
    path = halt_path(root)
    if not storage.exists(path):
        return None
    try:  # never blocks: a FIFO or device there is still a request, and must not hold up the decision
        head = storage.read_head(path, 4 * MAX_REASON)
    except (OSError, CheckpointError):  # unreadable, a directory, a FIFO: its presence is what counts
        return ""
    first = head.decode("utf-8", errors="replace").split("\n", 1)[0]
    return first.strip()[:MAX_REASON]


def request(root: str, reason: str = "", storage: Storage = POSIX) -> str:
    """Write the halt file under the existing directory ``root`` (atomically); returns its path."""
    root = os.fspath(root)
    if not storage.is_directory(root):
        raise FileNotFoundError(2, "no such checkpoint root", root)
    path = halt_path(root)
    storage.atomic_write(path, (" ".join(reason.split()) + "\n").encode(), fsync=False)
    return path


def withdraw(root: str, storage: Storage = POSIX) -> bool:
    """Remove the halt file under ``root``; whether there was one."""
    try:
        storage.remove_file(halt_path(root))
    except FileNotFoundError:
        return False
    return True
