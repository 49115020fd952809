"""Errors reach the user once: :func:`report_errors` around an MPI program's main code.

Why: hpcckpt raises a failure of a collective call as the same
``CheckpointError`` on every rank (mpi/collective.py), so an unhandled one prints
as many interleaved tracebacks as there are ranks.  And an exception on one
rank only (a bug in the application) leaves the other ranks waiting forever
in their next collective.  ``report_errors`` turns the first case into one
line from rank 0 and exit status 1 on every rank, and the second into the
traceback of the rank(s) that raised it, each line prefixed with the rank,
followed by ``MPI_Abort`` so that no rank hangs.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import struct
import sys
import termios
import time
import traceback

from hpcckpt.mpi.collective import resolve_comm
from hpcckpt.errors import CheckpointError
from hpcckpt.mpi.watchdog import enabled as debug_enabled, unwrapped

#: The exit status of every rank after an error.
EXIT_STATUS = 1
#: How long a rank with a CheckpointError waits for the others to have it too (they do within moments).
AGREE_SECONDS = 10.0
#: The longest a rank waits, between printing its error and aborting, for the launcher to take that output
#: (:func:`wait_until_taken`): MPI_Abort tears the job down at once, and mpiexec (MPICH's hydra) drops output it
#: has not yet read from the rank's pipe.
DRAIN_SECONDS = 5.0


class report_errors(contextlib.ContextDecorator):
    """``with hpcckpt.report_errors(comm): main()``, or ``@hpcckpt.report_errors()`` on the main function.

    ``comm``: the communicator whose ranks run the code (default as for
    every hpcckpt call: ``MPI.COMM_WORLD``, or one process without MPI).

    * A ``CheckpointError`` (hpcckpt raises it on every rank alike): rank 0
      prints one line, ``hpcckpt: error: <what happened>`` plus what to do, on
      stderr (with ``HPCCKPT_DEBUG=1`` its traceback too); every rank exits
      with status 1 (``SystemExit``).  The ranks check that they all have it
      (a non-blocking barrier, error path only): a CheckpointError raised on
      some ranks only (the application's own) is one line from each of them,
      prefixed with the rank, and an abort after ``AGREE_SECONDS``.
    * Any other exception: the ranks that raised it print its traceback,
      each line prefixed ``[rank N]``, and abort the communicator
      (``MPI_Abort``, status 1), so that the ranks waiting in a collective end
      too; a ``KeyboardInterrupt`` (Ctrl-C, which reaches every rank) is one
      line per rank instead of a traceback.  On one process the exception
      propagates as usual.
    * ``SystemExit`` passes through.
    """

    def __init__(self, comm=None):
        self._comm = comm

    def __enter__(self):
        return self

    def __exit__(self, cls, exc, tb):
        if exc is None or isinstance(exc, (SystemExit, GeneratorExit)):
            return False
        comm = resolve_comm(self._comm)
        rank, size = comm.Get_rank(), comm.Get_size()
        agreed = isinstance(exc, CheckpointError) and (size == 1 or every_rank_raised(comm))
        if agreed:
            if rank == 0:
                print(one_line(exc, size), file=sys.stderr, flush=True)
                if debug_enabled():
                    traceback.print_exception(cls, exc, tb, file=sys.stderr)
                    sys.stderr.flush()
            raise SystemExit(EXIT_STATUS) from None
        if size == 1:
            return False
        if isinstance(exc, CheckpointError):  # raised on some ranks only (the application's own): not lost
            text = f"[rank {rank}] {one_line(exc, 1)}; the other ranks did not raise it: aborting the job\n"
        elif isinstance(exc, KeyboardInterrupt):  # Ctrl-C reaches every rank: one line each, not N tracebacks
            text = f"[rank {rank}] interrupted (KeyboardInterrupt): aborting the job\n"
        else:
            text = prefixed(f"[rank {rank}] ", "".join(traceback.format_exception(cls, exc, tb)))
        print(text, end="", file=sys.stderr, flush=True)
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.flush()
        wait_until_taken((1, 2), DRAIN_SECONDS)
        try:
            comm.Abort(EXIT_STATUS)
        finally:
            os._exit(EXIT_STATUS)  # MPICH's MPI_Abort may return before the process is killed: never run on


def every_rank_raised(comm) -> bool:
    """Whether every rank of ``comm`` reaches this error path within ``AGREE_SECONDS``: a non-blocking barrier.

    hpcckpt raises a CheckpointError on every rank within moments of each
    other; one the application raises on some ranks only would leave the
    others waiting.  MPI never matches a non-blocking barrier with a blocking
    collective another rank waits in, so this ends in time either way (the
    barrier left pending is moot: the process ends next).
    """
    return within(AGREE_SECONDS, unwrapped(comm).Ibarrier().Test)


def unread_bytes(fd: int) -> int:
    """Bytes written to ``fd`` that its reader has not taken yet: a pipe's content (FIONREAD), a socket's
    unconsumed send queue (TIOCOUTQ); 0 for anything else (a file or a terminal keeps what was written)."""
    try:
        mode = os.fstat(fd).st_mode
        request = termios.FIONREAD if stat.S_ISFIFO(mode) else \
            getattr(termios, "TIOCOUTQ", None) if stat.S_ISSOCK(mode) else None
        if request is None:
            return 0
        return struct.unpack("i", fcntl.ioctl(fd, request, b"\0\0\0\0"))[0]
    except OSError:
        return 0


def wait_until_taken(fds, seconds: float) -> bool:
    """Wait until the readers of ``fds`` (the launcher, for stdout and stderr) have taken what was written to
    them, at most ``seconds``; whether they did.  An abort right after printing loses nothing that way, whatever
    the machine's load, and a reader that never reads delays the abort by ``seconds`` only."""
    return within(seconds, lambda: not any(unread_bytes(fd) for fd in fds))


def within(seconds: float, done) -> bool:
    """Whether ``done()`` turns true within ``seconds`` (polled every 5 ms)."""
    deadline = time.monotonic() + seconds
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def one_line(exc: CheckpointError, size: int) -> str:
    """What rank 0 prints for an error every rank raised: the message on one line and what to do."""
    text = " ".join(str(exc).split()).rstrip(".") or type(exc).__name__
    where = f" (raised on all {size} ranks)" if size > 1 else ""
    return (f"hpcckpt: error{where}: {text}. What to do: fix the cause named here and rerun (a failed save "
            "commits nothing; `hpcckpt ls ROOT` lists the committed versions); HPCCKPT_DEBUG=1 adds the traceback")


def prefixed(prefix: str, text: str) -> str:
    """``text`` with ``prefix`` before every line: one rank's output stays readable among the others'."""
    return "".join(prefix + line for line in text.splitlines(keepends=True))
