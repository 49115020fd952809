"""Phase timers: where the time of a save or load goes, per rank."""

from __future__ import annotations

import time
from contextlib import contextmanager


class PhaseTimer:
    """Accumulates wall-clock seconds per named phase (``with timer.phase("write"): ...``)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.timeline: list[tuple[str, float, float]] = []  # (phase, start, end) in s since the timer began
        self._t0 = time.perf_counter()

    @contextmanager
    def phase(self, name: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            t1 = time.perf_counter()
            self.seconds[name] = self.seconds.get(name, 0.0) + t1 - t0
            if len(self.timeline) < 64:  # per-piece phases (hash) repeat: keep the record small
                self.timeline.append((name, t0 - self._t0, t1 - self._t0))
