"""The collective save of one version: describe -> plan -> write -> commit.

Each phase's rank-local work runs inside ``agree`` so that a failure on any
rank (a bad block, a full disk, a permission error) becomes the same
CheckpointError on every rank and nobody waits forever.  The version becomes
visible only at the very end, when rank 0 renames the metadata into place after
every rank's data file is fsynced.
"""

from __future__ import annotations

import shutil


from .arrays import byte_view, global_pieces
from .checksum import checksum
from .codecs.pipeline import EncodedPieces
from .collective import agree, on_root
from .commit import commit_version, metadata_from_rows
from .devices import as_local_array
from .errors import CheckpointError
from .log import logger
from .monitor import PhaseTimer
from .options import SaveOptions, SaveResult
from .save_stages import describe_state, plan_and_prepare
from .stats import phase_record, slowest, straggler
from .transport import WRITERS, Piece, TransportContext
from .transport import io_history
from .transport.auto import choose_strategy
from .transport.topology import node_layout, ranks_per_node_setting

def save_version(state, directory: str, comm, options: SaveOptions, step: int | None = None,
                 extra: dict | None = None, io_root: str | None = None) -> SaveResult:
    """Collectively write ``state`` into the (new) ``directory`` and commit it.

    ``io_root``: where bandwidth measurements for ``strategy="auto"`` are kept
    (a Checkpointer's root), or None.
    """
    if options.incremental or options.base is not None:
        from .incremental import save_incremental

        return save_incremental(state, directory, comm, options, step=step, extra=extra, io_root=io_root)
    rank = comm.Get_rank()
    timer = PhaseTimer()
    what = f"save of {directory!r}"
    with timer.phase("plan"):
        local = agree(comm, what, lambda: describe_state(state, rank, options))
        summaries = comm.gather(local["summaries"], root=0)
        plan = agree(comm, what, lambda: on_root(comm, lambda: plan_and_prepare(summaries, directory, options)))
        boxes = comm.scatter(plan[1] if plan else None, root=0)
        codec_configs = comm.bcast(plan[2] if plan else None, root=0)
    try:
        ctx, strategy = _transport(comm, what, directory, options, local["arrays"], io_root)
        with timer.phase("write"):
            pieces = _pieces(local["arrays"], boxes, options.chunk_bytes, timer,
                             EncodedPieces.for_save(codec_configs, local["summaries"], options.codec_threads),
                             hash_here=strategy != "file-per-rank")
            written = agree(comm, what, lambda: WRITERS[strategy](ctx, pieces))
        stats = comm.gather({"seconds": timer.seconds, "timeline": timer.timeline, "bytes": written.nbytes}, root=0)
        with timer.phase("commit"):
            tables = comm.gather(written.rows, root=0)
            record = on_root(comm, lambda: phase_record(stats))
            extra = {**(extra or {}), "strategy": strategy, "stats": record}
            total = agree(comm, what, lambda: on_root(comm, lambda: _commit(
                directory, plan, tables, local["values"], comm.Get_size(), step, extra, options.fsync)
                + (slowest(record),)))
            total = comm.bcast(total, root=0)
    except CheckpointError:
        if rank == 0:  # the directory is new (planning created it): drop the partial version
            shutil.rmtree(directory, ignore_errors=True)
        raise
    if rank == 0:
        write_seconds = max(s["seconds"]["write"] for s in stats)
        io_history.record(io_root, strategy, comm.Get_size(), total[0], write_seconds)
        logger.info("saved %s: %d bytes in %d chunks, %s, write %.3f s (%.2f GB/s); %s", directory, total[0],
                    total[1], strategy, write_seconds, total[0] / max(write_seconds, 1e-9) / 1e9,
                    straggler(record))
    return SaveResult(path=directory, step=step, bytes_written=total[0], nchunks=total[1],
                      timings={**total[2], "commit": timer.seconds["commit"]}, strategy=strategy)


def _transport(comm, what: str, directory: str, options: SaveOptions, arrays: dict, io_root: str | None):
    """The transport context and the strategy (auto resolved the same way on every rank)."""
    needs_layout = options.strategy in ("auto", "aggregated")
    # the only rank-local step that can fail (a bad HPCCKPT_RANKS_PER_NODE) runs under agree
    agree(comm, what, lambda: ranks_per_node_setting(options.ranks_per_node))
    layout = node_layout(comm, options.ranks_per_node) if needs_layout else None
    strategy = options.strategy
    if strategy == "auto":
        local_bytes = sum(as_local_array(a).nbytes for a in arrays.values() if a is not None)
        total = comm.allreduce(local_bytes)
        history = comm.bcast(io_history.read(io_root) if comm.Get_rank() == 0 else None, root=0)
        strategy = choose_strategy(comm.Get_size(), total / comm.Get_size(), layout.max_ranks_per_node, history)
    ctx = TransportContext(comm=comm, directory=directory, layout=layout, max_writers=options.max_writers,
                           aggregators=options.aggregators, aggregator_buffer=options.aggregator_buffer,
                           mpiio_hints=options.mpiio_hints, fsync=options.fsync)
    return ctx, strategy


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


def _commit(directory: str, plan, tables, values, nranks: int, step, extra: dict, fsync: bool) -> tuple[int, int]:
    """Rank 0: build the version's metadata from every rank's rows and commit it; ``(bytes, chunks)``."""
    variables, _, codecs = plan
    meta, total, nchunks = metadata_from_rows(variables, tables, codecs, values, nranks, step, extra)
    commit_version(directory, meta, fsync)
    return total, nchunks
