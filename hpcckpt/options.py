"""The options of a save and what a save reports: SaveOptions (all validation in one place) and SaveResult.

Pure: no MPI, no I/O.  Every kind of save (blocking, incremental,
asynchronous, multi-level) takes the same SaveOptions and returns a SaveResult,
made in one place from what the commit reported (saving/pipeline.save_result).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from hpcckpt.codecs.pipeline import check_codec_option
from hpcckpt.errors import CheckpointError
from hpcckpt.core.humanize import format_duration, human_bytes
from hpcckpt.transport import TRANSPORTS

#: Default largest chunk: small enough that the scratch buffer and the parts a
#: reshard load forwards stay well under 10% of a typical per-rank state, large
#: enough that 100 GiB is about 12,800 chunks (metadata opens in well under 1 s).
DEFAULT_CHUNK_BYTES = 8 << 20
STRATEGIES = ("auto", *TRANSPORTS)


@dataclass(frozen=True)
class SaveOptions:
    """Options of a save (``hpcckpt.save(..., **options)`` and ``Checkpointer(..., **options)``).

    ``strategy``: "auto" (default), "file-per-rank", "aggregated" or "shared-file"
    (docs/io.md); ``aggregators``: aggregator count (default one per node);
    ``aggregator_buffer``: the aggregated strategy's slice size (an aggregator
    holds one slice, plus as much again of compressed pieces waiting for their
    turn: hpcckpt.transport.aggregated);
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
    # incremental saves (docs/incremental.md, hpcckpt/incremental/rules.py): only blocks not already stored are written
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
        _check_incremental(opts)
        return opts


@dataclass
class SaveResult:
    """What a save did; the same meaning for every kind of save (blocking, incremental, asynchronous, levels).

    ``bytes_written``: the stored bytes all ranks wrote for this version
    (an incremental version: the new blocks only); ``nchunks``: chunks in the
    version's index (an incremental version's referenced ones included);
    ``timings``: seconds per phase of the slowest rank (the maximum over the
    ranks of each phase, as stored in the version's ``extra.stats``), plus this
    rank's ``commit`` (and, after a blocking ``Checkpointer.save``, this rank's
    ``retention``: rank 0 removes the versions beyond ``keep``); ``strategy``: the transport used; ``kind``: ``"full"``
    or ``"incremental"``; ``levels``: where the version is committed,
    ``("root",)`` or the node-local levels it reached (``"L1"``, ``"L2"``
    partner copy, ``"L3"`` XOR parity, ``"RS"`` Reed-Solomon parity; the L4 flush commits later); ``incremental``:
    the figures of an incremental save (docs/incremental.md), else None.

    ``this_rank``: this rank's own figures, apart from the global ones:
    ``bytes`` (what this rank wrote itself) and ``timings`` (its phases).

    ``pending``: an asynchronous save whose data is still being written: then
    nothing is committed yet (``bytes_written`` and ``nchunks`` are 0, and
    ``timings`` are this rank's foreground phases); the committed result comes
    from ``Checkpointer.wait()`` or, after the next call, ``Checkpointer.last_result``.
    """

    path: str
    step: int | None
    bytes_written: int = 0
    nchunks: int = 0
    timings: dict[str, float] = field(default_factory=dict)
    strategy: str = "file-per-rank"
    kind: str = "full"
    levels: tuple[str, ...] = ("root",)
    pending: bool = False
    incremental: dict | None = None
    this_rank: dict = field(default_factory=dict)

    def __repr__(self) -> str:
        """One line: the version, its step, kind, size and where it is (the fields have the details)."""
        name = os.path.basename(os.path.normpath(self.path)) if self.path else "?"
        if self.pending:
            return f"SaveResult({name}, step {self.step}, pending)"
        size = human_bytes(self.bytes_written)
        slow = max((v for k, v in self.timings.items() if k != "commit"), default=0.0)
        return (f"SaveResult({name}, step {self.step}, {self.kind}, {size} in {self.nchunks} chunks, "
                f"{'+'.join(self.levels)}, {self.strategy}, slowest phase {format_duration(slow)})")


def _check_incremental(opts) -> None:
    """Validate the incremental save options (docs/incremental.md) of a SaveOptions (CheckpointError)."""
    if not isinstance(opts.incremental, bool):
        raise CheckpointError(f"incremental must be True or False, got {opts.incremental!r}")
    if not isinstance(opts.dedup, bool):
        raise CheckpointError(f"dedup must be True or False, got {opts.dedup!r}")
    if opts.base is not None and not isinstance(opts.base, (str, os.PathLike)):
        raise CheckpointError(f"base must be a path or None, got {opts.base!r}")
    for name in ("block_bytes", "max_chain"):
        value = getattr(opts, name)
        low = 1 if name == "block_bytes" else 0
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise CheckpointError(f"{name} must be an integer >= {low}, got {value!r}")
    t = opts.full_threshold
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t <= 1:
        raise CheckpointError(f"full_threshold must be a number in [0, 1], got {t!r}")
