"""Debug mode for collective calls (``HPCCKPT_DEBUG=1``): ranks in different hpcckpt calls are a CheckpointError,
a collective that does not complete in bounded time aborts the job; both name the hpcckpt call.

Why: every hpcckpt call that moves data or decides something is collective.
Made on a subset of the ranks (``if rank == 0: ck.save(...)``), it waits in
MPI forever and the job hangs without a word; made while the other ranks are
in another hpcckpt call (rank 0 in ``save``, rank 1 in ``restore``), its
collectives may pair with theirs and exchange the wrong data.

In debug mode every collective hpcckpt makes through its communicator
(:func:`watch`) is preceded by one small ``allgather`` of a call-site tag: the
public hpcckpt call this rank is in (``Checkpointer.save(step=10)``, found on
the stack) and the MPI operation.  When the tags differ, every rank raises the
same CheckpointError naming both calls and two ranks.  The exchange and the
collective run under a timer: after ``HPCCKPT_DEBUG_TIMEOUT`` seconds (default
120; set it above your longest save) the waiting rank prints which MPI call,
inside which hpcckpt call, never completed, and aborts the job
(``MPI_Abort``), so the batch system ends it at once instead of at its
wall-time limit.  Communicators hpcckpt derives (``Split``, ``Dup``) are
watched too.  Without ``HPCCKPT_DEBUG`` :func:`watch` returns the communicator
itself: no extra collective, no cost.
"""

from __future__ import annotations

import os
import sys
import threading

from hpcckpt.errors import CheckpointError

ENV = "HPCCKPT_DEBUG"
ENV_TIMEOUT = "HPCCKPT_DEBUG_TIMEOUT"
DEFAULT_TIMEOUT = 120.0
#: The communicator methods that block until the other ranks make the same call.
COLLECTIVES = frozenset({"allgather", "gather", "bcast", "scatter", "allreduce", "exscan", "Scan", "alltoall",
                         "Barrier", "barrier", "Allgather", "Gather", "Bcast", "Scatter", "Allreduce", "Alltoallv", "Split",
                         "Split_type", "Dup"})
#: The collectives that return a new communicator (watched in turn).
DERIVING = frozenset({"Split", "Split_type", "Dup"})
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # hpcckpt/, above this mpi/
_SELF = os.path.abspath(__file__)


def enabled() -> bool:
    """Whether debug mode is on (``HPCCKPT_DEBUG`` set to anything but empty or ``0``)."""
    return os.environ.get(ENV, "") not in ("", "0")


def watch(comm):
    """``comm``, watched when debug mode is on (and it has more than one rank); else ``comm`` itself."""
    if not enabled() or isinstance(comm, WatchedComm) or comm.Get_size() == 1:
        return comm
    try:
        timeout = float(os.environ.get(ENV_TIMEOUT) or DEFAULT_TIMEOUT)
    except ValueError:
        timeout = DEFAULT_TIMEOUT
    return WatchedComm(comm, timeout)


class WatchedComm:
    """A communicator whose collectives check that every rank is in the same hpcckpt call, and abort the job
    when they wait longer than ``timeout`` seconds."""

    def __init__(self, comm, timeout: float):
        self.comm, self.timeout = comm, timeout

    def __getattr__(self, name):
        attr = getattr(self.comm, name)
        if name not in COLLECTIVES or not callable(attr):
            return attr

        def watched(*args, **kwargs):
            call = public_call()
            timer = threading.Timer(self.timeout, expired, (name, call[1], self.comm.Get_rank(), self.timeout))
            timer.daemon = True
            timer.start()
            try:
                raise_if_calls_differ(self.comm.allgather((call[0], name, call[1])))
                out = attr(*args, **kwargs)
            finally:
                timer.cancel()
            return WatchedComm(out, self.timeout) if name in DERIVING and not is_null(out) else out
        return watched


def is_null(comm) -> bool:
    """Whether a derived communicator is ``MPI.COMM_NULL`` (this rank is in no group: nothing to watch)."""
    from mpi4py import MPI

    return comm is None or comm == MPI.COMM_NULL


def unwrapped(comm):
    """The mpi4py communicator itself, for MPI functions that take one (``MPI.File.Open``)."""
    return comm.comm if isinstance(comm, WatchedComm) else comm


def public_call() -> tuple[str, str]:
    """``(key, shown)`` of the outermost hpcckpt function on this thread's stack: the call the application made.

    ``key`` (``"Checkpointer.save"``) is what the ranks must agree on;
    ``shown`` adds the step when the call has one (``"Checkpointer.save(step=10)"``).
    Nested functions (decorators' wrappers, such as the Checkpointer's signal
    shield) are never the call itself: the function they wrap is.
    """
    frame, outer = sys._getframe(1), None
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if path.startswith(_PACKAGE + os.sep) and path != _SELF and "<locals>" not in frame.f_code.co_qualname:
            outer = frame
        frame = frame.f_back
    if outer is None:
        return "an hpcckpt call", "an hpcckpt call"
    name, module = outer.f_code.co_qualname, outer.f_globals.get("__name__", "hpcckpt")
    if "." in name:  # a method: Checkpointer.save, Checkpointer (the constructor)
        key = name.removesuffix(".__init__")
    else:  # a function: hpcckpt.save (the public api module's), hpcckpt.hdf5.export...
        key = f"{'hpcckpt' if module == 'hpcckpt.api' else module}.{name}"
    step = outer.f_locals.get("step")
    return key, f"{key}(step={step!r})" if step is not None else f"{key}()"


def raise_if_calls_differ(tags: list) -> None:
    """Every rank's ``(key, MPI operation, shown)``: the same CheckpointError on every rank if two differ."""
    first = tags[0]
    for rank, tag in enumerate(tags):
        if tag[:2] != first[:2]:
            raise CheckpointError(
                f"collective calls do not match ({ENV}=1): rank 0 is in {first[2]} (MPI {first[1]}), rank {rank} "
                f"in {tag[2]} (MPI {tag[1]}); every rank must make the same collective hpcckpt calls in the same "
                "order (Checkpointer.latest/steps/register are the only ones any subset may call)")


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
