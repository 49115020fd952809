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
any, is the reason shown to the user.
"""

from __future__ import annotations

import os

from hpcckpt.errors import CheckpointError
from hpcckpt.storage.opening import open_regular
from hpcckpt.storage.posix import atomic_write

HALT_NAME = ".hpcckpt-halt"
#: The longest reason carried to the ranks and printed.
MAX_REASON = 200


def halt_path(root: str) -> str:
    return os.path.join(os.fspath(root), HALT_NAME)


def requested(root: str) -> str | None:
    """The reason of a halt request under ``root`` ('' when it gives none), or None when there is none."""
    path = halt_path(root)
    if not os.path.lexists(path):
        return None
    try:
        fd = open_regular(path)  # a FIFO or device there is still a request, and must not block the decision
    except (OSError, CheckpointError):  # unreadable, a directory, a FIFO: its presence is what counts
        return ""
    try:
        head = os.read(fd, 4 * MAX_REASON)
    except OSError:
        return ""
    finally:
        os.close(fd)
    first = head.decode("utf-8", errors="replace").split("\n", 1)[0]
    return first.strip()[:MAX_REASON]


def request(root: str, reason: str = "") -> str:
    """Write the halt file under the existing directory ``root`` (atomically); returns its path."""
    root = os.fspath(root)
    if not os.path.isdir(root):
        raise FileNotFoundError(2, "no such checkpoint root", root)
    path = halt_path(root)
    atomic_write(path, (" ".join(reason.split()) + "\n").encode(), fsync=False)
    return path


def withdraw(root: str) -> bool:
    """Remove the halt file under ``root``; whether there was one."""
    try:
        os.remove(halt_path(root))
    except FileNotFoundError:
        return False
    return True
