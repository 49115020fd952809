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
``flock`` on the file, which the kernel drops when the process dies.  That is
the one POSIX-only part: every other access goes through the root's Storage
(POSIX by default); on another Storage the exclusively created file alone is
the lock, and a holder on this host is judged by its pid only.

On a Storage with conditional writes (``Storage.conditional_writes``: an
object store) the lock is a *lease*: its body also holds ``"lease_seconds"``
and ``"expires"`` (the holder's clock, seconds since the epoch), and the holder
renews it (:func:`renew`, at each save once a quarter of the lease has passed)
by replacing the object only if it is still the one it wrote
(``Storage.write_if_unchanged``: ``If-Match`` its ETag).  A node that dies
stops renewing; once its lease has expired on the taker's clock, the lock is
stale.  The take-over of a lease is the same conditional replacement, so of
two takers exactly one gets it, and a holder whose lease was taken over learns
it at its next renewal (a CheckpointError: this job no longer writes the root).
A lease assumes the clocks of the holder and the taker differ by far less than
:data:`LEASE_SECONDS`, and a job must save at least once per lease (or set
``HPCCKPT_LOCK_LEASE`` to a longer one, in seconds).

A lock that exists is *stale*, and is taken over with a warning, when
(:func:`stale_reason`):

* it names an earlier attempt of this SLURM job (same job id, smaller restart
  count: SLURM requeues a job only after the previous attempt ended), or
* it was taken on this host and its process is gone, or its ``flock`` is free
  (the process ended and its pid was reused), or
* it was taken by this very process (a Checkpointer that was never closed), or
* it was taken on another host and its lease has expired.

Any other lock (another host, a live process) makes the save fail with a
CheckpointError naming the holder.  When that job is known to be gone (a crash
on another node), pass ``break_lock=True`` to the Checkpointer, call
:func:`break_lock`, or run ``hpcckpt unlock ROOT``.  None of these removes a
lock whose holder is *provably alive* (:func:`alive_here`: on this host, its
process running and its flock held) unless forced (``force=True``,
``hpcckpt unlock --force``): such a job may still be writing the root.

What lies at the lock path is untrusted.  Something hpcckpt cannot have
written there (a directory, a FIFO, a device, a symbolic link, a file over
64 KiB, a body that is not JSON or names no valid host and pid) names no
holder: a save refuses it with a CheckpointError saying what it is, and
``break_lock``/``hpcckpt unlock`` remove it (the link itself, never its target)
-- except a directory that is not empty, which may hold someone's data and is
only ever reported.  Removal moves the file aside first and removes it only if
it is still the object that was judged, so a fresh lock taken meanwhile by
another job is put back.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import time
from dataclasses import dataclass
from typing import Callable

from hpcckpt.core.warn import warn
from hpcckpt.errors import CheckpointError
from hpcckpt.core.humanize import format_time
from hpcckpt.storage import POSIX, PosixStorage, Storage
from hpcckpt.storage.base import DIRECTORY, FILE, LINK, Stat
from hpcckpt.storage.posix import flock_exclusive, flock_free

LOCK_FILE = ".hpcckpt-lock"
_FORMAT = "hpcckpt-lock"
_MAX_BYTES = 1 << 16
_ATTEMPTS = 5
#: The largest pid any process can have (pid_t is a 32-bit int): a larger one names no process.
_MAX_PID = (1 << 31) - 1
_MAX_NAME = 255  # a host name or SLURM job id longer than this is no real one
_EMPTY = "an empty file"
_NOT_JSON = "a file whose body is not JSON"
_FULL_DIR = "a directory that is not empty"
#: What a lock being written right now looks like for a moment (created, body not written yet).
_MAYBE_BEING_WRITTEN = (_EMPTY, _NOT_JSON)
#: How long a lease lasts without renewal, in seconds (HPCCKPT_LOCK_LEASE overrides it).
LEASE_SECONDS = 3600.0
#: A holder renews its lease at a save once this fraction of it has passed.
RENEW_AFTER = 0.25


def now() -> float:
    """The time leases are judged and written by (seconds since the epoch): :func:`acquire` and :func:`renew`
    read it unless given another clock."""
    return time.time()


def lease_seconds() -> float:
    """The lease of a lock taken now: HPCCKPT_LOCK_LEASE (seconds, positive) or LEASE_SECONDS."""
    text = os.environ.get("HPCCKPT_LOCK_LEASE")
    if text is None:
        return LEASE_SECONDS
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise CheckpointError(f"HPCCKPT_LOCK_LEASE must be a positive number of seconds, got {text!r}")
    return value


@dataclass
class RootLock:
    """Rank 0's hold on a root: the open lock file (a handle of ``storage.create``, keeping the flock on POSIX;
    None once released, and for a lease taken over) and the body it wrote; for a lease, the Stat of the lock
    object as this process last wrote it (``seen``: what a renewal and the release compare against) and
    ``released``."""

    path: str
    handle: object
    body: bytes
    storage: Storage = POSIX
    seen: Stat | None = None
    released: bool = False

    @property
    def holder(self) -> dict:
        return json.loads(self.body)


@dataclass(frozen=True)
class LockFile:
    """What lay at a root's lock path when it was looked at (:func:`_inspect`).

    ``identity``: ``(Stat.identity, kind, size)`` of the object itself (a
    link is not followed), which tells it from a lock created later at the
    same path.  ``raw``: the body of a regular file that could be read, else
    None.  ``holder``: the checked body of a valid lock, else ``{}``.
    ``problem``: why it is not a lock hpcckpt can have written (None for a
    valid one), e.g. "a FIFO".
    """

    path: str
    identity: tuple
    raw: bytes | None
    holder: dict
    problem: str | None
    storage: Storage = POSIX
    stat: Stat | None = None

    def describe(self) -> str:
        """Its holder, or why it has none, for messages."""
        return describe(self.holder) if self.problem is None else f"no job: it is {self.problem}"


def this_process(at: float | None = None, lease: float | None = None) -> dict:
    """The lock body that names the calling process (and its SLURM job, if any), taken at ``at`` (:func:`now`
    by default); with ``lease``, a lease of that many seconds from ``at``."""
    rc = os.environ.get("SLURM_RESTART_COUNT")
    at = now() if at is None else at
    body = {"format": _FORMAT, "version": 1, "hostname": socket.gethostname(), "pid": os.getpid(),
            "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
            "slurm_restart_count": int(rc) if rc is not None and rc.isdigit() else None, "start": at}
    if lease is not None:
        body.update(lease_seconds=lease, expires=at + lease)
    return body


def stale_reason(holder: dict, me: dict, pid_alive: Callable[[int], bool], flock_free: bool,
                 now: float | None = None) -> str | None:
    """Why the lock ``holder`` may be taken over by ``me`` (see the module docstring), or None when it may not.

    Pure: the caller says whether a pid is alive on this host, whether the
    lock file's flock could be taken and, for a lease, what time it is now
    (a lease is never judged without ``now``).  A holder on this host is
    judged by its process, whatever its lease says.
    """
    job, rc = holder.get("slurm_job_id"), holder.get("slurm_restart_count")
    if (job is not None and job == me.get("slurm_job_id") and type(rc) is int
            and type(me.get("slurm_restart_count")) is int and rc < me["slurm_restart_count"]):
        return f"it was taken by restart {rc} of this SLURM job ({job}), which has ended"
    pid = holder.get("pid")
    if holder.get("hostname") != me.get("hostname") or type(pid) is not int or pid <= 0:
        expires = holder.get("expires")
        if now is not None and type(expires) in (int, float) and expires < now:
            return (f"its lease expired at {format_time(expires)} and was not renewed (the job or its node is "
                    "gone)")
        return None
    if pid == me.get("pid"):
        return "this process took it through a Checkpointer that was not closed"
    if not pid_alive(pid):
        return f"process {pid} on this host, which took it, is gone"
    if flock_free:
        return f"process {pid} on this host no longer holds it (the pid was reused)"
    return None


def alive_here(holder: dict, me: dict, pid_alive: Callable[[int], bool], flock_free: bool) -> bool:
    """Whether the lock ``holder`` is provably held by a running process: one on ``me``'s host that is not stale.

    Such a holder may still be writing the root, so removing its lock needs
    force.  A holder on another host cannot be checked from here: only the
    user knows whether it is gone.  Pure, like :func:`stale_reason`.
    """
    return holder.get("hostname") == me.get("hostname") and stale_reason(holder, me, pid_alive, flock_free) is None


def check_holder(doc) -> tuple[dict, str | None]:
    """``(holder, None)`` for a parsed lock body naming a valid holder, else ``({}, why it names none)``.

    Pure.  The holder keeps only the fields a lock has, each of its type
    (others are dropped), so that messages and :func:`stale_reason` never see
    a foreign value: a deep structure, a pid no process can have (which
    ``os.kill`` cannot even take), a host name with control characters.
    """
    if not isinstance(doc, dict) or doc.get("format") != _FORMAT:
        return {}, f'a file that is not an hpcckpt lock (no "format": "{_FORMAT}")'
    host, pid = doc.get("hostname"), doc.get("pid")
    if not _is_name(host):
        return {}, "an hpcckpt lock without a valid host name"
    if type(pid) is not int or not 0 < pid <= _MAX_PID:
        return {}, f"an hpcckpt lock naming pid {_short(pid)}, which no process can have"
    job, rc, start, version = (doc.get(k) for k in ("slurm_job_id", "slurm_restart_count", "start", "version"))
    return {"format": _FORMAT, "version": version if type(version) is int else None, "hostname": host, "pid": pid,
            "slurm_job_id": job if _is_name(job) else None,
            "slurm_restart_count": rc if type(rc) is int and 0 <= rc <= _MAX_PID else None,
            "start": start if type(start) in (int, float) else None,
            "expires": _finite(doc.get("expires")), "lease_seconds": _finite(doc.get("lease_seconds"))}, None


def _finite(value) -> float | None:
    """``value`` when it is a finite number (a lease's time), else None."""
    return value if type(value) in (int, float) and abs(value) < float("inf") else None


def describe(holder: dict) -> str:
    """A human description of a lock's holder, for messages."""
    if not holder:
        return "an unknown process (the lock file is empty or unreadable)"
    job = f", SLURM job {holder['slurm_job_id']}" if holder.get("slurm_job_id") else ""
    start, expires = holder.get("start"), holder.get("expires")
    since = f" since {format_time(start)}" if isinstance(start, (int, float)) else ""
    lease = f", its lease until {format_time(expires)}" if isinstance(expires, (int, float)) else ""
    return f"pid {holder.get('pid')} on host {holder.get('hostname')}{job}{since}{lease}"


def acquire(root: str, force: bool = False, storage: Storage = POSIX, clock: Callable[[], float] | None = None
            ) -> RootLock:
    """Take the writer lock of ``root`` (rank 0, at the first save); CheckpointError if another job holds it.

    ``force``: take over any lock but a provably alive holder's
    (:func:`alive_here`; the user knows its holder is gone).  Something at the
    lock path that no job can hold (:func:`_inspect`) is refused without
    ``force``, naming what it is, and removed with it, except a directory that
    is not empty.  An unwritable root (read-only mount, no permission) is a
    CheckpointError that says so.  ``clock``: the time a lease is judged and
    taken at (module docstring).
    """
    path = os.path.join(root, LOCK_FILE)
    at = (clock or now)()
    me = this_process(at, lease_seconds() if storage.conditional_writes else None)
    for attempt in range(_ATTEMPTS):
        try:
            handle = storage.create(path)
        except FileExistsError:
            lock = _inspect(storage, path)
            if lock is None:
                continue  # released meanwhile: try again
            if lock.problem is not None:
                if not force and lock.problem in _MAYBE_BEING_WRITTEN and attempt < _ATTEMPTS - 1:
                    time.sleep(0.05 * (attempt + 1))  # maybe being written right now
                    continue
                if not force or lock.problem == _FULL_DIR:
                    raise CheckpointError(_invalid_message(root, lock)) from None
                why = "break_lock=True was given"
            else:
                flock_free = _flock_free(storage, path)
                why = stale_reason(lock.holder, me, _pid_alive, flock_free, at)
                if why is None:
                    live = alive_here(lock.holder, me, _pid_alive, flock_free)
                    if live or not force:
                        raise CheckpointError(_held_message(root, lock, live)) from None
                    why = "break_lock=True was given"
            warn(f"hpcckpt: taking over the lock {path} of {lock.describe()}: {why}", RuntimeWarning)
            if storage.conditional_writes and lock.stat is not None and lock.stat.kind == FILE:
                taken = _take_over_lease(lock, me)
                if taken is not None:
                    return taken
                continue  # another taker won, or the holder renewed: look again
            _remove_if_unchanged(lock)
            continue
        except OSError as exc:
            raise CheckpointError(f"cannot save under {root!r}: the lock {LOCK_FILE} cannot be created there "
                                  f"({exc.strerror}; a read-only or non-writable root can only be restored from)"
                                  ) from None
        return _fill(storage, path, handle, me)
    raise CheckpointError(f"cannot take the lock {path}: other processes keep taking it at the same time")


def release(lock: RootLock | None) -> None:
    """Drop the lock: remove the file if it is still ours (not taken over meanwhile), close it."""
    if lock is None or lock.released:
        return
    lock.released = True
    try:
        if _still_ours(lock):
            lock.storage.remove_file(lock.path)
    except OSError:
        pass  # gone already, or the root went away: nothing left to release
    finally:
        if lock.handle is not None:
            lock.storage.close(lock.handle, fsync=False)
            lock.handle = None


def _still_ours(lock: RootLock) -> bool:
    """Whether the lock path still holds the lock this process wrote: the object it last wrote, for a lease
    (a renewal rewrites it); the very file its handle writes, otherwise."""
    if lock.seen is not None:
        st = lock.storage.stat(lock.path)
        return st is not None and st.tag == lock.seen.tag
    return lock.handle is not None and lock.storage.names_handle(lock.path, lock.handle)


def renew(lock: RootLock | None, clock: Callable[[], float] | None = None) -> None:
    """Rank 0 at a save: extend a lease once :data:`RENEW_AFTER` of it has passed (nothing for a lock that is no
    lease); CheckpointError when another job took it over meanwhile (its lease had expired)."""
    if lock is None or lock.seen is None or lock.released:
        return
    holder, at = lock.holder, (clock or now)()
    lease = holder["lease_seconds"]
    if at < holder["expires"] - lease * (1 - RENEW_AFTER):
        return
    body = json.dumps({**holder, "expires": at + lease}).encode()
    if not lock.storage.write_if_unchanged(lock.path, body, lock.seen):
        now_there = _inspect(lock.storage, lock.path)
        who = now_there.describe() if now_there is not None else "nobody (it was removed)"
        raise CheckpointError(f"the writer lock {lock.path} is no longer this job's: its lease expired at "
                              f"{format_time(holder['expires'])} and it is now held by {who}. Another job may be "
                              "writing the root: this job stops saving there")
    lock.body, lock.seen = body, lock.storage.stat(lock.path)


def _take_over_lease(lock: LockFile, me: dict) -> RootLock | None:
    """Replace the stale lease ``lock`` by this process's, only if it is still the object judged (one of two
    takers wins); the new RootLock, or None when it changed meanwhile."""
    body = json.dumps(me).encode()
    if not lock.storage.write_if_unchanged(lock.path, body, lock.stat):
        return None
    return RootLock(lock.path, None, body, lock.storage, lock.storage.stat(lock.path))


def remove_lock(root: str, force: bool = False, storage: Storage = POSIX) -> LockFile | None:
    """Remove the lock of ``root`` (its holder is known to be gone): what was removed, or None when there was none.

    A lock hpcckpt cannot read is removed too (a symbolic link itself, not
    its target; an empty directory).  CheckpointError, removing nothing, for
    a holder that is provably alive (:func:`alive_here`) unless ``force``, and
    for a directory that is not empty (it may hold someone's data).
    """
    path = os.path.join(os.fspath(root), LOCK_FILE)
    me = this_process()
    for _ in range(_ATTEMPTS):
        lock = _inspect(storage, path)
        if lock is None:
            return None
        if not force and lock.problem is None and alive_here(lock.holder, me, _pid_alive, _flock_free(storage, path)):
            raise CheckpointError(
                f"{describe(lock.holder)} holds {path} and is running on this host: that job may still be "
                f"writing {os.fspath(root)!r}, and a second job writing it as well would damage the versions of "
                "both. Stop that job (it releases the lock when it closes); force the removal only if you are sure "
                "it no longer writes (`hpcckpt unlock --force ROOT`)")
        if _remove_if_unchanged(lock):
            return lock
    raise CheckpointError(f"cannot remove the lock {path}: other processes keep taking it at the same time")


def break_lock(root: str, force: bool = False, storage: Storage = POSIX) -> dict | None:
    """Remove the lock of ``root`` as :func:`remove_lock` does; the holder's body, ``{}`` for a lock that named
    none, or None when there was no lock."""
    lock = remove_lock(root, force, storage)
    return None if lock is None else lock.holder


def _held_message(root: str, lock: LockFile, live: bool) -> str:
    """The error of a save that finds ``root`` locked by another job's valid lock (``live``: see
    :func:`alive_here`)."""
    head = (f"{root!r} is being written by another job: {describe(lock.holder)} holds {lock.path}. Two jobs saving "
            "into one root would damage each other's versions; ")
    if live:
        return head + ("that process is running on this host, so neither break_lock=True nor `hpcckpt unlock` "
                       "takes its lock: stop that job first (`hpcckpt unlock --force ROOT` removes the lock if you "
                       "are sure it no longer writes)")
    return head + "if that job is gone, run `hpcckpt unlock ROOT` or pass break_lock=True"


def _invalid_message(root: str, lock: LockFile) -> str:
    """The error of a save that finds at the lock path something no job can hold."""
    head = f"{root!r} cannot take its writer lock: {lock.path} is {lock.problem}, not a lock any job holds. "
    if lock.problem == _FULL_DIR:
        return head + "hpcckpt never makes a directory there: look at what it holds and remove it yourself"
    return head + "If no job writes this root, remove it with `hpcckpt unlock ROOT` or pass break_lock=True"


def _fill(storage: Storage, path: str, handle, me: dict) -> RootLock:
    """Write the body into the new lock file (after taking its flock, so a reader never sees a free flock)."""
    try:
        if isinstance(storage, PosixStorage):  # the POSIX-only part (module docstring): a handle is a descriptor
            flock_exclusive(handle)  # not taken (a file system without flock): the O_EXCL file alone is the lock
        body = json.dumps(me).encode()
        storage.append(handle, body)
        storage.sync(handle)
        seen = storage.stat(path) if storage.conditional_writes else None
    except OSError as exc:
        storage.close(handle, fsync=False)
        try:
            storage.remove_file(path)
        except OSError:
            pass
        raise CheckpointError(f"cannot write the lock {path}: {exc.strerror}") from None
    return RootLock(path, handle, body, storage, seen)


def _inspect(storage: Storage, path: str) -> LockFile | None:
    """What lies at ``path`` (None: nothing), looked at without following a link or blocking on a FIFO.

    Only a regular file of at most 64 KiB is read (through ``storage.read_file``,
    which refuses anything else should the file be replaced meanwhile).
    """
    try:
        st = storage.stat(path)
    except OSError as exc:
        raise CheckpointError(f"cannot look at the lock {path}: {exc.strerror}") from None
    if st is None:
        return None
    identity = (st.identity, st.kind, st.size)
    raw, problem = None, None
    if st.kind == LINK:
        problem = f"a symbolic link (to {_link_target(st.target)})"
    elif st.kind == DIRECTORY:
        problem = "an empty directory" if _is_empty_dir(storage, path) else _FULL_DIR
    elif st.kind != FILE:
        problem = st.describe()
    elif st.size > _MAX_BYTES:
        problem = f"a file of {st.size} bytes, longer than any lock ({_MAX_BYTES} bytes at most)"
    else:
        try:
            raw = storage.read_file(path, _MAX_BYTES)
        except FileNotFoundError:
            return None
        except CheckpointError as exc:
            problem = f"unreadable ({exc})"
    if raw is None:
        return LockFile(path, identity, None, {}, problem, storage, st)
    holder, problem = _parse(raw)
    return LockFile(path, identity, raw, holder, problem, storage, st)


def _parse(raw: bytes) -> tuple[dict, str | None]:
    """:func:`check_holder` of a lock file's body, or ``({}, why)`` when it is not JSON at all."""
    if not raw:
        return {}, _EMPTY
    try:
        doc = json.loads(raw)
    except RecursionError:
        return {}, "a file whose JSON is nested too deeply to be a lock"
    except ValueError:
        return {}, _NOT_JSON
    return check_holder(doc)


def _is_name(value) -> bool:
    """Whether ``value`` can be a host name or a SLURM job id: a printable string of reasonable length."""
    return type(value) is str and 0 < len(value) <= _MAX_NAME and value.isprintable()


def _short(value) -> str:
    """``value`` (a would-be pid) for a message: a number if it is a short one, else what it is."""
    if type(value) is int and value.bit_length() <= 256:
        return str(value)
    return f"a {value.bit_length()}-bit number" if type(value) is int else f"of type {type(value).__name__}"


def _link_target(target: str | None) -> str:
    if target is None:
        return "an unreadable target"
    return repr(target if len(target) <= 200 else target[:200] + "...")


def _is_empty_dir(storage: Storage, path: str) -> bool:
    try:
        return not storage.listdir(path)
    except OSError:
        return False


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def _flock_free(storage: Storage, path: str) -> bool:
    """Whether nobody holds the flock of the lock file (False where flock is not supported or the file is gone).

    POSIX only (module docstring): no other Storage has a flock to test.
    """
    return isinstance(storage, PosixStorage) and flock_free(path)


def _remove_if_unchanged(lock: LockFile) -> bool:
    """Remove ``lock`` unless what lies at its path changed since it was looked at (another taker won); whether
    it was removed.

    A directory is removed with ``rmdir``, which removes only an empty one and
    only a directory, so nothing can be taken by mistake; CheckpointError for
    one that is not empty.  Anything else is renamed aside first, then removed
    if it is still the object that was judged (same identity and body), else
    put back with a hard link, which never replaces a lock taken meanwhile.
    """
    path, storage = lock.path, lock.storage
    if lock.identity[1] == DIRECTORY:
        return _remove_empty_dir(storage, path)
    aside = f"{path}.stale-{socket.gethostname()}-{os.getpid()}"
    try:
        storage.replace(path, aside)
    except FileNotFoundError:
        return False  # another taker removed it first
    except OSError as exc:
        raise CheckpointError(f"cannot remove the lock {path}: {exc.strerror}") from None
    moved = _inspect(storage, aside)
    if moved is None:
        return False
    same = (moved.identity, moved.raw) == (lock.identity, lock.raw)
    try:
        if not same:  # a fresh lock: put it back (unless yet another one appeared meanwhile)
            try:
                storage.link(aside, path)
            except FileExistsError:
                pass
        storage.remove_file(aside)
    except OSError as exc:
        raise CheckpointError(f"cannot remove the lock {path} (moved aside to {aside}): {exc.strerror}") from None
    return same


def _remove_empty_dir(storage: Storage, path: str) -> bool:
    try:
        storage.remove_directory(path)
    except (FileNotFoundError, NotADirectoryError):
        return False  # gone, or replaced by a lock file meanwhile: look again
    except OSError as exc:
        if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
            raise CheckpointError(f"{path} is {_FULL_DIR}, not a lock hpcckpt wrote: look at what it holds and "
                                  "remove it yourself") from None
        raise CheckpointError(f"cannot remove the lock {path}: {exc.strerror}") from None
    return True
