"""Self-adaptive pre-copy for incremental saves: the next version's blocks written ahead of it.

``Checkpointer(root, incremental=True, precopy=True)``, blocking or
``asynchronous=True``, on the root or with ``local_dir``:
between checkpoints, ``ck.maybe_save(step)`` (a step at which no save is due)
starts a pre-copy round when the rules of saving/precopy_plan.py say so (paced by the
interval policy's progress towards the next checkpoint, which the decision's
allreduce brings from rank 0).  The call only describes the state (which
arrays, on the cached plan's grid) and starts the round; the round then runs
in two background threads of the rank, without MPI, while the application
computes (:class:`Round`):

1. the producer hashes every block of the rank's state on the incremental
   grid (the block size the plan chose), exactly as the select stage does, and
   copies each block that neither the base version nor an earlier round of
   this interval holds into the staging pool, then hashes *that copy*: the key
   the round records for a block is the content hash of the bytes it writes;
2. a background writer (saving/background.py) writes the copies into one file
   ``data/precopy-<rank>-<round>.bin`` under ``ROOT/.hpcckpt-precopy/r<rank>/``.

A state held on a GPU runs its round in the calling thread instead (hashed on
the device, where the application's kernels cannot change it meanwhile): the
copy is then the content that was hashed.

A *probe* round (the interval after a back-off, saving/precopy_plan.py) runs step 1
without the copies and step 2: it records the hash of each block new to the
interval, so that the next round and the checkpoint measure what changed since
it (the checkpoint's select stage counts the bytes of its changed blocks whose
content a probe saw, ``probed_bytes``), and writes nothing.

At the checkpoint, ``save`` takes the rounds that have finished (it never
waits for one: a round still running is cancelled, it stops at its next
block, its file is removed, and the next intervals start their rounds
earlier), moves their files into the new version's ``data/`` (a rename) and
passes the blocks they hold to
the select stage: it hashes the state *at the call* again, and a block whose
content a round wrote is pointed at in that file, every other changed block is
copied and written as usual.

Why that is correct although the application changes its arrays while a
round reads them: a round's record of a block is the hash of the copy it
wrote, so its file holds exactly the bytes of that hash, whatever the
application did during the copy (a torn copy, half old and half new, is
recorded as what it is).  The checkpoint uses a round's block only when the
block's content *at the call* has that very hash, so the bytes referenced are
the values at the call (up to a collision of the 128-bit hash, the premise of
every incremental save).  The producer's first hash of the live block only
chooses what to copy: when the application changes a block after it, the
block is either copied anyway (its copy's hash recorded) or skipped (written
by the checkpoint).  A pre-copied block that no longer matches at the call is
simply not referenced (its bytes stay unused in the file; a round file of
which no block is referenced leaves the version, deleted in the background).

Pre-copy is an optimisation, never a failure: a round that fails on a rank
(a write error, a state that cannot be described) is logged and drops that
rank's pre-copy for the interval; the checkpoint then writes every changed
block itself.  Nothing here is collective, so ranks may run different rounds.

With node-local levels (``local_dir``) every round is a probe: the levels
protect and flush each rank's own data file of the version, so blocks written
into another file ahead of the checkpoint would not be covered by them.
"""

from __future__ import annotations

import dataclasses
import os
import threading

from hpcckpt.incremental import chain_cache
from hpcckpt.core.arrays import byte_view
from hpcckpt.saving.background import BackgroundWrite, lower_priority
from hpcckpt.codecs.pipeline import EncodedPieces
from hpcckpt.core.devices import is_device_array
from hpcckpt.core.encoding import dtype_from_json
from hpcckpt.core.checksum import raw_hash
from hpcckpt.incremental.rules import hash_pieces
from hpcckpt.core.log import logger
from hpcckpt.root.catalog import Retirement, VersionEntry
from hpcckpt.core.names import DATA_DIR, PRECOPY_DIR, precopy_file
from hpcckpt.saving.precopy_plan import PrecopyConfig, PrecopyPlan
from hpcckpt.saving.pipeline import describe
from hpcckpt.saving.selection import known_digests, written_parts
from hpcckpt.saving.staging import SlotQueue, stage


class RoundCancelled(Exception):
    """A round still running at the checkpoint: it stops copying (its blocks would not be used)."""


