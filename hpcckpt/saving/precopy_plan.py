"""The pure decisions of self-adaptive pre-copy: when to run a round, when to stop, which block size.

Pre-copy (docs/async.md, "Pre-copy") copies the state's changed blocks into
files of the next version in rounds before that checkpoint is due, so that the
checkpoint itself writes only what changed since its last round.  This module
holds its rules, free of MPI, I/O and clocks (tested with hypothesis):

* ``progress``: how far the run is from the last checkpoint to the next one,
  in [0, 1] (the interval policy's schedule knows it: steps for FixedSteps,
  seconds for the others).
* The dirty rate ``rate``: the fraction of the state that changes per unit of
  progress, measured by each round (the changed fraction since the previous
  round divided by the progress between them) and by each checkpoint (the
  fraction it found changed since the last round).
* Rounds: the first at ``progress >= start`` (a quarter earlier after a
  checkpoint that found a round still writing, and a stop when that happens
  with rounds starting at 0 already: the writes are too slow for the interval); each next one halfway between the
  last and the checkpoint, while the fraction expected to change before the
  checkpoint, ``rate * (1 - progress)``, exceeds ``target`` and fewer than
  ``max_rounds`` ran.  So a slowly changing state gets one or two rounds, a
  faster one more, each closer to the checkpoint.
* Stop: when ``rate * (1 - progress) >= stop_fraction`` (most of the state
  will change again before the checkpoint: every copy now would be written
  again), pre-copy stops for this interval, and is then skipped for
  ``backoff`` intervals (1, 2, 4, ... up to ``max_backoff`` after successive
  stops), after which one interval probes again.  A checkpoint that finds
  ``stop_fraction`` or more changed since its last round counts as a stop too.
* Probes: the interval after a stop (once its skipped intervals are over)
  runs its rounds as *probes* (:attr:`PrecopyPlan.copies` is False): they hash
  the state and copy nothing, so that measuring whether pre-copy pays again
  costs no write; the rounds and the stop follow the same rules, the
  checkpoint's figure counts what changed since the last probe.  A probe
  interval that does not stop makes the next interval copy again; one that
  stops backs off as above.  (A state that changes everywhere thus never has
  its copy written twice after its first interval.)
* Block size: pre-copy and its checkpoint use one block size, the same on
  every rank (the incremental grid is global), changed only at a commit of a
  version that used pre-copied blocks, from the global changed fraction the
  checkpoint found (identical on every rank, so no message is needed; never
  from one rank's own rounds): halved (down to ``min_block``) when under
  ``low``, doubled (up to ``max_block``) when over ``high``; a halving that did
  not cut the changed bytes by a quarter is undone and not tried again.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpcckpt.errors import CheckpointError


@dataclass(frozen=True)
class PrecopyConfig:
    """The knobs of pre-copy (``precopy=True`` takes the defaults; a dict of these sets them)."""

    start: float = 0.5
    max_rounds: int = 4
    target: float = 0.02
    stop_fraction: float = 0.5
    max_backoff: int = 8
    min_block: int = 64 << 10
    max_block: int = 16 << 20
    low: float = 0.10
    high: float = 0.25

    def __post_init__(self):
        for name in ("start", "target", "stop_fraction", "low", "high"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v <= 1.0:
                raise CheckpointError(f"precopy {name} must be a number in [0, 1], got {v!r}")
        for name in ("max_rounds", "max_backoff", "min_block", "max_block"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise CheckpointError(f"precopy {name} must be a positive integer, got {v!r}")
        if self.min_block > self.max_block or self.low > self.high:
            raise CheckpointError("precopy needs min_block <= max_block and low <= high")

    @classmethod
    def from_option(cls, value) -> "PrecopyConfig | None":
        """The configuration of the ``precopy`` option: False/None (off), True (defaults) or a dict of fields."""
        if value is None or value is False:
            return None
        if value is True:
            return cls()
        if isinstance(value, dict):
            unknown = set(value) - set(cls.__dataclass_fields__)
            if unknown:
                raise CheckpointError(f"unknown precopy settings {sorted(unknown)}")
            return cls(**value)
        raise CheckpointError(f"precopy must be True, False or a dict of settings, got {value!r}")


class PrecopyPlan:
    """The pre-copy state of one rank across intervals (see the module docstring for the rules).

    Per interval: :meth:`wants_round` at each call of the application, then
    :meth:`round_done` after each round; at the checkpoint's commit
    :meth:`checkpoint_done` and :meth:`adapt_block` (the next block size, from global figures only).
    """

    def __init__(self, config: PrecopyConfig, block_bytes: int):
        self.config = config
        self.block_bytes = min(max(int(block_bytes), config.min_block), config.max_block)
        self.start = config.start  # moved earlier when rounds were still writing at the checkpoint
        self.rounds = 0
        self.last_progress = 0.0
        self.rate: float | None = None
        self.stopped = False  # this interval
        self.skip = 0  # intervals still to skip after a stop
        self.backoff = 1
        self.probing = False  # this interval's rounds hash only (the first interval after a back-off)
        self._halved_from: tuple | None = None  # (block size, changed bytes) before the last halving
        self._halving_paid = True  # False once a halving was undone: the size is not halved again

    def next_progress(self) -> float:
        """The progress at which the next round is due."""
        if self.rounds == 0:
            return self.start
        return self.last_progress + (1.0 - self.last_progress) / 2.0

    def wants_round(self, progress: float) -> bool:
        """Whether to run a round now, at ``progress`` of the interval (never at 1 or past it: that is the save)."""
        if self.stopped or self.skip or self.rounds >= self.config.max_rounds or not 0.0 <= progress < 1.0:
            return False
        if self.rounds and self.rate is not None and self.rate * (1.0 - self.last_progress) <= self.config.target:
            return False  # what remains for the checkpoint is already small
        return progress >= self.next_progress()

    def round_done(self, progress: float, changed_fraction: float) -> bool:
        """Record a round at ``progress`` that found ``changed_fraction`` of the state changed since the previous
        one (the first: since the base version); False when pre-copy stops for this interval."""
        span = progress - self.last_progress if self.rounds else progress
        if self.rounds:  # the first round measures everything since the last checkpoint, not a rate
            self.rate = changed_fraction / max(span, 1e-9)
        self.rounds += 1
        self.last_progress = progress
        if self.rate is not None and self.rate * (1.0 - progress) >= self.config.stop_fraction:
            self._stop()
        return not self.stopped

    @property
    def copies(self) -> bool:
        """Whether this interval's rounds copy and write the blocks (False: probes that only hash them)."""
        return not self.probing

    def _stop(self) -> None:
        self.stopped = True
        self.skip = self.backoff
        self.backoff = min(self.backoff * 2, self.config.max_backoff)
        self.probing = True  # the interval after the skipped ones measures before it copies

    def checkpoint_done(self, changed_fraction: float, late: bool = False) -> None:
        """The checkpoint found ``changed_fraction`` of the whole state changed since the last round (a copy or a
        probe; a global figure, the same on every rank); the next interval starts.

        ``late``: a round of this rank was still writing at the checkpoint (its blocks were not used): the next
        intervals start their rounds a quarter earlier, and when they already start at 0 the writes are too slow
        for the interval and pre-copy stops as if it did not pay.
        """
        precopied = self.rounds > 0
        if late and not self.stopped:  # the figures say nothing of the dirty rate: only the pacing changes
            if self.start <= 0.0:
                self._stop()
            self.start = max(0.0, self.start - 0.25)
        elif precopied and not self.stopped and changed_fraction >= self.config.stop_fraction:
            self._stop()
        elif precopied and not self.stopped:
            self.backoff, self.probing = 1, False  # it pays (again): the next interval copies
        elif not precopied and self.skip:
            self.skip -= 1
        self.rounds, self.last_progress, self.rate, self.stopped = 0, 0.0, None, False

    def adapt_block(self, fraction: float, changed_bytes: int, precopied_anywhere: bool) -> int:
        """The block size of the next interval, from a checkpoint's global figures only (so that it is the same on
        every rank, whatever each rank's rounds did): ``fraction`` and ``changed_bytes`` changed since the rounds,
        ``precopied_anywhere``: some rank's rounds were used.  Unchanged after a checkpoint without pre-copy."""
        if precopied_anywhere:
            self._adapt_block(fraction, changed_bytes)
        return self.block_bytes

    def _adapt_block(self, fraction: float, changed_bytes: int) -> None:
        c = self.config
        if self._halved_from is not None:
            before, before_bytes = self._halved_from
            self._halved_from = None
            if changed_bytes > 0.75 * before_bytes:  # smaller blocks did not pay: back, and stay there
                self.block_bytes, self._halving_paid = before, False
                return
        if fraction < c.low and self._halving_paid and self.block_bytes // 2 >= c.min_block:
            self._halved_from = (self.block_bytes, changed_bytes)
            self.block_bytes //= 2
        elif fraction > c.high and self.block_bytes * 2 <= c.max_block:
            self.block_bytes *= 2

    @property
    def active(self) -> bool:
        """Whether this interval may still pre-copy (not stopped, not skipped)."""
        return not self.stopped and not self.skip


__all__ = ["PrecopyConfig", "PrecopyPlan"]
