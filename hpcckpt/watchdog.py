"""Debug mode for collective calls (``HPCCKPT_DEBUG=1``): a collective that does not complete in bounded time
aborts the job with one line that names the hpcckpt call.

Why: every hpcckpt call that moves data or decides something is collective.
Made on a subset of the ranks (``if rank == 0: ck.steps()``), it waits in MPI
forever and the job hangs without a word.  In debug mode each collective call
hpcckpt makes through its communicator is watched by a timer: after
``HPCCKPT_DEBUG_TIMEOUT`` seconds (default 120; set it above your longest
save) the waiting rank prints which MPI call, inside which hpcckpt call,
never completed, and aborts the job (``MPI_Abort``), so the batch system ends
it at once instead of at its wall-time limit.
"""

from __future__ import annotations

import os
import sys
import threading
import traceback

ENV = "HPCCKPT_DEBUG"
ENV_TIMEOUT = "HPCCKPT_DEBUG_TIMEOUT"
DEFAULT_TIMEOUT = 120.0
#: The communicator methods that block until the other ranks make the same call.
COLLECTIVES = frozenset({"allgather", "gather", "bcast", "scatter", "allreduce", "exscan", "alltoall", "Barrier",
                         "barrier", "Allgather", "Gather", "Bcast", "Scatter", "Allreduce", "Alltoallv", "Split",
                         "Split_type", "Dup"})
_PACKAGE = os.path.dirname(os.path.abspath(__file__))


def watch(comm):
    """``comm``, watched when debug mode is on (and it has more than one rank); else ``comm`` itself."""
    if not os.environ.get(ENV) or isinstance(comm, WatchedComm) or comm.Get_size() == 1:
        return comm
    try:
        timeout = float(os.environ.get(ENV_TIMEOUT) or DEFAULT_TIMEOUT)
    except ValueError:
        timeout = DEFAULT_TIMEOUT
    return WatchedComm(comm, timeout)


class WatchedComm:
    """A communicator whose collective calls abort the job when they wait longer than ``timeout`` seconds."""

    def __init__(self, comm, timeout: float):
        self.comm, self.timeout = comm, timeout

    def __getattr__(self, name):
        attr = getattr(self.comm, name)
        if name not in COLLECTIVES or not callable(attr):
            return attr

        def watched(*args, **kwargs):
            timer = threading.Timer(self.timeout, expired, (name, entry_point(), self.comm.Get_rank(), self.timeout))
            timer.daemon = True
            timer.start()
            try:
                return attr(*args, **kwargs)
            finally:
                timer.cancel()
        return watched


def entry_point() -> str:
    """The outermost hpcckpt function on this thread's stack (the call the application made), as ``module.name``."""
    for frame in traceback.extract_stack():
        path = os.path.abspath(frame.filename)
        if path.startswith(_PACKAGE + os.sep) and not path.endswith("watchdog.py"):
            module = os.path.relpath(path, os.path.dirname(_PACKAGE))[:-3].replace(os.sep, ".")
            return f"{module}.{frame.name}"
    return "an hpcckpt call"


def expired(name: str, where: str, rank: int, timeout: float) -> None:
    """The timer ran out: say what never completed, then end the job."""
    print(f"hpcckpt: rank {rank} waited {timeout:g} s in MPI {name} inside {where}: the other ranks did not make "
          f"the same collective call (every rank must call hpcckpt's collective functions, in the same order); "
          f"aborting the job ({ENV}=1, {ENV_TIMEOUT}={timeout:g})", file=sys.stderr, flush=True)
    try:
        from mpi4py import MPI

        MPI.COMM_WORLD.Abort(1)
    finally:
        os._exit(1)
