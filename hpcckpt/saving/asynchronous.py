"""Asynchronous and multi-level saves for :class:`hpcckpt.Checkpointer`: the save pipeline with a deferred commit.

``Checkpointer(root, asynchronous=True, ...)`` runs the stages of
saving/pipeline.py split in two:

* foreground, inside ``save``: describe; plan (the cached plan, checked at the
  commit, so a full save of an unchanged layout calls no MPI at all; an
  incremental save agrees its plan and runs its select stage collectively:
  an allreduce and an allgather, or two alltoalls from
  dedup_owners.OWNERS_FROM_RANKS ranks on when it deduplicates); stage (a copy of the selected arrays or changed blocks into
  the staging pool, saving/staging.py); then ``save`` returns.  The caller may
  overwrite its arrays at once.
* background (one thread per rank, no MPI call in it, saving/background.py): the
  transform stage and the file-per-rank write, into the root's version
  directory or, with ``local_dir``, into the node-local level L1.
* the commit, at the next collective call into the Checkpointer (``save``,
  ``wait``, ``restore``, ``close``; and ``should_save``/``poll`` when every
  rank's writer is already done; ``latest``/``steps`` are not collective and
  list committed versions only): every rank waits for its writer,
  all agree on failures (one rank's failure is a CheckpointError on every
  rank, and the version is removed, never committed), the levels protect it
  (partner copies, parity, Reed-Solomon: levels/node.py), rank 0 writes the metadata, and
  retention uncommits the versions it drops at once and deletes their
  directories on a thread (catalog.Retirement): freeing their bytes is no
  part of this commit.

With ``local_dir`` (asynchronous or not) the levels of ``hpcckpt.levels`` are
the commit's destinations: L1 node-local, L2 partner, L3 XOR parity, L4 the
root, flushed from L1 in a background thread and committed at a later call.
An incremental version on the levels reuses only blocks of its own rank's file
(they sit on its node) and is a full version when it is due for a flush and
its base is not on the root.  ``restore`` picks the newest version and the
fastest level that holds it whole, rebuilding lost files from partners or
parity, and falls back to the root with a warning that says why.

At most one save is in flight: a save while one is in flight waits for it
(``skip_if_busy=True``: is skipped, counted in ``skipped``, and returns None,
unless every rank's writer has already finished).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from dataclasses import dataclass, field

from hpcckpt.incremental import chain_cache
from hpcckpt.saving.background import BackgroundWrite
from hpcckpt.root.catalog import Retirement, VersionEntry, check_step, current, list_versions, new_version_name, removable, \
    remove_versions
from hpcckpt.codecs.pipeline import EncodedPieces
from hpcckpt.mpi.collective import allgather_checked, attempt, bcast_checked, best_effort, collective_error, \
    describe_failure
from hpcckpt.core.devices import is_device_array
from hpcckpt.errors import CheckpointError
from hpcckpt.levels import LevelOptions, keyword_names
from hpcckpt.levels.node import NodeLevels
from hpcckpt.core.log import logger
from hpcckpt.core.monitor import PhaseTimer
from hpcckpt.core.names import parse_version_name, rank_file
from hpcckpt.options import SaveOptions, SaveResult
from hpcckpt.saving.precopy import PreCopy
from hpcckpt.saving.precopy_plan import PrecopyConfig
from hpcckpt.saving.messages import OwnPlan, VersionToCommit, WrittenPart
from hpcckpt.saving.pipeline import commit_on_root, describe, is_incremental, save_result, select
from hpcckpt.saving.plan import PlanCache, agree_plan, plan_locally, settle
from hpcckpt.saving.selection import Selection
from hpcckpt.saving.staging import DEFAULT_STAGING_BYTES, SlotQueue, StagingPool, stage, staged_bytes


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


@dataclass
class Pending:
    """A save whose data is being written in the background; committed by :meth:`Engine.complete`."""

    step: int
    name: str
    directory: str  # where this rank's writer writes (root version or node-local version)
    values: dict | None
    writer: BackgroundWrite
    due: dict
    stage_seconds: float
    options: SaveOptions
    selection: Selection  # what was selected (its items dropped: the writer holds the staged copies)
    key: str | None  # this rank's layout key, adopted with a reconciled plan
    own: OwnPlan | None = None  # the plan this rank made alone when its layout changed
    details: dict | None = None  # what the ranks must agree on (mpi/agreement.py), when not agreed in the plan stage
    per_rank: dict | None = None  # this rank's PerRank values (JSON form), collected by the commit
    started: float = field(default_factory=time.perf_counter)


class Engine:
    """The asynchronous / multi-level side of a Checkpointer (see the module docstring).

    Read-only attributes for tools and tests: ``node`` (the NodeLevels, or
    None without ``local_dir``), ``pool`` (the staging pool), ``plan_cache``,
    ``pending``, ``skipped``, ``restored_level``, ``last_result``.
    """

    def __init__(self, ckpt, options: EngineOptions):
        self.ckpt = ckpt
        self.comm = ckpt.comm
        self.rank = self.comm.Get_rank()
        self.asynchronous = options.asynchronous
        self.staging_bytes = options.staging_bytes
        self.skip_if_busy = options.skip_if_busy
        self.node: NodeLevels | None = None
        if options.levels.enabled:
            self.node = NodeLevels(self.comm, ckpt.root, ckpt.keep, ckpt.options.ranks_per_node, options.levels)
        self.restored_level: str | None = None
        self.pool: StagingPool | None = None
        self.pending: Pending | None = None
        self.skipped = 0
        self.count = 0  # checkpoints committed by this run (for the level intervals)
        self.last_result: SaveResult | None = None
        self.plan_cache = PlanCache()  # the agreed plan, reused while the layout is unchanged
        self._names: set[str] = set()  # every version name that may exist (agreed on every rank)
        self._retirement = Retirement()  # rank 0: retention's deletions, off the commit's critical path
        #: The committed versions not flushed to the root that the newest one needs (itself and the versions it
        #: points into), each with its flush arguments: a clean end flushes them (:meth:`flush_newest`).
        self._unflushed: dict[str, UnflushedVersion] = {}
        self.precopy: PreCopy | None = None
        if options.precopy is not None:
            if not self.asynchronous or not is_incremental(ckpt.options) or self.node is not None:
                raise CheckpointError("precopy needs asynchronous=True and incremental=True, without local_dir")
            self.precopy = PreCopy(self, options.precopy)

    # ------------------------------------------------------------------ save
    def save(self, state, step: int, **options) -> SaveResult | None:
        """The foreground stages: describe, plan, select, stage; then the writer runs (see the module docstring).

        Commits at once when not asynchronous.  The first save (and the first
        after a failed commit) plans collectively and clears leftovers of
        interrupted runs; later full saves of an unchanged layout call no MPI
        here: the blocking part is the commit of a previous save still in
        flight (if any) plus one copy per array.
        """
        t0 = time.perf_counter()
        if self.pending is not None:
            if self.skip_if_busy and not self._all_done():
                self.skipped += 1
                return None
            self.complete()
        what = f"save of step {step!r} under {self.ckpt.root!r}"
        timer = PhaseTimer()
        error = own = local = None
        opts, error = self._options(step, options)
        with timer.phase("plan"):
            try:
                if error is None:
                    local = describe(state, self.comm, opts, step)
            except Exception as exc:  # noqa: BLE001 - agreed in the plan stage, or at the commit
                error = exc
            # a plan with replicated Blocks is agreed every time: who owns a region depends on every rank's block
            agreed = is_incremental(opts) or not self.plan_cache.valid or self.plan_cache.has_replicated
            if agreed:
                index = self._agree(local, None if error is None else describe_failure(error), opts, step, what)
                starts = None
            else:  # checked at the commit: no collective now; a failure here surfaces there
                index = starts = None
                if error is None:
                    try:
                        starts, _, own = plan_locally(local, self.plan_cache, opts)
                    except Exception as exc:  # noqa: BLE001 - agreed at the commit
                        error = exc
            name = new_version_name([_entry(n) for n in self._names], step if isinstance(step, int) and not
                                    isinstance(step, bool) and 0 <= step else 0)
            directory = self._target(name)
        precopied, probed = self.precopy.hand_over(directory) if self.precopy is not None else (None, None)
        with timer.phase("hash" if is_incremental(opts) else "plan"):
            selection = Selection([]) if error is not None else select(
                self.comm, what, local, self.plan_cache, opts, index, starts, per_rank_files=self.node is not None,
                precopied=precopied, probed=probed)
        if precopied:
            self.precopy.drop_unused(directory, selection.refs)
        codecs = self.plan_cache.codecs if own is None else own.codecs
        writer = self._writer(directory, selection, codecs, local, opts)
        self._stage(selection, writer, opts, timer, error)
        due = self.node.levels.due(self.count) if self.node is not None else {}
        self.pending = Pending(step, name, directory, local.values if local else None, writer, due,
                               timer.seconds.get("stage", 0.0), opts, selection.with_items([]),
                               local.key if local else None, own,
                               None if agreed or local is None else local.details,
                               local.per_rank if local else None)
        if not self.asynchronous:
            result = self.complete()
        else:
            result = save_result(self._path(name), step, selection, timer.seconds)
        self.ckpt.pacer.record_save(step, time.perf_counter() - t0)
        return result

    def _options(self, step, options: dict) -> tuple:
        """``(SaveOptions, None)``, or ``(stand-in options, the exception)`` for an invalid option or step.

        The failure is agreed in the plan stage or at the commit, like any
        other failure of this rank: every rank raises the same CheckpointError.
        The stand-in (the Checkpointer's options, with the incremental choice
        this call asked for) keeps this rank's collectives those of the others.
        """
        merged = {**self.ckpt.options.__dict__, **options}
        try:
            check_step(step)
            opts = SaveOptions.from_kwargs(**merged)
            if self.precopy is not None:  # the rounds' block size, the same on every rank (saving/precopy_plan.py)
                opts = dataclasses.replace(opts, block_bytes=self.precopy.block_bytes(opts))
            return opts, None
        except Exception as exc:  # noqa: BLE001 - agreed in the plan stage, or at the commit
            wanted = bool(merged.get("incremental")) or merged.get("base") is not None
            return dataclasses.replace(self.ckpt.options, incremental=wanted, base=None), exc

    def _agree(self, local, failure, opts: SaveOptions, step: int, what: str):
        """The plan stage agreed before writing (the first save, and every incremental save); the base index.

        On the first plan, rank 0 clears uncommitted leftovers on the root (not
        the version being flushed) and node leaders those in their node
        directory; the names every rank then sees are kept for later saves.
        Rank 0 also resolves an incremental save's base.
        """
        first = not self.plan_cache.valid
        root_part = report = None
        if failure is None:
            if first and self.node is not None:
                report, failure = attempt(self.node.clear_leftovers)
            if self.rank == 0 and failure is None:
                root_part, failure = attempt(lambda: self._root_start(first, opts, step))
        report = (frozenset(report or ()), frozenset(chain_cache.held()))
        root, (names_left, held_by_all), _ = agree_plan(self.comm, what, local, failure, opts, self.plan_cache,
                                                        root_part, report, _merge_reports)
        names, base_key = root
        if first:
            self._names = set(names) | names_left
        if not is_incremental(opts):
            return None
        return chain_cache.base_index(self.comm, what, base_key, held_by_all)

    def _root_start(self, first: bool, opts: SaveOptions, step: int) -> tuple:
        """Rank 0's part of an agreed plan: ``(names on the root, or None; base key, or None)``."""
        names = None
        if first:
            self._retirement.wait()  # the last retention's deletions are done: the listing sees the root settled
            flushing = self.node.flushing if self.node is not None else None
            remove_versions([e for e in list_versions(self.ckpt.root) if not e.committed and e.name != flushing])
            if self.node is not None and flushing is None:
                self.node.flush_marker(None)  # left by a run killed during its flush
            names = [e.name for e in list_versions(self.ckpt.root)]
        if not is_incremental(opts):
            return names, None
        target = self.node.node_dir if self.node is not None else self.ckpt.root
        chosen = chain_cache.chosen_base(opts.base, self.ckpt.chain_base, target)
        look_in = target
        if self.node is not None and self.node.levels.due(self.count).get("flush"):
            # a version flushed to the root must find its base there: else it is a full version
            if chosen is not None and os.path.basename(chosen) not in self.node.on_root:
                chosen = None
            look_in = None
        new = os.path.join(target, new_version_name([_entry(n) for n in (names or self._names)], step))
        return names, chain_cache.resolve_base(new, chosen, look_in)

    def _writer(self, directory: str, selection: Selection, codecs: dict, local, opts: SaveOptions):
        """The background writer of this save, with a staging pool made at the first save."""
        if self.pool is None:  # page-locked when the state holds GPU arrays (fast device-to-host copies)
            self.pool = StagingPool(self.staging_bytes, pinned=any(is_device_array(i[2]) for i in selection.items))
        return BackgroundWrite(directory, rank_file(self.rank), self.pool, SlotQueue(),
                               EncodedPieces.for_save(codecs or {}, local.summaries if local else {},
                                                      opts.codec_threads),
                               opts.fsync, max(64, opts.chunk_bytes), selection.digests)

    def _stage(self, selection: Selection, writer: BackgroundWrite, opts: SaveOptions, timer, error) -> None:
        """The stage stage: copy the selection into the pool, and start the writer.

        A selection that fits in the pool is copied (one copy per item) before
        the writer starts: no competition for cores and memory bandwidth while
        the caller waits; a larger one streams through the pool in pieces as
        the writer frees buffers.
        """
        fits = staged_bytes(selection.items) <= self.pool.capacity
        if not fits:
            writer.start()
        with timer.phase("stage"):
            try:
                if error is not None:
                    writer.queue.put(None)
                    raise error
                stage(selection.items, self.pool, writer.queue,
                      None if fits else max(64, min(opts.chunk_bytes, self.staging_bytes)))
            except Exception as exc:  # noqa: BLE001 - surfaces, agreed, at the commit
                writer.fail(exc)
        if fits:
            writer.start()

    def _path(self, name: str) -> str:
        return os.path.join(self.ckpt.root, name)

    def _target(self, name: str) -> str:
        return self.node.path(name) if self.node is not None else self._path(name)

    def _all_done(self) -> bool:
        mine = 1 if self.pending.writer.done else 0
        return bool(min(self.comm.allgather(mine)))

    # ---------------------------------------------------------------- commit
    def complete(self) -> SaveResult | None:
        """Collective, the commit stage: wait for the writers, agree, protect on the levels, commit.

        Without levels this is one gather (failures, file sizes, chunk rows,
        timings, and the plan of any rank whose layout changed) and one
        broadcast of rank 0's verdict; rank 0 reconciles the plans, writes the
        metadata and applies retention in between.
        """
        p, self.pending = self.pending, None
        if p is None:
            return None
        t0 = time.perf_counter()
        comm = self.comm
        what = f"asynchronous save of step {p.step} ({p.name})" if self.asynchronous else \
            f"save of step {p.step} ({p.name})"
        p.writer.join()
        w = p.writer
        timer = w.timer
        failure = None if w.error is None else describe_failure(w.error)
        stats = {"seconds": {**timer.seconds, "stage": p.stage_seconds}, "timeline": timer.timeline,
                 "bytes": w.written.nbytes}
        mine = WrittenPart(stats, p.selection.commit_part(w.written.rows), p.per_rank, p.selection.replicas,
                           version=p.name, own=p.own, details=p.details, file_bytes=w.file_bytes)
        msgs = comm.gather((failure, mine), root=0)
        committed = None
        try:
            settled = self._settle(msgs) if self.rank == 0 else None
            levels = sizes = None
            if self.node is not None:
                verdict = comm.bcast(settled if isinstance(settled, dict) else [part.file_bytes for _, part in msgs]
                                     if self.rank == 0 else None, root=0)
                if isinstance(verdict, dict):
                    raise collective_error(what, verdict, comm.Get_size())
                sizes = verdict
                with timer.phase("levels"):
                    levels = self.node.protect(p.directory, sizes, p.due, p.options.fsync, what)
            out = settled
            if self.rank == 0 and not isinstance(out, dict):
                try:
                    committed = self._commit_root(p, settled, levels, [part for _, part in msgs])
                    out = committed.report(settled.replanned, with_metadata=self.node is not None)
                except Exception as exc:  # noqa: BLE001 - reaches every rank in the broadcast
                    out = {0: describe_failure(exc)}
            report = comm.bcast(out, root=0)
            if isinstance(report, dict):
                raise collective_error(what, report, comm.Get_size())
            if self.node is not None:
                self.node.commit_nodes(p.directory, report.metadata, p.options.fsync, what)
        except CheckpointError:
            self.plan_cache.invalidate()  # the next save plans collectively again (and clears the leftovers)
            self._discard(p.name)
            raise
        if report.replanned is not None:  # some rank's layout changed: everyone adopts the reconciled plan
            self.plan_cache.adopt(p.key, report.replanned, self.rank, settled if self.rank == 0 else None)
        if report.chain is not None:
            chain_cache.remember(*report.chain)
        if self.precopy is not None:
            self.precopy.committed(p.selection.info, p.options)
        self.ckpt.chain_base = p.directory
        self._names.add(p.name)
        result = save_result(self._path(p.name), p.step, p.selection, {**timer.seconds, "stage": p.stage_seconds},
                             report, mine, time.perf_counter() - t0,
                             levels=self.node.reached(p.due) if self.node is not None else ("root",))
        self.last_result = result
        self.count += 1
        if self.rank == 0:
            logger.info("committed %s (%s, %s): %d bytes in %d chunks", p.name, result.kind,
                        ",".join(result.levels), report.nbytes, report.nchunks)
        if self.node is not None:
            self.node.retain()
            references = committed.references if committed else frozenset()
            if p.due.get("flush"):
                local_cost = p.stage_seconds + timer.seconds.get("write", 0.0) + timer.seconds.get("levels", 0.0)
                self.node.start_flush(p.name, p.step, report.metadata, references, sizes, p.options.fsync, local_cost)
                self._unflushed = {}
            else:
                newest = UnflushedVersion(p.name, p.step, report.metadata, references, sizes, p.options.fsync)
                self._unflushed = {n: v for n, v in self._unflushed.items() if n in references}
                self._unflushed[p.name] = newest
                self.node.poll_flush(block=False)
        return result

    def _settle(self, msgs):
        """Rank 0: the failures (a dict by rank), or the plan the commit writes (save_plan.Reconciled);
        ``msgs``: every rank's ``(failure, WrittenPart)``."""
        bad = {r: failure for r, (failure, _) in enumerate(msgs) if failure is not None}
        if bad:
            return bad
        settled, failure = attempt(lambda: settle(self.plan_cache, [part for _, part in msgs]))
        return {0: failure} if failure is not None else settled

    def _commit_root(self, p: Pending, settled, levels, parts: list):
        """Rank 0: write the metadata (root version, or rank 0's node-local version) and apply root retention."""
        version = VersionToCommit(p.directory, p.step, {"strategy": "file-per-rank", "asynchronous": self.asynchronous},
                                  p.selection.info, p.options.fsync, levels=levels)
        committed = commit_on_root(version, settled, p.values, parts)
        flushing = self.node.flushing if self.node is not None else None  # never a version being flushed
        best_effort(f"retention under {self.ckpt.root!r}", lambda: self._retirement.retire(
            [e for e in removable(list_versions(self.ckpt.root), self.ckpt.keep) if e.name != flushing]))
        return committed

    def _discard(self, name: str) -> None:
        """Remove every trace of a version that failed (root on rank 0, node-local dirs on node leaders)."""
        if self.rank == 0:
            shutil.rmtree(self._path(name), ignore_errors=True)
        if self.node is not None:
            self.node.discard(name)
        self.comm.Barrier()  # every rank raises after the cleanup is done everywhere

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
            self._retirement.wait()
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
            e.name for e in list_versions(node_dir) if e.committed]) for n in ns}
        root = bcast_checked(self.comm, f"listing {self.ckpt.root!r}", lambda: [
            e.name for e in list_versions(self.ckpt.root) if e.committed])
        return current([_entry(n, True, self._path(n)) for n in sorted(names | set(root))])

    def committed_here(self) -> list[VersionEntry]:
        """Committed versions this rank reads now, without MPI: the root's and its own node directory's.

        The pending save is not among them (it is committed by the next
        collective call).  With ``local_dir``, a version held only in other
        nodes' directories (a node replaced after a failure) is missing here
        but found by :meth:`live`.
        """
        names = {e.name for e in list_versions(self.ckpt.root) if e.committed}
        if self.node is not None:
            names |= {e.name for e in list_versions(self.node.node_dir) if e.committed}
        return current([_entry(n, True, self._path(n)) for n in sorted(names)])

    def restore(self, state, step=None, strict=True, cast=False):
        from hpcckpt.levels.restore import restore_levels

        self.sync()
        return restore_levels(self, state, step, strict, cast)


def _merge_reports(a: tuple, b: tuple) -> tuple:
    """Two ranks' reports of the plan stage as one: the names left in their node directories (a union) and the
    base indexes they all hold (an intersection)."""
    return a[0] | b[0], a[1] & b[1]


def _entry(name: str, committed: bool = True, path: str = "") -> VersionEntry:
    parsed = parse_version_name(name)
    return VersionEntry(name, path, parsed.step, parsed.revision, committed)


__all__ = ["Engine", "EngineOptions", "ENGINE_OPTIONS", "pop_engine_options"]
