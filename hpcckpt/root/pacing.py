"""When a Checkpointer saves: the collective side of the interval policy (hpcckpt.policy).

The decision logic itself is pure (policy.Schedule); this module adds what needs
a communicator, a clock and the process: rank 0's clock decides, a signal
caught on any rank counts for all, a halt file under the root (hpcckpt.root.halt)
is looked for by rank 0 only, the failure history under the checkpoint root is
updated by rank 0 only (a save's heartbeat written at most every
HEARTBEAT_SECONDS), and the answer costs one small allreduce.

Why a signal gives the same decision on every rank: each rank reads its flag
just before the allreduce, and the allreduce (MAX) hands every rank the same
result.  A signal that arrives after the read, on one rank or on all, is
counted at the next decision, again by all ranks; the handler never raises
(hpcckpt.policy.signals), so it cannot take one rank out of a collective.

The failure history is bookkeeping: a write that fails (read-only root, disk
full, EIO) is one warning on rank 0, after which this run keeps its history in
memory only (no further writes, no further warnings); no rank ever raises for it.
"""

from __future__ import annotations

import signal
import time

from hpcckpt.core.warn import warn
from hpcckpt.root import halt
from hpcckpt.mpi.collective import allreduce_checked, best_effort
from hpcckpt.policy import FailureHistory, Learned, Schedule, SignalFlag, end_time_from_env
from hpcckpt.policy.policies import Policy
from hpcckpt.storage import POSIX, Storage

#: Codes of the decision allreduce (MAX wins): a signal beats a halt file beats a deadline beats the interval.
_NONE, _INTERVAL, _DEADLINE, _HALT, _SIGNAL = 0, 1, 2, 3, 4
_REASONS = {_NONE: None, _INTERVAL: "interval", _DEADLINE: "deadline", _HALT: "halt", _SIGNAL: "signal"}
#: The reasons after which the job should stop (``should_exit``).
FINAL = ("signal", "halt", "deadline")
#: Seconds between two writes of the failure history for the heartbeats of saves: a code saving every second
#: rewrites (and fsyncs) the file at most this often; a failed run's exposure is then short by less than this.
HEARTBEAT_SECONDS = 30.0


