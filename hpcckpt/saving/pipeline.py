"""The stages of the save run (saving/run.py), one function each, and the commit rank 0 makes.

::

    describe   stages.describe_state -> messages.Described: summaries, arrays, values (no MPI)
    select     selection                 full: every array; incremental: the changed blocks (the policy and
                                         deduplication: one allgather, two for a full version with reusable
                                         blocks; from dedup_owners.OWNERS_FROM_RANKS ranks on two alltoalls
                                         through the keys' owners)
    write      transform + transport     cut into chunks -> codec -> checksum -> transport.TRANSPORTS
    commit     commit_on_root            rank 0: the version's metadata from every rank's messages.WrittenPart,
                                         committed (storage/commit.py); its messages.CommitReport
    result     save_result               the SaveResult of every save, on every rank
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from hpcckpt.incremental import chain_cache
from hpcckpt.mpi.agreement import replica_mismatch
from hpcckpt.codecs.pipeline import EncodedPieces
from hpcckpt.mpi.collective import attempt
from hpcckpt.storage.commit import commit_version, metadata_from_rows, parent_directory
from hpcckpt.core.encoding import dtype_from_json, encode_per_rank
from hpcckpt.errors import CheckpointError
from hpcckpt.root.file_manifest import manifest
from hpcckpt.incremental.rules import incremental_metadata, referenced_versions
from hpcckpt.core.monitor import PhaseTimer
from hpcckpt.core.names import DATA_DIR, METADATA_FILE
from hpcckpt.options import SaveOptions, SaveResult
from hpcckpt.saving.messages import CommitReport, Described, VersionToCommit, WrittenPart
from hpcckpt.saving.plan import PlanCache, Reconciled
from hpcckpt.saving.stages import describe_state
from hpcckpt.saving.selection import Selection, select_changed, select_full
from hpcckpt.stateful import resolve as resolve_state
from hpcckpt.core.stats import phase_record, slowest, straggler
from hpcckpt.storage import POSIX, Storage
from hpcckpt.saving.transform import encoded_pieces, raw_pieces
from hpcckpt.transport import TRANSPORTS, TransportContext
from hpcckpt.transport.auto import choose_strategy
from hpcckpt.transport.topology import node_layout, ranks_per_node_setting


def describe(state, comm, options: SaveOptions, step=None, directory: str | None = None) -> Described:
    """The describe stage on this rank (no MPI); a bad HPCCKPT_RANKS_PER_NODE fails here, on every rank alike.
    ``directory``: the path of a save to a path, which every rank must pass alike (mpi/agreement.py).

    The state is resolved here, once per save, for every kind of save
    (hpcckpt.stateful: Stateful objects, callables, getters, nested dicts).
    """
    local = describe_state(resolve_state(state), comm.Get_rank(), comm.Get_size(), options, step=step,
                           directory=directory)
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
    if starts is not None:  # a plan made on this rank: never one with replicated Blocks
        return select_full(local.arrays, starts)
    return select_full(local.arrays, {n: b[0] for n, b in cache.boxes.items()}, cache.replicas)


def write_foreground(ctx: TransportContext, strategy: str, codecs: dict, local: Described, selection: Selection,
                     options: SaveOptions, timer: PhaseTimer) -> tuple:
    """The transform and transport stages on this rank, now: ``(written, failure)`` (the failure described for
    the commit, which agrees on it)."""
    transport = TRANSPORTS[strategy]
    with timer.phase("write"):
        encoder = EncodedPieces.for_save(codecs, local.summaries, options.codec_threads)
        pieces = encoded_pieces(raw_pieces(selection.items, options.chunk_bytes), encoder, timer,
                                checksum_here=not transport.hashes_while_writing, digests=selection.digests)
        written, failure = attempt(lambda: transport.write(ctx, pieces))
        if failure is None and ctx.fsync and transport.name == "file-per-rank":
            failure = attempt(lambda: sync_written(ctx, written))[1]
    return written, failure


def sync_written(ctx: TransportContext, written) -> None:
    """After this rank wrote its own file (file-per-rank, fsynced): ``data/`` fsynced by every rank that created a
    file there, the version's parent by rank 0 (the version directory exists by now), each in parallel with the
    other ranks' writes instead of on rank 0's commit (commit.commit_version with ``synced``)."""
    storage = ctx.storage or POSIX
    if written.rows:
        storage.sync_directory(os.path.join(ctx.directory, DATA_DIR))
    if ctx.comm.Get_rank() == 0:
        storage.sync_directory(parent_directory(ctx.directory))


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


def start_transport(comm, directory: str, options: SaveOptions, cache: PlanCache, history, strategy: str | None,
               storage: Storage):
    """The transport context and strategy; after a new plan, the node layout (collective the first time for
    these processes) and ``auto`` resolved from rank 0's ``history`` (the same answer on every rank)."""
    if strategy is None and not storage.shared_paths:
        strategy = "file-per-rank"  # the only transport whose files need not be seen by other processes
        cache.layout = None
    if strategy is None:
        needs_layout = options.strategy == "auto" or TRANSPORTS[options.strategy].needs_node_layout
        cache.layout = node_layout(comm, options.ranks_per_node) if needs_layout else None
        strategy = options.strategy
        if strategy == "auto":
            strategy = choose_strategy(comm.Get_size(), cache.total_bytes / comm.Get_size(),
                                       cache.layout.max_ranks_per_node, history, shared_files=storage.shared_files,
                                       aggregators=options.aggregators)
    ctx = TransportContext(comm=comm, directory=directory, layout=cache.layout, max_writers=options.max_writers,
                           aggregators=options.aggregators, aggregator_buffer=options.aggregator_buffer,
                           mpiio_hints=options.mpiio_hints, fsync=options.fsync, storage=storage,
                           encoded=any(c.get("id") != "none" for c in (cache.codecs or {}).values()))
    return ctx, strategy


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
        parent = os.path.dirname(version.storage.realpath(version.directory))
        references = frozenset(referenced_versions(meta.files))
        for ref in references:
            if not version.storage.is_file(os.path.join(parent, ref, METADATA_FILE)):
                raise CheckpointError(f"the base version {ref} was removed during the save")
    raw = commit_version(version.directory, meta, version.fsync, version.storage, version.synced)
    chain = chain_cache.committed(version.directory, meta, version.storage) if version.info else None
    return Committed(raw, nbytes, nchunks, summary, chain, references, stats)
