"""L4: copying this rank's L1 files (its data file, and its blocks of tracked files) to the shared root in a background thread (no MPI in the thread).

The thread copies with ``Storage.append_from`` (POSIX: ``os.copy_file_range``
or ``sendfile``, the GIL released for the whole copy, so the application's
Python code keeps running) at the lowest CPU priority (``nice 19`` for this thread only, on Linux), optionally
capped at ``bandwidth`` bytes per second.  The version is committed on the root
only later, in the foreground, once every rank reports its copy done: rank 0
then writes the same ``metadata.json`` there.  A crash during the flush leaves
an uncommitted directory, which does not count and is cleared later.
"""

from __future__ import annotations

import os
import threading
import time

from hpcckpt.storage.base import Storage, copy_through_buffer

#: The buffer of a copy between two storages (node-local to an object store: at least one multipart part).
COPY_BYTES = 8 << 20


class FlushThread:
    """Copies each ``(src, dst)`` of ``copies``, from ``source`` (the node directories' storage) to ``target``
    (the root's), in turn (none: a rank with no data copies nothing)."""

    def __init__(self, source: Storage, target: Storage, copies: list[tuple[str, str]], fsync: bool = True,
                 bandwidth: float | None = None, low_priority: bool = True):
        self.source, self.target, self.copies, self.fsync = source, target, copies, fsync
        self.bandwidth = bandwidth
        self.low_priority = low_priority
        self.error: BaseException | None = None
        self.seconds = 0.0
        self.nbytes = 0
        self._thread = threading.Thread(target=self._run, name="hpcckpt-flush", daemon=True)
        self._thread.start()

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def join(self) -> None:
        self._thread.join()

    def _run(self) -> None:
        t0 = time.perf_counter()
        try:
            if self.low_priority and hasattr(os, "setpriority"):
                try:
                    os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
                except OSError:
                    pass
            for src, dst in self.copies:
                self.nbytes += copy_file(self.source, src, dst, self.fsync, self.bandwidth, self.target)
        except BaseException as exc:  # noqa: BLE001 - reported at the next collective call
            self.error = exc
        finally:
            self.seconds = time.perf_counter() - t0


def copy_file(storage: Storage, src: str, dst: str, fsync: bool = True, bandwidth: float | None = None,
              target: Storage | None = None) -> int:
    """Copy ``src`` in ``storage`` to a new ``dst`` in ``target`` (``storage`` too unless given), written as
    ``dst.part`` then renamed; return the bytes copied."""
    target = storage if target is None else target
    target.make_directories(os.path.dirname(dst))
    tmp = dst + ".part"
    t0 = time.perf_counter()

    def pace(done: int) -> None:
        ahead = done / bandwidth - (time.perf_counter() - t0)
        if ahead > 0:
            time.sleep(ahead)

    fi, size = storage.open_read(src)
    try:
        fo = target.create_replacing(tmp)
        try:
            if target is storage:
                done = storage.append_from(fo, fi, size, src, pace if bandwidth else None)
            else:
                done = copy_through_buffer(storage, fi, target, fo, size, src, pace if bandwidth else None,
                                           COPY_BYTES)
            if fsync:
                target.sync(fo)
        finally:
            target.close(fo, fsync=False)
    finally:
        storage.close_read(fi)
    target.replace(tmp, dst)
    return done
