"""The collective save of one version: describe -> plan -> write -> commit.

Each phase's rank-local work runs inside ``agree`` so that a failure on any
rank (a bad block, a full disk, a permission error) becomes the same
CheckpointError on every rank and nobody waits forever.  The version becomes
visible only at the very end, when rank 0 renames the metadata into place after
every rank's data file is fsynced.
"""

from __future__ import annotations

import datetime as _dt
import os
import shutil
from dataclasses import dataclass, field


from .collective import agree, on_root
from .arrays import byte_view, global_pieces
from .checksum import checksum
from .codecs.pipeline import EncodedPieces, check_codec_option, codec_summary, decide_codecs
from .devices import as_local_array
from .encoding import dtype_from_json, encode_value
from .log import logger
from .errors import CheckpointError
from .metadata import ChunkTable, Metadata, Variable
from .monitor import PhaseTimer
from .names import DATA_DIR, METADATA_FILE
from .planning import plan_save
from .state import split_state, summarize_for_save
from .stats import straggler
from .storage.posix import atomic_write, fsync_path
from .transport import WRITERS, Piece, TransportContext
from .transport import io_history
from .transport.auto import choose_strategy
from .transport.topology import node_layout, ranks_per_node_setting

#: Default largest chunk: small enough that the scratch buffer and the parts a
#: reshard load forwards stay well under 10% of a typical per-rank state, large
#: enough that 100 GiB is about 12,800 chunks (metadata opens in well under 1 s).
DEFAULT_CHUNK_BYTES = 8 << 20
STRATEGIES = ("auto", *WRITERS)


