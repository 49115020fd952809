"""The save pipeline: every kind of save runs these stages, in this order, through one module each.

::

    describe   save_stages.describe_state      this rank's summaries, arrays, values (no MPI)
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
    commit     commit_on_root + commit.commit_version   (every rank's rows gathered to rank 0; a repeated
                                                blocking file-per-rank save: 2 collectives in all)

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
from dataclasses import dataclass

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
from hpcckpt.saving.plan import PlanCache, agree_plan, check_at_commit, plan_locally, reconcile
from hpcckpt.saving.stages import create_version_directory, describe_state
from hpcckpt.saving.selection import Selection, select_changed, select_full
from hpcckpt.stateful import resolve as resolve_state
from hpcckpt.core.stats import phase_record, slowest, straggler
from hpcckpt.storage import POSIX, Storage
from hpcckpt.saving.transform import encoded_pieces, raw_pieces
from hpcckpt.transport import TRANSPORTS, TransportContext, io_history
from hpcckpt.transport.auto import choose_strategy
from hpcckpt.transport.topology import node_layout, ranks_per_node_setting


def describe(state, comm, options: SaveOptions, step=None) -> dict:
    """The describe stage on this rank (no MPI); a bad HPCCKPT_RANKS_PER_NODE fails here, on every rank alike.

    The state is resolved here, once per save, for every kind of save
    (hpcckpt.stateful: Stateful objects, callables, getters, nested dicts).
    """
    local = describe_state(resolve_state(state), comm.Get_rank(), comm.Get_size(), options, step=step)
    ranks_per_node_setting(options.ranks_per_node)
    return local


def is_incremental(options: SaveOptions) -> bool:
    return options.incremental or options.base is not None


def select(comm, what: str, local: dict, cache: PlanCache, options: SaveOptions, index, starts=None,
           per_rank_files: bool = False, precopied: dict | None = None, probed: frozenset | None = None) -> Selection:
    """The select stage: every array (full saves; ``starts`` default to the cached boxes) or the changed blocks
    (``precopied``: blocks already written into this version by pre-copy, ``probed``: keys its probes saw,
    selection.select_changed)."""
    if is_incremental(options):
        return select_changed(comm, what, local["arrays"], cache.boxes, cache.variables, cache.codecs, options,
                              index, per_rank_files, cache.replicas, precopied, probed)
    if starts is not None:  # a plan made locally (asynchronous saves): never one with replicated Blocks
        return select_full(local["arrays"], starts)
    return select_full(local["arrays"], {n: b[0] for n, b in cache.boxes.items()}, cache.replicas)


def save_version(state, directory, comm, options: SaveOptions | dict, step: int | None = None, extra: dict | None = None,
                 io_root: str | None = None, cache: PlanCache | None = None, chain_base: str | None = None,
                 storage: Storage = POSIX, files=None, names: KnownNames | None = None) -> SaveResult:
    """Collectively write ``state`` into a new version directory and commit it (a blocking save).

    ``directory``: the path, or a callable that rank 0 runs to choose it (a
    Checkpointer clears leftovers and names the version there, inside the
    plan stage's allreduce).  ``io_root``: where bandwidth measurements for
    ``strategy="auto"`` are kept and, for an incremental save, where the
    newest version is looked up as its base (a Checkpointer's root).
    ``cache``: a PlanCache kept across saves.  ``names``: a Checkpointer's
    catalog.KnownNames (rank 0 fills them when it names a version; every rank
    receives them with the plan).  With both, a repeated full save of the same
    options with ``strategy="file-per-rank"`` (no tracked files, no replicated
    Blocks) plans locally and is checked at its commit: two collectives, the
    commit's gather and broadcast (:func:`_save_checked_at_commit`).
    Otherwise the plan is agreed before the data moves: on a cache hit one
    allreduce, then the commit's gather + broadcast (an incremental save adds
    its select stage's allgather, or its two alltoalls from
    dedup_owners.OWNERS_FROM_RANKS ranks on).
    ``chain_base``: the version an incremental save builds on when it still
    exists (a Checkpointer's last saved or restored one).  ``storage``: where
    the version is written (hpcckpt.storage); one without ``shared_files``
    takes the file-per-rank transport only.  ``options``: SaveOptions, or the
    keyword arguments to make them from, validated inside the plan stage (an
    invalid option on one rank is the same CheckpointError on every rank).
    Every rank must pass the same step, options, names, kinds and replicated
    values (mpi/agreement.py; checked in the plan stage's allreduce, or at the
    commit).
    ``files``: called as ``files(directory)`` on every rank after its data are
    written, returns this rank's records of the tracked output files
    (hpcckpt.root.files); rank 0 commits them as ``extra["files"]``.
    """
    rank, size = comm.Get_rank(), comm.Get_size()
    timer = PhaseTimer()
    cache = cache if cache is not None else PlanCache()
    options, failure = _options(options)  # a failure is agreed in the plan stage, below
    incremental = failure is None and is_incremental(options)
    with timer.phase("plan"):
        if failure is None:
            local, failure = attempt(lambda: describe(state, comm, options, step))
        else:
            local = None
    if cache.checked_at_commit and names is not None and names.revisions is not None:  # agreed on every rank
        result = _save_checked_at_commit(comm, local, failure, options, step, extra, cache, names, timer)
        if result is not None:
            return result
        # some rank asked for other options, or a changed layout did not reconcile: plan collectively after all
    name_of = lambda root: f"save of {root[0]!r}" if root else "save of a new version"  # noqa: E731
    with timer.phase("plan"):
        root_part = None
        if rank == 0 and failure is None:
            root_part, failure = attempt(lambda: _start_on_root(directory, size, options, cache, local, io_root,
                                                                chain_base, storage, names))
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
        with timer.phase("commit"):
            def on_root(msgs):
                check_replicas([m[3] for m in msgs])
                return _commit_rows(path, msgs, cache.variables, cache.codecs, [m[1] for m in msgs], local, size,
                                    step, {**(extra or {}), "strategy": strategy}, options, selection, storage,
                                    files is not None)

            mine = (stats, selection.commit_part(written.rows) if written is not None else None, local["per_rank"],
                    selection.replicas, records)
            outcome = root_phase(comm, what, failure, mine, on_root)
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
    return _saved(path, step, outcome, selection, options, strategy, stats, timer, rank, size, io_root, names)


def _save_checked_at_commit(comm, local: dict | None, failure, options: SaveOptions | None, step, extra,
                            cache: PlanCache, names: KnownNames, timer: PhaseTimer) -> SaveResult | None:
    """A blocking save planned locally against the cached plan and checked at its commit: two collectives.

    Every rank names the version from ``names`` (catalog.KnownNames, no
    listing), creates its directory if no rank did yet, plans with
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
    rank, size = comm.Get_rank(), comm.Get_size()
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
        codecs = cache.codecs if own is None else own[2]
        written, records, failure, stats = _write(ctx, TRANSPORTS["file-per-rank"], codecs, local, selection,
                                                  options, timer, None)
    what = f"save of {path!r}" if path else "save of a new version"
    reconciled = []  # rank 0: the plan it committed with
    with timer.phase("commit"):
        def on_root(msgs):
            if any(m[5] for m in msgs):
                return None
            check_at_commit([m[4] for m in msgs], [m[6] for m in msgs], [{}] * len(msgs))
            settled, unreconciled = attempt(lambda: reconcile(cache, [m[1] for m in msgs], [m[3] for m in msgs]))
            if unreconciled is not None:
                return None
            reconciled.append(settled)
            return _commit_rows(path, msgs, settled.variables, settled.codecs, settled.tables, local, size, step,
                                {**(extra or {}), "strategy": "file-per-rank"}, options, selection, POSIX, False), \
                ((settled.variables, settled.all_boxes, settled.codecs) if settled.changed else None)

        mine = (stats, selection.commit_part(written.rows) if written is not None else None, local and
                local["per_rank"], own, local and local["details"], other, path and os.path.basename(path))
        try:
            outcome = root_phase(comm, what, failure, mine, on_root)
        except CheckpointError:
            cache.invalidate()
            names.forget()
            _drop_here(path, rank)
            raise
    if outcome is None:
        cache.invalidate()
        _drop_here(path, rank)
        return None
    outcome, replanned = outcome
    if replanned is not None:  # some rank's layout changed: every rank adopts the reconciled plan
        cache.adopt(local["key"], replanned, rank, reconciled[0] if rank == 0 else None)
    return _saved(path, step, outcome, selection, options, "file-per-rank", stats, timer, rank, size, None, names)


def _plan_here(local: dict, cache: PlanCache, options: SaveOptions, names: KnownNames, step) -> tuple:
    """This rank's plan of a save checked at the commit: ``(version directory, selection, own plan or None)``;
    creates the directory and its ``data/`` unless another rank already did (no MPI).  A directory that holds
    a committed version is refused (never the case while this job holds the root's lock), and then left alone:
    this rank has no ``path`` to remove."""
    starts, _, own = plan_locally(local, cache, options)
    path = names.next_path(check_step(step))
    if os.path.lexists(os.path.join(path, METADATA_FILE)):
        raise CheckpointError(f"{path} already holds a committed version: the root changed behind this job")
    os.makedirs(os.path.join(path, DATA_DIR), exist_ok=True)
    return path, select_full(local["arrays"], starts), own


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


def _write(ctx: TransportContext, transport, codecs: dict, local: dict, selection: Selection, options: SaveOptions,
           timer: PhaseTimer, files) -> tuple:
    """The transform and transport stages on this rank: ``(written, tracked-file records, failure, stats)``."""
    with timer.phase("write"):
        encoder = EncodedPieces.for_save(codecs, local["summaries"], options.codec_threads)
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


def _commit_rows(path: str, msgs: list, variables: dict, codecs: dict, tables: list, local: dict, size: int, step,
                 extra: dict, options: SaveOptions, selection: Selection, storage: Storage, tracked: bool) -> tuple:
    """Rank 0, the commit of a blocking save from every rank's message ``(stats, part, per-rank values, ...,
    tracked-file records)``: what every rank receives (Committed.small, the slowest phases, the straggler)."""
    record = phase_record([m[0] for m in msgs])
    values = with_per_rank(local["values"], [m[2] for m in msgs])
    files = {"files": manifest([r for m in msgs for r in m[4]])} if tracked else {}
    done = commit_on_root(path, variables, codecs, tables, values, size, step,
                          {**extra, "stats": record, **files}, options.fsync, selection.info, storage,
                          synced=extra["strategy"] == "file-per-rank")
    return done.small() + (slowest(record), str(straggler(record)))  # small: broadcast to every rank


def _saved(path: str, step, outcome: tuple, selection: Selection, options: SaveOptions, strategy: str, stats: dict,
           timer: PhaseTimer, rank: int, size: int, io_root, names: KnownNames | None) -> SaveResult:
    """Every rank, after a commit: the SaveResult (rank 0 records the bandwidth for ``auto`` and logs)."""
    nbytes, nchunks, summary, chain, phases, straggler_text = outcome
    if chain is not None:
        chain_cache.remember(*chain)
    if names is not None:
        names.add(os.path.basename(path))
    if rank == 0:
        write_seconds = phases.get("write", 0.0)
        if options.strategy == "auto":  # its only reader: a fixed strategy's save skips the write of the file
            io_history.record(io_root, strategy, size, nbytes, write_seconds)
        logger.info("saved %s (%s): %d bytes in %d chunks, %s, write %.3f s (%.2f GB/s); %s", path,
                    selection.kind, nbytes, nchunks, strategy, write_seconds,
                    nbytes / max(write_seconds, 1e-9) / 1e9, straggler_text)
    return SaveResult(path=path, step=step, bytes_written=nbytes, nchunks=nchunks,
                      timings={**phases, "commit": timer.seconds["commit"]}, strategy=strategy, kind=selection.kind,
                      incremental=None if selection.info is None else {**selection.info, **summary},
                      this_rank={"bytes": stats["bytes"], "timings": dict(timer.seconds)})


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


def _start_on_root(directory, nranks: int, options: SaveOptions, cache: PlanCache, local: dict, io_root, chain_base,
                   storage: Storage, names: KnownNames | None) -> tuple:
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
        base = chain_cache.resolve_base(path, chain_cache.chosen_base(options.base, chain_base), io_root)
    history = io_history.read(io_root) if options.strategy == "auto" and storage.shared_files else None
    strategy = _auto(nranks, options, cache, history, storage) if local["key"] == cache.key else None
    create_version_directory(path, storage)  # last: nothing to clean up when the checks above fail
    return path, strategy, base, history, None if names is None else names.revisions


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
    (None for a plain full save), ``chain`` (the new version's index key and index, for the next save) and
    the sibling versions it points into."""

    raw: bytes
    nbytes: int
    nchunks: int
    summary: dict | None
    chain: tuple | None
    references: frozenset = frozenset()

    def small(self) -> tuple:
        """What every rank needs of it (the metadata bytes stay on rank 0)."""
        return self.nbytes, self.nchunks, self.summary, self.chain


def commit_on_root(directory: str, variables: dict, codecs: dict, parts: list, values, nranks: int, step,
                   extra: dict, fsync: bool, info: dict | None, storage: Storage = POSIX,
                   synced: bool = False) -> Committed:
    """Rank 0, the commit stage: the version's Metadata from every rank's part, committed at ``directory``.

    ``parts``: each rank's :meth:`Selection.commit_part`; ``info``: the
    incremental policy's outcome (None for a plain full save).  An
    incremental version whose base disappeared during the save is refused.
    ``synced``: the writers fsynced ``data/`` and the parent already
    (:func:`sync_written`; commit.commit_version).
    """
    references = frozenset()
    if info is None:
        meta, nbytes, nchunks = metadata_from_rows(variables, parts, codecs, values, nranks, step, extra)
        summary = None
    else:
        dtypes = {n: dtype_from_json(v.dtype) for n, v in variables.items()}
        meta, nbytes, nchunks, summary = incremental_metadata(variables, dtypes, codecs, parts, values, nranks,
                                                              step, {**extra, "incremental": dict(info)})
        parent = os.path.dirname(os.path.realpath(directory))
        references = frozenset(referenced_versions(meta.files))
        for ref in references:
            if not os.path.isfile(os.path.join(parent, ref, METADATA_FILE)):
                raise CheckpointError(f"the base version {ref} was removed during the save")
    raw = commit_version(directory, meta, fsync, storage, synced)
    return Committed(raw, nbytes, nchunks, summary, chain_cache.committed(directory, meta) if info else None,
                     references)
