"""The blocking save of one version: describe -> plan (cached) -> write -> commit.

Collectives: one allgather in which every rank reports a failure or whether its
layout still matches the cached plan (rank 0 adds the version's directory and
the strategy); a new plan when some layout changed (gather, scatter, bcast, and
the node layout / bandwidth history for ``auto``); the transport's own; and
the commit, a gather to rank 0 and a broadcast of the result.  A failure on
any rank (a bad block, a full disk, a permission error) reaches every rank in
one of these as the same CheckpointError; nobody waits forever.  The version
becomes visible only at the very end, when rank 0 renames the metadata into
place after every rank's data file is fsynced.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass


from .arrays import byte_view, global_pieces
from .checksum import checksum
from .codecs.pipeline import EncodedPieces
from .collective import agree, attempt, bcast_checked, collective_error, on_root, raise_if_failed, root_phase
from .commit import commit_version, metadata_from_rows
from .devices import as_local_array
from .errors import CheckpointError
from .log import logger
from .monitor import PhaseTimer
from .options import SaveOptions, SaveResult
from .save_stages import create_version_directory, describe_state, measure_codecs, plan_variables
from .stats import phase_record, slowest, straggler
from .transport import TRANSPORTS, Piece, TransportContext
from .transport import io_history
from .transport.auto import choose_strategy
from .transport.topology import node_layout, ranks_per_node_setting

@dataclass
class PlanCache:
    """A Checkpointer's agreed plan of its last blocking save, reused while no rank's layout changed.

    Every rank keeps its own part: ``key`` (its layout: what it holds, the
    codec specs and the options), its ``boxes``, the agreed ``codecs``, the node
    ``layout`` and the global byte count (for ``strategy="auto"``); rank 0 also
    the planned ``variables`` it commits with.  A hit costs one small allgather.
    """

    key: str | None = None
    boxes: dict | None = None
    codecs: dict | None = None
    variables: dict | None = None
    layout: object = None
    total_bytes: int = 0

    def invalidate(self) -> None:
        self.key = None


def save_version(state, directory, comm, options: SaveOptions, step: int | None = None,
                 extra: dict | None = None, io_root: str | None = None, cache: PlanCache | None = None) -> SaveResult:
    """Collectively write ``state`` into a new version directory and commit it.

    ``directory``: the path, or a callable that rank 0 runs to choose it (a
    Checkpointer clears leftovers and names the version there, inside the first
    collective).  ``io_root``: where bandwidth measurements for
    ``strategy="auto"`` are kept (a Checkpointer's root), or None.  ``cache``:
    a PlanCache kept across saves; a repeated save of an unchanged layout then
    makes three collectives with the file-per-rank transport: the allgather
    that agrees the plan still holds (and hands out rank 0's directory and
    strategy), and the gather + broadcast of the commit.
    """
    if options.incremental or options.base is not None:
        from .incremental import save_incremental

        if callable(directory):
            directory = agree(comm, "naming the version", lambda: on_root(comm, directory))
            directory = comm.bcast(directory, root=0)
        return save_incremental(state, directory, comm, options, step=step, extra=extra, io_root=io_root)
    rank = comm.Get_rank()
    timer = PhaseTimer()
    cache = cache if cache is not None else PlanCache()
    what = "save"
    with timer.phase("plan"):
        local, failure = attempt(lambda: _start(state, directory, comm, options, cache, io_root))
        everyone = comm.allgather((failure, local is not None and local["key"] == cache.key,
                                   local["root"] if rank == 0 and local is not None else None))
        root_part = everyone[0][2]
        directory = root_part[0] if root_part else directory
        what = f"save of {directory!r}" if isinstance(directory, str) else "save of a new version"
        try:
            raise_if_failed(comm, what, [f for f, _, _ in everyone])
            hit = all(h for _, h, _ in everyone)
            if hit:
                strategy = root_part[1]
                ctx = _context(comm, directory, options, cache.layout)
            else:
                cache.invalidate()
                _plan(comm, what, local, options, cache)
                ctx, strategy = _transport(comm, what, directory, options, cache, io_root)
                cache.key = local["key"]
        except CheckpointError:
            cache.invalidate()
            if rank == 0 and root_part:
                shutil.rmtree(directory, ignore_errors=True)
            raise
    try:
        with timer.phase("write"):
            pieces = _pieces(local["arrays"], cache.boxes, options.chunk_bytes, timer,
                             EncodedPieces.for_save(cache.codecs, local["summaries"], options.codec_threads),
                             hash_here=not TRANSPORTS[strategy].hashes_while_writing)
            written, failure = attempt(lambda: TRANSPORTS[strategy].write(ctx, pieces))
        stats = {"seconds": dict(timer.seconds), "timeline": list(timer.timeline),
                 "bytes": written.nbytes if written is not None else 0}
        with timer.phase("commit"):
            def commit_on_root(msgs):
                record = phase_record([m[0] for m in msgs])
                done = _commit(directory, cache, [m[1] for m in msgs], local["values"], comm.Get_size(), step,
                               {**(extra or {}), "strategy": strategy, "stats": record}, options.fsync)
                return done + (slowest(record), str(straggler(record)))  # small: broadcast to every rank

            total = root_phase(comm, what, failure, (stats, written.rows if written is not None else None),
                               commit_on_root)
    except CheckpointError:
        cache.invalidate()
        if rank == 0:  # the directory is new (rank 0 created it): drop the partial version
            shutil.rmtree(directory, ignore_errors=True)
        raise
    nbytes, nchunks, phases, straggler_text = total
    if rank == 0:
        write_seconds = phases.get("write", 0.0)
        io_history.record(io_root, strategy, comm.Get_size(), nbytes, write_seconds)
        logger.info("saved %s: %d bytes in %d chunks, %s, write %.3f s (%.2f GB/s); %s", directory, nbytes,
                    nchunks, strategy, write_seconds, nbytes / max(write_seconds, 1e-9) / 1e9, straggler_text)
    return SaveResult(path=directory, step=step, bytes_written=nbytes, nchunks=nchunks,
                      timings={**phases, "commit": timer.seconds["commit"]}, strategy=strategy)


def _start(state, directory, comm, options: SaveOptions, cache: PlanCache, io_root: str | None) -> dict:
    """This rank's part of the first collective: its description and layout key; rank 0 also creates the
    version directory (choosing it first when ``directory`` is a callable) and, when this rank's layout is
    unchanged, decides the strategy of this save; no MPI."""
    local = describe_state(state, comm.Get_rank(), options, measure=False)
    ranks_per_node_setting(options.ranks_per_node)  # a bad HPCCKPT_RANKS_PER_NODE fails here, on every rank alike
    local["key"] = repr((comm.Get_size(), options, sorted(local["summaries"].items()), sorted(local["specs"].items())))
    if comm.Get_rank() == 0:
        path = directory() if callable(directory) else directory
        create_version_directory(path)
        strategy = _auto(comm.Get_size(), options, cache, io_root) if local["key"] == cache.key else None
        local["root"] = (path, strategy)
    return local


def _plan(comm, what: str, local: dict, options: SaveOptions, cache: PlanCache) -> None:
    """Plan on rank 0 from every rank's summary (a layout changed, or the first save): gather, scatter, bcast."""
    measured, failure = attempt(lambda: measure_codecs(local, options))
    msgs = comm.gather((failure, measured), root=0)
    plan = None
    if comm.Get_rank() == 0:
        plan, failure = attempt(lambda: _plan_on_root(msgs, options))
    failure = comm.bcast(failure if comm.Get_rank() == 0 else None, root=0)
    raise_if_failed(comm, what, [failure])
    cache.boxes = comm.scatter(plan[1] if plan else None, root=0)
    cache.codecs, cache.total_bytes = comm.bcast((plan[2], plan[3]) if plan else None, root=0)
    cache.variables = plan[0] if plan else None


def _plan_on_root(msgs: list, options: SaveOptions) -> tuple:
    """Rank 0: ``(variables, boxes per rank, codecs, global bytes)``, or the ranks' own failures raised as one."""
    bad = {r: f for r, (f, _) in enumerate(msgs) if f is not None}
    if bad:
        raise collective_error("describing the state", bad, len(msgs))
    summaries = [m[1] for m in msgs]
    variables, boxes, codecs = plan_variables(summaries, options)
    return variables, boxes, codecs, sum(v.nbytes for v in variables.values())


def _auto(nranks: int, options: SaveOptions, cache: PlanCache, io_root: str | None) -> str:
    """Rank 0: the strategy of a save whose plan is cached (auto decided from the recorded bandwidths)."""
    if options.strategy != "auto":
        return options.strategy
    return choose_strategy(nranks, cache.total_bytes / nranks, cache.layout.max_ranks_per_node,
                           io_history.read(io_root))


def _context(comm, directory: str, options: SaveOptions, layout) -> TransportContext:
    return TransportContext(comm=comm, directory=directory, layout=layout, max_writers=options.max_writers,
                            aggregators=options.aggregators, aggregator_buffer=options.aggregator_buffer,
                            mpiio_hints=options.mpiio_hints, fsync=options.fsync)


def _transport(comm, what: str, directory: str, options: SaveOptions, cache: PlanCache, io_root: str | None):
    """The transport context and the strategy after a new plan (auto resolved the same way on every rank)."""
    needs_layout = options.strategy == "auto" or TRANSPORTS[options.strategy].needs_node_layout
    cache.layout = node_layout(comm, options.ranks_per_node) if needs_layout else None
    strategy = options.strategy
    if strategy == "auto":
        history = bcast_checked(comm, what, lambda: io_history.read(io_root))
        strategy = choose_strategy(comm.Get_size(), cache.total_bytes / comm.Get_size(),
                                   cache.layout.max_ranks_per_node, history)
    return _context(comm, directory, options, cache.layout), strategy


def _pieces(arrays: dict, boxes: dict, chunk_bytes: int, timer: PhaseTimer, encoder: EncodedPieces,
            hash_here: bool = True):
    """This rank's chunks as Pieces (encoded by their codec), produced lazily as the transport consumes them.

    ``hash_here=False`` leaves the checksum to a transport that hashes while it writes.
    """
    items = {}
    for name, local in arrays.items():
        arr = as_local_array(local) if local is not None else None
        if arr is not None and arr.size:
            items[name] = (arr, boxes[name][0])
    for variable, start, count, arr in encoder.wrap(global_pieces(items, chunk_bytes), timer):
        payload = byte_view(arr)
        if not hash_here:
            yield Piece(variable, start, count, payload, None)
            continue
        with timer.phase("hash"):
            digest = checksum(payload)
        yield Piece(variable, start, count, payload, digest)


def _commit(directory: str, cache: PlanCache, tables, values, nranks: int, step, extra: dict,
            fsync: bool) -> tuple[int, int]:
    """Rank 0: build the version's metadata from every rank's rows and commit it; ``(bytes, chunks)``."""
    meta, total, nchunks = metadata_from_rows(cache.variables, tables, cache.codecs, values, nranks, step, extra)
    commit_version(directory, meta, fsync)
    return total, nchunks
