"""Numbered versions under one root: the object an application's time loop talks to."""

from __future__ import annotations

import functools
import os
import time
import weakref

from hpcckpt.core.warn import warn
from hpcckpt.root import lock as rootlock
from hpcckpt.mpi.collective import agree, attempt, bcast_checked, on_root, resolve_comm
from hpcckpt.root.catalog import KnownNames, current, list_versions, retained
from hpcckpt.core.names import METADATA_FILE
from hpcckpt.errors import CheckpointError, TemplateMismatchError
from hpcckpt.root.files import FileTracker, rollback
from hpcckpt.loading.load import load_version, reads_metadata_itself, version_metadata
from hpcckpt.root.pacing import Pacer
from hpcckpt.options import SaveOptions, SaveResult
from hpcckpt.saving.pipeline import is_incremental
from hpcckpt.saving.run import SaveRequest, Series, save_now
from hpcckpt.storage import POSIX, Storage
from hpcckpt.storage.s3 import storage_for
from hpcckpt.transport import io_history


#: ``restore()``'s default state: the registered one (a sentinel, as ``None`` asks for no template).
_REGISTERED = object()


def _shielded(method):
    """A collective method: signals arriving inside it only set the flag; chained application handlers wait
    until it returns (hpcckpt.policy.signals), so no rank leaves a collective the others are in."""
    @functools.wraps(method)
    def shielded(self, *args, **kwargs):
        self.pacer.signals.adopt_replacements()  # an application handler that replaced ours: chain to it, warn once
        with self.pacer.signals.deferred():
            return method(self, *args, **kwargs)
    return shielded


