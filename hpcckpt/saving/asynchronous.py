"""Asynchronous and multi-level saves for :class:`hpcckpt.Checkpointer`: what is pending, polled and flushed.

Every save is a :class:`hpcckpt.saving.run.SaveRun`.  ``asynchronous=True``
makes it write in the background: ``save`` returns once the selection is
staged into the pool (the caller may overwrite its arrays at once), the
writer thread encodes and writes this rank's file, and the run's commit waits
for the next collective call into the Checkpointer (``save``, ``wait``,
``restore``, ``close``; and ``should_save``/``poll`` when every rank's writer
is already done; ``latest``/``steps`` are not collective and list committed
versions only).  A full save of an unchanged layout calls no MPI in ``save``.

With ``local_dir`` (asynchronous or not) the levels of ``hpcckpt.levels`` are
the commit's destinations: L1 node-local, L2 partner, L3 XOR parity, RS
Reed-Solomon, PM persistent memory, L4 the root, flushed from L1 in a
background thread and committed at a later call.  An incremental version on
the levels reuses only blocks of its own rank's file (they sit on its node)
and is a full version when it is due for a flush and its base is not on the
root.  ``restore`` picks the newest version and the fastest level that holds
it whole, rebuilding lost files from partners or parity, and falls back to the
root with a warning that says why.  A clean end flushes the newest version to
the root when it is not there yet (:meth:`Engine.flush_newest`).

At most one save is in flight: a save while one is in flight waits for it
(``skip_if_busy=True``: is skipped, counted in ``skipped``, and returns None,
unless every rank's writer has already finished).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from hpcckpt.errors import CheckpointError
from hpcckpt.levels import LevelOptions, keyword_names
from hpcckpt.levels.node import NodeLevels
from hpcckpt.mpi.collective import allgather_checked, bcast_checked
from hpcckpt.core.names import parse_version_name
from hpcckpt.options import SaveResult
from hpcckpt.root.catalog import VersionEntry, current, list_versions
from hpcckpt.saving.precopy import PreCopy
from hpcckpt.saving.precopy_plan import PrecopyConfig
from hpcckpt.saving.run import SaveRequest, SaveRun, save_now
from hpcckpt.saving.staging import DEFAULT_STAGING_BYTES


#: The engine's own options (Checkpointer keyword arguments); the levels' come from their registry.
ENGINE_OPTIONS = ("asynchronous", "staging_bytes", "skip_if_busy", "precopy")


@dataclass(frozen=True)
class EngineOptions:
    """The asynchronous / multi-level engine's options: its own, and the node-local levels' (``levels``).

    ``asynchronous``: the commit waits for the next call; ``staging_bytes``:
    the staging pool's size; ``skip_if_busy``: a save while one is in flight
    is skipped; ``precopy``: pre-copy rounds (saving/precopy_plan.py).
    """

    asynchronous: bool = False
    staging_bytes: int = DEFAULT_STAGING_BYTES
    skip_if_busy: bool = False
    precopy: PrecopyConfig | None = None
    levels: LevelOptions = field(default_factory=LevelOptions)

    @classmethod
    def from_kwargs(cls, **keywords) -> EngineOptions:
        """The options from Checkpointer keywords (those :func:`pop_engine_options` took); invalid: a
        CheckpointError."""
        own = {n: keywords.pop(n) for n in ENGINE_OPTIONS if n in keywords}
        own["precopy"] = PrecopyConfig.from_option(own.get("precopy"))
        return cls(levels=LevelOptions.from_kwargs(**keywords), **own)

    def __post_init__(self):
        if isinstance(self.staging_bytes, bool) or not isinstance(self.staging_bytes, int) or self.staging_bytes < 1:
            raise CheckpointError(f"staging_bytes must be a positive integer, got {self.staging_bytes!r}")
        object.__setattr__(self, "asynchronous", bool(self.asynchronous))
        object.__setattr__(self, "skip_if_busy", bool(self.skip_if_busy))

    @property
    def wanted(self) -> bool:
        """Whether these options need the engine (otherwise a Checkpointer saves blocking, without it)."""
        return self.asynchronous or self.levels.enabled or self.precopy is not None


def pop_engine_options(options: dict) -> dict:
    """Remove and return the engine's options from a Checkpointer's keyword arguments."""
    return {k: options.pop(k) for k in ENGINE_OPTIONS + keyword_names() if k in options}


@dataclass(frozen=True)
class UnflushedVersion:
    """A committed node-local version not flushed to the root: what its flush needs (``metadata``: the sealed
    bytes on rank 0, None elsewhere)."""

    name: str
    step: int
    metadata: bytes | None
    references: frozenset
    sizes: list
    fsync: bool


class Engine:
    """The asynchronous / multi-level side of a Checkpointer (see the module docstring).

    Read-only attributes for tools and tests: ``node`` (the NodeLevels, or
    None without ``local_dir``), ``pool`` (the staging pool), ``plan_cache``,
    ``pending`` (the SaveRun in flight), ``skipped``, ``restored_level``,
    ``last_result``.
    """

    def __init__(self, ckpt, options: EngineOptions):
        self.ckpt = ckpt
        self.comm = ckpt.comm
        self.rank = self.comm.Get_rank()
        self.asynchronous = options.asynchronous
        self.skip_if_busy = options.skip_if_busy
        self.series = ckpt.series
        self.series.staging_bytes = options.staging_bytes
        if options.levels.enabled:
            self.series.levels = NodeLevels(self.comm, ckpt.root, ckpt.keep, ckpt.options.ranks_per_node,
                                            options.levels, ckpt.local_storage, ckpt.storage)
        self.restored_level: str | None = None
        self.pending: SaveRun | None = None
        self.skipped = 0
        #: The committed versions not flushed to the root that the newest one needs (itself and the versions it
        #: points into), each with its flush arguments: a clean end flushes them (:meth:`flush_newest`).
        self._unflushed: dict[str, UnflushedVersion] = {}
        if options.precopy is not None:
            self.series.precopy = PreCopy(self, options.precopy)

    @property
    def node(self) -> NodeLevels | None:
        return self.series.levels

    @property
    def precopy(self) -> PreCopy | None:
        return self.series.precopy

    @property
    def pool(self):
        return self.series.pool

    @property
    def plan_cache(self):
        return self.series.cache

    @property
    def last_result(self) -> SaveResult | None:
        return self.series.last_result

    # ------------------------------------------------------------------ save
    def save(self, request: SaveRequest) -> SaveResult | None:
        """Commit the save in flight (or skip this one while it writes), then run this one: committed at once
        when not asynchronous, else at the next collective call."""
        if self.pending is not None:
            if self.skip_if_busy and not self._all_done():
                self.skipped += 1
                return None
            self.complete()
        if not request.background:
            result, run = save_now(self.comm, self.series, request)
            self._after_commit(run)
            return result
        self.pending = SaveRun(self.comm, self.series, request).start()
        return self.pending.pending_result()

    def _all_done(self) -> bool:
        return all(allgather_checked(self.comm, "polling the asynchronous save", lambda: self.pending.written_here))

    def complete(self) -> SaveResult | None:
        """Collective: commit the save in flight (waiting for the writers); its SaveResult, or None without one."""
        run, self.pending = self.pending, None
        return None if run is None else self._finish(run)

    def _finish(self, run: SaveRun) -> SaveResult:
        """Commit a background save (whose plan stands or fails: never planned again)."""
        result = run.finish()
        self._after_commit(run)
        return result

    def _after_commit(self, run: SaveRun) -> None:
        if self.node is not None:
            self._after_levels(run)

    def _after_levels(self, run: SaveRun) -> None:
        """Node-local retention, then the version's flush to the root when one is due (else it is kept as the
        newest unflushed version, with the unflushed ones it points into, for a clean end to flush)."""
        node, planned = self.node, run.planned
        node.retain()
        version = UnflushedVersion(planned.name, run.request.step, run.report_metadata, run.references, run.sizes,
                                   run.options.fsync)
        if run.due.get("flush"):
            node.start_flush(version.name, version.step, version.metadata, version.references, version.sizes,
                             version.fsync, run.local_cost)
            self._unflushed = {}
        else:
            self._unflushed = {n: v for n, v in self._unflushed.items() if n in run.references}
            self._unflushed[planned.name] = version
            node.poll_flush(block=False)

    # ------------------------------------------------------------ the others
    def poll(self) -> bool:
        """Collective, non-blocking: commit the pending save and flush if every rank finished; True if idle."""
        if self.pending is not None and self._all_done():
            self.complete()
        flushed = self.node.poll_flush(block=False) if self.node is not None else True
        return self.pending is None and flushed

    def sync(self) -> SaveResult | None:
        """Collective: commit the pending save (waiting for the writers); the SaveResult of the last commit.

        A flush that finished is committed even when the pending save's commit
        fails (the error is agreed, so every rank gets here alike): an earlier
        complete version must not stay uncommitted on the root.
        """
        try:
            if self.pending is not None:
                self.complete()
        finally:
            if self.node is not None:
                self.node.poll_flush(block=False)
        return self.last_result

    def wait(self) -> SaveResult | None:
        """Collective: commit the pending save and wait for the flush in progress (committed even if the save
        fails)."""
        try:
            self.sync()
        finally:
            if self.node is not None:
                self.node.poll_flush(block=True)
        return self.last_result

    def flush_newest(self) -> None:
        """Collective: flush the newest committed version to the root if it is not there, after the versions it
        points into that are not there either (oldest first), so that a clean end leaves the newest version
        restorable from the root alone, on any node count.  The same on every rank: every rank keeps the same
        ``_unflushed`` (the commit's decisions are agreed)."""
        if self.node is None or not self._unflushed:
            return
        for version in sorted(self._unflushed.values(), key=lambda v: v.step):
            self.node.start_flush(version.name, version.step, version.metadata, version.references, version.sizes,
                                  version.fsync)
        self._unflushed = {}
        self.node.poll_flush(block=True)

    def close(self) -> None:
        try:
            self.wait()
            self.flush_newest()
        finally:
            if self.precopy is not None:
                self.precopy.close()
            if self.node is not None:
                self.node.close()

    def live(self) -> list[VersionEntry] | None:
        """Committed versions on any level (newest revision of each step), oldest first; collective."""
        self.sync()
        if self.node is None:
            return None
        node_dir = self.node.node_dir
        names = {n for ns in allgather_checked(self.comm, f"listing {node_dir!r}", lambda: [
            e.name for e in list_versions(node_dir, self.node.storage) if e.committed]) for n in ns}
        root = bcast_checked(self.comm, f"listing {self.ckpt.root!r}", lambda: [
            e.name for e in list_versions(self.ckpt.root, self.ckpt.storage) if e.committed])
        return current([_entry(n, True, self._path(n)) for n in sorted(names | set(root))])

    def committed_here(self) -> list[VersionEntry]:
        """Committed versions this rank reads now, without MPI: the root's and its own node directory's.

        The pending save is not among them (it is committed by the next
        collective call).  With ``local_dir``, a version held only in other
        nodes' directories (a node replaced after a failure) is missing here
        but found by :meth:`live`.
        """
        names = {e.name for e in list_versions(self.ckpt.root, self.ckpt.storage) if e.committed}
        if self.node is not None:
            names |= {e.name for e in list_versions(self.node.node_dir, self.node.storage) if e.committed}
        return current([_entry(n, True, self._path(n)) for n in sorted(names)])

    def _path(self, name: str) -> str:
        return os.path.join(self.ckpt.root, name)

    def restore(self, state, step=None, strict=True, cast=False):
        from hpcckpt.levels.restore import restore_levels

        self.sync()
        return restore_levels(self, state, step, strict, cast)


def _entry(name: str, committed: bool = True, path: str = "") -> VersionEntry:
    parsed = parse_version_name(name)
    return VersionEntry(name, path, parsed.step, parsed.revision, committed)


__all__ = ["Engine", "EngineOptions", "ENGINE_OPTIONS", "pop_engine_options"]
