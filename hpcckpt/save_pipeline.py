"""The save pipeline: every kind of save runs these stages, in this order, through one module each.

::

    describe   save_stages.describe_state      this rank's summaries, arrays, values (no MPI)
    plan       save_plan                        agreed before writing (one allreduce on a cache hit),
                                                or checked at the commit (asynchronous full saves: no MPI)
    select     selection                        full: every array; incremental: the changed blocks
                                                (the policy and deduplication: one allgather, two for a
                                                full version with reusable blocks; from
                                                dedup_owners.OWNERS_FROM_RANKS ranks on two alltoalls
                                                through the keys' owners)
    stage      zero-copy (blocking) | staging.stage into the pool (asynchronous; device -> host for CuPy)
    transform  transform                        cut into chunks -> codec -> checksum
    transport  transport.TRANSPORTS (blocking) | background.BackgroundWrite (asynchronous, file-per-rank)
    commit     commit_on_root + commit.commit_version   (every rank's rows gathered to rank 0)

:func:`save_version` is the blocking save (``hpcckpt.save`` and a
Checkpointer without engine); the asynchronous / multi-level engine
(asynchronous.py) runs the same stages with the transport on its background
writer and the commit at its next call, and adds the levels as destinations
of the commit.  A failure on any rank, in any stage, is the same
CheckpointError on every rank, and the new version's directory is removed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from . import chain_cache
from .agreement import replica_mismatch
from .codecs.pipeline import EncodedPieces
from .collective import attempt, root_phase
from .commit import commit_version, metadata_from_rows
from .encoding import dtype_from_json, encode_per_rank
from .errors import CheckpointError
from .file_manifest import manifest
from .incremental import incremental_metadata, referenced_versions
from .log import logger
from .monitor import PhaseTimer
from .names import METADATA_FILE
from .options import SaveOptions, SaveResult
from .save_plan import PlanCache, agree_plan
from .save_stages import create_version_directory, describe_state
from .selection import Selection, select_changed, select_full
from .stateful import resolve as resolve_state
from .stats import phase_record, slowest, straggler
from .storage import POSIX, Storage
from .transform import encoded_pieces, raw_pieces
from .transport import TRANSPORTS, TransportContext, io_history
from .transport.auto import choose_strategy
from .transport.topology import node_layout, ranks_per_node_setting


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
                 storage: Storage = POSIX, files=None) -> SaveResult:
    """Collectively write ``state`` into a new version directory and commit it (a blocking save).

    ``directory``: the path, or a callable that rank 0 runs to choose it (a
    Checkpointer clears leftovers and names the version there, inside the
    plan stage's allreduce).  ``io_root``: where bandwidth measurements for
    ``strategy="auto"`` are kept and, for an incremental save, where the
    newest version is looked up as its base (a Checkpointer's root).
    ``cache``: a PlanCache kept across saves; a repeated save of an unchanged
    layout then makes three collectives with the file-per-rank transport: the
    allreduce of the plan stage, and the gather + broadcast of the commit (an
    incremental save adds its select stage's allgather, or its two alltoalls
    from dedup_owners.OWNERS_FROM_RANKS ranks on).
    ``chain_base``: the version an incremental save builds on when it still
    exists (a Checkpointer's last saved or restored one).  ``storage``: where
    the version is written (hpcckpt.storage); one without ``shared_files``
    takes the file-per-rank transport only.  ``options``: SaveOptions, or the
    keyword arguments to make them from, validated inside the plan stage (an
    invalid option on one rank is the same CheckpointError on every rank).
    Every rank must pass the same step, options, names, kinds and replicated
    values (agreement.py; checked in the plan stage's allreduce).
    ``files``: called as ``files(directory)`` on every rank after its data are
    written, returns this rank's records of the tracked output files
    (hpcckpt.file_tracking); rank 0 commits them as ``extra["files"]``.
    """
    rank, size = comm.Get_rank(), comm.Get_size()
    timer = PhaseTimer()
    cache = cache if cache is not None else PlanCache()
    options, failure = _options(options)  # a failure is agreed in the plan stage's allreduce, below
    incremental = failure is None and is_incremental(options)
    name_of = lambda root: f"save of {root[0]!r}" if root else "save of a new version"  # noqa: E731
    with timer.phase("plan"):
        if failure is None:
            local, failure = attempt(lambda: describe(state, comm, options, step))
        else:
            local = None
        root_part = None
        if rank == 0 and failure is None:
            root_part, failure = attempt(lambda: _start_on_root(directory, size, options, cache, local, io_root,
                                                                chain_base, storage))
        try:
            root, held, hit = agree_plan(comm, name_of, local, failure, options, cache, root_part,
                                         frozenset(chain_cache.held()) if incremental else None,
                                         frozenset.intersection)
        except CheckpointError:
            if rank == 0 and root_part:
                _drop(storage, root_part[0])
            raise
    path, strategy, base_key, history = root
    what = name_of(root)
    try:
        with timer.phase("plan"):
            ctx, strategy = _transport(comm, path, options, cache, history, strategy if hit else None, storage)
            index = chain_cache.base_index(comm, what, base_key, held) if incremental else None
        with timer.phase("hash" if incremental else "plan"):
            selection = select(comm, what, local, cache, options, index)
        transport = TRANSPORTS[strategy]
        with timer.phase("write"):
            encoder = EncodedPieces.for_save(cache.codecs, local["summaries"], options.codec_threads)
            pieces = encoded_pieces(raw_pieces(selection.items, options.chunk_bytes), encoder, timer,
                                    checksum_here=not transport.hashes_while_writing, digests=selection.digests)
            written, failure = attempt(lambda: transport.write(ctx, pieces))
            records = None
            if failure is None and files is not None:
                records, failure = attempt(lambda: files(path))
        stats = {"seconds": dict(timer.seconds), "timeline": list(timer.timeline),
                 "bytes": written.nbytes if written is not None else 0}
        with timer.phase("commit"):
            def on_root(msgs):
                check_replicas([m[3] for m in msgs])
                record = phase_record([m[0] for m in msgs])
                values = with_per_rank(local["values"], [m[2] for m in msgs])
                tracked = {} if files is None else {"files": manifest([r for m in msgs for r in m[4]])}
                done = commit_on_root(path, cache.variables, cache.codecs, [m[1] for m in msgs], values,
                                      size, step, {**(extra or {}), "strategy": strategy, "stats": record, **tracked},
                                      options.fsync, selection.info, storage)
                return done.small() + (slowest(record), str(straggler(record)))  # small: broadcast to every rank

            mine = (stats, selection.commit_part(written.rows) if written is not None else None, local["per_rank"],
                    selection.replicas, records)
            nbytes, nchunks, summary, chain, phases, straggler_text = root_phase(comm, what, failure, mine, on_root)
    except CheckpointError:
        cache.invalidate()
        if rank == 0:  # the directory is new (rank 0 created it): drop the partial version
            _drop(storage, path)
        raise
    if chain is not None:
        chain_cache.remember(*chain)
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
                   storage: Storage) -> tuple:
    """Rank 0's part of the plan stage: ``(version directory, strategy or None, base key or None, bandwidth
    history or None)``.

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
    return path, strategy, base, history


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
                           mpiio_hints=options.mpiio_hints, fsync=options.fsync, storage=storage)
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
                   extra: dict, fsync: bool, info: dict | None, storage: Storage = POSIX) -> Committed:
    """Rank 0, the commit stage: the version's Metadata from every rank's part, committed at ``directory``.

    ``parts``: each rank's :meth:`Selection.commit_part`; ``info``: the
    incremental policy's outcome (None for a plain full save).  An
    incremental version whose base disappeared during the save is refused.
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
    raw = commit_version(directory, meta, fsync, storage)
    return Committed(raw, nbytes, nchunks, summary, chain_cache.committed(directory, meta) if info else None,
                     references)
