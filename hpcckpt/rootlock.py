"""The writer lock of a Checkpointer root: one job writes a root at a time.

Why: two jobs saving into one root at once (a user resubmitting while the old
job still runs) pick the same version names and clear each other's "leftovers",
so committed versions end up with missing or foreign data files.

The lock is the file ``ROOT/.hpcckpt-lock`` (not a version name: listing and gc
never see it), created by rank 0 with ``O_CREAT | O_EXCL`` at the first save
and removed by ``close()`` (or at interpreter exit).  Its body is JSON::

    {"format": "hpcckpt-lock", "version": 1, "hostname": "node017", "pid": 4242,
     "slurm_job_id": "123" or null, "slurm_restart_count": 0 or null, "start": 1700000000.0}

Where the file system supports it, the holder also keeps an exclusive
``flock`` on the file, which the kernel drops when the process dies.

A lock that exists is *stale*, and is taken over with a warning, when
(:func:`stale_reason`):

* it names an earlier attempt of this SLURM job (same job id, smaller restart
  count: SLURM requeues a job only after the previous attempt ended), or
* it was taken on this host and its process is gone, or its ``flock`` is free
  (the process ended and its pid was reused), or
* it was taken by this very process (a Checkpointer that was never closed).

Any other lock (another host, a live process) makes the save fail with a
CheckpointError naming the holder.  When that job is known to be gone (a crash
on another node), pass ``break_lock=True`` to the Checkpointer, call
:func:`break_lock`, or delete the file.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
import warnings
from dataclasses import dataclass
from typing import Callable

from .errors import CheckpointError
from .humanize import format_time
from .storage.posix import read_bounded

LOCK_FILE = ".hpcckpt-lock"
_FORMAT = "hpcckpt-lock"
_MAX_BYTES = 1 << 16
_ATTEMPTS = 5


@dataclass
class RootLock:
    """Rank 0's hold on a root: the open lock file (keeping the flock) and the body it wrote."""

    path: str
    fd: int
    body: bytes


def this_process() -> dict:
    """The lock body that names the calling process (and its SLURM job, if any)."""
    rc = os.environ.get("SLURM_RESTART_COUNT")
    return {"format": _FORMAT, "version": 1, "hostname": socket.gethostname(), "pid": os.getpid(),
            "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
            "slurm_restart_count": int(rc) if rc is not None and rc.isdigit() else None, "start": time.time()}


def stale_reason(holder: dict, me: dict, pid_alive: Callable[[int], bool], flock_free: bool) -> str | None:
    """Why the lock ``holder`` may be taken over by ``me`` (see the module docstring), or None when it may not.

    Pure: the caller says whether a pid is alive on this host and whether the
    lock file's flock could be taken.
    """
    job, rc = holder.get("slurm_job_id"), holder.get("slurm_restart_count")
    if (job is not None and job == me.get("slurm_job_id") and type(rc) is int
            and type(me.get("slurm_restart_count")) is int and rc < me["slurm_restart_count"]):
        return f"it was taken by restart {rc} of this SLURM job ({job}), which has ended"
    pid = holder.get("pid")
    if holder.get("hostname") != me.get("hostname") or type(pid) is not int or pid <= 0:
        return None
    if pid == me.get("pid"):
        return "this process took it through a Checkpointer that was not closed"
    if not pid_alive(pid):
        return f"process {pid} on this host, which took it, is gone"
    if flock_free:
        return f"process {pid} on this host no longer holds it (the pid was reused)"
    return None


def describe(holder: dict) -> str:
    """A human description of a lock's holder, for messages."""
    if not holder:
        return "an unknown process (the lock file is empty or unreadable)"
    job = f", SLURM job {holder['slurm_job_id']}" if holder.get("slurm_job_id") else ""
    start = holder.get("start")
    since = f" since {format_time(start)}" if isinstance(start, (int, float)) else ""
    return f"pid {holder.get('pid')} on host {holder.get('hostname')}{job}{since}"