class Pacer:
    """The per-job state behind ``Checkpointer.should_save/maybe_save/should_exit``.

    ``policy``: a policy object (default ``Learned`` with ``mtbf`` as prior),
    ``deadline``: epoch seconds (default SLURM_JOB_END_TIME), ``handle_signals``:
    install SIGUSR1/SIGTERM/SIGINT handlers now (True), at the first decision or
    save (None) or never (False); ``track_failures``: keep the failure history
    under ``root``; ``storage``: where ``root`` lives (its halt file and failure
    history are read and written there).  After a final decision, ``final_reason`` is 'signal', 'halt'
    or 'deadline' and ``stop_reason`` says it for people, the same on every rank.
    """

    def __init__(self, comm, root: str, policy: Policy | None = None, mtbf: float | None = None,
                 deadline: float | None = None, handle_signals: bool | None = None,
                 track_failures: bool = True, storage: Storage = POSIX):
        self.comm = comm
        self.root = root
        self.storage = storage
        self.signals = SignalFlag()
        self.handle_signals = handle_signals
        self.final_reason: str | None = None
        self.stop_reason: str | None = None
        self.history = None
        self.schedule = None
        self.progress = 0.0  # rank 0's progress towards the next checkpoint at the last decision (pre-copy)
        self._persisted = float("-inf")  # when rank 0 last wrote the failure history
        if handle_signals:
            self.signals.install()
        if comm.Get_rank() == 0:
            if track_failures:
                self.history = FailureHistory.load(root, storage=storage)
                from hpcckpt.slurm import detect  # lazily: `python -m hpcckpt.slurm` must not find it imported

                job = detect()  # SLURM job id and restart count, None outside SLURM
                self.history.job_start(time.time(), job_id=job.job_id, restart_count=job.restart_count,
                                       persist=False)
                self._persist("recording the job start")
            policy = policy if policy is not None else Learned(prior_mtbf=mtbf, history=self.history)
            end = deadline if deadline is not None else end_time_from_env()
            self.schedule = Schedule(policy, mtbf=mtbf if not isinstance(policy, Learned) else None,
                                     deadline=end, start_time=time.time())

    def arm(self) -> None:
        """Before a decision or a save: install the handlers now if ``handle_signals=None`` (the Checkpointer
        adopts replaced ones at each of its collective calls)."""
        if self.handle_signals is None and not self.signals.installed:
            self.signals.install()

    def decide(self, step: int) -> str | None:
        """Collective: why to save now ('signal', 'halt', 'deadline', 'interval') or None, the same on every rank."""
        self.arm()
        mine = (_SIGNAL, self.signals.signum or 0, "") if self.signals.is_set else (_NONE, 0, "")
        progress = 0.0
        if self.schedule is not None:  # rank 0
            try:
                reason = halt.requested(self.root, self.storage)
                if reason is not None:
                    mine = max(mine, (_HALT, 0, reason))
                now = time.time()
                d = self.schedule.decide(now, step, signalled=False)
                mine = max(mine, ({"deadline": _DEADLINE, "interval": _INTERVAL}.get(d.reason, _NONE), 0, ""))
                progress = self.schedule.progress(now, step)
            except Exception as exc:  # noqa: BLE001 - a policy bug must not leave the other ranks waiting
                warn(f"hpcckpt: the checkpoint policy failed ({exc}); not saving at step {step}")
        # rank 0's progress rides last: the tuples of the other ranks tie with rank 0's up to it unless a save
        # is decided anyway (a signal), so MAX hands every rank rank 0's progress when it matters
        mine = mine + (progress,)
        code, signum, detail, self.progress = mine if self.comm.Get_size() == 1 else \
            allreduce_checked(self.comm, f"the checkpoint decision at step {step}", None, mine, max)
        reason = _REASONS[code]
        if reason in FINAL and self.final_reason is None:
            self.final_reason = reason
            self.stop_reason = describe_stop(reason, signum, detail, self.root)
        return reason

    def record_save(self, step: int, blocking_seconds: float) -> None:
        """Feed the measured blocking cost of a save (rank 0's) to the schedule and the history (the history's
        file is rewritten for it at most every HEARTBEAT_SECONDS: small frequent saves do not pay a write and
        an fsync each)."""
        if self.schedule is not None:
            now = time.time()
            self.schedule.record_save(now, step, blocking_seconds)
            if self.history is not None:
                self.history.heartbeat(now, persist=False)
                if now - self._persisted >= HEARTBEAT_SECONDS:
                    self._persist("recording a checkpoint")

    def close(self) -> None:
        """Record a clean end of this run (the job stopped on purpose), restore the signal handlers, and
        remove the halt file this run honoured (rank 0: the next run of the same command continues)."""
        self.signals.uninstall()
        if self.final_reason == "halt" and self.comm.Get_rank() == 0:
            best_effort(f"removing the halt file {halt.halt_path(self.root)!r}",
                        lambda: halt.withdraw(self.root, self.storage))
        if self.history is not None:  # rank 0
            self.history.clean_end(time.time(), self.final_reason or "completed", persist=False)
            self._persist("recording the clean end")

    def _persist(self, event: str) -> None:
        """Rank 0: write the history; on failure warn once and keep it in memory only (see the module doc)."""
        self._persisted = time.time()
        if self.history.directory is not None and not best_effort(
                f"writing the failure history under {self.root!r} ({event})", self.history.save):
            self.history.directory = None


def describe_stop(reason: str, signum: int, detail: str, root: str) -> str:
    """What asked the job to stop, for people: 'SIGTERM', 'halt file ROOT/.hpcckpt-halt (TEXT)', 'deadline'."""
    if reason == "signal":
        try:
            return signal.Signals(signum).name
        except ValueError:
            return f"signal {signum}"
    if reason == "halt":
        return f"halt file {halt.halt_path(root)}" + (f" ({detail})" if detail else "")
    return "the job's end time (deadline) is near"
