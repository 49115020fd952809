"""The save run: the one driver of every save, its stages in order over typed messages.

::

    SaveRun.start()                                       (the call: ``hpcckpt.save``, ``Checkpointer.save``)
      describe   -> Described        this rank's state, read now (no MPI)
      plan       -> Planned          agreed before the data moves (one allreduce on a cache hit, a gather +
                                     broadcast + scatter for a new plan), or made on each rank against the
                                     cached plan and checked at the commit (no collective)
      select     -> Selection        every array, or the changed blocks (incremental: collective)
      write                          foreground: transform + transport (any strategy) before ``start`` returns;
                                     background: the selection staged into the pool, then transform + the
                                     file-per-rank write on this rank's writer thread
    SaveRun.finish()                                      (at once, or at the next collective call)
      commit     WrittenPart -> CommitReport   every rank's part gathered to rank 0, checked, committed, the
                                     report broadcast; with node-local levels the levels protect the version
                                     between the gather and rank 0's commit, and every node commits it after
      -> SaveResult                  (:func:`pipeline.save_result`, the one place it is made)

Blocking or background writing is :attr:`SaveRequest.background`; nothing
else differs between the two.  A failure on any rank, in any stage, is the
same CheckpointError on every rank, and what the run wrote is removed.  The
state a Checkpointer's saves share from one to the next (the plan cache, the
version names, the chain base, the levels, pre-copy, the staging pool) is the
:class:`Series`.
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass, field

from hpcckpt.codecs.pipeline import EncodedPieces
from hpcckpt.core.devices import is_device_array
from hpcckpt.core.log import logger
from hpcckpt.core.monitor import PhaseTimer
from hpcckpt.core.names import DATA_DIR, METADATA_FILE, rank_file
from hpcckpt.errors import CheckpointError
from hpcckpt.incremental import chain_cache
from hpcckpt.mpi.collective import attempt, best_effort, bcast_checked, describe_failure, root_phase
from hpcckpt.options import SaveOptions, SaveResult
from hpcckpt.root.file_manifest import tracked_file
from hpcckpt.root.catalog import KnownNames, Retirement, check_step, list_versions, removable, remove_versions
from hpcckpt.saving.background import BackgroundWrite
from hpcckpt.saving.messages import CommitReport, Described, OwnPlan, VersionToCommit, WrittenPart
from hpcckpt.saving.pipeline import commit_on_root, describe, is_incremental, save_result, select, \
    start_transport, write_foreground, check_replicas
from hpcckpt.saving.plan import PlanCache, Reconciled, agree_plan, plan_locally, reconcile, check_at_commit
from hpcckpt.saving.selection import Selection
from hpcckpt.saving.staging import DEFAULT_STAGING_BYTES, SlotQueue, StagingPool, stage, staged_bytes
from hpcckpt.storage import POSIX, Storage
from hpcckpt.transport import TRANSPORTS, io_history
from hpcckpt.transport.auto import choose_strategy


@dataclass
class Series:
    """What the saves under one root share from one save to the next (one per Checkpointer; a save on its own
    has one of its own).

    ``root``: the root, or None for a save into a directory the caller names;
    ``cache``: the plan (saving/plan.PlanCache); ``names``: every version name
    the root (and the node directories) may hold, the same on every rank
    (catalog.KnownNames; None without a root); ``chain_base``: the version an
    incremental save builds on while it is still committed; ``keep``:
    retention; ``levels``: the node-local levels (levels/node.NodeLevels) or
    None; ``precopy``: pre-copy (saving/precopy.PreCopy) or None;
    ``tracker``: the tracked output files (root/files.FileTracker) or None;
    ``pool``: the staging pool of background writes, made at the first one;
    ``committed``: versions committed (the levels' intervals count them).
    """

    root: str | None = None
    storage: Storage = POSIX
    cache: PlanCache = field(default_factory=PlanCache)
    names: KnownNames | None = None
    chain_base: str | None = None
    keep: int | None = None
    levels: object = None
    precopy: object = None
    tracker: object = None
    staging_bytes: int = DEFAULT_STAGING_BYTES
    pool: StagingPool | None = None
    retirement: Retirement = field(default_factory=Retirement)
    committed: int = 0
    last_result: SaveResult | None = None

    def version_path(self, name: str) -> str:
        """A version's directory on the root."""
        return os.path.join(self.root, name)

    def target(self, name: str) -> str:
        """Where this rank writes a version: its node directory with node-local levels, else the root."""
        return self.levels.path(name) if self.levels is not None else self.version_path(name)

    @property
    def target_storage(self) -> Storage:
        """The storage :meth:`target` is in: the node-local levels' with them, else the root's."""
        return self.levels.storage if self.levels is not None else self.storage

    def staging_pool(self, pinned: bool) -> StagingPool:
        """The staging pool of background writes, made at the first (page-locked when ``pinned``: the state
        holds GPU arrays, whose device-to-host copies are faster into page-locked memory)."""
        if self.pool is None:
            self.pool = StagingPool(self.staging_bytes, pinned=pinned)
        return self.pool

    def flushing(self) -> str | None:
        """The version the levels are flushing to the root (never cleared or retired meanwhile), or None."""
        return self.levels.flushing if self.levels is not None else None


@dataclass(frozen=True)
class SaveRequest:
    """One call's save: ``options`` are SaveOptions or the keyword arguments to make them from (validated in
    the plan stage, so an invalid one is the same error on every rank); ``directory``: the version's directory
    for a save on its own (the series then has no root); ``background``: written by a thread and committed at
    a later call; ``defaults``: the options a rank whose options are invalid stands in with, so that its
    collectives stay those of the other ranks."""

    state: object
    step: int | None
    options: SaveOptions | dict
    directory: str | None = None
    background: bool = False
    defaults: SaveOptions = field(default_factory=SaveOptions)


@dataclass(frozen=True)
class Planned:
    """The plan stage's outcome on this rank.

    ``name``: the version's name (its directory's base name); ``path``: its
    directory on the root (or the caller's directory); ``directory``: where
    this rank writes it (``path``, or its node directory with levels);
    ``strategy``: the transport; ``checked``: the plan was made on each rank
    and is checked at the commit; ``index``: an incremental save's base index
    (or None); ``starts``: box starts of a plan made here (None: the cached
    boxes); ``own``: this rank's own plan when its layout left the cached one;
    ``other``: this rank asked for other options than the cached plan was
    agreed for, and writes nothing (the run is then planned collectively);
    ``history``: the bandwidths ``strategy="auto"`` decides a new plan from.
    """

    name: str
    path: str
    directory: str
    strategy: str
    checked: bool = False
    index: object = None
    starts: dict | None = None
    own: OwnPlan | None = None
    other: bool = False
    history: dict | None = None


@dataclass(frozen=True)
class RootStart:
    """Rank 0's part of an agreed plan, handed to every rank in the plan's exchange: the version's ``path``
    (None with levels: named after the exchange, from every node's names), the ``strategy`` when the cached
    plan decides it, the incremental ``base`` key, the bandwidth ``history`` for ``auto``, and the version
    names the root holds (``revisions``, catalog.KnownNames) when it was listed."""

    path: str | None
    strategy: str | None
    base: tuple | None
    history: dict | None
    revisions: dict | None


class SaveRun:
    """One save: :meth:`start` (describe, plan, select, write) then :meth:`finish` (the commit); collective.

    Every rank runs the same stages in the same order; a failure is carried
    to the next exchange and raised there on every rank alike.  A foreground
    run whose plan was made on each rank and cannot be checked at the commit
    (some rank asked for other options, or a changed layout does not
    reconcile) writes nothing that stays, and :meth:`finish` returns None: the
    caller runs the save again, planned collectively.
    """

    def __init__(self, comm, series: Series, request: SaveRequest):
        self.comm, self.series, self.request = comm, series, request
        self.rank = comm.Get_rank()
        self.timer = PhaseTimer()
        self.failure = None  # this rank's failure, agreed at the next exchange
        self.options: SaveOptions = request.defaults
        self.local: Described | None = None
        self.planned: Planned | None = None
        self.selection = Selection([])
        self.written = None
        self.records = None
        self.writer: BackgroundWrite | None = None
        self.due: dict = {}  # the levels due for this version
        self.sizes: list | None = None  # every rank's file size, with levels
        self.references: frozenset = frozenset()  # rank 0, with levels: the versions this one points into
        self.report_metadata: bytes | None = None  # with levels: the committed metadata, for the flush
        self.retention_seconds = 0.0  # rank 0: retention's part of the commit
        self.wrote = False  # this rank made or wrote into the version's directory

    @property
    def what(self) -> str:
        """The save's name in errors: its version, and whether it was written in the background."""
        planned = self.planned
        if planned is None:
            return f"save of step {self.request.step!r}"
        if self.request.background:
            return f"asynchronous save of step {self.request.step!r} ({planned.name})"
        return f"save of {planned.path!r}"

    # ------------------------------------------------------------------ start
    def start(self) -> "SaveRun":
        """Describe, plan, select and write (or stage, in the background); collective where the plan and the
        selection are."""
        self.options, self.failure = self._options()
        with self.timer.phase("plan"):
            if self.failure is None:
                self.local, self.failure = attempt(lambda: describe(self.request.state, self.comm, self.options,
                                                                    self.request.step, self.request.directory))
            self.planned = self._plan_here() if self._checked() else self._agree()
        self._select()
        self._write()
        return self

    def _options(self) -> tuple:
        """``(SaveOptions, None)``, or ``(stand-in options, failure)`` for an invalid option or step."""
        request, precopy = self.request, self.series.precopy
        try:
            if request.directory is None:
                check_step(request.step)
            opts = request.options if isinstance(request.options, SaveOptions) else \
                SaveOptions.from_kwargs(**request.options)
            if precopy is not None:  # the rounds' block size, the same on every rank (saving/precopy_plan.py)
                opts = dataclasses.replace(opts, block_bytes=precopy.block_bytes(opts))
            return opts, None
        except Exception as exc:  # noqa: BLE001 - agreed in the plan stage, or at the commit
            asked = request.options if isinstance(request.options, dict) else request.options.__dict__
            wanted = bool(asked.get("incremental")) or asked.get("base") is not None
            return SaveOptions(incremental=wanted), describe_failure(exc)

    def _checked(self) -> bool:
        """Whether this run plans on each rank against the cached plan, checked at the commit (the same answer on
        every rank: what the last commit agreed, and, in the background, whether this save is incremental)."""
        series = self.series
        return (series.cache.checked_at_commit and series.names is not None and series.names.revisions is not None
                and not (self.request.background and is_incremental(self.options)))

    def _plan_here(self) -> Planned:
        """The plan made on this rank, no MPI; a failure is carried to the commit."""
        cache, names, opts = self.series.cache, self.series.names, self.options
        name = os.path.basename(names.next_path(self.request.step if isinstance(self.request.step, int) else 0))
        directory = self.series.target(name)
        other = self.failure is None and not self.request.background and opts != cache.options
        planned = Planned(name, self.series.version_path(name), directory, "file-per-rank", checked=True,
                          other=other)
        if self.failure is not None or other:
            return planned
        made, self.failure = attempt(lambda: plan_locally(self.local, cache, opts))
        if self.failure is not None:
            return planned
        starts, _, own = made
        return Planned(name, planned.path, directory, "file-per-rank", checked=True, starts=starts, own=own)

    def _agree(self) -> Planned:
        """Collective: the plan agreed before the data moves (saving/plan.agree_plan), with rank 0's part of it
        (:class:`RootStart`) and every rank's report (the names in its node directory, the base indexes it
        holds); a failure on any rank raises here on every rank."""
        series, opts = self.series, self.options
        first = not series.cache.valid
        left = root = None
        if self.failure is None and first and series.levels is not None:
            left, self.failure = attempt(series.levels.clear_leftovers)
        if self.rank == 0 and self.failure is None:
            root, self.failure = attempt(self._start_on_root)
        report = (frozenset(left or ()), frozenset(chain_cache.held()))
        what = lambda r: f"save of {r.path!r}" if r is not None and r.path else self.what  # noqa: E731
        try:
            root, (names_left, held), hit = agree_plan(self.comm, what, self.local, self.failure, opts, series.cache,
                                                       root, report, _merge_reports)
        except CheckpointError:
            if self.rank == 0 and root is not None and root.path is not None:  # rank 0 created it
                _remove(series.storage, root.path)
            raise
        if series.names is not None and root.revisions is not None:  # what this job knows, what rank 0 listed
            series.names.adopt(_newest(series.names.revisions or {}, root.revisions,
                                       KnownNames.revisions_of(names_left)))
        if root.path is not None:
            path = root.path
            name = os.path.basename(path)
        else:  # with levels: named from every node's names, alike on every rank
            name = os.path.basename(series.names.next_path(self.request.step))
            path = series.version_path(name)
        directory = path if series.levels is None or self.request.directory is not None else series.target(name)
        index = chain_cache.base_index(self.comm, self.what, root.base, held, series.target_storage) \
            if is_incremental(opts) else None
        return Planned(name, path, directory, root.strategy if hit and root.strategy else "", index=index,
                       history=root.history)

    def _start_on_root(self) -> RootStart:
        """Rank 0's part of an agreed plan: clear what interrupted runs left and list the names, name and create
        the version (without levels), resolve an incremental save's base and hand out what ``strategy="auto"``
        decides from."""
        series, opts, request = self.series, self.options, self.request
        storage = series.storage
        if opts.strategy != "auto" and not TRANSPORTS[opts.strategy].fits(storage):
            usable = [name for name, t in TRANSPORTS.items() if t.fits(storage)]
            raise CheckpointError(f"strategy {opts.strategy!r} writes files shared between ranks, which "
                                  f"{type(storage).__name__} does not hold: use {' or '.join(usable)}")
        revisions = None
        if request.directory is not None:
            path = request.directory
        else:
            revisions = self._clear_root()
            series.names.adopt(_newest(series.names.revisions or {}, revisions))
            path = series.names.next_path(check_step(request.step))
        base = None
        if is_incremental(opts):
            base = self._base(path)
        history = io_history.read(series.root) if self.measures_strategies else None
        strategy = self._cached_strategy(history) if self.local.key == series.cache.key else None
        if series.levels is not None and request.directory is None:
            return RootStart(None, strategy, base, history, revisions)
        storage.make_version(path)  # last: nothing to remove when the checks above fail
        return RootStart(path, strategy, base, history, revisions)

    def _clear_root(self) -> dict:
        """Rank 0: remove the root's uncommitted versions (not one being flushed) and the flush marker a run
        killed during its flush left; the version names left (catalog.KnownNames.revisions_of)."""
        series = self.series
        series.retirement.wait()  # the last retention's deletions are done: the listing sees the root settled
        flushing = series.flushing()
        entries = list_versions(series.root, series.storage)
        removed = set(remove_versions([e for e in entries if not e.committed and e.name != flushing]))
        if series.levels is not None and flushing is None:
            series.levels.flush_marker(None)
        return KnownNames.revisions_of(e.name for e in entries if e.name not in removed)

    def _base(self, path: str) -> tuple | None:
        """Rank 0: the key of an incremental save's base (chain_cache.resolve_base).  With levels a version due
        for a flush must find its base on the root, else it is a full version."""
        series = self.series
        target = series.levels.node_dir if series.levels is not None else series.root
        storage = series.target_storage
        chosen = chain_cache.chosen_base(self.options.base, series.chain_base, target, storage)
        look_in = target
        if series.levels is not None:
            path = os.path.join(target, os.path.basename(path))
            if series.levels.levels.due(series.committed).get("flush"):
                if chosen is not None and os.path.basename(chosen) not in series.levels.on_root:
                    chosen = None
                look_in = None
        return chain_cache.resolve_base(path, chosen, look_in, storage)

    def _cached_strategy(self, history) -> str:
        """Rank 0: the strategy of a save whose plan is cached (``auto`` decided from the recorded bandwidths)."""
        opts, cache = self.options, self.series.cache
        if self.writes_own_file:
            return "file-per-rank"
        if opts.strategy != "auto":
            return opts.strategy
        nranks = self.comm.Get_size()
        return choose_strategy(nranks, cache.total_bytes / nranks, cache.layout.max_ranks_per_node, history,
                               shared_files=self.series.storage.shared_files, aggregators=opts.aggregators)

    @property
    def writes_own_file(self) -> bool:
        """Whether each rank writes its own file whatever the options: in the background, on node-local levels,
        or into storage whose files other processes do not see."""
        series = self.series
        return self.request.background or series.levels is not None or not series.storage.shared_paths

    @property
    def measures_strategies(self) -> bool:
        """Whether ``strategy="auto"`` decides from the bandwidths earlier saves under the root measured (the
        root's io_history): on a storage that holds files shared between ranks (auto.choose_strategy)."""
        return self.options.strategy == "auto" and self.series.storage.shared_files

    # ----------------------------------------------------------------- select
    def _select(self) -> None:
        """The select stage (collective for an incremental save); pre-copy hands over the blocks its rounds
        wrote ahead."""
        planned, precopy = self.planned, self.series.precopy
        precopied = probed = None
        if precopy is not None:
            precopied, probed = precopy.hand_over(planned.directory)
        with self.timer.phase("hash" if is_incremental(self.options) else "plan"):
            if planned.checked:  # full, no MPI: a failure is carried to the commit
                if self.failure is None and not planned.other:
                    self.selection, self.failure = attempt(lambda: self._select_now(precopied, probed))
            else:  # agreed: every rank is here without a failure; an incremental selection is collective
                self.selection = self._select_now(precopied, probed)
        if precopied:
            precopy.drop_unused(planned.directory, self.selection.refs)

    def _select_now(self, precopied, probed) -> Selection:
        return select(self.comm, self.what, self.local, self.series.cache, self.options, self.planned.index,
                      self.planned.starts, per_rank_files=self.series.levels is not None, precopied=precopied,
                      probed=probed)

    # ------------------------------------------------------------------ write
    def _write(self) -> None:
        """The write stage: this rank's directory, its tracked files' records, then its data, written now
        (foreground) or staged for its writer thread (background)."""
        series, planned = self.series, self.planned
        if series.levels is not None:
            self.due = series.levels.levels.due(series.committed)
        if self.failure is None and not planned.other and (planned.checked or planned.directory != planned.path):
            self.failure = attempt(lambda: _ensure_directory(series.target_storage, planned.directory))[1]
        if self.failure is None and not planned.other and series.tracker is not None and series.tracker.patterns:
            self.records, self.failure = attempt(lambda: series.tracker.capture(
                self.rank, planned.directory, self.options.fsync, self.comm.Get_size()))
        self.wrote = not planned.other  # a rank that wrote nothing removes nothing (a run planned again)
        if self.request.background:
            self._start_writer()
        elif not planned.other:
            self._write_now()

    def _write_now(self) -> None:
        """The transform and transport stages, now; a new plan may ask the node layout (collective, the first
        time for these processes: every rank of an agreed plan takes part)."""
        planned, series = self.planned, self.series
        strategy = "file-per-rank" if self.writes_own_file or planned.checked else planned.strategy or None
        if planned.checked:
            if self.failure is not None:
                return
            made, self.failure = attempt(lambda: start_transport(self.comm, planned.directory, self.options,
                                                                 series.cache, None, strategy,
                                                                 series.target_storage))
            if self.failure is not None:
                return
        else:
            made = start_transport(self.comm, planned.directory, self.options, series.cache, planned.history,
                                   strategy, series.target_storage)
            if self.failure is not None:  # capturing the tracked files failed: agreed at the commit
                return
        ctx, strategy = made
        self.planned = dataclasses.replace(planned, strategy=strategy)
        codecs = series.cache.codecs if planned.own is None else planned.own.codecs
        self.written, self.failure = write_foreground(ctx, strategy, codecs, self.local, self.selection,
                                                      self.options, self.timer)

    def _start_writer(self) -> None:
        """Stage the selection into the pool and start this rank's writer thread (file-per-rank)."""
        series, planned, opts = self.series, self.planned, self.options
        series.staging_pool(any(is_device_array(i[2]) for i in self.selection.items))
        codecs = series.cache.codecs if planned.own is None else planned.own.codecs
        writer = BackgroundWrite(planned.directory, rank_file(self.rank), series.pool, SlotQueue(),
                                 EncodedPieces.for_save(codecs or {}, self.local.summaries if self.local else {},
                                                        opts.codec_threads),
                                 opts.fsync, max(64, opts.chunk_bytes), self.selection.digests, series.target_storage)
        fits = staged_bytes(self.selection.items) <= series.pool.capacity
        if not fits:  # streamed through the pool as the writer frees buffers
            writer.start()
        staging_began = time.perf_counter()
        with self.timer.phase("stage"):
            try:
                if self.failure is not None:
                    writer.queue.put(None)
                    raise CheckpointError(self.failure[1])
                stage(self.selection.items, series.pool, writer.queue,
                      None if fits else max(64, min(opts.chunk_bytes, series.staging_bytes)))
            except Exception as exc:  # noqa: BLE001 - surfaces, agreed, at the commit
                writer.fail(exc)
        if fits:  # copied before the writer starts, which then waits as long as the copy took (BackgroundWrite.start)
            writer.start(after=time.perf_counter() - staging_began)
        self.writer = writer
        self.selection = self.selection.with_items([])  # the staged copies are the writer's

    @property
    def written_here(self) -> bool:
        """Whether this rank's data are written (a background writer finished)."""
        return self.writer is None or self.writer.done

    def pending_result(self) -> SaveResult:
        """The SaveResult of a background save not committed yet."""
        return save_result(self.planned.path, self.request.step, self.selection, self.timer.seconds)

    # ----------------------------------------------------------------- commit
    def finish(self) -> SaveResult | None:
        """Collective, the commit stage: every rank's part to rank 0, checked and committed there, the report to
        every rank; the SaveResult (None: a foreground run planned here that must be planned collectively)."""
        t0 = time.perf_counter()
        mine, failure = self._part()
        try:
            with self.timer.phase("commit"):
                report, settled = self._commit(mine, failure)
        except CheckpointError:
            self._discard()
            raise
        if report is None:
            self._discard()
            return None
        return self._committed(report, settled, mine, time.perf_counter() - t0)

    def _part(self) -> tuple:
        """This rank's WrittenPart and failure (waiting for its writer thread)."""
        planned, local = self.planned, self.local
        seconds, timeline, failure = dict(self.timer.seconds), list(self.timer.timeline), self.failure
        written, file_bytes = self.written, 0
        if self.writer is not None:
            self.writer.join()
            written, file_bytes = self.writer.written, self.writer.file_bytes
            seconds.update(self.writer.timer.seconds)
            timeline += self.writer.timer.timeline
            if failure is None and self.writer.error is not None:
                failure = describe_failure(self.writer.error)
        elif written is not None:
            file_bytes = written.nbytes
        stats = {"seconds": seconds, "timeline": timeline, "bytes": written.nbytes if written is not None else 0}
        mine = WrittenPart(stats, self.selection.commit_part(written.rows) if written is not None else None,
                           local.per_rank if local is not None else None, self.selection.replicas, self.records,
                           version=planned.name, own=planned.own,
                           details=local.details if planned.checked and local is not None else None,
                           other_options=planned.other, file_bytes=file_bytes)
        return mine, failure

    def _version(self, levels: dict | None = None) -> VersionToCommit:
        extra = {"strategy": self.planned.strategy or "file-per-rank"}
        if self.series.levels is not None or self.request.background:
            extra["asynchronous"] = self.request.background
        return VersionToCommit(self.planned.directory, self.request.step, extra, self.selection.info,
                               self.options.fsync, self.series.target_storage,
                               synced=extra["strategy"] == "file-per-rank" and self.writer is None,
                               tracked=self.series.tracker is not None and bool(self.series.tracker.patterns),
                               levels=levels)

    def _commit(self, mine: WrittenPart, failure) -> tuple:
        """``(CommitReport or None, rank 0's Reconciled plan or None)``: without levels a gather and a broadcast;
        with them a gather, a broadcast of the file sizes, the levels' protection, rank 0's commit broadcast and
        every node's commit."""
        levels, settled = self.series.levels, []

        def settle(parts):
            plan = self._settle(parts)
            if plan is not None:
                settled.append(plan)
            return plan

        if levels is None:
            def on_root(parts):
                plan = settle(parts)
                if plan is None:
                    return None
                committed = commit_on_root(self._version(), plan, self.local.values, parts)
                self._retire()
                return committed.report(plan.replanned)
            report = root_phase(self.comm, self.what, failure, mine, on_root)
            return report, settled[0] if settled else None
        parts_on_root = []

        def sizes_on_root(parts):
            if settle(parts) is None:
                return None
            parts_on_root.extend(parts)
            return [p.file_bytes for p in parts]

        sizes = root_phase(self.comm, self.what, failure, mine, sizes_on_root)
        if sizes is None:  # planned again collectively (see :meth:`_settle`)
            return None, None
        fsync = self.options.fsync
        with self.timer.phase("levels"):
            described = levels.protect(self.planned.directory, sizes, self.due, fsync, self.what)

        def commit_here():
            committed = commit_on_root(self._version(described), settled[0], self.local.values, parts_on_root)
            self.references = committed.references  # rank 0: the versions the flush must find on the root
            self._retire()
            return committed.report(settled[0].replanned, with_metadata=True)

        report = bcast_checked(self.comm, self.what, commit_here)
        self.report_metadata = report.metadata
        levels.commit_nodes(self.planned.directory, report.metadata, fsync, self.what)
        self.sizes = sizes
        return report, settled[0] if settled else None

    def _retire(self) -> None:
        """Rank 0, right after the commit and before any rank learns of it (so that no rank has started a flush
        into the root yet): retention uncommits the versions beyond ``keep`` and queues their deletion on a
        thread (catalog.Retirement); never one being flushed.  Bookkeeping: a failure is a warning."""
        series = self.series
        if series.root is None:
            return
        t0 = time.perf_counter()
        flushing = series.flushing()
        best_effort(f"retention under {series.root!r}", lambda: series.retirement.retire(
            [e for e in removable(_settled_versions(series), series.keep) if e.name != flushing]))
        self.retention_seconds = time.perf_counter() - t0

    def _settle(self, parts: list[WrittenPart]) -> Reconciled | None:
        """Rank 0: the plan the version commits with; None when a plan made on the ranks cannot stand and the
        run is planned again collectively (foreground); a CheckpointError when the ranks disagree."""
        cache = self.series.cache
        check_replicas([p.replicas for p in parts])
        if not self.planned.checked:
            return Reconciled([p.part for p in parts], cache.variables, cache.codecs)
        if any(p.other_options for p in parts):
            return None
        check_at_commit(parts)
        tables = [p.part for p in parts]
        owns = [None] * len(parts) if isinstance(tables[0], dict) else [p.own for p in parts]
        plan, failure = attempt(lambda: reconcile(cache, tables, owns))
        if failure is None:
            return plan
        if self.request.background:
            raise CheckpointError(failure[1])
        return None

    def _discard(self) -> None:
        """Remove what this run wrote (rank 0 the version on the root, node leaders theirs, every other rank its
        own file), then invalidate what the next save would have reused."""
        series, planned = self.series, self.planned
        series.cache.invalidate()  # the next save plans collectively again (and clears the leftovers)
        if series.names is not None:
            series.names.forget()
        if planned is None:
            return
        if self.rank == 0:
            _remove(series.storage, planned.path)
        if series.levels is not None:
            series.levels.discard(planned.name)
        if self.wrote and (planned.directory != planned.path or self.rank != 0):
            _drop_own(series.target_storage, planned.directory, self.rank)
        if series.levels is not None or self.request.background:
            # the engine's contract: when a later call raises for a failed version, it is gone on every rank
            # (node leaders clear the node directories the other ranks wrote into)
            self.comm.Barrier()

    def _committed(self, report: CommitReport, settled, mine: WrittenPart, commit_seconds: float) -> SaveResult:
        """Every rank, after the commit: what the next save reuses, retention, the levels' flush; the SaveResult."""
        series, planned, opts = self.series, self.planned, self.options
        if report.replanned is not None:  # some rank's layout changed: every rank adopts the reconciled plan
            series.cache.adopt(self.local.key, report.replanned, self.rank, settled)
        if report.chain is not None:
            chain_cache.remember(*report.chain)
        if series.names is not None:
            series.names.add(planned.name)
        series.chain_base = planned.directory
        series.committed += 1
        if series.tracker is not None:
            series.tracker.committed(planned.name)
        if series.precopy is not None:
            series.precopy.committed(self.selection.info, opts)
        # the next save of these options may plan on each rank, checked at its commit (every rank decides alike)
        cache = series.cache
        cache.checked_at_commit = (series.names is not None and not is_incremental(opts) and not cache.has_replicated
                                   and (self.writes_own_file or (cache.expect_hit and opts.strategy == "file-per-rank"))
                                   and series.storage is POSIX)
        cache.options = opts
        levels_reached = ("root",)
        if series.levels is not None:
            levels_reached = series.levels.reached(self.due)
        seconds = dict(self.timer.seconds)
        if self.writer is not None:
            seconds.update(self.writer.timer.seconds)
        result = save_result(planned.path, self.request.step, self.selection, seconds, report, mine, commit_seconds,
                             planned.strategy or "file-per-rank", levels_reached)
        if self.rank == 0:
            self._log(report, result)
        if series.root is not None:
            result.timings["retention"] = result.this_rank["timings"]["retention"] = self.retention_seconds
        series.last_result = result
        return result

    def _log(self, report: CommitReport, result: SaveResult) -> None:
        write_seconds = report.phases.get("write", 0.0)
        if self.measures_strategies and self.series.root is not None and not self.writes_own_file:
            io_history.record(self.series.root, result.strategy, self.comm.Get_size(), report.nbytes, write_seconds)
        logger.info("saved %s (%s, %s): %d bytes in %d chunks, %s, write %.3f s (%.2f GB/s); %s", result.path,
                    result.kind, ",".join(result.levels), report.nbytes, report.nchunks, result.strategy,
                    write_seconds, report.nbytes / max(write_seconds, 1e-9) / 1e9, report.straggler)

    @property
    def local_cost(self) -> float:
        """This rank's seconds to stage, write and protect the version on the levels (the flush interval's
        measure)."""
        seconds = dict(self.timer.seconds)
        if self.writer is not None:
            seconds.update(self.writer.timer.seconds)
        return seconds.get("stage", 0.0) + seconds.get("write", 0.0) + seconds.get("levels", 0.0)


def save_now(comm, series: Series, request: SaveRequest) -> tuple[SaveResult, SaveRun]:
    """A save written and committed now: ``(its SaveResult, the run)``; a run planned on the ranks whose plan
    cannot stand is planned collectively once more (:meth:`SaveRun.finish` returned None, and the plan cache
    is invalid by then, so the second run agrees its plan)."""
    while True:
        run = SaveRun(comm, series, request).start()
        result = run.finish()
        if result is not None:
            return result, run


def _merge_reports(a: tuple, b: tuple) -> tuple:
    """Two ranks' reports of the plan stage as one: the names left in their node directories (a union) and the
    base indexes they all hold (an intersection)."""
    return a[0] | b[0], a[1] & b[1]


def _newest(*revisions: dict) -> dict:
    """The highest revision of each step among ``revisions`` (catalog.KnownNames.revisions_of)."""
    out: dict = {}
    for each in revisions:
        for step, revision in each.items():
            out[step] = max(revision, out.get(step, -1))
    return out


def _ensure_directory(storage: Storage, directory: str) -> None:
    """This rank's version directory and its ``data/`` (another rank may have made them); refused when it holds
    a committed version (never the case while this job holds the root's lock)."""
    if storage.exists(os.path.join(directory, METADATA_FILE)):
        raise CheckpointError(f"{directory} already holds a committed version: the root changed behind this job")
    storage.make_directories(os.path.join(directory, DATA_DIR))


def _remove(storage: Storage, path: str) -> None:
    """Rank 0: remove a version that failed, going on past entries the other ranks remove at the same time;
    never raises."""
    storage.discard_tree(path)


def _drop_own(storage: Storage, directory: str, rank: int) -> None:
    """A rank other than rank 0 (or any rank on its node directory): remove its own files of a failed version
    (its data file, its blocks of tracked files) and the directories if empty; never raises, whatever order the
    ranks come in."""
    for remove, target in ((storage.remove_file, os.path.join(directory, rank_file(rank))),
                           (storage.remove_file, os.path.join(directory, tracked_file(rank))),
                           (storage.remove_directory, os.path.join(directory, DATA_DIR)),
                           (storage.remove_directory, directory)):
        try:
            remove(target)
        except OSError:
            pass


def _settled_versions(series: Series) -> list:
    """Rank 0, after a save: the root's versions retention may consider, committed ones and those whose names
    are taken (uncommitted: retired before, a deletion that failed).  Not a newer uncommitted directory: the
    other ranks may have started the next save, planned on each rank, and be writing into it."""
    entries = list_versions(series.root, series.storage)
    return [e for e in entries if e.committed or (series.names is not None and series.names.taken(e.name))]