def acquire(root: str, force: bool = False) -> RootLock:
    """Take the writer lock of ``root`` (rank 0, at the first save); CheckpointError if another job holds it.

    ``force``: take over any lock (the user knows its holder is gone).  An
    unwritable root (read-only mount, no permission) is a CheckpointError
    that says so.
    """
    path = os.path.join(root, LOCK_FILE)
    me = this_process()
    for attempt in range(_ATTEMPTS):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except FileExistsError:
            raw, holder = _read_holder(path)
            if raw is None:
                continue  # released meanwhile: try again
            why = stale_reason(holder, me, _pid_alive, _flock_free(path)) or (
                "break_lock=True was given" if force else None)
            if why is None:
                if not holder and attempt < _ATTEMPTS - 1:
                    time.sleep(0.05 * (attempt + 1))  # maybe being written right now
                    continue
                raise CheckpointError(
                    f"{root!r} is being written by another job: {describe(holder)} holds {path}. Two jobs saving "
                    "into one root would damage each other's versions; if that job is gone, delete the file or "
                    "pass break_lock=True") from None
            warnings.warn(f"hpcckpt: taking over the lock {path} of {describe(holder)}: {why}", RuntimeWarning,
                          stacklevel=3)
            _remove_if_unchanged(path, raw)
            continue
        except OSError as exc:
            raise CheckpointError(f"cannot save under {root!r}: the lock {LOCK_FILE} cannot be created there "
                                  f"({exc.strerror}; a read-only or non-writable root can only be restored from)"
                                  ) from None
        return _fill(path, fd, me)
    raise CheckpointError(f"cannot take the lock {path}: other processes keep taking it at the same time")


def release(lock: RootLock | None) -> None:
    """Drop the lock: remove the file if it is still ours (not taken over meanwhile), close it."""
    if lock is None or lock.fd < 0:
        return
    try:
        if os.stat(lock.path).st_ino == os.fstat(lock.fd).st_ino:
            os.unlink(lock.path)
    except OSError:
        pass  # gone already, or the root went away: nothing left to release
    finally:
        os.close(lock.fd)
        lock.fd = -1


def break_lock(root: str) -> dict | None:
    """Remove the lock of ``root`` whoever holds it (the holder is known to be gone); the holder's body, or None."""
    path = os.path.join(os.fspath(root), LOCK_FILE)
    raw, holder = _read_holder(path)
    if raw is None:
        return None
    _remove_if_unchanged(path, raw)
    return holder


def _fill(path: str, fd: int, me: dict) -> RootLock:
    """Write the body into the new lock file (after taking its flock, so a reader never sees a free flock)."""
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            pass  # a file system without flock: the O_EXCL file alone is the lock
        body = json.dumps(me).encode()
        os.write(fd, body)
        os.fsync(fd)
    except OSError as exc:
        os.close(fd)
        try:
            os.unlink(path)
        except OSError:
            pass
        raise CheckpointError(f"cannot write the lock {path}: {exc.strerror}") from None
    return RootLock(path, fd, body)


def _read_holder(path: str) -> tuple[bytes | None, dict]:
    """(raw body or None when the file is gone, parsed body or {} when malformed)."""
    try:
        raw = read_bounded(path, _MAX_BYTES)
    except FileNotFoundError:
        return None, {}
    except CheckpointError:
        return b"", {}
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        return raw, {}
    return raw, doc if isinstance(doc, dict) and doc.get("format") == _FORMAT else {}


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def _flock_free(path: str) -> bool:
    """Whether nobody holds the flock of the lock file (False where flock is not supported or the file is gone)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


def _remove_if_unchanged(path: str, raw: bytes) -> None:
    """Remove the stale lock ``path`` unless it changed since it was read as ``raw`` (another taker won)."""
    aside = f"{path}.stale-{socket.gethostname()}-{os.getpid()}"
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return  # another taker removed it first
    try:
        same = read_bounded(aside, _MAX_BYTES) == raw
    except (OSError, CheckpointError):
        same = False
    if not same:  # a fresh lock: put it back (unless yet another one appeared meanwhile)
        try:
            os.link(aside, path)
        except OSError as exc:
            if exc.errno != errno.EEXIST:
                raise
    os.unlink(aside)