class Round:
    """One pre-copy round of one rank: the producer (hash, copy the new blocks, hash the copies) and its writer.

    ``parts``: the rank's ``(variable, global start, array)`` to scan;
    ``known``: the keys that need no copy (the base version's are looked up in
    ``index``); ``background``: the producer runs in its own thread (host
    state) and records the hash of each copy, else :meth:`run` runs in the
    caller's thread and records the hash of the block (the application is not
    running).  ``writer`` None: a probe, which hashes and copies nothing.
    After :attr:`done`: ``changed``, the fraction of the scanned bytes new to
    the interval, ``keys``, ``{(variable, start): Key}`` of the blocks the
    writer wrote (a probe: of the blocks it found new), and ``error``.
    """

    def __init__(self, progress: float, parts: list, cache, block_bytes: int, index, known: frozenset,
                 writer: BackgroundWrite | None, pool, background: bool):
        self.progress = progress
        self.parts, self.cache, self.block_bytes, self.index, self.known = parts, cache, block_bytes, index, known
        self.writer, self.pool, self.background = writer, pool, background
        self.changed = 0.0
        self.keys: dict = {}
        self.cancelled = False
        self._error: BaseException | None = None  # a probe's (a copying round's is its writer's)
        self._scanned: dict = {}  # (variable, start) -> Key of the live block (chooses what to copy)
        self._thread = threading.Thread(target=self._produce, name="hpcckpt-precopy", daemon=True) \
            if background else None

    def start(self) -> None:
        """Start the writer, then the producer (in its thread, or here: returns when the copies are staged)."""
        if self.writer is not None:
            self.writer.start()
        if self._thread is not None:
            self._thread.start()
        else:
            self._produce()

    def cancel(self) -> None:
        """Stop copying and writing (the checkpoint came first): an abandoned round must not compete with it."""
        self.cancelled = True
        if self.writer is not None:
            self.writer.cancel()

    @property
    def done(self) -> bool:
        return (self._thread is None or not self._thread.is_alive()) and (self.writer is None or self.writer.done)

    @property
    def error(self) -> BaseException | None:
        return self._error if self.writer is None else self.writer.error

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join()
        if self.writer is not None:
            self.writer.join()

    def _produce(self) -> None:
        try:
            if self.background:
                lower_priority()
            items = self._new_blocks()
        except BaseException as exc:  # noqa: BLE001 - reported by the writer, then this interval stops
            if self.writer is None:
                self._error = exc
            else:
                self.writer.fail(exc)
                self.writer.queue.put(None)
            items = None
        if self.writer is None:  # a probe: the hashes of the new blocks are what it records
            self.keys = dict(self._scanned)
        elif items is not None:
            try:
                stage(items, self.pool, self.writer.queue, staged=self._record)
            except BaseException as exc:  # noqa: BLE001 - as above (stage has ended the writer's queue)
                self.writer.fail(exc)
        self.parts = []  # no reference to the application's arrays once the copies are staged

    def _new_blocks(self) -> list:
        """Hash every block; the items to copy: blocks new to the chain and to this interval (an equal one once)."""
        c = self.cache
        dtypes = {n: dtype_from_json(v.dtype) for n, v in c.variables.items()}
        entries = hash_pieces(self.parts, c.variables, dtypes, c.codecs, self.block_bytes, self.index)
        total = sum(e[5] for e in entries)
        items, seen, changed = [], set(), 0
        for e in entries:
            if e[6] is None and e[4] not in self.known and e[4] not in seen:
                seen.add(e[4])
                changed += e[5]
                self._scanned[(e[0], tuple(e[1]))] = e[4]
                items.append((e[0], tuple(e[1]), e[3], False))
        self.changed = changed / total if total else 0.0
        return items

    def _record(self, copy) -> None:
        """Stage hook, before the writer gets ``copy``: its key (the copy's own hash in the background)."""
        if self.cancelled:
            raise RoundCancelled("the checkpoint came first")
        where = (copy.variable, copy.start)
        key = self._scanned[where]
        if self.background:  # the application may have changed the block since it was hashed: the copy counts
            key = (raw_hash(byte_view(copy.array)), key[1], key[2])
        self.keys[where] = key
        self.writer.digests.update(known_digests([(copy.variable, copy.start, None, None, key, key[1])]))




