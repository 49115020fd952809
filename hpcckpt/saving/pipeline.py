"""The save pipeline: every kind of save runs these stages, in this order, through one module each.

::

    describe   save_stages.describe_state      -> messages.Described: summaries, arrays, values (no MPI)
    plan       save_plan                        agreed before writing (one allreduce on a cache hit),
                                                or checked at the commit (no MPI: asynchronous full saves,
                                                repeated blocking full file-per-rank saves)
    select     selection                        full: every array; incremental: the changed blocks
                                                (the policy and deduplication: one allgather, two for a
                                                full version with reusable blocks; from
                                                dedup_owners.OWNERS_FROM_RANKS ranks on two alltoalls
                                                through the keys' owners)
    stage      zero-copy (blocking) | staging.stage into the pool (asynchronous; device -> host for CuPy)
    transform  transform                        cut into chunks -> codec -> checksum
    transport  transport.TRANSPORTS (blocking) | background.BackgroundWrite (asynchronous, file-per-rank)
    commit     commit_on_root + commit.commit_version   (every rank's messages.WrittenPart gathered to
                                                rank 0, its messages.CommitReport broadcast, and
                                                :func:`save_result` made from it; a repeated blocking
                                                file-per-rank save: 2 collectives in all)

:func:`save_version` is the blocking save (``hpcckpt.save`` and a
Checkpointer without engine); the asynchronous / multi-level engine
(saving/asynchronous.py) runs the same stages with the transport on its background
writer and the commit at its next call, and adds the levels as destinations
of the commit.  A failure on any rank, in any stage, is the same
CheckpointError on every rank, and the new version's directory is removed.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field

from hpcckpt.incremental import chain_cache
from hpcckpt.root.catalog import KnownNames, check_step
from hpcckpt.mpi.agreement import replica_mismatch
from hpcckpt.codecs.pipeline import EncodedPieces
from hpcckpt.mpi.collective import attempt, root_phase
from hpcckpt.storage.commit import commit_version, metadata_from_rows, parent_directory
from hpcckpt.core.encoding import dtype_from_json, encode_per_rank
from hpcckpt.errors import CheckpointError
from hpcckpt.root.file_manifest import manifest
from hpcckpt.incremental.rules import incremental_metadata, referenced_versions
from hpcckpt.core.log import logger
from hpcckpt.core.monitor import PhaseTimer
from hpcckpt.core.names import DATA_DIR, METADATA_FILE, rank_file
from hpcckpt.options import SaveOptions, SaveResult
from hpcckpt.saving.messages import CommitReport, Described, VersionToCommit, WrittenPart
from hpcckpt.saving.plan import PlanCache, Reconciled, agree_plan, check_at_commit, plan_locally, reconcile
from hpcckpt.saving.stages import create_version_directory, describe_state
from hpcckpt.saving.selection import Selection, select_changed, select_full
from hpcckpt.stateful import resolve as resolve_state
from hpcckpt.core.stats import phase_record, slowest, straggler
from hpcckpt.storage import POSIX, Storage
from hpcckpt.saving.transform import encoded_pieces, raw_pieces
from hpcckpt.transport import TRANSPORTS, TransportContext, io_history
from hpcckpt.transport.auto import choose_strategy
from hpcckpt.transport.topology import node_layout, ranks_per_node_setting


def describe(state, comm, options: SaveOptions, step=None) -> Described:
    """The describe stage on this rank (no MPI); a bad HPCCKPT_RANKS_PER_NODE fails here, on every rank alike.

    The state is resolved here, once per save, for every kind of save
    (hpcckpt.stateful: Stateful objects, callables, getters, nested dicts).
    """
    local = describe_state(resolve_state(state), comm.Get_rank(), comm.Get_size(), options, step=step)
    ranks_per_node_setting(options.ranks_per_node)
    return local


def is_incremental(options: SaveOptions) -> bool:
    return options.incremental or options.base is not None


def select(comm, what: str, local: Described, cache: PlanCache, options: SaveOptions, index, starts=None,
           per_rank_files: bool = False, precopied: dict | None = None, probed: frozenset | None = None) -> Selection:
    """The select stage: every array (full saves; ``starts`` default to the cached boxes) or the changed blocks
    (``precopied``: blocks already written into this version by pre-copy, ``probed``: keys its probes saw,
    selection.select_changed)."""
    if is_incremental(options):
        return select_changed(comm, what, local.arrays, cache, options, index, per_rank_files, precopied, probed)
    if starts is not None:  # a plan made locally (asynchronous saves): never one with replicated Blocks
        return select_full(local.arrays, starts)
    return select_full(local.arrays, {n: b[0] for n, b in cache.boxes.items()}, cache.replicas)


@dataclass(frozen=True)
class Series:
    """The saves a Checkpointer makes one after another under its root: what a blocking save reuses and updates.

    ``root``: where bandwidth measurements for ``strategy="auto"`` are kept
    and, for an incremental save, where the newest version is looked up as
    its base; ``cache``: the PlanCache kept across the saves; ``names``: the
    catalog.KnownNames (rank 0 fills them when it names a version; every rank
    receives them with the plan); ``chain_base``: the version an incremental
    save builds on when it still exists (the last saved or restored one).
    """

    root: str | None = None
    cache: PlanCache = field(default_factory=PlanCache)
    names: KnownNames | None = None
    chain_base: str | None = None


def save_version(state, directory, comm, options: SaveOptions | dict, step: int | None = None,
                 storage: Storage = POSIX, files=None, series: Series | None = None) -> SaveResult:
    """Collectively write ``state`` into a new version directory and commit it (a blocking save).

    ``directory``: the path, or a callable that rank 0 runs to choose it (a
    Checkpointer clears leftovers and names the version there, inside the
    plan stage's allreduce).  ``series``: a Checkpointer's :class:`Series`
    (None: a save on its own, with a plan cache of its own).  With a series,
    a repeated full save of the same options with ``strategy="file-per-rank"``
    (no tracked files, no replicated Blocks) plans locally and is checked at
    its commit: two collectives, the commit's gather and broadcast
    (:func:`_save_checked_at_commit`).  Otherwise the plan is agreed before
    the data moves: on a cache hit one allreduce, then the commit's gather +
    broadcast (an incremental save adds its select stage's allgather, or its
    two alltoalls from dedup_owners.OWNERS_FROM_RANKS ranks on).
    ``storage``: where the version is written (hpcckpt.storage); one without
    ``shared_files`` takes the file-per-rank transport only.  ``options``:
    SaveOptions, or the keyword arguments to make them from, validated inside
    the plan stage (an invalid option on one rank is the same CheckpointError
    on every rank).  Every rank must pass the same step, options, names, kinds
    and replicated values (mpi/agreement.py; checked in the plan stage's
    allreduce, or at the commit).
    ``files``: called as ``files(directory)`` on every rank after its data are
    written, returns this rank's records of the tracked output files
    (hpcckpt.root.files); rank 0 commits them as ``extra["files"]``.
    """
    rank, size = comm.Get_rank(), comm.Get_size()
    timer = PhaseTimer()
    series = series if series is not None else Series()
    cache, names = series.cache, series.names
    options, failure = _options(options)  # a failure is agreed in the plan stage, below
    incremental = failure is None and is_incremental(options)
    with timer.phase("plan"):
        if failure is None:
            local, failure = attempt(lambda: describe(state, comm, options, step))
        else:
            local = None
    if cache.checked_at_commit and names is not None and names.revisions is not None:  # agreed on every rank
        result = _save_checked_at_commit(comm, local, failure, options, step, series, timer)
        if result is not None:
            return result
        # some rank asked for other options, or a changed layout did not reconcile: plan collectively after all
    name_of = lambda root: f"save of {root[0]!r}" if root else "save of a new version"  # noqa: E731
    with timer.phase("plan"):
        root_part = None
        if rank == 0 and failure is None:
            root_part, failure = attempt(lambda: _start_on_root(directory, size, options, local, storage, series))
        try:
            root, held, hit = agree_plan(comm, name_of, local, failure, options, cache, root_part,
                                         frozenset(chain_cache.held()) if incremental else None,
                                         frozenset.intersection)
        except CheckpointError:
            if rank == 0 and root_part:
                _drop(storage, root_part[0])
            raise
    path, strategy, base_key, history, listed = root
    if names is not None:
        names.adopt(listed)
    what = name_of(root)
    try:
        with timer.phase("plan"):
            ctx, strategy = _transport(comm, path, options, cache, history, strategy if hit else None, storage)
            index = chain_cache.base_index(comm, what, base_key, held) if incremental else None
        with timer.phase("hash" if incremental else "plan"):
            selection = select(comm, what, local, cache, options, index)
        written, records, failure, stats = _write(ctx, TRANSPORTS[strategy], cache.codecs, local, selection,
                                                  options, timer, files)
        version = VersionToCommit(path, step, {"strategy": strategy}, selection.info, options.fsync, storage,
                                  synced=strategy == "file-per-rank", tracked=files is not None)
        with timer.phase("commit"):
            def on_root(parts):
                check_replicas([p.replicas for p in parts])
                plan = Reconciled([p.part for p in parts], cache.variables, cache.codecs)
                return commit_on_root(version, plan, local.values, parts).report()

            mine = WrittenPart(stats, selection.commit_part(written.rows) if written is not None else None,
                               local.per_rank, selection.replicas, records)
            report = root_phase(comm, what, failure, mine, on_root)
    except CheckpointError:
        cache.invalidate()
        if names is not None:
            names.forget()
        if rank == 0:  # the directory is new (rank 0 created it): drop the partial version
            _drop(storage, path)
        raise
    # the next save of these options may plan locally, checked at its commit (every rank decides alike)
    cache.checked_at_commit = (names is not None and cache.expect_hit and not incremental and files is None
                               and storage is POSIX and options.strategy == "file-per-rank"
                               and not cache.has_replicated)
    cache.options = options
    return _saved(comm, series, version, report, selection, options, mine, timer)


def _save_checked_at_commit(comm, local: Described | None, failure, options: SaveOptions | None, step,
                            series: Series, timer: PhaseTimer) -> SaveResult | None:
    """A blocking save planned locally against the cached plan and checked at its commit: two collectives.

    Every rank names the version from the series' names (catalog.KnownNames,
    no listing), creates its directory if no rank did yet, plans with
    save_plan.plan_locally and writes its file; the commit's gather brings
    rank 0 what the plan stage's allreduce would have checked (failures, the
    ranks' digests, one version name: save_plan.check_at_commit), rank 0
    reconciles a changed layout (save_plan.reconcile) and commits, and the
    broadcast carries the outcome to every rank: the same CheckpointError
    everywhere on a failure (the version's directory removed by rank 0,
    the cache invalidated, so the next save plans collectively and clears any
    leftover), or the reconciled plan each rank adopts.  A rank whose options
    differ from those of the save that agreed the plan writes nothing (its
    options may change how the ranks write together); then, or when a
    changed layout does not reconcile, the directory is removed and None
    returned on every rank: the caller plans collectively after all.
    """
    rank = comm.Get_rank()
    cache, names = series.cache, series.names
    other = failure is None and options != cache.options  # this rank asks for another kind of save
    path = own = None
    selection = Selection([])
    with timer.phase("plan"):
        if failure is None and not other:
            planned, failure = attempt(lambda: _plan_here(local, cache, options, names, step))
            if failure is None:
                path, selection, own = planned
    written = records = None
    stats = {"seconds": {}, "timeline": [], "bytes": 0}
    if failure is None and not other:
        ctx = TransportContext(comm=comm, directory=path, layout=None, max_writers=options.max_writers,
                               fsync=options.fsync)
        codecs = cache.codecs if own is None else own.codecs
        written, records, failure, stats = _write(ctx, TRANSPORTS["file-per-rank"], codecs, local, selection,
                                                  options, timer, None)
    what = f"save of {path!r}" if path else "save of a new version"
    version = None if options is None else VersionToCommit(path, step, {"strategy": "file-per-rank"},
                                                           selection.info, options.fsync, synced=True)
    reconciled = []  # rank 0: the plan it committed with
    with timer.phase("commit"):
        def on_root(parts):
            if any(p.other_options for p in parts):
                return None
            check_at_commit(parts)
            settled, unreconciled = attempt(lambda: reconcile(cache, [p.part for p in parts],
                                                              [p.own for p in parts]))
            if unreconciled is not None:
                return None
            reconciled.append(settled)
            return commit_on_root(version, settled, local.values, parts).report(settled.replanned)

        mine = WrittenPart(stats, selection.commit_part(written.rows) if written is not None else None,
                           None if local is None else local.per_rank, selection.replicas,
                           version=path and os.path.basename(path), own=own,
                           details=None if local is None else local.details, other_options=other)
        try:
            report = root_phase(comm, what, failure, mine, on_root)
        except CheckpointError:
            cache.invalidate()
            names.forget()
            _drop_here(path, rank)
            raise
    if report is None:
        cache.invalidate()
        _drop_here(path, rank)
        return None
    if report.replanned is not None:  # some rank's layout changed: every rank adopts the reconciled plan
        cache.adopt(local.key, report.replanned, rank, reconciled[0] if rank == 0 else None)
    return _saved(comm, series, version, report, selection, options, mine, timer)


def _plan_here(local: Described, cache: PlanCache, options: SaveOptions, names: KnownNames, step) -> tuple:
    """This rank's plan of a save checked at the commit: ``(version directory, selection, own plan or None)``;
    creates the directory and its ``data/`` unless another rank already did (no MPI).  A directory that holds
    a committed version is refused (never the case while this job holds the root's lock), and then left alone:
    this rank has no ``path`` to remove."""
    starts, _, own = plan_locally(local, cache, options)
    path = names.next_path(check_step(step))
    if os.path.lexists(os.path.join(path, METADATA_FILE)):
        raise CheckpointError(f"{path} already holds a committed version: the root changed behind this job")
    os.makedirs(os.path.join(path, DATA_DIR), exist_ok=True)
    return path, select_full(local.arrays, starts), own


def _drop_here(path: str | None, rank: int) -> None:
    """Remove what a failed save checked at the commit left (``path``: this rank's directory, or None): rank 0
    the whole directory, another rank its own file and the directories if empty (a rank that named another
    version, passing another step, created one of its own); never raises, whatever order the ranks come in."""
    if path is None:
        return
    if rank == 0:
        shutil.rmtree(path, ignore_errors=True)
        return
    for remove, target in ((os.unlink, os.path.join(path, rank_file(rank))),
                           (os.rmdir, os.path.join(path, DATA_DIR)), (os.rmdir, path)):
        try:
            remove(target)
        except OSError:
            pass


def _write(ctx: TransportContext, transport, codecs: dict, local: Described, selection: Selection,
           options: SaveOptions, timer: PhaseTimer, files) -> tuple:
    """The transform and transport stages on this rank: ``(written, tracked-file records, failure, stats)``."""
    with timer.phase("write"):
        encoder = EncodedPieces.for_save(codecs, local.summaries, options.codec_threads)
        pieces = encoded_pieces(raw_pieces(selection.items, options.chunk_bytes), encoder, timer,
                                checksum_here=not transport.hashes_while_writing, digests=selection.digests)
        written, failure = attempt(lambda: transport.write(ctx, pieces))
        if failure is None and ctx.fsync and transport.name == "file-per-rank":
            failure = attempt(lambda: sync_written(ctx, written))[1]
        records = None
        if failure is None and files is not None:
            records, failure = attempt(lambda: files(ctx.directory))
    stats = {"seconds": dict(timer.seconds), "timeline": list(timer.timeline),
             "bytes": written.nbytes if written is not None else 0}
    return written, records, failure, stats


def sync_written(ctx: TransportContext, written) -> None:
    """After this rank wrote its own file (file-per-rank, fsynced): ``data/`` fsynced by every rank that created a
    file there, the version's parent by rank 0 (the version directory exists by now), each in parallel with the
    other ranks' writes instead of on rank 0's commit (commit.commit_version with ``synced``)."""
    storage = ctx.storage or POSIX
    if written.rows:
        storage.sync_directory(os.path.join(ctx.directory, DATA_DIR))
    if ctx.comm.Get_rank() == 0:
        storage.sync_directory(parent_directory(ctx.directory))


def _saved(comm, series: Series, version: VersionToCommit, report: CommitReport, selection: Selection,
           options: SaveOptions, mine: WrittenPart, timer: PhaseTimer) -> SaveResult:
    """Every rank, after the commit of a blocking save: the SaveResult (rank 0 records the bandwidth for
    ``auto`` and logs)."""
    if report.chain is not None:
        chain_cache.remember(*report.chain)
    if series.names is not None:
        series.names.add(os.path.basename(version.directory))
    strategy = version.extra["strategy"]
    if comm.Get_rank() == 0:
        write_seconds = report.phases.get("write", 0.0)
        if options.strategy == "auto":  # its only reader: a fixed strategy's save skips the write of the file
            io_history.record(series.root, strategy, comm.Get_size(), report.nbytes, write_seconds)
        logger.info("saved %s (%s): %d bytes in %d chunks, %s, write %.3f s (%.2f GB/s); %s", version.directory,
                    selection.kind, report.nbytes, report.nchunks, strategy, write_seconds,
                    report.nbytes / max(write_seconds, 1e-9) / 1e9, report.straggler)
    return save_result(version.directory, version.step, selection, dict(timer.seconds), report, mine,
                       timer.seconds["commit"], strategy)


def save_result(path: str, step, selection: Selection, seconds: dict, committed: CommitReport | None = None,
                mine: WrittenPart | None = None, commit_seconds: float = 0.0, strategy: str = "file-per-rank",
                levels: tuple = ("root",)) -> SaveResult:
    """The SaveResult of every kind of save, on every rank, from what it wrote and what the commit reported.

    ``seconds``: this rank's phases; ``committed``: the commit's report, or
    None for an asynchronous save whose data are still being written (then
    nothing is committed: no bytes, no chunks, no levels, and its timings are
    this rank's foreground phases); ``mine``: this rank's part of the commit;
    ``commit_seconds``: this rank's commit.  The timings of a committed save
    are the slowest rank's phases plus this rank's own ``levels`` (when
    ``seconds`` has them) and ``commit``.
    """
    if committed is None:
        timings, this_rank, levels, incremental = dict(seconds), {}, (), None
    else:
        timings = {**committed.phases, **({"levels": seconds["levels"]} if "levels" in seconds else {}),
                   "commit": commit_seconds}
        this_rank = {"bytes": mine.stats["bytes"], "timings": dict(seconds)}
        incremental = None if selection.info is None else {**selection.info, **committed.summary}
    return SaveResult(path=path, step=step, bytes_written=committed.nbytes if committed else 0,
                      nchunks=committed.nchunks if committed else 0, timings=timings, strategy=strategy,
                      kind=selection.kind, levels=levels, pending=committed is None, incremental=incremental,
                      this_rank=this_rank)


def check_replicas(per_rank: list) -> None:
    """Rank 0, before a commit: every rank's copy of each shared region of a replicated Block equal, else the
    CheckpointError naming the variable, the region and two ranks (``per_rank``: each rank's Selection.replicas)."""
    error = replica_mismatch(per_rank)
    if error is not None:
        raise error


def _options(options) -> tuple:
    """``(SaveOptions, None)``, or ``(None, failure)`` when the keyword arguments are not valid options."""
    if isinstance(options, SaveOptions):
        return options, None
    return attempt(lambda: SaveOptions.from_kwargs(**options))


def _start_on_root(directory, nranks: int, options: SaveOptions, local: Described, storage: Storage,
                   series: Series) -> tuple:
    """Rank 0's part of the plan stage: ``(version directory, strategy or None, base key or None, bandwidth
    history or None, the known version names or None)``.

    Creates the directory (choosing it first when ``directory`` is a callable),
    decides the strategy when its own layout is unchanged (a cache hit needs no
    other collective for it), for an incremental save resolves the base, and
    for ``strategy="auto"`` hands out the recorded bandwidths (so that a new
    plan chooses the strategy without a collective of its own).
    """
    path = directory() if callable(directory) else directory
    if not storage.shared_files and options.strategy not in ("auto", "file-per-rank"):
        raise CheckpointError(f"strategy {options.strategy!r} writes files shared between ranks, which "
                              f"{type(storage).__name__} does not hold: use file-per-rank")
    base = None
    if is_incremental(options):
        if storage is not POSIX:
            raise CheckpointError("incremental saves build on versions in POSIX storage only")
        base = chain_cache.resolve_base(path, chain_cache.chosen_base(options.base, series.chain_base), series.root)
    history = io_history.read(series.root) if options.strategy == "auto" and storage.shared_files else None
    strategy = _auto(nranks, options, series.cache, history, storage) if local.key == series.cache.key else None
    create_version_directory(path, storage)  # last: nothing to clean up when the checks above fail
    return path, strategy, base, history, None if series.names is None else series.names.revisions


def _auto(nranks: int, options: SaveOptions, cache: PlanCache, history, storage: Storage) -> str:
    """Rank 0: the strategy of a save whose plan is cached (auto decided from the recorded bandwidths)."""
    if options.strategy != "auto" or not storage.shared_files:
        return options.strategy if storage.shared_files else "file-per-rank"
    return choose_strategy(nranks, cache.total_bytes / nranks, cache.layout.max_ranks_per_node, history)


def _transport(comm, directory: str, options: SaveOptions, cache: PlanCache, history, strategy: str | None,
               storage: Storage):
    """The transport context and strategy; after a new plan, the node layout (collective the first time for
    these processes) and ``auto`` resolved from rank 0's ``history`` (the same answer on every rank)."""
    if strategy is None and not storage.shared_files:
        strategy = "file-per-rank"  # the only transport that needs no file shared between ranks
        cache.layout = None
    if strategy is None:
        needs_layout = options.strategy == "auto" or TRANSPORTS[options.strategy].needs_node_layout
        cache.layout = node_layout(comm, options.ranks_per_node) if needs_layout else None
        strategy = options.strategy
        if strategy == "auto":
            strategy = choose_strategy(comm.Get_size(), cache.total_bytes / comm.Get_size(),
                                       cache.layout.max_ranks_per_node, history)
    ctx = TransportContext(comm=comm, directory=directory, layout=cache.layout, max_writers=options.max_writers,
                           aggregators=options.aggregators, aggregator_buffer=options.aggregator_buffer,
                           mpiio_hints=options.mpiio_hints, fsync=options.fsync, storage=storage,
                           encoded=any(c.get("id") != "none" for c in (cache.codecs or {}).values()))
    return ctx, strategy


def _drop(storage: Storage, path: str) -> None:
    """Rank 0: remove a version that failed (it created the directory); never raises."""
    try:
        storage.remove(path)
    except OSError:
        pass


def with_per_rank(values: dict, per_rank: list) -> dict:
    """Rank 0: the version's values, with each PerRank value as one entry per rank (``per_rank``: by rank)."""
    out = dict(values)
    for name in per_rank[0]:
        out[name] = encode_per_rank([p[name] for p in per_rank])
    return out


@dataclass
class Committed:
    """Rank 0's account of a commit: the metadata bytes, the stored bytes and chunks, the incremental figures
    (None for a plain full save), ``chain`` (the new version's index key and index, for the next save), the
    sibling versions it points into and ``stats``, the ranks' phase record stored with the version."""

    raw: bytes
    nbytes: int
    nchunks: int
    summary: dict | None
    chain: tuple | None
    references: frozenset
    stats: dict

    def report(self, replanned: tuple | None = None, with_metadata: bool = False) -> CommitReport:
        """What every rank learns of it (the metadata bytes stay on rank 0 unless ``with_metadata``)."""
        return CommitReport(self.nbytes, self.nchunks, self.summary, self.chain, slowest(self.stats),
                            str(straggler(self.stats)), replanned, self.raw if with_metadata else None)


def commit_on_root(version: VersionToCommit, plan: Reconciled, values: dict, parts: list[WrittenPart]) -> Committed:
    """Rank 0, the commit stage of every save: the version's Metadata from every rank's part, committed.

    ``plan``: the variables, codecs and each rank's rows (Selection.commit_part) the version commits with;
    ``values``: the replicated values (Described.values), to which each rank's PerRank values are added;
    ``parts``: every rank's :class:`WrittenPart`, by rank.  The version's ``extra`` is ``version.extra``,
    then the ranks' ``stats``, the tracked ``files`` and the ``levels``, then an incremental save's figures.
    An incremental version whose base disappeared during the save is refused.
    """
    stats = phase_record([p.stats for p in parts])
    values = with_per_rank(values, [p.per_rank for p in parts])
    extra = {**version.extra, "stats": stats}
    if version.tracked:
        extra["files"] = manifest([r for p in parts for r in p.files])
    if version.levels is not None:
        extra["levels"] = version.levels
    nranks, references = len(parts), frozenset()
    if version.info is None:
        meta, nbytes, nchunks = metadata_from_rows(plan.variables, plan.tables, plan.codecs, values, nranks,
                                                   version.step, extra)
        summary = None
    else:
        dtypes = {n: dtype_from_json(v.dtype) for n, v in plan.variables.items()}
        meta, nbytes, nchunks, summary = incremental_metadata(plan.variables, dtypes, plan.codecs, plan.tables,
                                                              values, nranks, version.step,
                                                              {**extra, "incremental": dict(version.info)})
        parent = os.path.dirname(os.path.realpath(version.directory))
        references = frozenset(referenced_versions(meta.files))
        for ref in references:
            if not os.path.isfile(os.path.join(parent, ref, METADATA_FILE)):
                raise CheckpointError(f"the base version {ref} was removed during the save")
    raw = commit_version(version.directory, meta, version.fsync, version.storage, version.synced)
    chain = chain_cache.committed(version.directory, meta) if version.info else None
    return Committed(raw, nbytes, nchunks, summary, chain, references, stats)
