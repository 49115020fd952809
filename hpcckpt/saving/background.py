"""The background writer of an asynchronous save: one thread per rank, no MPI call in it.

It runs the save pipeline's transform stage (saving/transform.py: cut, codec,
checksum) over the staged copies and stores the Pieces into one file-per-rank
data file (the file-per-rank transport's own ``store_piece``), handing each
staging buffer back to the pool as soon as everything in it is written.  Its
rows, byte counts and failure are collected by the commit, in the foreground.
"""

from __future__ import annotations

import os
import queue
import threading
import time

from hpcckpt.core.monitor import PhaseTimer
from hpcckpt.saving.staging import SlotQueue, StagingPool
from hpcckpt.saving.transform import encoded_pieces, raw_pieces
from hpcckpt.storage import POSIX, Storage
from hpcckpt.transport.base import Written
from hpcckpt.transport.file_per_rank import SequentialFile, store_piece


class WriteCancelled(Exception):
    """A background write stopped by :meth:`BackgroundWrite.cancel`."""


class BackgroundWrite:
    """One rank's writer thread: staged items -> chunks -> codec -> checksum -> ``directory/name``.

    ``digests``: checksums already known by ``(variable, start)`` (see
    transform.encoded_pieces); ``storage``: where the file is written.  Call :meth:`start` once, then :meth:`join`;
    ``error`` holds what failed (staging or writing), for the commit to agree on.
    """

    def __init__(self, directory: str, name: str, pool: StagingPool, queue: SlotQueue, encoder, fsync: bool,
                 chunk_bytes: int, digests: dict | None = None, storage: Storage = POSIX):
        self.directory, self.name, self.storage = directory, name, storage
        self.pool, self.queue, self.encoder, self.fsync = pool, queue, encoder, fsync
        self.chunk_bytes, self.digests = chunk_bytes, digests
        self.timer = PhaseTimer()
        self.written = Written()
        self.file_bytes = 0
        self.error: BaseException | None = None
        self._eof = False
        self._held: list = []
        self._staging_error: BaseException | None = None
        self._cancelled = False
        self._started = False
        self._after = 0.0
        self._finished = threading.Event()

    def start(self, after: float = 0.0) -> None:
        """Hand the write to a writer thread of :data:`WRITERS` (an idle one: no new thread to wait for), which
        begins writing ``after`` seconds from now.

        A whole state staged at once passes the time its copy took: the ranks
        of a node enter a collective checkpoint at about the same time and copy
        together, and a writer that starts while the others still copy takes
        cores and memory bandwidth from them, while each caller's ``save()``
        blocks until its own copy is done.  The write ends later by one copy of
        the state, small beside the write itself.
        """
        self._started = True
        self._after = max(0.0, after)
        WRITERS.run(self._run_then_signal)

    def _run_then_signal(self) -> None:
        try:
            self._run()
        finally:
            self._finished.set()

    def cancel(self) -> None:
        """Stop writing at the next piece (pre-copy abandons a round the checkpoint came before): what is left
        would compete with the checkpoint's own write; ``error`` becomes a :class:`WriteCancelled`."""
        self._cancelled = True

    def fail(self, exc: BaseException) -> None:
        """Staging failed on this rank: the writer drains the pool and reports ``exc`` at the commit."""
        self._staging_error = exc

    @property
    def done(self) -> bool:
        return self._started and self._finished.is_set()

    def join(self) -> None:
        if self._started:
            self._finished.wait()

    def _chunks(self, owners: list):
        """The raw chunks of the staged items as the queue delivers them; ``owners`` gets each chunk's item."""
        while True:
            item = self.queue.get()
            if item is None:
                self._eof = True
                return
            chunks = list(raw_pieces([item.item], self.chunk_bytes))
            item.remaining = len(chunks)
            self._held.append(item)
            for chunk in chunks:
                owners.append(item)
                yield chunk

    def _release(self, item) -> None:
        self._held.remove(item)
        self.pool.release(item.buffer)

    def _run(self) -> None:
        target = SequentialFile(self.directory, self.name, self.fsync, self.storage)
        owners: list = []
        try:
            lower_priority()
            if self._after:
                time.sleep(self._after)
            if self._staging_error is not None:
                raise self._staging_error
            self.storage.make_directories(os.path.dirname(os.path.join(self.directory, self.name)))
            with self.timer.phase("write"):
                try:
                    for piece in encoded_pieces(self._chunks(owners), self.encoder, self.timer,
                                                digests=self.digests):
                        if self._cancelled:
                            raise WriteCancelled(f"the write of {self.name} was cancelled")
                        store_piece(target, piece, self.written)
                        item = owners.pop(0)
                        item.remaining -= 1
                        if item.remaining == 0:
                            self._release(item)
                finally:
                    target.close()
            self.file_bytes = target.offset
            if self._staging_error is not None:
                raise self._staging_error
        except BaseException as exc:  # noqa: BLE001 - surfaces on every rank at the next collective call
            self.error = exc
        finally:  # hand every buffer back (also after a failure) so that a blocked save() never waits forever
            for item in list(self._held):
                self._release(item)
            while not self._eof:
                item = self.queue.get()
                if item is None:
                    self._eof = True
                else:
                    self.pool.release(item.buffer)


class IdleThreads:
    """Daemon threads that stay after a job for the next one: :meth:`run` hands a job to an idle thread, and
    starts a thread (and waits for it to be scheduled) only when none is idle, so that a save does not wait for
    a new thread each time.  Every job gets a thread of its own while it runs (two writes never wait on each
    other); like the threads they replace, they do not keep the interpreter alive at exit."""

    def __init__(self, name: str):
        self.name = name
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0

    def run(self, job) -> None:
        """Run ``job()`` (which must not raise) on an idle thread, or on a new one."""
        with self._lock:
            start = self._idle == 0
            if not start:
                self._idle -= 1
        self._jobs.put(job)
        if start:
            threading.Thread(target=self._serve, name=self.name, daemon=True).start()

    def _serve(self) -> None:
        while True:
            self._jobs.get()()
            with self._lock:
                self._idle += 1


#: The threads that run the background writes of this process.
WRITERS = IdleThreads("hpcckpt-writer")


def lower_priority() -> None:
    """Run the calling (background) thread at nice 19 so that it yields the cores to the application (Linux)."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (AttributeError, OSError):
        pass
