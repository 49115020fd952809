"""Self-adaptive pre-copy for asynchronous incremental saves: the next version's blocks written ahead of it.

``Checkpointer(root, asynchronous=True, incremental=True, precopy=True)``:
between checkpoints, ``ck.maybe_save(step)`` (a step at which no save is due)
runs a pre-copy round when the rules of precopy_plan.py say so (paced by the
interval policy's progress towards the next checkpoint, which the decision's
allreduce brings from rank 0).  A round, on each rank and without MPI:

1. hashes every block of the rank's state on the incremental grid (the block
   size the plan chose), exactly as the select stage does;
2. copies the blocks that neither the base version nor an earlier round of
   this interval holds into the staging pool, in the same call (the
   application is not running: the copy is the content that was hashed);
3. hands them to a background writer (background.py) that writes one file
   ``data/precopy-<rank>-<round>.bin`` under ``ROOT/.hpcckpt-precopy/r<rank>/``.

At the checkpoint, ``save`` takes the rounds whose writers have finished
(it never waits for one: a round still writing is abandoned, its file removed
as it ends, and the next intervals start their rounds earlier), moves their
files into the new version's ``data/`` (a rename) and passes the blocks they
hold to the select stage: it hashes the state *at the call* again, and a
block whose content a round wrote is pointed at in that file, every other
changed block is copied and written as usual.  Correctness never rests on the
rounds: whatever the application changed after a round gives another content
hash and is written from the values at the call; a pre-copied block that no
longer matches is simply not referenced (its bytes stay unused in the file).

Pre-copy is an optimisation, never a failure: a round that fails on a rank
(a write error, a state that cannot be described) is logged and drops that
rank's pre-copy for the interval; the checkpoint then writes every changed
block itself.  Nothing here is collective, so ranks may run different rounds.
"""

from __future__ import annotations

import dataclasses
import os
import shutil

from . import chain_cache
from .background import BackgroundWrite
from .codecs.pipeline import EncodedPieces
from .encoding import dtype_from_json
from .incremental import hash_pieces
from .log import logger
from .names import DATA_DIR, PRECOPY_DIR, precopy_file
from .precopy_plan import PrecopyConfig, PrecopyPlan
from .save_pipeline import describe
from .selection import known_digests, written_parts
from .staging import SlotQueue, stage


