"""Failure history persisted as JSON under the checkpoint root.

Why: the MTBF that sets the checkpoint interval is not known in advance; it is
learned from how this job's earlier runs ended.  A run that started and never
ended cleanly was killed (node failure, crash, pre-emption without warning),
which is only visible at the *next* start, so the history must persist.

File: ``<directory>/failure_history.json`` (written only by the caller that owns
it -- rank 0 in an MPI job; this module does no MPI)::

    {"format": "hpcckpt-failure-history", "version": 1,
     "runs": [{"job_id": "123", "restart_count": 0, "start": 1700000000.0,
               "last_alive": 1700003600.0, "end": null, "end_reason": null,
               "failed": null, "exposure": null}, ...]}

Events and their rules:

* ``job_start(time, job_id, restart_count)`` -- if the previous run is still open
  (no ``clean_end``), it is closed as a **failure**.  Its exposure (time at
  risk) is ``last_alive - start`` when a heartbeat / save time was recorded,
  otherwise ``time - start`` (the next start time: an upper bound, since the
  gap before the restart includes queueing).  ``restart_count`` is the
  caller-supplied ``SLURM_RESTART_COUNT`` (this module never reads the
  environment): if it grew by more than one since the previous run of the same
  ``job_id``, the missing attempts died before they could record a start and
  are added as failures with zero exposure.
* ``heartbeat(time)`` -- the current run was alive at ``time`` (call it after
  each checkpoint, throttled: every call rewrites the file).
* ``clean_end(time, reason="completed")`` -- the run ended on purpose (finished,
  or stopped after a wall-time / signal checkpoint); it becomes a right-censored
  observation with exposure ``time - start``.

The file is read and written through a Storage (POSIX by default).  Every
write replaces the file atomically (``Storage.atomic_write``: on POSIX a
temporary file in the same directory, fsync'ed, then renamed over it).  A missing file is an
empty history; an unreadable file (or a FIFO, device or directory in its place,
or one over 64 MiB) produces a ``RuntimeWarning`` and an in-memory history that
this run does not write; a malformed file produces a ``RuntimeWarning``
and an empty history (the bad file is kept as ``failure_history.json.bad``),
never an exception.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from typing import List, Optional, Tuple

from hpcckpt.core.warn import warn
from hpcckpt.errors import CheckpointError
from hpcckpt.storage import POSIX, Storage

__all__ = ["FailureHistory", "RunRecord", "HISTORY_FILENAME"]

HISTORY_FILENAME = "failure_history.json"
_FORMAT = "hpcckpt-failure-history"
_VERSION = 1
#: Larger than any real history (a run is ~200 bytes): a longer file is not read.
MAX_HISTORY_BYTES = 64 << 20


@dataclass
class RunRecord:
    """One run (one job start).  ``failed`` is None while the run is open."""

    start: float
    job_id: Optional[str] = None
    restart_count: Optional[int] = None
    last_alive: Optional[float] = None
    end: Optional[float] = None
    end_reason: Optional[str] = None
    failed: Optional[bool] = None
    exposure: Optional[float] = None

    @property
    def is_open(self) -> bool:
        return self.failed is None


def _num(x, name, allow_none=False):
    if x is None and allow_none:
        return None
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        raise ValueError(f"bad {name}: {x!r}")
    return float(x)


def _record_from_json(d) -> RunRecord:
    if not isinstance(d, dict):
        raise ValueError("run entry is not an object")
    failed = d.get("failed")
    if failed not in (None, True, False):
        raise ValueError("bad failed flag")
    rc = d.get("restart_count")
    if rc is not None and (isinstance(rc, bool) or not isinstance(rc, int)):
        raise ValueError("bad restart_count")
    job_id = d.get("job_id")
    rec = RunRecord(
        start=_num(d.get("start"), "start"),
        job_id=None if job_id is None else str(job_id),
        restart_count=rc,
        last_alive=_num(d.get("last_alive"), "last_alive", True),
        end=_num(d.get("end"), "end", True),
        end_reason=None if d.get("end_reason") is None else str(d.get("end_reason")),
        failed=failed,
        exposure=_num(d.get("exposure"), "exposure", True),
    )
    if rec.failed is not None and (rec.exposure is None or rec.exposure < 0):
        raise ValueError("closed run without a valid exposure")
    return rec


def _check_time(t, name="time") -> float:
    try:
        x = float(t)
    except (TypeError, ValueError):
        raise CheckpointError(f"{name} must be a number, got {t!r}") from None
    if not math.isfinite(x):
        raise CheckpointError(f"{name} must be finite, got {t!r}")
    return x


@dataclass
class FailureHistory:
    """The runs of one job (or one checkpoint root), loaded from and saved to JSON.

    Use :meth:`load` to open ``<directory>/failure_history.json`` (in
    ``storage``); with ``directory=None`` the history lives in memory only
    (tests, simulator).
    """

    directory: Optional[str] = None
    runs: List[RunRecord] = field(default_factory=list)
    filename: str = HISTORY_FILENAME
    storage: Storage = field(default=POSIX, repr=False, compare=False)

    # ----------------------------------------------------------------- I/O
    @property
    def path(self) -> Optional[str]:
        return None if self.directory is None else os.path.join(self.directory, self.filename)

    @classmethod
    def load(cls, directory: Optional[str], filename: str = HISTORY_FILENAME,
             read_only: bool = False, storage: Storage = POSIX) -> "FailureHistory":
        """Read the history under ``directory`` in ``storage``; missing -> empty, malformed -> warning + empty
        (and set aside as ``.bad``, unless ``read_only``: a listing tool changes nothing under a root)."""
        h = cls(directory=directory, filename=filename, storage=storage)
        path = h.path
        if path is None:
            return h
        try:
            text = storage.read_file(path, MAX_HISTORY_BYTES)  # never blocks (a FIFO in its place is refused)
        except FileNotFoundError:  # none yet (a link to nothing included)
            return h
        except (OSError, CheckpointError) as exc:  # unreadable now (EACCES, EIO, too long): keep it, work in memory
            warn(f"hpcckpt: cannot read the failure history {path} ({exc}); not updating it this run",
                 RuntimeWarning)
            h.directory = None
            return h
        try:
            data = json.loads(text)
            if not isinstance(data, dict) or data.get("format") != _FORMAT:
                raise ValueError("not an hpcckpt failure history")
            if data.get("version") != _VERSION:
                raise ValueError(f"unsupported version {data.get('version')!r}")
            runs = data.get("runs")
            if not isinstance(runs, list):
                raise ValueError("'runs' is not a list")
            h.runs = [_record_from_json(r) for r in runs]
            for a, b in zip(h.runs, h.runs[1:]):
                if a.is_open:
                    raise ValueError("an open run is followed by another run")
        except (ValueError, TypeError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            warn(
                f"hpcckpt: ignoring malformed failure history {path} ({exc}); starting a fresh one",
                RuntimeWarning,
            )
            h.runs = []
            if read_only:
                return h
            try:
                storage.replace(path, path + ".bad")  # keep the evidence next to the fresh history
            except OSError as move_error:
                warn(f"hpcckpt: could not set {path} aside: {move_error}", RuntimeWarning)
        return h

    def save(self) -> None:
        """Write the history atomically and durably (Storage.atomic_write); no-op in memory."""
        path = self.path
        if path is None:
            return
        self.storage.make_directories(self.directory)
        payload = {"format": _FORMAT, "version": _VERSION, "runs": [asdict(r) for r in self.runs]}
        self.storage.atomic_write(path, json.dumps(payload, indent=1, allow_nan=False).encode())

    # -------------------------------------------------------------- events
    @property
    def current(self) -> Optional[RunRecord]:
        """The open run, if any."""
        return self.runs[-1] if self.runs and self.runs[-1].is_open else None

    def job_start(self, time: float, job_id=None, restart_count: Optional[int] = None,
                  persist: bool = True) -> List[RunRecord]:
        """Record a start; close a still-open previous run as a failure.

        Returns the runs newly counted as failures (possibly empty).
        """
        t = _check_time(time)
        if restart_count is not None:
            try:
                restart_count = int(restart_count)
            except (TypeError, ValueError):
                raise CheckpointError(f"restart_count must be an integer, got {restart_count!r}") from None
            if restart_count < 0:
                raise CheckpointError(f"restart_count must be >= 0, got {restart_count}")
        job_id = None if job_id is None else str(job_id)
        new_failures: List[RunRecord] = []
        prev = self.current
        if prev is not None:
            alive = prev.last_alive if prev.last_alive is not None else t
            prev.failed = True
            prev.end = alive
            prev.end_reason = "failure (detected at next start)"
            prev.exposure = max(0.0, alive - prev.start)
            new_failures.append(prev)
        # Attempts that SLURM restarted but that never recorded a start.
        if restart_count is not None and job_id is not None:
            last_same = next((r for r in reversed(self.runs)
                              if r.job_id == job_id and r.restart_count is not None), None)
            if last_same is not None:
                missing = restart_count - last_same.restart_count - 1
                for i in range(max(0, missing)):
                    rec = RunRecord(start=t, job_id=job_id,
                                    restart_count=last_same.restart_count + 1 + i,
                                    end=t, end_reason="failure (restart count gap)",
                                    failed=True, exposure=0.0)
                    self.runs.append(rec)
                    new_failures.append(rec)
        self.runs.append(RunRecord(start=t, job_id=job_id, restart_count=restart_count))
        if persist:
            self.save()
        return new_failures

    def heartbeat(self, time: float, persist: bool = True) -> None:
        """Note that the open run was alive at ``time`` (e.g. after a checkpoint)."""
        t = _check_time(time)
        cur = self.current
        if cur is None:
            return
        cur.last_alive = t if cur.last_alive is None else max(cur.last_alive, t)
        if persist:
            self.save()

    def clean_end(self, time: float, reason: str = "completed", persist: bool = True) -> None:
        """Close the open run as not failed (a right-censored observation)."""
        t = _check_time(time)
        cur = self.current
        if cur is None:
            return
        cur.failed = False
        cur.end = t
        cur.end_reason = str(reason)
        cur.exposure = max(0.0, t - cur.start)
        if persist:
            self.save()

    # ------------------------------------------------------------ summaries
    def observations(self, now: Optional[float] = None) -> List[Tuple[float, bool]]:
        """``(exposure_seconds, failed)`` for every closed run; the open run is
        added as censored ``(now - start, False)`` when ``now`` is given."""
        obs = [(r.exposure, bool(r.failed)) for r in self.runs if not r.is_open]
        cur = self.current
        if cur is not None and now is not None:
            obs.append((max(0.0, _check_time(now) - cur.start), False))
        return obs

    @property
    def n_failures(self) -> int:
        return sum(1 for r in self.runs if r.failed)

    def total_exposure(self, now: Optional[float] = None) -> float:
        return sum(e for e, _ in self.observations(now))