@dataclass(frozen=True)
class SaveOptions:
    """Options of a save (``hpcckpt.save(..., **options)`` and ``Checkpointer(..., **options)``).

    ``strategy``: "auto" (default), "file-per-rank", "aggregated" or "shared-file"
    (docs/io.md); ``aggregators``: aggregator count (default one per node);
    ``aggregator_buffer``: the most bytes an aggregator holds at once;
    ``max_writers``: at most this many ranks write at the same time;
    ``ranks_per_node``: simulate nodes of this many ranks (also the environment
    variable HPCCKPT_RANKS_PER_NODE); ``mpiio_hints``: MPI-IO hints for shared-file.
    """

    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    fsync: bool = True
    strategy: str = "auto"
    aggregators: int | None = None
    aggregator_buffer: int = 64 << 20
    max_writers: int | None = None
    ranks_per_node: int | None = None
    mpiio_hints: dict = field(default_factory=dict)
    codec: object = "none"  # the default codec of variables that name none (docs/compression.md)
    codec_threads: int | None = None  # compression threads per rank (default: min(4, cores))
    # incremental saves (docs/incremental.md, hpcckpt/incremental.py): only blocks not already stored are written
    incremental: bool = False
    base: str | None = None  # the version to build on (a sibling directory); implies incremental
    block_bytes: int = 1 << 20  # the global block grid of incremental saves (replaces chunk_bytes)
    max_chain: int = 10  # a full version once this many incremental versions follow one another
    full_threshold: float = 0.5  # a full version when more than this fraction of the bytes changed
    dedup: bool = True  # identical blocks within a version are stored once

    @classmethod
    def from_kwargs(cls, **kwargs) -> "SaveOptions":
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise CheckpointError(f"unknown save option(s) {unknown}; known: {sorted(known)}")
        opts = cls(**kwargs)
        for name in ("chunk_bytes", "aggregator_buffer"):
            value = getattr(opts, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise CheckpointError(f"{name} must be a positive integer, got {value!r}")
        for name in ("aggregators", "max_writers", "ranks_per_node"):
            value = getattr(opts, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise CheckpointError(f"{name} must be a positive integer or None, got {value!r}")
        if opts.strategy not in STRATEGIES:
            raise CheckpointError(f"unknown strategy {opts.strategy!r}; choose one of {list(STRATEGIES)}")
        if not isinstance(opts.mpiio_hints, dict):
            raise CheckpointError("mpiio_hints must be a dict of hint name -> value")
        check_codec_option(opts.codec, opts.codec_threads)
        from .incremental import check_options

        check_options(opts)
        return opts


@dataclass
class SaveResult:
    """What a save did: where, how many bytes (all ranks), and this rank's seconds per phase."""

    path: str
    step: int | None
    bytes_written: int
    nchunks: int
    timings: dict[str, float] = field(default_factory=dict)
    strategy: str = "file-per-rank"


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
        local = agree(comm, what, lambda: _describe(state, rank, options))
        summaries = comm.gather(local["summaries"], root=0)
        plan = agree(comm, what, lambda: on_root(comm, lambda: _plan_and_prepare(summaries, directory, options)))
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
            extra = {**(extra or {}), "strategy": strategy, "stats": on_root(comm, lambda: _stats(stats))}
            total = agree(comm, what, lambda: on_root(comm, lambda: _commit(
                directory, plan[0], tables, local["values"], comm.Get_size(), step, extra, options.fsync,
                plan[2])))
            total = comm.bcast(total, root=0)
    except CheckpointError:
        if rank == 0:  # the directory is new (planning created it): drop the partial version
            shutil.rmtree(directory, ignore_errors=True)
        raise
    if rank == 0:
        write_seconds = max(s["seconds"]["write"] for s in stats)
        io_history.record(io_root, strategy, comm.Get_size(), total[0], write_seconds)
        summary = _stats(stats)
        logger.info("saved %s: %d bytes in %d chunks, %s, write %.3f s (%.2f GB/s); %s", directory, total[0],
                    total[1], strategy, write_seconds, total[0] / max(write_seconds, 1e-9) / 1e9,
                    straggler(summary))
    return SaveResult(path=directory, step=step, bytes_written=total[0], nchunks=total[1], timings=timer.seconds,
                      strategy=strategy)


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


def _stats(per_rank: list[dict]) -> dict:
    """The per-rank phase timings and bytes stored with the version (small: a few numbers per rank)."""
    phases = sorted({p for s in per_rank for p in s["seconds"]})
    return {"phases": {p: [round(s["seconds"].get(p, 0.0), 6) for s in per_rank] for p in phases},
            "bytes": [s["bytes"] for s in per_rank],
            "timeline": [[[name, round(a, 6), round(b, 6)] for name, a, b in s["timeline"]] for s in per_rank]}


def _describe(state, rank: int, options: SaveOptions) -> dict:
    distributed, replicated = split_state(state)
    summaries = {name: summarize_for_save(name, value) for name, value in distributed.items()}
    for name, value in distributed.items():
        summaries[name]["codec"] = codec_summary(value, summaries[name], options.codec)
    arrays = {name: value.local for name, value in distributed.items()}
    values = {name: encode_value(v, repr(name)) for name, v in replicated.items()} if rank == 0 else None
    return {"summaries": summaries, "arrays": arrays, "values": values}


def _plan_and_prepare(summaries, directory: str, options: SaveOptions):
    variables, boxes = plan_save(summaries)
    codecs = decide_codecs(variables, summaries, options.codec_threads)
    os.makedirs(os.path.join(directory, DATA_DIR), exist_ok=False)
    return variables, boxes, codecs


def _commit(directory: str, variables, tables, values, nranks: int, step, extra: dict, fsync: bool,
            codecs: dict | None = None):
    files: list[str] = []
    index: dict[str, int] = {}
    rows: dict[str, list] = {name: [] for name in variables}
    total = nchunks = 0
    for rank_rows in tables:
        for variable, file, offset, nbytes, digest, start, count in rank_rows:
            if file not in index:
                index[file] = len(files)
                files.append(file)
            rows[variable].append((index[file], offset, nbytes, digest, start, count))
            total += nbytes
            nchunks += 1
    meta = Metadata(
        step=step, files=files, nranks=nranks,
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        variables={name: Variable(name=name, kind=plan.kind, dtype=dtype_from_json(plan.dtype), shape=plan.shape,
                                  chunks=ChunkTable.from_rows(rows[name], len(plan.shape)),
                                  codec=(codecs or {}).get(name, {"id": "none"}))
                   for name, plan in variables.items()},
        values=values, extra=extra)
    if fsync:
        fsync_path(os.path.join(directory, DATA_DIR))
    atomic_write(os.path.join(directory, METADATA_FILE), meta.to_json_bytes(), fsync=fsync)
    if fsync:
        fsync_path(os.path.dirname(os.path.abspath(directory)))
    return total, nchunks