class PreCopy:
    """One rank's pre-copy between checkpoints (see the module docstring); owned by the Engine.

    ``precopied``: ``{Key: Location}`` of the blocks the finished rounds of
    this interval wrote (files relative to the version); ``probed``: the keys
    of the blocks its finished probes found new; ``rounds``: the
    finished rounds of this interval with their progress and changed fraction,
    and ``started``: the rounds this run started, for tools and tests.
    """

    def __init__(self, engine, config: PrecopyConfig):
        self.engine = engine
        self.config = config
        self.rank = engine.rank
        self.storage = engine.ckpt.storage  # the root's: the round files move into its versions
        self.spool = os.path.join(engine.ckpt.root, PRECOPY_DIR, f"r{self.rank:06d}")
        self.dropped = os.path.join(engine.ckpt.root, PRECOPY_DIR, f"x{self.rank:06d}")  # unused files, deleting
        for path in (self.spool, self.dropped):  # left by a run that was killed between checkpoints
            self.storage.discard_tree(path)
        self.plan: PrecopyPlan | None = None  # made at the first save (its block size is the save's)
        self.options = None  # the SaveOptions of the last committed save (rounds describe the state with them)
        self.precopied: dict = {}
        self.probed: set = set()
        self.rounds: list = []
        self._jobs: list = []  # the Rounds not absorbed yet
        self.started = 0  # rounds of this run (their file names)
        self._late = False  # a round was still writing at the last save (its blocks were not used)
        self._abandoned: list = []  # those Rounds, joined at close so that nothing writes after it
        self._moved: list = []  # the round files the last save moved into its version
        self._retirement = Retirement()  # deletes the round files no version used
        self._count = 0  # their directories under ``dropped``

    def block_bytes(self, options) -> int:
        """The block size of the next save and its rounds (the plan's; the options' before the first save)."""
        if self.plan is None:
            self.plan = PrecopyPlan(self.config, options.block_bytes)
        return self.plan.block_bytes

    # ------------------------------------------------------------------ rounds
    def maybe_round(self, state, step, progress: float) -> bool:
        """Start a round now if the plan wants one at ``progress``; True when one started.  Never raises, no MPI."""
        engine = self.engine
        if self.options is None or engine.pending is not None or not engine.plan_cache.valid:
            return False
        if not self._absorb(block=False) or not self.plan.wants_round(progress):
            return False
        try:
            self._round(state, step, progress)
        except Exception as exc:  # noqa: BLE001 - an optimisation: the checkpoint writes everything instead
            logger.warning("pre-copy round on rank %d failed (%s: %s); the checkpoint writes every changed block",
                           self.rank, type(exc).__name__, exc)
            self.plan.stopped = True
        return True

    def _round(self, state, step, progress: float) -> None:
        engine, cache = self.engine, self.engine.plan_cache
        # described with the last save's options, so that an unchanged layout has the cached plan's key
        local = describe(state, engine.comm, self.options, step)
        if local.key != cache.key:
            raise ValueError("the layout changed since the last save")
        options = dataclasses.replace(self.options, block_bytes=self.plan.block_bytes)
        starts = {n: b[0] for n, b in cache.boxes.items()}
        parts = written_parts(local.arrays, starts, cache.replicas)
        name = precopy_file(self.rank, self.started)  # never reused in a run: an abandoned round may still write
        self.started += 1
        pool = engine.series.staging_pool(any(is_device_array(arr) for _, _, arr in parts))
        writer = None
        if self.plan.copies and engine.node is None:  # with node-local levels a round only probes: the levels
            # protect and flush each rank's own file
            encoder = EncodedPieces.for_save(cache.codecs or {}, local.summaries, options.codec_threads)
            writer = BackgroundWrite(self.spool, name, pool, SlotQueue(), encoder, options.fsync,
                                     max(64, options.chunk_bytes), {}, self.storage)
        background = not any(is_device_array(arr) for _, _, arr in parts)
        index = chain_cache.index_of(engine.ckpt.chain_base, self.storage)
        job = Round(progress, parts, cache, options.block_bytes, index, frozenset(self.precopied).union(self.probed),
                    writer, pool, background)
        self._jobs.append(job)
        job.start()

    def _absorb(self, block: bool) -> bool:
        """Take the blocks of finished rounds into ``precopied`` and their figures into the plan; False while one
        is still running (``block``: wait for them).  A failed round stops pre-copy for the interval."""
        while self._jobs:
            job = self._jobs[0]
            if not block and not job.done:
                return False
            job.join()
            self._jobs.pop(0)
            if job.error is not None:
                logger.warning("pre-copy on rank %d failed (%s); the checkpoint writes every changed block",
                               self.rank, job.error)
                self.plan.stopped = True
                self.precopied.clear()
                self.probed.clear()
                continue
            self.rounds.append((job.progress, job.changed))
            self.plan.round_done(job.progress, job.changed)
            if job.writer is None:
                self.probed.update(job.keys.values())
                continue
            for variable, file, offset, nbytes, checksum, start, _count in job.writer.written.rows:
                self.precopied[job.keys[(variable, tuple(start))]] = (file, offset, nbytes, checksum)
        return True

    @property
    def writing(self) -> bool:
        """Whether a round of this rank is still running (copying or writing)."""
        return any(not job.done for job in self._jobs)

    # --------------------------------------------------------------- the save
    def hand_over(self, directory: str) -> tuple:
        """At a save into ``directory``: the pre-copied blocks, their files moved into the version; no MPI.

        Returns ``(None, None)`` when pre-copy is off for this save (no plan
        yet), else the ``precopied`` map (possibly empty) and the ``probed``
        keys (a frozenset, possibly empty) for the select stage.
        """
        if self.plan is None:
            return None, None
        self._absorb(block=False)
        self._late = bool(self._jobs)  # still running: abandoned, never waited for (its file is unlinked below)
        for job in self._jobs:
            job.cancel()
        self._abandoned = [job for job in self._abandoned if not job.done] + self._jobs
        self._jobs = []
        moved: dict = {}
        try:
            if self.precopied:
                self.storage.make_directories(os.path.join(directory, DATA_DIR))
                for name in {loc[0] for loc in self.precopied.values()}:
                    self.storage.replace(os.path.join(self.spool, name), os.path.join(directory, name))
                moved = self.precopied
        except OSError as exc:
            logger.warning("pre-copy on rank %d: moving its files into %s failed (%s); writing every changed block",
                           self.rank, directory, exc)
        self._moved = sorted({loc[0] for loc in moved.values()})
        probed = frozenset(self.probed)
        self._reset()
        return moved, probed

    def drop_unused(self, directory: str, refs: list) -> None:
        """After the select stage: the round files moved into ``directory`` that none of ``refs`` (the
        selection's rows) points at leave the version, into ``ROOT/.hpcckpt-precopy/x<rank>/``, deleted on a
        thread (a state that changed everywhere since its rounds leaves no dead bytes in the version).  Never
        raises: a file that cannot be moved stays, unused."""
        used = {r[1] for r in refs}
        unused = [name for name in self._moved if name not in used]
        self._moved = []
        if not unused:
            return
        self._count += 1
        dropped = os.path.join(self.dropped, f"{self._count:06d}")
        try:
            self.storage.make_directories(dropped)
            for name in unused:
                self.storage.replace(os.path.join(directory, name), os.path.join(dropped, os.path.basename(name)))
        except OSError as exc:
            logger.warning("pre-copy on rank %d: unused round files stay in %s (%s)", self.rank, directory, exc)
        # deleted as retention deletes a version (no metadata to unlink: an uncommitted directory)
        self._retirement.retire([VersionEntry(os.path.basename(dropped), dropped, 0, 0, False, self.storage)])

    def committed(self, info: dict | None, options) -> None:
        """After the commit of a save with ``options``: the next interval starts, its block size from the global
        figures of ``info`` (the version's ``extra.incremental``)."""
        self.options = options
        if self.plan is None or not info:
            return
        total = info.get("total_bytes") or 0
        seen = (info.get("precopied_bytes") or 0) + (info.get("probed_bytes") or 0)  # unchanged since a round
        fresh = (info.get("changed_bytes") or 0) - seen
        fraction = fresh / total if total else 0.0
        self.plan.checkpoint_done(fraction, self._late)
        self.plan.adapt_block(fraction, fresh, seen > 0)
        self.rounds = []

    def close(self) -> None:
        """At the Checkpointer's close: wait for the rounds and remove what they wrote (no version takes it)."""
        for job in self._abandoned + self._jobs:
            job.cancel()
            job.join()
        self._retirement.wait()
        self.storage.discard_tree(self.dropped)  # emptied by now
        self._jobs, self._abandoned = [], []
        self._reset()

    def _reset(self) -> None:
        self.precopied, self.probed = {}, set()
        self.storage.discard_tree(self.spool)


__all__ = ["PreCopy", "Round", "RoundCancelled"]
