"""L4: copying this rank's L1 files (its data file, and its blocks of tracked files) to the shared root in a background thread (no MPI in the thread).

The thread copies with ``os.copy_file_range``/``sendfile`` (the GIL is released
for the whole copy, so the application's Python code keeps running) at the
lowest CPU priority (``nice 19`` for this thread only, on Linux), optionally
capped at ``bandwidth`` bytes per second.  The version is committed on the root
only later, in the foreground, once every rank reports its copy done: rank 0
then writes the same ``metadata.json`` there.  A crash during the flush leaves
an uncommitted directory, which does not count and is cleared later.
"""

from __future__ import annotations

import os
import threading
import time

from hpcckpt.storage.opening import create_replacing, open_regular
from hpcckpt.storage.posix import copy_data


class FlushThread:
    """Copies each ``(src, dst)`` of ``copies`` in turn (none: a rank with no data copies nothing)."""

    def __init__(self, copies: list[tuple[str, str]], fsync: bool = True, bandwidth: float | None = None,
                 low_priority: bool = True):
        self.copies, self.fsync = copies, fsync
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
                self.nbytes += copy_file(src, dst, self.fsync, self.bandwidth)
        except BaseException as exc:  # noqa: BLE001 - reported at the next collective call
            self.error = exc
        finally:
            self.seconds = time.perf_counter() - t0


def copy_file(src: str, dst: str, fsync: bool = True, bandwidth: float | None = None) -> int:
    """Copy ``src`` to a new ``dst`` (written as ``dst.part`` then renamed); return the bytes copied."""
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    tmp = dst + ".part"
    t0 = time.perf_counter()

    def pace(done: int) -> None:
        ahead = done / bandwidth - (time.perf_counter() - t0)
        if ahead > 0:
            time.sleep(ahead)

    fi = open_regular(src)
    try:
        fo = create_replacing(tmp)
        try:
            done = copy_data(fi, fo, os.fstat(fi).st_size, src, pace if bandwidth else None)
            if fsync:
                os.fsync(fo)
        finally:
            os.close(fo)
    finally:
        os.close(fi)
    os.replace(tmp, dst)
    return done
