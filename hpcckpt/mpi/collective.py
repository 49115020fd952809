"""The one family of collective helpers every phase of a save or load uses, and the rule that keeps them safe.

Every phase of a save or load runs its rank-local work inside :func:`agree`:
an exception on one rank is caught there, every rank then enters the same small
``allgather``, and every rank raises the same ``CheckpointError`` naming the
ranks that failed and why.  No rank ever waits in a collective that another
rank skipped because it raised.

``comm=None`` means ``MPI.COMM_WORLD`` when mpi4py is importable and a single
process otherwise; :class:`SerialComm` offers the handful of methods we call so
that the rest of the code never branches on "is there MPI".
"""

from __future__ import annotations

import os
from typing import Any, Callable, NamedTuple, TypeVar

from hpcckpt.core.warn import warn
from hpcckpt.errors import CheckpointError, CorruptCheckpointError, TemplateMismatchError
from hpcckpt.mpi.watchdog import watch

T = TypeVar("T")

#: Failures that keep their class when they cross ranks: a caller can tell a
#: damaged checkpoint from a template that does not fit.  Anything else becomes
#: a plain CheckpointError.
_SPECIFIC = (TemplateMismatchError, CorruptCheckpointError)


class SerialComm:
    """A one-process stand-in for an mpi4py communicator (the methods hpcckpt uses)."""

    rank = 0
    size = 1

    def Get_rank(self) -> int:
        return 0

    def Get_size(self) -> int:
        return 1

    def bcast(self, obj, root=0):
        return obj

    def gather(self, obj, root=0):
        return [obj]

    def allgather(self, obj):
        return [obj]

    def scatter(self, objs, root=0):
        return objs[0]

    def allreduce(self, obj, op=None):
        return obj

    def alltoall(self, objs):
        return list(objs)

    def exscan(self, obj, op=None):
        return None

    def Scan(self, sendbuf, recvbuf, op=None) -> None:
        recvbuf[...] = sendbuf

    def Barrier(self) -> None:
        pass

    barrier = Barrier


def resolve_comm(comm=None):
    """The communicator to use: the given one, else COMM_WORLD, else a serial stand-in (watched in debug mode:
    mpi/watchdog.py)."""
    if comm is not None:
        return watch(comm)
    if os.environ.get("HPCCKPT_NO_MPI"):
        return SerialComm()
    try:
        from mpi4py import MPI
    except ImportError:
        return SerialComm()
    return watch(MPI.COMM_WORLD)


def agree(comm, what: str, fn: Callable[[], T]) -> T:
    """Run ``fn`` on this rank; raise the same CheckpointError on every rank if any rank failed.

    ``what`` names the operation in the message ("save of 'run/step-3'").  The
    cost is one allgather of a small tuple per call.
    """
    result, failure = attempt(fn)
    raise_if_failed(comm, what, comm.allgather(failure))
    return result


def allgather_checked(comm, what: str, fn: Callable[[], T]) -> list[T]:
    """Like :func:`agree`, but also hands every rank the results of all ranks (one allgather)."""
    result, failure = attempt(fn)
    return allgather_payloads(comm, what, failure, result)


def allgather_payloads(comm, what: str, failure, payload) -> list:
    """Every rank's ``payload`` (one allgather), or the same CheckpointError on every rank when some rank's
    ``failure`` (its :func:`attempt` failure, or None) is set.

    For work whose failure is known before the exchange (an earlier stage's):
    the failure rides with the payload, so it costs no collective of its own.
    """
    pairs = comm.allgather((failure, None if failure else payload))
    raise_if_failed(comm, what, [f for f, _ in pairs])
    return [p for _, p in pairs]


class _Failed(NamedTuple):
    """An alltoall slot that carries its sender's failure (:func:`alltoall_payloads`) in place of a payload."""

    failure: tuple


def alltoall_payloads(comm, what: str, failure, slots: list) -> list:
    """The slots every rank addressed to this one, by sender (one alltoall of ``slots``, one per destination), or
    the same CheckpointError on every rank when some rank's ``failure`` is set.

    A failed rank sends its failure in every slot, so every rank learns of it.
    A payload goes bare: the slots are many and small, and a failure is told
    apart by its own type, so a success costs no byte more than its payloads.
    """
    sent = [_Failed(failure)] * comm.Get_size() if failure is not None else slots
    received = comm.alltoall(sent)
    raise_if_failed(comm, what, [s.failure if isinstance(s, _Failed) else None for s in received])
    return received


def allreduce_checked(comm, what, failure, value, op: Callable[[Any, Any], Any]):
    """``value`` of every rank combined by ``op`` (one allreduce), or the same CheckpointError on every rank when
    some rank's ``failure`` is set.

    The failure rides as one flag in the reduction, so what a rank receives
    stays as small as ``op``'s result whatever the rank count; only when some
    rank failed does one more allgather name the ranks and their failures.
    ``op`` must be associative and commutative (the reduction combines in a
    tree of its choosing) and never raise (it runs inside the reduction); it
    combines the values of failed ranks too.  ``what``: the operation's name,
    or a function of the combined value that gives it.
    """
    failed, combined = comm.allreduce((failure is not None, value), op=lambda a, b: (a[0] or b[0], op(a[1], b[1])))
    if failed:
        raise_if_failed(comm, what(combined) if callable(what) else what, comm.allgather(failure))
    return combined


def bcast_checked(comm, what: str, fn: Callable[[], T], root: int = 0) -> T:
    """Run ``fn`` on the root and broadcast its result, or its failure as the same error on every rank."""
    result, failure = attempt(fn) if comm.Get_rank() == root else (None, None)
    return unpack_checked(comm, what, comm.bcast((failure, None if failure else result), root=root), root)


