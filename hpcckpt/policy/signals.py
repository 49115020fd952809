"""A flag set by SIGUSR1 / SIGTERM / SIGINT, for "checkpoint now and stop" requests.

Why: SLURM warns a job before its time limit (``sbatch --signal=B:USR1@300``),
pre-emption and ``scancel`` send SIGTERM, and Ctrl-C of ``mpiexec`` sends
SIGINT to every rank; the application should then take a final checkpoint at
the next step boundary and exit.  A handler that only sets a flag is safe at
any instant; the checkpoint is taken later, from the main loop, after every
rank has agreed on it (hpcckpt.root.pacing).

``SignalFlag(signals=(SIGUSR1, SIGTERM, SIGINT))``:

* ``install()`` installs a handler per signal that sets the flag and then
  *chains*: it calls the Python handler it replaced, when that is an
  application's function.  It never chains to ``SIG_DFL``, ``SIG_IGN`` or
  Python's ``default_int_handler`` (dying on SIGTERM, or a KeyboardInterrupt
  raised at an arbitrary instant on one rank, is what hangs an MPI job: the
  flag wins).  ``uninstall()`` puts back what its handlers replaced; one of
  ours that another handler still chains to (closed out of order) becomes
  transparent: it does what the handler it replaced would have done.
* An application handler installed later replaces ours (Veros' ``run()``
  does).  ``adopt_replacements()`` -- called by the Checkpointer at each of
  its collective calls -- notices it, warns once per signal naming the
  replacing handler, and re-installs ours chained to it: the application's
  handler still runs, and the flag still sets.  The handler of another
  SignalFlag (a second Checkpointer of the process) that leads to ours is no
  replacement: it calls ours at once, so the flags of several Checkpointers
  share one chain instead of re-installing over each other at every save.
* While hpcckpt is inside a collective (``with flag.deferred():``) the
  chained application handlers are not called; they run when the outermost
  such section ends, so nothing raised by them can leave one rank out of a
  collective the others are in.
* An exception a chained handler raises (``raise SystemExit`` is a common
  "stop now" idiom) is held, not raised at the arbitrary instant the signal
  came: :meth:`raise_pending` raises it where the caller chooses -- the
  Checkpointer does so once the final checkpoint is written.

Python can only install handlers from the main thread of the main interpreter;
elsewhere ``install()`` warns and does nothing (the flag then never sets).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from typing import Iterable, Optional
from hpcckpt.core.warn import warn

__all__ = ["SignalFlag", "DEFAULT_SIGNALS", "handler_name"]

DEFAULT_SIGNALS = (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT)


def handler_name(handler) -> str:
    """How a warning names a signal handler: ``SIG_DFL``, ``module.function``, or its repr."""
    if handler in (signal.SIG_DFL, signal.SIG_IGN):
        return signal.Handlers(handler).name
    if handler is None:
        return "a handler installed outside Python"
    func = getattr(handler, "__func__", handler)
    module, name = getattr(func, "__module__", None), getattr(func, "__qualname__", None)
    return f"{module}.{name}" if module and name else repr(handler)


def effective(handler):
    """``handler``, or for one of ours left transparent (its flag uninstalled) what it stands for."""
    while isinstance(handler, _ChainedHandler) and not handler.flag.installed:
        handler = handler.previous
    return handler


def chains_to(handler) -> bool:
    """Whether our handler calls ``handler`` after setting the flag: only an application's Python callable."""
    handler = effective(handler)
    return callable(handler) and handler is not signal.default_int_handler


class _ChainedHandler:
    """One installed handler of a SignalFlag: sets the flag, then calls the handler it replaced."""

    def __init__(self, flag: "SignalFlag", previous):
        self.flag, self.previous = flag, previous

    def __call__(self, signum, frame):  # runs in the main thread, between bytecodes
        if not self.flag.installed:  # left in place by a handler installed over ours: be transparent
            target = effective(self.previous)
            if callable(target):
                target(signum, frame)
            elif target == signal.SIG_DFL:
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)
            return
        self.flag._caught(signum)
        target = effective(self.previous)
        if isinstance(target, _ChainedHandler):  # another Checkpointer's flag: set it now, it defers its own
            target(signum, frame)
        elif chains_to(target):
            self.flag._chain(target, signum, frame)

    def __repr__(self) -> str:
        return f"<hpcckpt signal handler, then {handler_name(self.previous)}>"