class PreCopy:
    """One rank's pre-copy between checkpoints (see the module docstring); owned by the asynchronous Engine.

    ``precopied``: ``{Key: Location}`` of the blocks the finished rounds of
    this interval wrote (files relative to the version); ``rounds``: the rounds
    of this interval with their progress and changed fraction, for tools and
    tests.
    """

    def __init__(self, engine, config: PrecopyConfig):
        self.engine = engine
        self.config = config
        self.rank = engine.rank
        self.spool = os.path.join(engine.ckpt.root, PRECOPY_DIR, f"r{self.rank:06d}")
        shutil.rmtree(self.spool, ignore_errors=True)  # left by a run that was killed between checkpoints
        self.plan: PrecopyPlan | None = None  # made at the first save (its block size is the save's)
        self.options = None  # the SaveOptions of the last committed save (rounds describe the state with them)
        self.precopied: dict = {}
        self.rounds: list = []
        self._writers: list = []  # (BackgroundWrite, {(variable, start): Key}) of rounds not absorbed yet
        self._count = 0  # rounds of this run (their file names)
        self._late = False  # a round was still writing at the last save (its blocks were not used)
        self._abandoned: list = []  # those writers, joined at close so that nothing writes after it

    def block_bytes(self, options) -> int:
        """The block size of the next save and its rounds (the plan's; the options' before the first save)."""
        if self.plan is None:
            self.plan = PrecopyPlan(self.config, options.block_bytes)
        return self.plan.block_bytes

    # ------------------------------------------------------------------ rounds
    def maybe_round(self, state, step, progress: float) -> bool:
        """Run a round now if the plan wants one at ``progress``; True when one ran.  Never raises, no MPI."""
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
        if local["key"] != cache.key:
            raise ValueError("the layout changed since the last save")
        options = dataclasses.replace(self.options, block_bytes=self.plan.block_bytes)
        starts = {n: b[0] for n, b in cache.boxes.items()}
        dtypes = {n: dtype_from_json(v.dtype) for n, v in cache.variables.items()}
        entries = hash_pieces(written_parts(local["arrays"], starts, cache.replicas), cache.variables, dtypes,
                              cache.codecs, options.block_bytes, chain_cache.index_of(engine.ckpt.chain_base))
        total = sum(e[5] for e in entries)
        dirty, keys, seen = [], {}, set()
        for e in entries:  # new to the chain and to this interval's rounds (an equal block once)
            if e[6] is None and e[4] not in self.precopied and e[4] not in seen:
                dirty.append(e)
                seen.add(e[4])
                keys[(e[0], tuple(e[1]))] = e[4]
        changed = sum(e[5] for e in dirty) / total if total else 0.0
        self.rounds.append((progress, changed))
        if not self.plan.round_done(progress, changed) or not dirty:
            return
        name = precopy_file(self.rank, self._count)  # never reused in a run: an abandoned writer may still write
        self._count += 1
        writer = BackgroundWrite(self.spool, name, engine.pool, SlotQueue(),
                                 EncodedPieces.for_save(cache.codecs or {}, local["summaries"], options.codec_threads),
                                 options.fsync, max(64, options.chunk_bytes), known_digests(dirty))
        self._writers.append((writer, keys))
        try:
            stage([(e[0], tuple(e[1]), e[3], False) for e in dirty], engine.pool, writer.queue)
        except Exception as exc:  # noqa: BLE001 - reported by the writer, then this interval stops
            writer.fail(exc)
        writer.start()

    def _absorb(self, block: bool) -> bool:
        """Take the blocks of finished round writers into ``precopied``; False while one is still writing
        (``block``: wait for them).  A failed writer stops pre-copy for the interval."""
        while self._writers:
            writer, keys = self._writers[0]
            if not block and not writer.done:
                return False
            writer.join()
            self._writers.pop(0)
            if writer.error is not None:
                logger.warning("pre-copy on rank %d failed (%s); the checkpoint writes every changed block",
                               self.rank, writer.error)
                self.plan.stopped = True
                self.precopied.clear()
                continue
            for variable, file, offset, nbytes, checksum, start, _count in writer.written.rows:
                self.precopied[keys[(variable, tuple(start))]] = (file, offset, nbytes, checksum)
        return True

    @property
    def writing(self) -> bool:
        """Whether a round's background writer is still running on this rank."""
        return any(not w.done for w, _ in self._writers)

    # --------------------------------------------------------------- the save
    def hand_over(self, directory: str) -> dict | None:
        """At a save into ``directory``: the pre-copied blocks, their files moved into the version; no MPI.

        Returns None when pre-copy is off for this save (no plan yet), else
        the ``precopied`` map (possibly empty) for the select stage.
        """
        if self.plan is None:
            return None
        self._absorb(block=False)
        self._late = bool(self._writers)  # still writing: abandoned, never waited for (its file is unlinked below)
        self._abandoned = [w for w in self._abandoned if not w.done] + [w for w, _ in self._writers]
        self._writers = []
        moved: dict = {}
        try:
            if self.precopied:
                os.makedirs(os.path.join(directory, DATA_DIR), exist_ok=True)
                for name in {loc[0] for loc in self.precopied.values()}:
                    os.replace(os.path.join(self.spool, name), os.path.join(directory, name))
                moved = self.precopied
        except OSError as exc:
            logger.warning("pre-copy on rank %d: moving its files into %s failed (%s); writing every changed block",
                           self.rank, directory, exc)
        self._reset()
        return moved

    def committed(self, info: dict | None, options) -> None:
        """After the commit of a save with ``options``: the next interval starts, its block size from the global
        figures of ``info`` (the version's ``extra.incremental``)."""
        self.options = options
        if self.plan is None or not info:
            return
        total = info.get("total_bytes") or 0
        fresh = (info.get("changed_bytes") or 0) - (info.get("precopied_bytes") or 0)
        fraction = fresh / total if total else 0.0
        self.plan.checkpoint_done(fraction, self._late)
        self.plan.adapt_block(fraction, fresh, (info.get("precopied_bytes") or 0) > 0)
        self.rounds = []

    def close(self) -> None:
        """At the Checkpointer's close: wait for the round writers and remove what they wrote (no version takes it)."""
        for writer in self._abandoned + [w for w, _ in self._writers]:
            writer.join()
        self._writers, self._abandoned = [], []
        self._reset()

    def _reset(self) -> None:
        self.precopied = {}
        shutil.rmtree(self.spool, ignore_errors=True)


__all__ = ["PreCopy"]