class Checkpointer:
    """Saves numbered versions of a state under ``root`` and restores the newest valid one.

    ``keep=N`` retains the newest N committed versions (older ones are deleted
    after each successful save); ``options`` are the defaults for every save
    (see :class:`hpcckpt.options.SaveOptions`).  All methods are collective over
    ``comm``: every rank calls them in the same order.

    The state is read when a save starts: a plain ``Block(u)`` saves the array
    object it was built with, so a code that rebinds ``u`` (``u, un = un, u``)
    must build its state at each save: :meth:`register` an object with
    ``state_dict()``/``load_state_dict(d)`` or a callable returning the dict,
    or use getter Blocks ``Block(lambda: u, ...)`` (see hpcckpt.stateful).
    Nested dicts of Blocks are stored as ``"group/name"`` and restored nested.

    When to save can be left to :meth:`maybe_save`: ``policy`` (an
    ``hpcckpt.policy`` object; default ``Learned``: Daly's interval with the
    failure rate learned from the history kept under ``root``, ``mtbf`` seconds
    as its prior), ``deadline`` (epoch seconds; default SLURM_JOB_END_TIME),
    ``handle_signals`` (SIGUSR1/SIGTERM/SIGINT request a final checkpoint;
    handlers installed now if True, at the first ``should_save``/``maybe_save``/
    ``save`` if None, never if False; they chain to the application's own
    handlers, and one that replaces ours is noticed at the next collective
    call, warned about once and chained to: hpcckpt.policy.signals) and
    ``track_failures`` (record job starts and clean ends under ``root``; call
    :meth:`close` at the end, or the run counts as failed).  A halt file
    ``ROOT/.hpcckpt-halt`` (``hpcckpt halt ROOT``) asks for a final checkpoint
    too (hpcckpt.root.halt); :attr:`stop_reason` says what asked.

    ``files``: output files to keep consistent with the versions (paths or
    globs, append-only; a dict pattern -> ``"append"``/``"inplace"``): each
    save records them, a restore rolls them back (:meth:`track_files`,
    docs/files.md).

    One job writes a root at a time: the first save takes the lock
    ``ROOT/.hpcckpt-lock`` (rank 0; see :mod:`hpcckpt.root.lock`), :meth:`close`
    releases it, and a save while another live job holds it is a
    CheckpointError on every rank naming the holder (``break_lock=True`` takes
    over a lock whose job is known to be gone).  Restoring needs no lock and
    works from a read-only root.

    Read-only attributes for monitoring and tools: ``engine`` (the
    asynchronous / multi-level engine, hpcckpt.saving.asynchronous.Engine, or None for
    blocking saves), ``chain_base`` (the version the next incremental save
    builds on: the one saved or restored last), ``last_restored`` and
    ``last_result`` (the SaveResult of the newest committed save).
    """

    #: Where the root lives: the root directory, its versions' listing, retention, the writer lock, the halt
    #: file and the failure and bandwidth histories go through it.  POSIX directories; the versions themselves
    #: are written and read by the save and load paths, in their own default storage, POSIX as well.
    storage: Storage = POSIX
    #: Where the node-local levels' directories live (``local_dir``): a node-local file system, whatever storage
    #: the root is in (an ``s3://`` root's L4 flush copies from here to the bucket).
    local_storage: Storage = POSIX

    def __init__(self, root, comm=None, keep: int | None = None, *, policy=None, mtbf: float | None = None,
                 deadline: float | None = None, handle_signals: bool | None = None,
                 track_failures: bool = True, break_lock: bool = False, files=None, **options):
        self.root = os.fspath(root)
        self.storage = storage_for(self.root, self.storage)  # an s3://bucket/prefix root: an S3Storage
        self.comm = resolve_comm(comm)
        if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 1):
            raise CheckpointError(f"keep must be a positive integer or None, got {keep!r}")
        self.keep = keep
        from hpcckpt.saving.asynchronous import EngineOptions, pop_engine_options  # asynchronous / multi-level saves

        engine_keywords = pop_engine_options(options)
        self.files = agree(self.comm, f"creating {self.root!r}", lambda: FileTracker(files))
        # validated inside the first collective: an invalid option on one rank is the same error on every rank
        self.options = agree(self.comm, f"creating {self.root!r}", lambda: SaveOptions.from_kwargs(**options))
        engine_options = agree(self.comm, f"creating {self.root!r}", lambda: EngineOptions.from_kwargs(
            **engine_keywords))
        if engine_keywords.get("precopy") not in (None, False) and not is_incremental(self.options):
            raise CheckpointError(
                "precopy needs incremental=True: pre-copy writes ahead the blocks that changed since the previous "
                "checkpoint, and the checkpoint reuses one only if its content hash at the call matches; only an "
                "incremental save hashes its blocks and points at blocks written before the call, a full save "
                "(incremental=False) writes every block at the call")
        #: What the saves under this root share from one to the next (saving/run.py)
        self.series = Series(root=self.root, storage=self.storage, names=KnownNames(self.root), keep=keep,
                             tracker=self.files)
        self.last_restored: str | None = None
        self._closed = False
        self._registered = None  # the state of register(): read at every save/restore given none
        self._break_lock = bool(break_lock)
        self._unlock = None  # set once the writer lock is held (every rank alike); releases it
        agree(self.comm, f"creating {self.root!r}",
              lambda: on_root(self.comm, lambda: self.storage.make_directories(self.root)))
        self.pacer = agree(self.comm, f"starting the checkpoint policy under {self.root!r}", lambda: Pacer(
            self.comm, self.root, policy=policy, mtbf=mtbf, deadline=deadline, handle_signals=handle_signals,
            track_failures=track_failures, storage=self.storage))
        self.engine = None
        if engine_options.wanted:
            from hpcckpt.saving.asynchronous import Engine

            self.engine = Engine(self, engine_options)
        self._engine_options = engine_options

    def resize(self, comm) -> None:
        """Continue on ``comm`` after the job changed its rank count (hpcckpt.redistribute; docs/malleability.md).

        Called by every rank of this Checkpointer's communicator: a rank that
        stays passes the new communicator, a rank that leaves passes None (its
        Checkpointer is closed here without the collective bookkeeping of
        :meth:`close`).  Collective over ``comm`` with the joining ranks'
        :meth:`join`.  Rank 0 must stay rank 0 (it holds the writer lock and
        the failure history), otherwise every rank raises a CheckpointError.
        The next save is planned afresh on the new ranks and, if incremental,
        continues the chain (incremental saves are independent of the rank
        count).  An asynchronous save in flight is committed first; with
        node-local levels the newest version is flushed to the root, and the
        levels start afresh on the new ranks (their node directories and
        parity groups follow the new layout).  Per-rank tracked files of a
        rank that left are recorded from then on by rank ``i % n`` of the
        ``n`` ranks, so a restore rolls them back too.
        """
        self._check_open()
        was_root = self.comm.Get_rank() == 0
        if self.engine is not None:  # collective over the old ranks: the leaving ones take part
            self.engine.close()
        if comm is None or _is_null(comm):
            if was_root:
                raise CheckpointError(f"rank 0 of the Checkpointer for {self.root!r} cannot leave: it holds the "
                                      "writer lock and the failure history; let another rank leave")
            self._closed = True
            self.pacer.signals.uninstall()
            return
        comm = resolve_comm(comm)
        _resize_agreed(comm, self.root, lambda: self._resize_config(was_root))
        self.comm = self.pacer.comm = comm
        self.series.cache.invalidate()
        self.files.ranks_seen(comm.Get_size())
        if self.engine is not None:
            from hpcckpt.saving.asynchronous import Engine

            self.series.levels = self.series.precopy = None
            self.engine = Engine(self, self._engine_options)

    def _resize_config(self, was_root: bool) -> dict:
        """Rank 0 of the new communicator: what a joining rank needs to continue this Checkpointer."""
        if not was_root:
            raise CheckpointError("rank 0 of the new communicator must be rank 0 of the old one (it holds the "
                                  "writer lock and the failure history)")
        return {"root": self.root, "files": self.files.patterns, "owners": self.files.owners, "keep": self.keep,
                "options": self.options, "engine": self._engine_options, "chain_base": self.chain_base,
                "last_restored": self.last_restored, "handle_signals": self.pacer.handle_signals,
                "break_lock": self._break_lock, "locked": self._unlock is not None}

    @classmethod
    def join(cls, comm) -> "Checkpointer":
        """The Checkpointer of a rank joining a job that grew (MPI.Comm_spawn + Merge): collective over ``comm``
        with the staying ranks' :meth:`resize` (their root, options and chain continue here)."""
        comm = resolve_comm(comm)
        config = _resize_agreed(comm, "a joined Checkpointer", _joining_root)
        self = cls.__new__(cls)
        self.root, self.comm, self.keep, self.options = config["root"], comm, config["keep"], config["options"]
        self.storage = storage_for(self.root, self.storage)
        self.last_restored, self._closed, self._registered = config["last_restored"], False, None
        self._break_lock = config["break_lock"]
        self.files = FileTracker.following(config["files"], config["owners"])
        self.files.ranks_seen(comm.Get_size())
        self.series = Series(root=self.root, storage=self.storage, names=KnownNames(self.root), keep=self.keep,
                             tracker=self.files, chain_base=config["chain_base"])
        # the lock is rank 0's; the other ranks only mark that it was taken, so the next save agrees on it
        self._unlock = weakref.finalize(self, rootlock.release, None) if config["locked"] else None
        self.pacer = Pacer(comm, self.root, handle_signals=config["handle_signals"],  # not rank 0: no history
                           storage=self.storage)
        self._engine_options, self.engine = config["engine"], None
        if self._engine_options.wanted:
            from hpcckpt.saving.asynchronous import Engine

            self.engine = Engine(self, self._engine_options)
        return self

    def _restore_listing(self, step: int | None) -> tuple[list, dict]:
        """The live versions and ``{path: (failure, metadata)}`` of the one a restore tries first (the newest,
        of ``step`` if given), read by rank 0 with the listing: one broadcast for both (the load makes none of
        its own; loading.load_version).  An asynchronous engine's own listing comes without metadata, and so
        does a listing for a load whose ranks read the metadata themselves (loading.load.reads_metadata_itself:
        no pickled metadata in the broadcast, and each rank reuses what it parsed before)."""
        self._check_open()
        if self.engine is not None:
            live = self.engine.live()  # commits a pending asynchronous save first
            if live is not None:
                return live, {}
        own = self.storage.shared_files and reads_metadata_itself(self.comm.Get_size())

        def list_and_read():
            live = current(list_versions(self.root, self.storage))
            wanted = [e for e in live if step is None or e.step == step]
            if not wanted or own:
                return live, {}
            meta, failure = attempt(lambda: version_metadata(wanted[-1].path, self.storage,
                                                                    expect_step=wanted[-1].step))
            return live, {wanted[-1].path: (failure, meta)}

        return bcast_checked(self.comm, f"listing {self.root!r}", list_and_read)

    def _committed_here(self) -> list:
        """The committed versions as this rank reads them now, without MPI (see :meth:`steps`)."""
        self._check_open()
        try:
            if self.engine is not None:
                return retained(self.engine.committed_here(), self.keep)
            return retained(list_versions(self.root, self.storage), self.keep)
        except OSError as exc:
            raise CheckpointError(f"listing {self.root!r} failed on rank {self.comm.Get_rank()}: "
                                  f"{type(exc).__name__}: {exc}") from exc

    @_shielded
    def latest(self) -> int | None:
        """The newest committed step, or None; not collective (see :meth:`steps`)."""
        live = self._committed_here()
        return live[-1].step if live else None

    @_shielded
    def steps(self) -> list[int]:
        """Every committed step, oldest first; not collective: any subset of the ranks may call it.

        The calling rank reads the catalog from the file system (the root's
        committed versions, and with ``local_dir`` its own node directory's,
        less those ``keep`` retires: rank 0 may still be deleting them), so
        every rank sees what the collective :meth:`restore` would choose from.
        An asynchronous save still pending (its SaveResult says ``pending``) is
        not listed: it is committed by the next collective call (``save``,
        ``should_save``/``maybe_save`` once written, ``wait``, ``restore``,
        ``close``); call :meth:`wait` on every rank first to see it.
        """
        return [e.step for e in self._committed_here()]

    def register(self, state) -> "Checkpointer":
        """Keep ``state`` for every later :meth:`save`, :meth:`maybe_save` and :meth:`restore` called without one.

        ``state``: a Stateful object (``state_dict()`` / ``load_state_dict(d)``),
        a callable returning the state dict, or a dict (of getter Blocks, for
        arrays the application rebinds); it is read at every save, so
        ``ck.register(sim)`` once, then ``ck.maybe_save(step)`` in the loop.
        Returns the Checkpointer.  Not collective.
        """
        if isinstance(state, int) or state is None:
            raise CheckpointError(f"register needs a state (a dict, Stateful object or callable), got {state!r}")
        self._registered = state
        return self

    def track_files(self, files, mode: str = "append", block_bytes: int = 1 << 20) -> "Checkpointer":
        """Track output files: every later save records them, every restore rolls them back (docs/files.md).

        ``files``: a path or glob, or a list of them; ``{rank}`` in a path
        makes it one file per rank (each rank records its own), any other
        path is recorded by rank 0.  ``mode``: ``"append"`` (the file only
        grows: its length and the checksum of its last ``block_bytes`` are
        recorded) or ``"inplace"`` (rewritten anywhere: its blocks of
        ``block_bytes`` that changed since the previous save are stored).
        Call it on every rank alike, before the saves.  Returns the Checkpointer.
        """
        self.files.track(files, mode, block_bytes)
        return self

    def _state_and_step(self, state, step, what: str):
        """``(state, step)`` of a call that may omit the state (a registered one) or pass the step first."""
        if step is None and isinstance(state, int) and not isinstance(state, bool):
            state, step = None, state  # ck.save(10) with a registered state
        if state is None:
            state = self._registered
            if state is None:
                raise CheckpointError(f"{what} without a state: pass one, or call register(state) first")
        return state, step

    @_shielded
    def save(self, state=None, step: int | None = None, **options) -> SaveResult:
        """Write ``state`` as version ``step``, commit it, then apply retention; collective.

        ``state``: a dict, a Stateful object or a callable returning the dict
        (read now; see hpcckpt.stateful), or omitted for the registered one
        (``ck.save(step)``).  Retention is bookkeeping: a deletion that fails
        is a warning on rank 0.  When the save returns, the versions retention
        removes are no longer committed (their metadata.json is gone); their
        directories are deleted by a worker thread of rank 0, which a save
        that lists the root (one that plans collectively) and :meth:`close`
        wait for (catalog.Retirement).  A repeated full save with
        ``strategy="file-per-rank"`` makes two collectives, the commit's gather and broadcast (saving/run.py).
        """
        state, step = self._state_and_step(state, step, "save")
        self._check_open()
        self.pacer.arm()
        what = f"save of step {step!r} under {self.root!r}"
        self._lock(what)
        t0 = time.perf_counter()
        engine = self.engine
        request = SaveRequest(state, step, {**self.options.__dict__, **options},
                              background=engine is not None and engine.asynchronous, defaults=self.options)
        result = engine.save(request) if engine is not None else save_now(self.comm, self.series, request)[0]
        self.pacer.record_save(step, time.perf_counter() - t0)
        if self.should_exit():  # the final checkpoint is committed: now an application handler may stop us
            self.pacer.signals.raise_pending()
        return result

    def _lock(self, what: str) -> None:
        """Collective, at the first save: rank 0 takes the root's writer lock, or every rank raises the same error.

        Not at construction: a restore-only use (another job's root, a
        read-only root) must work without it.  Released by :meth:`close`, or
        at interpreter exit for a Checkpointer never closed.  At a later save,
        on a root whose lock is a lease (an object store), rank 0 renews it
        (hpcckpt.root.lock.renew): one more collective.
        """
        if self._unlock is not None:
            if self.storage.conditional_writes:  # the same on every rank: one storage per root
                agree(self.comm, what, lambda: on_root(self.comm, lambda: rootlock.renew(self._held_lock())))
            return
        lock = agree(self.comm, what, lambda: on_root(self.comm, lambda: rootlock.acquire(self.root,
                                                                                         self._break_lock,
                                                                                         self.storage)))
        self._unlock = weakref.finalize(self, rootlock.release, lock)

    def _held_lock(self):
        """Rank 0: the RootLock its release (``_unlock``) holds; None elsewhere and once released."""
        held = self._unlock.peek() if self._unlock is not None else None
        return held[2][0] if held else None

    @_shielded
    def should_save(self, step: int) -> bool:
        """Collective: whether to checkpoint at this step (interval due, deadline near, or a signal).

        Rank 0's clock decides; a signal on any rank counts; one small allreduce.
        """
        self._check_open()
        if self.engine is not None:
            self.engine.poll()  # commits a finished asynchronous save without waiting for an unfinished one
        return self.pacer.decide(step) is not None

    def maybe_save(self, state=None, step: int | None = None, **options) -> SaveResult | None:
        """Save if :meth:`should_save` says so; the SaveResult, or None when no save was due.

        ``ck.maybe_save(step)`` saves the registered state (:meth:`register`).
        With ``precopy=True`` a step at which no save is due may run a pre-copy
        round (hpcckpt.saving.precopy): the changed blocks written ahead of the next save.
        """
        state, step = self._state_and_step(state, step, "maybe_save")
        if self.should_save(step):
            return self.save(state, step, **options)
        if self.engine is not None and self.engine.precopy is not None:  # no MPI: a round if one is due
            self.engine.precopy.maybe_round(state, step, self.pacer.progress)
        return None

    def should_exit(self) -> bool:
        """True on every rank once a decision was taken for a signal, the halt file or the deadline: stop now."""
        return self.pacer.final_reason is not None

    @property
    def stop_reason(self) -> str | None:
        """What made :meth:`should_exit` True, the same on every rank: the signal's name ('SIGTERM'), the halt
        file (with its reason) or the deadline; None before."""
        return self.pacer.stop_reason

    @_shielded
    def restore(self, state=_REGISTERED, step: int | None = None, strict: bool | str = True,
                cast: bool = False) -> dict:
        """Load the newest valid version (or the given step) into ``state``; collective.

        ``state``: the template, as for :meth:`save` (omitted: the registered
        one); Blocks are filled in place (a getter Block: the array the getter
        returns now), a Stateful object gets ``load_state_dict`` with the
        restored dict, which is also returned (nested as the template is).
        ``None``: no template, every variable of the version in new arrays,
        split evenly over the ranks as :func:`hpcckpt.load` with ``None``
        gives them.  Omitted with nothing registered, it is ``None`` too, with
        a warning on rank 0: such a restore fills none of the application's
        arrays.

        A version that cannot be read -- data truncated or failing a checksum,
        a file that cannot be opened (EACCES, a directory in its place),
        malformed metadata, metadata whose step differs from the directory's
        name -- is skipped with a warning naming the cause, and the next older
        one is tried; every rank restores the same version.  A template that
        does not fit raises at once, and so does any failure of an explicitly
        requested ``step``.  ``cast=True``: a template dtype that differs from
        the stored one is filled by casting, as :func:`hpcckpt.load` does;
        ``strict`` as there (``"rest"``: the variables the template omits are
        returned too).

        A Checkpointer that tracks files (``files=``, :meth:`track_files`)
        then rolls back every file the restored version recorded to its
        content there (docs/files.md); a file missing or replaced is a
        CheckpointError on every rank, and then no file is touched.
        """
        if state is _REGISTERED:
            state = self._registered
            if state is None and self.comm.Get_rank() == 0:
                warn("hpcckpt: Checkpointer.restore() without a state, and none is registered: every variable "
                     "comes back in new arrays and none of the application's is filled (ck.register(state) or "
                     "restore(state) fills them; restore(None) or hpcckpt.load(None, path) asks for new arrays "
                     "without this warning)")
        if self.engine is not None and self.engine.node is not None:
            self._check_open()
            out = self.engine.restore(state, step, strict, cast)
            if self.files.patterns:
                self._roll_back(self.last_restored)
            return out
        live, first = self._restore_listing(step)
        if step is not None:
            live = [e for e in live if e.step == step]
            if not live:
                raise CheckpointError(f"no committed version of step {step} under {self.root!r}")
        if not live:
            raise CheckpointError(f"no committed checkpoint under {self.root!r}")
        skipped = []
        for entry in reversed(live):
            try:
                out = load_version(state, entry.path, self.comm, strict=strict, expect_step=entry.step, cast=cast,
                                   metadata=first.get(entry.path), storage=self.storage, shared_directory=True)
            except TemplateMismatchError:
                raise
            except CheckpointError as exc:  # agreed: the same on every rank, so every rank skips alike
                if step is not None:  # the caller asked for this version: no silent fallback
                    raise
                skipped.append(entry.name)
                if self.comm.Get_rank() == 0:
                    warn(f"hpcckpt: skipping unusable version {entry.path}: {exc}")
                continue
            if self.files.patterns:
                self._roll_back(entry.path)
            self.last_restored = self.chain_base = entry.path
            return out
        raise CheckpointError(f"no valid checkpoint under {self.root!r}: every version is damaged or unreadable ({skipped})")

    def _roll_back(self, version_dir: str) -> None:
        """Collective: the tracked files back to their content at the version restored from ``version_dir``
        (agreed checks first, then one atomic step per file).  A version restored from the node-local levels
        takes the blocks of its in-place files from the root when it was flushed there (any rank count), else
        from each rank's node directory."""
        name = os.path.basename(version_dir)
        on_root = os.path.join(self.root, name)
        if version_dir != on_root and bcast_checked(self.comm, f"listing {self.root!r}", lambda: self.storage.exists(
                os.path.join(on_root, METADATA_FILE))):
            version_dir = on_root
        self.files.remember(rollback(self.comm, version_dir, self.files.patterns), name)

    def close(self) -> None:
        """Collective: record a clean end in the failure history, restore signal handlers, remove a halt file
        this run honoured, release the root's writer lock; later calls raise.  Then raises what a chained
        application signal handler raised and nothing raised yet (hpcckpt.policy.signals)."""
        if self._closed:
            return
        self._closed = True
        with self.pacer.signals.deferred():
            try:
                if self.engine is not None:
                    self.engine.close()  # commits a pending save and waits for a flush in progress
            finally:
                self.series.retirement.wait()
                io_history.flush(self.root, forget=True)  # rank 0's bandwidth measurements not yet written
                self.pacer.close()
                if self._unlock is not None:
                    self._unlock()
        self.pacer.signals.raise_pending()

    @_shielded
    def wait(self):
        """Collective: commit the asynchronous save in flight and wait for a flush; its SaveResult (or None)."""
        self._check_open()
        return self.engine.wait() if self.engine is not None else None

    @property
    def last_result(self) -> SaveResult | None:
        """The SaveResult of the newest committed save of this Checkpointer (an asynchronous save's counts
        once a later call, or :meth:`wait`, has committed it); None before any."""
        return self.series.last_result

    @property
    def chain_base(self) -> str | None:
        """The version the next incremental save builds on: the one saved or restored last."""
        return self.series.chain_base

    @chain_base.setter
    def chain_base(self, path: str | None) -> None:
        self.series.chain_base = path

    @property
    def skipped(self) -> int:
        """Saves skipped because one was in flight (``skip_if_busy=True``)."""
        return self.engine.skipped if self.engine is not None else 0

    def _check_open(self) -> None:
        if self._closed:
            raise CheckpointError(f"the Checkpointer for {self.root!r} is closed")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _is_null(comm) -> bool:
    try:
        from mpi4py import MPI
    except ImportError:
        return False
    return comm == MPI.COMM_NULL


def _joining_root():
    raise CheckpointError("rank 0 of the new communicator must be a rank that already has the Checkpointer "
                          "(call resize there, join only on joining ranks)")


def _resize_agreed(comm, what: str, config_on_root):
    """Collective over the resized communicator: rank 0's configuration (or its error) on every rank."""
    return bcast_checked(comm, f"resizing the Checkpointer for {what!r}", config_on_root)