class SignalFlag:
    """Set when one of ``signals`` arrives; ``bool(flag)`` / ``flag.is_set``, ``flag.signum`` (the last one)."""

    def __init__(self, signals: Iterable[int] = DEFAULT_SIGNALS):
        self.signals = tuple(signals)
        self._set = False
        self.signum: Optional[int] = None
        self.count = 0
        self._original = {}  # signum -> the handler install() replaced
        self._warned = set()  # signals whose replacement was reported
        self._depth = 0  # nesting of deferred() sections
        self._queued = []  # chained calls that arrived inside a deferred() section
        self._pending: Optional[BaseException] = None
        self.installed = False

    def _caught(self, signum) -> None:
        self._set = True
        self.signum = signum
        self.count += 1

    def _chain(self, handler, signum, frame) -> None:
        if self._depth:
            self._queued.append((handler, signum, frame))
        else:
            self._call(handler, signum, frame)

    def _call(self, handler, signum, frame) -> None:
        try:
            handler(signum, frame)
        except BaseException as exc:  # noqa: BLE001 - held for raise_pending(): never at an arbitrary instant
            if self._pending is None:
                self._pending = exc

    def _ours(self, handler) -> bool:
        return isinstance(handler, _ChainedHandler) and handler.flag is self

    def _reached(self, handler) -> bool:
        """Whether ``handler`` is ours, or hpcckpt handlers of other flags (other Checkpointers of this process)
        that lead to ours: each calls the one it replaced, so our flag still sets."""
        while isinstance(handler, _ChainedHandler):
            if handler.flag is self:
                return True
            handler = handler.previous
        return False

    def install(self) -> "SignalFlag":
        if self.installed:
            return self
        if threading.current_thread() is not threading.main_thread():
            warn("hpcckpt: SignalFlag.install() called outside the main thread; "
                 "signal handlers not installed", RuntimeWarning)
            return self
        try:
            for s in self.signals:
                self._original[s] = signal.signal(s, _ChainedHandler(self, signal.getsignal(s)))
        except ValueError as exc:  # e.g. a sub-interpreter
            self._restore()
            warn(f"hpcckpt: cannot install signal handlers ({exc})", RuntimeWarning)
            return self
        self.installed = True
        return self

    def adopt_replacements(self) -> list[int]:
        """Re-install our handler, chained to it, for every signal whose handler another one replaced.

        Warns once per signal (naming it and the replacing handler).  Returns
        the signals re-installed now.  A no-op when not installed, or outside
        the main thread (where handlers cannot be set).
        """
        if not self.installed or threading.current_thread() is not threading.main_thread():
            return []
        adopted = []
        for s in self.signals:
            current = signal.getsignal(s)
            if self._reached(current):
                continue
            signal.signal(s, _ChainedHandler(self, current))
            adopted.append(s)
            if s not in self._warned:
                self._warned.add(s)
                calls = (f"then calls {handler_name(current)}" if chains_to(current)
                         else f"and does not call {handler_name(current)}")
                warn(f"hpcckpt: the {signal.Signals(s).name} handler of hpcckpt was replaced by "
                     f"{handler_name(current)}; hpcckpt re-installed its own, which sets its "
                     f"checkpoint-and-exit flag {calls} (handle_signals=False leaves "
                     f"{signal.Signals(s).name} to the application)", RuntimeWarning)
        return adopted

    def _restore(self) -> None:
        for s, prev in self._original.items():
            current = signal.getsignal(s)
            if self._ours(current):  # put back what our handler chains to (the original, or an adopted one),
                previous = effective(current.previous)  # past handlers of flags uninstalled before ours
                signal.signal(s, previous if previous is not None else signal.SIG_DFL)
            # else another handler replaced ours since the last adopt_replacements(): it stays
        self._original.clear()

    def uninstall(self) -> None:
        """Put back the handlers ours replaced (the ones in place before ``install()``, or adopted since)."""
        if not self.installed:
            return
        if threading.current_thread() is not threading.main_thread():
            warn("hpcckpt: SignalFlag.uninstall() outside the main thread; handlers kept",
                 RuntimeWarning)
            return
        self._restore()
        self.installed = False

    @contextlib.contextmanager
    def deferred(self):
        """While inside: chained application handlers wait; they run when the outermost section ends."""
        self._depth += 1
        try:
            yield self
        finally:
            self._depth -= 1
            if not self._depth:
                queued, self._queued = self._queued, []
                for handler, signum, frame in queued:
                    self._call(handler, signum, frame)

    @property
    def pending(self) -> Optional[BaseException]:
        """The first exception a chained handler raised, not raised yet (see :meth:`raise_pending`)."""
        return self._pending

    def raise_pending(self) -> None:
        """Raise (once) the exception a chained application handler raised, if any."""
        exc, self._pending = self._pending, None
        if exc is not None:
            raise exc

    @property
    def is_set(self) -> bool:
        return self._set

    def __bool__(self) -> bool:
        return self._set

    def clear(self) -> None:
        self._set = False
        self.signum = None

    def __enter__(self) -> "SignalFlag":
        return self.install()

    def __exit__(self, *exc) -> None:
        self.uninstall()

    def __repr__(self) -> str:
        names = ",".join(signal.Signals(s).name for s in self.signals)
        return f"SignalFlag({names}, set={self._set}, installed={self.installed})"
