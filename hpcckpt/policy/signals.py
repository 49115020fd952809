"""A flag set by SIGUSR1 / SIGTERM, for "checkpoint now and stop" requests.

Why: SLURM warns a job before its time limit (``sbatch --signal=B:USR1@300``)
and pre-emption sends SIGTERM; the application should then take a final
checkpoint at the next step boundary and exit.  A handler that only sets a
flag is async-signal-safe; the checkpoint is taken later from the main loop.

``SignalFlag(signals=(SIGUSR1, SIGTERM))``: ``install()`` replaces the handlers
(remembering the previous ones), ``uninstall()`` restores them.  Python can only
install handlers from the main thread of the main interpreter; elsewhere
``install()`` warns and does nothing (the flag then never sets).  Our handler
replaces, not chains, the previous one: with SIGTERM that means the process no
longer dies on SIGTERM while installed -- the application must poll the flag.
"""

from __future__ import annotations

import signal
import threading
import warnings
from typing import Iterable, Optional

__all__ = ["SignalFlag", "DEFAULT_SIGNALS"]

DEFAULT_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)


class SignalFlag:
    """Set when one of ``signals`` arrives; ``bool(flag)`` / ``flag.is_set``."""

    def __init__(self, signals: Iterable[int] = DEFAULT_SIGNALS):
        self.signals = tuple(signals)
        self._set = False
        self.signum: Optional[int] = None
        self.count = 0
        self._previous = {}
        self.installed = False

    def _handler(self, signum, frame):  # runs in the main thread, between bytecodes
        self._set = True
        self.signum = signum
        self.count += 1

    def install(self) -> "SignalFlag":
        if self.installed:
            return self
        if threading.current_thread() is not threading.main_thread():
            warnings.warn("hpcckpt: SignalFlag.install() called outside the main thread; "
                          "signal handlers not installed", RuntimeWarning, stacklevel=2)
            return self
        try:
            for s in self.signals:
                self._previous[s] = signal.signal(s, self._handler)
        except ValueError as exc:  # e.g. a sub-interpreter
            self._restore()
            warnings.warn(f"hpcckpt: cannot install signal handlers ({exc})", RuntimeWarning,
                          stacklevel=2)
            return self
        self.installed = True
        return self

    def _restore(self) -> None:
        for s, prev in self._previous.items():
            signal.signal(s, prev if prev is not None else signal.SIG_DFL)
        self._previous.clear()

    def uninstall(self) -> None:
        """Restore the handlers that were in place before ``install()``."""
        if not self.installed:
            return
        if threading.current_thread() is not threading.main_thread():
            warnings.warn("hpcckpt: SignalFlag.uninstall() outside the main thread; handlers kept",
                          RuntimeWarning, stacklevel=2)
            return
        self._restore()
        self.installed = False

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