def unpack_checked(comm, what: str, pair: tuple, root: int = 0):
    """The result in a ``(failure, result)`` pair the root broadcast (:func:`bcast_checked`'s, or one riding on
    another broadcast), or the root's failure as the same error on every rank."""
    failure, result = pair
    if failure is not None:
        raise collective_error(what, {root: failure}, comm.Get_size())
    return result


def root_phase(comm, what, failure, payload, root_fn):
    """Gather ``(failure, payload)`` on rank 0, run ``root_fn(payloads)`` there, broadcast its result.

    ``failure`` is this rank's :func:`attempt` failure (or None) of the work
    that produced ``payload``.  Two collectives in place of agree's allgather
    plus a gather and a bcast: any rank's failure (or ``root_fn``'s) becomes the
    same CheckpointError on every rank.  ``what``: the operation's name, or a
    function that gives it on rank 0 (whose name every rank then reports).
    """
    return _checked(comm, comm.bcast(_settle_on_root(comm, what, failure, payload, root_fn), root=0))


def root_phase_scattered(comm, what, failure, payload, root_fn) -> tuple:
    """:func:`root_phase` whose ``root_fn`` hands each rank a part of its own: ``(shared, this rank's part)``.

    ``root_fn(payloads)`` returns ``(shared, parts)``, ``parts`` one per rank.
    Three collectives: the gather, the broadcast of ``shared`` (or of the
    failures: every rank raises the same CheckpointError before the scatter,
    so no rank waits in it), and the scatter of ``parts``, which sends each
    rank its part alone however large all of them are.
    """
    failed, result = _settle_on_root(comm, what, failure, payload, root_fn)
    shared, parts = result if result is not None else (None, None)
    shared = _checked(comm, comm.bcast((failed, shared), root=0))
    return shared, comm.scatter(parts, root=0)


def _settle_on_root(comm, what, failure, payload, root_fn):
    """Gather ``(failure, payload)`` on rank 0; there ``(None, root_fn(payloads))``, or ``((name, failures by
    rank), None)`` when a rank or ``root_fn`` failed; ``(None, None)`` on the other ranks."""
    msgs = comm.gather((failure, None if failure else payload), root=0)
    if comm.Get_rank() != 0:
        return None, None
    bad = {r: f for r, (f, _) in enumerate(msgs) if f is not None}
    if not bad:
        result, f = attempt(lambda: root_fn([p for _, p in msgs]))
        if f is None:
            return None, result
        bad = {0: f}
    return (what() if callable(what) else what, bad), None


def _checked(comm, settled: tuple):
    """The result in rank 0's broadcast :func:`_settle_on_root` outcome, or its failures as the same error on
    every rank."""
    failed, result = settled
    if failed is not None:
        raise collective_error(*failed, comm.Get_size())
    return result


def attempt(fn):
    """``(fn(), None)``, or ``(None, failure)`` with the failure described for the other ranks."""
    try:
        return fn(), None
    except Exception as exc:  # noqa: BLE001 - every failure must reach the other ranks
        return None, describe_failure(exc)


def raise_if_failed(comm, what: str, failures: list) -> None:
    """Raise the collective error for the ranks whose entry of ``failures`` (one per rank) is set."""
    bad = {rank: f for rank, f in enumerate(failures) if f is not None}
    if bad:
        raise collective_error(what, bad, comm.Get_size())


def describe_failure(exc: BaseException) -> tuple[str, str, str]:
    """``(class kept across ranks, message, original class)``: what a failure sends to the other ranks."""
    kind = next((cls.__name__ for cls in _SPECIFIC if isinstance(exc, cls)), "CheckpointError")
    text = str(exc) if isinstance(exc, CheckpointError) else f"{type(exc).__name__}: {exc}"
    return kind, text, type(exc).__name__


def collective_error(what: str, bad: dict, size: int) -> CheckpointError:
    """The one error every rank raises for the failures ``bad`` (by rank) of the operation ``what``."""
    kinds = {kind for kind, _, _ in bad.values()}
    cls = next((c for c in _SPECIFIC if kinds == {c.__name__}), CheckpointError)
    shown = sorted(bad.items())[:4]
    parts = [text if size == 1 else f"rank {rank}: {text}" for rank, (_, text, _) in shown]
    more = f" (and {len(bad) - len(shown)} more ranks)" if len(bad) > len(shown) else ""
    where = "" if size == 1 else f" on {len(bad)} of {size} ranks"
    err = cls(f"{what} failed{where}: " + "; ".join(parts) + more)
    err.failures = {rank: text for rank, (_, text, _) in bad.items()}
    return err


def best_effort(what: str, fn: Callable[[], Any]) -> bool:
    """Run rank-local bookkeeping whose loss loses no checkpoint data; any failure is a warning, never a raise.

    Why: an exception on one rank between two collectives mis-pairs them (a
    hang), so every piece of I/O an operation does either runs under
    :func:`agree` or cannot raise.  Bookkeeping (the failure history, the
    bandwidth history, retention) takes the second way: its failure costs a
    measurement or some disk space, not a checkpoint, and must not fail the
    operation that did the real work.  Returns whether ``fn`` succeeded.
    """
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - bookkeeping must never raise between collectives
        warn(f"hpcckpt: {what} failed ({type(exc).__name__}: {exc}); continuing without it",
             RuntimeWarning)
        return False
    return True


def on_root(comm, fn: Callable[[], Any], root: int = 0):
    """Run ``fn`` on the root only (None elsewhere); the caller wraps it in :func:`agree`."""
    return fn() if comm.Get_rank() == root else None
