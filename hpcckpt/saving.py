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

import numpy as np

from ._mpi import agree, on_root
from .arrays import global_pieces
from .encoding import dtype_from_json, encode_value
from .errors import CheckpointError
from .metadata import METADATA_FILE, ChunkTable, Metadata, Variable
from .monitor import PhaseTimer
from .planning import plan_save
from .state import split_state, summarize_for_save
from .storage.posix import atomic_write, fsync_path
from .transport.file_per_rank import write_rank_file

DATA_DIR = "data"
#: Default largest chunk: small enough that a reshard load reads little beyond
#: what it needs, large enough that 100 GiB is fewer than 10,000 chunks.
DEFAULT_CHUNK_BYTES = 16 << 20


@dataclass(frozen=True)
class SaveOptions:
    """Options of a save (``hpcckpt.save(..., **options)`` and ``Checkpointer(..., **options)``)."""

    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    fsync: bool = True

    @classmethod
    def from_kwargs(cls, **kwargs) -> "SaveOptions":
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise CheckpointError(f"unknown save option(s) {unknown}; known: {sorted(known)}")
        opts = cls(**kwargs)
        if not isinstance(opts.chunk_bytes, int) or opts.chunk_bytes < 1:
            raise CheckpointError(f"chunk_bytes must be a positive integer, got {opts.chunk_bytes!r}")
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
                 extra: dict | None = None) -> SaveResult:
    """Collectively write ``state`` into the (new or leftover-only) ``directory`` and commit it."""
    rank = comm.Get_rank()
    timer = PhaseTimer()
    what = f"save of {directory!r}"

    with timer.phase("describe"):
        local = agree(comm, what, lambda: _describe(state, rank))
        summaries = comm.gather(local["summaries"], root=0)
        plan = agree(comm, what, lambda: on_root(comm, lambda: _plan_and_prepare(summaries, directory)))
        boxes = comm.scatter(plan[1] if plan else None, root=0)
    try:
        with timer.phase("write"):
            written = agree(comm, what, lambda: _write(local["arrays"], boxes, directory, rank, options))
        with timer.phase("commit"):
            tables = comm.gather(written, root=0)
            total = agree(comm, what, lambda: on_root(comm, lambda: _commit(
                directory, plan[0], tables, local["values"], comm.Get_size(), step, extra or {}, options.fsync)))
            total = comm.bcast(total, root=0)
    except CheckpointError:
        if rank == 0:  # the directory is new (planning created it): drop the partial version
            shutil.rmtree(directory, ignore_errors=True)
        raise
    return SaveResult(path=directory, step=step, bytes_written=total[0], nchunks=total[1], timings=timer.seconds)


def _describe(state, rank: int) -> dict:
    distributed, replicated = split_state(state)
    summaries = {name: summarize_for_save(name, value) for name, value in distributed.items()}
    arrays = {name: value.local for name, value in distributed.items()}
    values = {name: encode_value(v, repr(name)) for name, v in replicated.items()} if rank == 0 else None
    return {"summaries": summaries, "arrays": arrays, "values": values}


def _plan_and_prepare(summaries, directory: str):
    variables, boxes = plan_save(summaries)
    os.makedirs(os.path.join(directory, DATA_DIR), exist_ok=False)
    return variables, boxes


def _write(arrays: dict, boxes: dict, directory: str, rank: int, options: SaveOptions):
    items = {}
    for name, local in arrays.items():
        arr = np.asarray(local) if local is not None else None
        if arr is not None and arr.size:
            items[name] = (arr, boxes[name][0])
    name = f"{DATA_DIR}/part-{rank:06d}.bin"
    return write_rank_file(directory, name, global_pieces(items, options.chunk_bytes), fsync=options.fsync)


def _commit(directory: str, variables, tables, values, nranks: int, step, extra: dict, fsync: bool):
    files: list[str] = []
    rows: dict[str, list] = {name: [] for name in variables}
    total = nchunks = 0
    for written in tables:
        if written.name is None:
            continue
        index = len(files)
        files.append(written.name)
        total += written.nbytes
        nchunks += len(written.rows)
        for variable, offset, nbytes, digest, start, count in written.rows:
            rows[variable].append((index, offset, nbytes, digest, start, count))
    meta = Metadata(
        step=step, files=files, nranks=nranks,
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        variables={name: Variable(name=name, kind=plan.kind, dtype=dtype_from_json(plan.dtype), shape=plan.shape,
                                  chunks=ChunkTable.from_rows(rows[name], len(plan.shape)))
                   for name, plan in variables.items()},
        values=values, extra=extra)
    if fsync:
        fsync_path(os.path.join(directory, DATA_DIR))
    atomic_write(os.path.join(directory, METADATA_FILE), meta.to_json_bytes(), fsync=fsync)
    if fsync:
        fsync_path(os.path.dirname(os.path.abspath(directory)))
    return total, nchunks
