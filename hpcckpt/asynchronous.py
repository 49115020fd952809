"""Asynchronous and multi-level saves for :class:`hpcckpt.Checkpointer`.

``Checkpointer(root, asynchronous=True, ...)`` splits a save in two:

* foreground, inside ``save``: the collective planning (as a blocking save),
  then a copy of this rank's arrays into staging buffers (``staging.py``), then
  ``save`` returns.  The caller may overwrite its arrays at once.
* background (one thread per rank, no MPI call in it): compression, checksums
  and the file-per-rank write, into the root's version directory or, with
  ``local_dir``, into the node-local level L1.
* the collective commit happens at the next call into the Checkpointer
  (``save``, ``wait``, ``latest``, ``steps``, ``restore``, ``close``; and
  ``should_save``/``poll`` when every rank's writer is already done): every rank
  waits for its writer, all agree on failures (one rank's failure is a
  CheckpointError on every rank, and the version is removed, never committed),
  partner copies and parity are exchanged when due (MPI, in the foreground),
  rank 0 writes the metadata, and retention runs.

With ``local_dir`` (asynchronous or not) the levels of ``hpcckpt.levels`` apply:
L1 node-local, L2 partner, L3 XOR parity, L4 the root, flushed from L1 in a
background thread and committed at a later call.  ``restore`` picks the newest
version and the fastest level that holds it whole, rebuilding lost files from
partners or parity, and falls back to the root with a warning that says why.

At most one save is in flight: a save while one is in flight waits for it
(``skip_if_busy=True``: is skipped, counted in ``skipped``, and returns None,
unless every rank's writer has already finished).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import threading
import time
import warnings
from dataclasses import dataclass, field


from .arrays import byte_view
from .catalog import VersionEntry, check_step, current, list_versions, new_version_name, removable, \
    remove_versions
from .checksum import checksum
from .codecs.core import AUTO, spec_to_json
from .codecs.pipeline import EncodedPieces, codec_summary, decide, decide_codecs, default_threads
from .collective import agree, allgather_checked, bcast_checked, best_effort, collective_error, \
    describe_failure, on_root
from .commit import commit_version, metadata_from_rows
from .devices import as_local_array, is_device_array
from .encoding import dtype_from_json, encode_value
from .errors import CheckpointError, TemplateMismatchError
from .levels import DEFAULT_LOCAL_FAILURE_FRACTION, ENGINE_OPTIONS, FLUSH_MARKER, LEVELS_FILE, LevelOptions, \
    derived_flush_every, node_dir, node_leader, parity_groups, partners
from .levels.flush import FlushThread
from .levels.partner import transfer
from .log import logger
from .monitor import PhaseTimer
from .names import parity_file, parse_version_name, rank_file
from .planning import plan_save
from .options import SaveOptions, SaveResult
from .staging import DEFAULT_STAGING_BYTES, SlotQueue, StagingPool, pieces_of, stage, staged_bytes
from .state import split_state, summarize_for_save
from .stats import phase_record, slowest
from .storage.posix import atomic_write
from .transport.base import Written
from .transport.file_per_rank import SequentialFile
from .transport.topology import node_layout, ranks_per_node_setting


def pop_engine_options(options: dict) -> dict:
    """Remove and return the engine's options from a Checkpointer's keyword arguments."""
    return {k: options.pop(k) for k in ENGINE_OPTIONS if k in options}


def engine_wanted(engine_options: dict) -> bool:
    return bool(engine_options.get("asynchronous")) or engine_options.get("local_dir") is not None


class BackgroundWrite:
    """One rank's writer thread: staged arrays -> pieces -> codec -> checksum -> one file-per-rank data file."""

    def __init__(self, directory: str, name: str, pool: StagingPool, queue: SlotQueue, encoder: EncodedPieces,
                 fsync: bool, piece_bytes: int):
        self.directory, self.name = directory, name
        self.pool, self.queue, self.encoder, self.fsync = pool, queue, encoder, fsync
        self.piece_bytes = piece_bytes
        self.timer = PhaseTimer()
        self.written = Written()
        self.file_bytes = 0
        self.error: BaseException | None = None
        self._eof = False
        self._held: list = []
        self._staging_error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="hpcckpt-writer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def fail(self, exc: BaseException) -> None:
        """Staging failed on this rank: the writer drains the pool and reports ``exc`` at the commit."""
        self._staging_error = exc

    @property
    def done(self) -> bool:
        return self._thread.ident is not None and not self._thread.is_alive()

    def join(self) -> None:
        self._thread.join()

    def _stream(self, owners: list):
        while True:
            item = self.queue.get()
            if item is None:
                self._eof = True
                return
            pieces = list(pieces_of(item, self.piece_bytes))
            item.remaining = len(pieces)
            self._held.append(item)
            for start, count, view in pieces:
                owners.append(item)
                yield item.variable, start, count, view

    def _release(self, item) -> None:
        self._held.remove(item)
        self.pool.release(item.buffer)

    def _run(self) -> None:
        target = SequentialFile(self.directory, self.name, self.fsync)
        owners: list = []
        try:
            _lower_priority()
            if self._staging_error is not None:
                raise self._staging_error
            os.makedirs(os.path.dirname(os.path.join(self.directory, self.name)), exist_ok=True)
            with self.timer.phase("write"):
                try:
                    for variable, start, count, arr in self.encoder.wrap(self._stream(owners), self.timer):
                        payload = byte_view(arr)
                        with self.timer.phase("hash"):
                            digest = checksum(payload)
                        self.written.add((variable, start, count, payload.nbytes, digest), target.name,
                                         target.append(payload))
                        item = owners.pop(0)
                        item.remaining -= 1
                        if item.remaining == 0:
                            self._release(item)
                finally:
                    target.close()
            self.file_bytes = target.offset
            if self._staging_error is not None:
                raise self._staging_error
        except BaseException as exc:  # noqa: BLE001 - surfaces on every rank at the next collective call
            self.error = exc
        finally:  # hand every buffer back (also after a failure) so that a blocked save() never waits forever
            for item in list(self._held):
                self._release(item)
            while not self._eof:
                item = self.queue.get()
                if item is None:
                    self._eof = True
                else:
                    self.pool.release(item.buffer)


@dataclass
class Layout:
    """The agreed plan of the last save, reused while this rank's layout is unchanged (no collective then).

    ``summaries``/``boxes``: every rank's (as of the last agreement);
    ``key``: this rank's layout key (names, kinds, dtypes, shapes, boxes,
    codec specs: see :func:`_layout_key`).
    """

    key: str
    summaries: list
    variables: dict
    boxes: list
    codecs: dict


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
    staged_bytes: int
    nchunks: int
    options: SaveOptions
    layout: Layout | None  # the agreed plan this rank used (None: this rank's own, checked at the commit)
    own: tuple | None = None  # (summaries, box starts, codecs) this rank used when its layout changed
    started: float = field(default_factory=time.perf_counter)


@dataclass
class Settled:
    """Rank 0's reconciled commit: file sizes, chunk rows, variables and codecs; the new plan if it changed."""

    sizes: list
    tables: list
    variables: dict
    codecs: dict
    layout: tuple | None
    stats: dict


@dataclass
class Flush:
    name: str
    thread: FlushThread
    meta: bytes | None  # rank 0: the metadata to commit on the root
    local_cost: float = 0.0  # seconds this rank spent on the version's local levels (for derived intervals)


class Engine:
    """The asynchronous / multi-level side of a Checkpointer (see the module docstring)."""

    def __init__(self, ckpt, asynchronous: bool = False, staging_bytes: int = DEFAULT_STAGING_BYTES,
                 skip_if_busy: bool = False, local_dir=None, partner_every: int | None = None,
                 parity_every: int | None = None, parity_group: int = 8, flush_every: int | None = None,
                 flush_bandwidth: float | None = None, level_costs=None,
                 local_failure_fraction: float = DEFAULT_LOCAL_FAILURE_FRACTION):
        self.ckpt = ckpt
        self.comm = ckpt.comm
        self.rank = self.comm.Get_rank()
        if isinstance(staging_bytes, bool) or not isinstance(staging_bytes, int) or staging_bytes < 1:
            raise CheckpointError(f"staging_bytes must be a positive integer, got {staging_bytes!r}")
        self.asynchronous = bool(asynchronous)
        self.staging_bytes = staging_bytes
        self.skip_if_busy = bool(skip_if_busy)
        # no explicit interval: derive them (partner copy every checkpoint, flush_every from Benoit et al.'s
        # multi-level optimum with the given costs, or with the costs measured on the first checkpoint)
        self.auto_levels = local_dir is not None and partner_every is parity_every is flush_every is None
        if level_costs is not None and not self.auto_levels:
            raise CheckpointError("level_costs derives partner_every/flush_every: give one or the other"
                                  if local_dir is not None else "level_costs needs local_dir")
        self.local_failure_fraction = local_failure_fraction
        self.level_costs: tuple | None = None  # (local, flush) seconds the intervals were derived from
        self.levels = LevelOptions(None if local_dir is None else os.fspath(local_dir), partner_every or 0,
                                   parity_every or 0, parity_group, 1 if flush_every is None else flush_every)
        if self.auto_levels:
            derived_flush_every(1.0, 1.0, local_failure_fraction)  # validates the fraction
            if level_costs is not None:
                try:
                    local_cost, flush_cost = (float(c) for c in level_costs)
                except (TypeError, ValueError):
                    raise CheckpointError(f"level_costs must be (local seconds, flush seconds), got {level_costs!r}"
                                          ) from None
                self._derive_intervals(local_cost, flush_cost)
        if flush_bandwidth is not None and (isinstance(flush_bandwidth, bool) or not flush_bandwidth > 0):
            raise CheckpointError(f"flush_bandwidth must be a positive number of bytes/s or None, got {flush_bandwidth!r}")
        self.flush_bandwidth = flush_bandwidth
        self.restored_level: str | None = None
        self.pool: StagingPool | None = None
        self.pending: Pending | None = None
        self.flush: Flush | None = None
        self.skipped = 0
        self.count = 0  # checkpoints committed by this run (for the level intervals)
        self.last_result: SaveResult | None = None
        self._parity_comm = None
        self._plan_cache: Layout | None = None  # the agreed plan, reused while the layout is unchanged
        self._names: set[str] = set()  # every version name that may exist (agreed on every rank)
        self._plan_name = ""
        self.layout = None
        self.node_dir = None
        if self.levels.enabled:
            simulated = ranks_per_node_setting(ckpt.options.ranks_per_node) is not None
            self.layout = node_layout(self.comm, ckpt.options.ranks_per_node)
            self.node_dir = node_dir(self.levels.local_dir, self.layout, self.rank, simulated)
            self.leader = node_leader(self.layout, self.rank)
            self.partner = partners(self.layout)
            self.groups = parity_groups(self.layout, self.levels.parity_group)
            if self.auto_levels and self.partner is not None:
                self.levels = dataclasses.replace(self.levels, partner_every=1)
            agree(self.comm, f"creating {self.node_dir!r}", lambda: os.makedirs(self.node_dir, exist_ok=True))
            if self.rank == 0 and (self.levels.partner_every and self.partner is None
                                   or self.levels.parity_every and not self.groups):
                warnings.warn("hpcckpt: a single node: partner copies and parity protect nothing and are skipped",
                              stacklevel=3)
            self._node_dirs = [node_dir(self.levels.local_dir, self.layout, r, simulated)
                               for r in (self.layout.ranks_on(k)[0] for k in range(self.layout.nnodes))]
            self._simulated = simulated
            self._write_levels_file()

    def _write_levels_file(self) -> None:
        """Rank 0: ``ROOT/levels.json``, where ``hpcckpt ls`` finds the node-local levels (best effort)."""
        if self.rank != 0:
            return
        doc = {"local_dir": os.path.abspath(self.levels.local_dir), "simulated_nodes": self._simulated,
               "node_dirs": [os.path.abspath(d) for d in self._node_dirs], "ranks": self.comm.Get_size(),
               "partner_every": self.levels.partner_every, "parity_every": self.levels.parity_every,
               "parity_group": self.levels.parity_group, "flush_every": self.levels.flush_every,
               "derived_from_costs": list(self.level_costs) if self.level_costs else None,
               "local_failure_fraction": self.local_failure_fraction if self.auto_levels else None}
        try:
            atomic_write(os.path.join(self.ckpt.root, LEVELS_FILE), json.dumps(doc, indent=1).encode(), fsync=False)
        except OSError as exc:
            warnings.warn(f"hpcckpt: cannot write {LEVELS_FILE} under {self.ckpt.root!r}: {exc}", stacklevel=3)

    def _derive_intervals(self, local_cost: float, flush_cost: float) -> None:
        """Set ``flush_every`` from the two levels' costs (the same inputs, hence result, on every rank)."""
        k = derived_flush_every(local_cost, flush_cost, self.local_failure_fraction)
        self.level_costs = (local_cost, flush_cost)
        self.levels = dataclasses.replace(self.levels, flush_every=k)
        if self.rank == 0:
            logger.info("multi-level intervals: local level %.3g s, L4 flush %.3g s, %.0f%% of failures local: "
                        "flush every %d checkpoint(s)", local_cost, flush_cost, 100 * self.local_failure_fraction, k)

    # ------------------------------------------------------------------ save
    def save(self, state, step: int, **options) -> SaveResult | None:
        """Copy the state aside and start the writer; commit at once if not asynchronous.

        The first save (and the first after a failed commit) plans collectively
        (one allgather).  Later saves reuse that plan when this rank's layout is
        unchanged and call no MPI at all: the blocking part is the commit of a
        previous save still in flight (if any) plus one ``np.copyto`` per array.
        A rank whose layout changed plans its own part; the commit checks and
        reconciles every rank's plan (or fails the version on every rank).
        """
        t0 = time.perf_counter()
        if self.pending is not None:
            if self.skip_if_busy and not self._all_done():
                self.skipped += 1
                return None
            self.complete()
        opts = SaveOptions.from_kwargs(**{**self.ckpt.options.__dict__, **options})
        what = f"save of step {step!r} under {self.ckpt.root!r}"
        if getattr(opts, "incremental", False) or getattr(opts, "base", None):
            raise CheckpointError("incremental saves are not supported with asynchronous=True or local_dir yet")
        check_step(step)  # the same on every rank: raises everywhere alike
        timer = PhaseTimer()
        with timer.phase("plan"):
            if self._plan_cache is None:
                arrays, values, starts, codecs, summaries, layout, own, failure = self._plan(state, step, opts, what)
                name = self._plan_name
            else:
                arrays, values, starts, codecs, layout, own, failure = self._replan_locally(state, opts)
                summaries = own[0] if own is not None else layout.summaries[self.rank] if layout else {}
                name = new_version_name([_entry(n) for n in self._names], step)
            directory = self._target(name)
        local_bytes = staged_bytes(arrays)
        if self.pool is None:  # page-locked when the state holds GPU arrays (fast device-to-host copies)
            self.pool = StagingPool(self.staging_bytes,
                                    pinned=any(is_device_array(a) for a in arrays.values() if a is not None))
        fits = local_bytes <= self.pool.capacity
        queue = SlotQueue()
        writer = BackgroundWrite(directory, rank_file(self.rank), self.pool, queue,
                                 EncodedPieces.for_save(codecs, summaries, opts.codec_threads), opts.fsync,
                                 max(64, opts.chunk_bytes))
        # a state that fits in the pool is copied (one np.copyto per array) before the writer starts: no
        # competition for cores and memory bandwidth while the caller waits; a larger one streams through the
        # pool in pieces as the writer frees buffers
        if not fits:
            writer.start()
        with timer.phase("stage"):
            try:
                if failure is not None:
                    raise failure
                staged = stage(arrays, starts, self.pool, queue,
                               None if fits else max(64, min(opts.chunk_bytes, self.staging_bytes)))
            except Exception as exc:  # noqa: BLE001 - surfaces, agreed, at the commit
                if failure is not None:
                    queue.put(None)
                writer.fail(exc)
                staged = (0, 0)
        if fits:
            writer.start()
        due = self.levels.due(self.count) if self.levels.enabled else {}
        self.pending = Pending(step, name, directory, values, writer, due, timer.seconds.get("stage", 0.0),
                               staged[0], staged[1], opts, layout, own)
        if not self.asynchronous:
            result = self.complete()
        else:
            result = SaveResult(path=self._path(name), step=step, timings=dict(timer.seconds), pending=True,
                                levels=())
        self.ckpt.pacer.record_save(step, time.perf_counter() - t0)
        return result

    def _describe(self, state, opts: SaveOptions, measure: bool):
        """This rank's arrays, values (rank 0), summaries and layout key; no MPI."""
        distributed, replicated = split_state(state)
        summaries, specs, arrays = {}, {}, {}
        for name, value in distributed.items():
            summaries[name] = summarize_for_save(name, value)
            spec = getattr(value, "codec", None)
            specs[name] = spec_to_json(opts.codec if spec is None else spec)
            arrays[name] = None if value.local is None else as_local_array(value.local)
        key = _layout_key(summaries, specs)
        if measure:
            for name, value in distributed.items():
                summaries[name]["codec"] = codec_summary(value, summaries[name], opts.codec)
        values = {name: encode_value(v, repr(name)) for name, v in replicated.items()} if self.rank == 0 else None
        return arrays, values, summaries, key

    def _replan_locally(self, state, opts: SaveOptions):
        """The fast path: the cached plan when this rank's layout is unchanged, else this rank's own plan."""
        cache = self._plan_cache
        try:
            arrays, values, summaries, key = self._describe(state, opts, measure=False)
            if key == cache.key:
                starts = {n: b[0] for n, b in cache.boxes[self.rank].items()}
                return arrays, values, starts, cache.codecs, cache, None, None
            # this rank's layout changed: its own part of a plan; the commit reconciles it with the others'
            for name, value in split_state(state)[0].items():
                summaries[name]["codec"] = codec_summary(value, summaries[name], opts.codec)
            starts, codecs = {}, {}
            for name, s in summaries.items():
                old = cache.boxes[self.rank].get(name)
                if s["kind"] == "block":
                    starts[name] = tuple(s["start"])
                else:  # Ragged: the row offset depends on the other ranks; fixed at the commit
                    starts[name] = (int(old[0][0]) if old else 0,) + (0,) * len(s["trailing"] or ())
                if s.get("dtype") is None:
                    continue
                if "auto" in s["codec"] and name in cache.codecs:
                    codecs[name] = cache.codecs[name]  # keep the agreed automatic choice
                else:
                    codecs[name] = decide(name, dtype_from_json(s["dtype"]), [s["codec"]],
                                          opts.codec_threads or default_threads())
            return arrays, values, starts, codecs, None, (summaries, starts, codecs), None
        except Exception as exc:  # noqa: BLE001 - surfaces on every rank at the commit
            return {}, None, {}, {}, None, None, exc

    def _plan(self, state, step, opts: SaveOptions, what: str):
        """One allgather: every rank's description (or failure) and listing; every rank plans the same way.

        Rank 0 first clears uncommitted leftovers on the root (not the version
        being flushed), node leaders those in their node directory; every rank
        then picks the same new name and runs the (pure, deterministic)
        planner.  The plan and the names seen are kept for the later saves.
        """
        comm = self.comm
        flushing = self.flush.name if self.flush is not None else None
        failure, local, names = None, None, []
        try:
            local = self._describe(state, opts, measure=True)
            if self.levels.enabled:
                if self.leader:
                    remove_versions([e for e in list_versions(self.node_dir) if not e.committed])
                names += [e.name for e in list_versions(self.node_dir)]
            if self.rank == 0:
                remove_versions([e for e in list_versions(self.ckpt.root) if not e.committed and e.name != flushing])
                if self.levels.enabled and flushing is None:
                    self._flush_marker(None)  # left by a run killed during its flush
                names += [e.name for e in list_versions(self.ckpt.root)]
        except Exception as exc:  # noqa: BLE001 - every rank learns of it in the same allgather
            failure = describe_failure(exc)
        everyone = comm.allgather((failure, None if local is None else local[2], names))
        bad = {r: f for r, (f, _, _) in enumerate(everyone) if f is not None}
        if bad:
            raise collective_error(what, bad, comm.Get_size())
        try:
            self._names = {n for _, _, ns in everyone for n in ns}
            self._plan_name = new_version_name([_entry(n) for n in self._names], step)
            summaries = [s for _, s, _ in everyone]
            variables, boxes = plan_save(summaries)
            codecs = decide_codecs(variables, summaries, opts.codec_threads)
        except Exception as exc:  # noqa: BLE001 - the same inputs fail the same way on every rank
            raise collective_error(what, {0: describe_failure(exc)}, 1) from None
        arrays, values, mine, key = local
        layout = Layout(key, summaries, variables, boxes, codecs)
        self._plan_cache = layout
        starts = {n: b[0] for n, b in boxes[self.rank].items()}
        return arrays, values, starts, codecs, mine, layout, None, None

    def _path(self, name: str) -> str:
        return os.path.join(self.ckpt.root, name)

    def _target(self, name: str) -> str:
        return os.path.join(self.node_dir, name) if self.levels.enabled else self._path(name)

    def _all_done(self) -> bool:
        mine = 1 if self.pending.writer.done else 0
        return bool(min(self.comm.allgather(mine)))

    # ---------------------------------------------------------------- commit
    def complete(self) -> SaveResult | None:
        """Collective: wait for the writers, agree, exchange partner/parity copies, commit the pending save.

        Without levels this is one gather (failures, file sizes, chunk rows,
        timings, and the plan of any rank whose layout changed) and one
        broadcast of rank 0's verdict; rank 0 reconciles the plans, writes the
        metadata and applies retention in between.
        """
        p, self.pending = self.pending, None
        if p is None:
            return None
        comm = self.comm
        what = f"asynchronous save of step {p.step} ({p.name})" if self.asynchronous else \
            f"save of step {p.step} ({p.name})"
        p.writer.join()
        w = p.writer
        timer = w.timer
        failure = None if w.error is None else describe_failure(w.error)
        stats = {"seconds": {**timer.seconds, "stage": p.stage_seconds}, "timeline": timer.timeline,
                 "bytes": w.written.nbytes}
        msgs = comm.gather((failure, w.file_bytes, w.written.rows, stats, p.name, p.own), root=0)
        try:
            settled = None
            if self.rank == 0:
                settled = _verdict(msgs)
                if not isinstance(settled, dict):
                    settled = self._settle(p, msgs)
            if self.levels.enabled:
                verdict = comm.bcast(settled.sizes if isinstance(settled, Settled) else settled, root=0)
                if isinstance(verdict, dict):
                    raise collective_error(what, verdict, comm.Get_size())
                sizes = verdict
                with timer.phase("levels"):
                    levels = self._redundancy(p, sizes, what)
            else:
                sizes, levels = None, None
            out = settled
            if self.rank == 0 and not isinstance(out, dict):
                try:
                    out = (self._commit_root(p, settled, levels), settled.layout)
                except Exception as exc:  # noqa: BLE001 - reaches every rank in the broadcast
                    out = {0: describe_failure(exc)}
            out = comm.bcast(out, root=0)
            if isinstance(out, dict):
                raise collective_error(what, out, comm.Get_size())
            (total, raw), layout = out
            if self.levels.enabled:
                agree(comm, what, lambda: self._commit_nodes(p, raw))
        except CheckpointError:
            self._plan_cache = None  # the next save plans collectively again (and clears the leftovers)
            self._discard(p.name)
            raise
        if layout is not None:  # some rank's layout changed: everyone adopts the reconciled plan
            summaries, variables, boxes, codecs = layout
            mine = summaries[self.rank]
            self._plan_cache = Layout(_layout_key({n: {k: v for k, v in s.items() if k != "codec"}
                                                   for n, s in mine.items()},
                                                  {n: s["codec"].get("spec", AUTO) for n, s in mine.items()}),
                                      summaries, variables, boxes, codecs)
        self._names.add(p.name)
        result = SaveResult(path=self._path(p.name), step=p.step, bytes_written=total[0], nchunks=total[1],
                            timings={**timer.seconds, **total[2]},
                            levels=self._levels_reached(p.due))
        self.last_result = result
        self.count += 1
        if self.rank == 0:
            logger.info("committed %s (%s): %d bytes in %d chunks", p.name,
                        "levels " + ",".join(["L1"] + [k for k, v in p.due.items() if v]) if self.levels.enabled
                        else "root", total[0], total[1])
        if self.levels.enabled:
            self._retention()
            if p.due.get("flush"):
                local_cost = p.stage_seconds + timer.seconds.get("write", 0.0) + timer.seconds.get("levels", 0.0)
                self._start_flush(p, raw, sizes, local_cost)
            else:
                self._poll_flush(block=False)
        return result

    def _settle(self, p: Pending, msgs) -> "Settled | dict":
        """Rank 0: the failures (a dict by rank), or what the commit writes.

        When every rank used the agreed plan (``own`` is None everywhere) it
        stands as is.  Otherwise the plan is redone from every rank's current
        summary: it must be valid (names, dtypes, tiling), every rank must have
        encoded a variable with the same codec, and chunk rows whose box moved
        (a Ragged whose row offset changed) are shifted to the new offsets.
        """
        names = {m[4] for m in msgs}
        if len(names) != 1:
            return {0: describe_failure(CheckpointError(
                f"the ranks saved different versions {sorted(names)} (different steps?)"))}
        tables = [m[2] for m in msgs]
        cache = self._plan_cache
        if all(m[5] is None for m in msgs):
            return Settled([m[1] for m in msgs], tables, cache.variables, cache.codecs, None,
                           phase_record([m[3] for m in msgs]))
        try:
            summaries = [cache.summaries[r] if m[5] is None else m[5][0] for r, m in enumerate(msgs)]
            used_starts = [{n: b[0] for n, b in cache.boxes[r].items()} if m[5] is None else m[5][1]
                           for r, m in enumerate(msgs)]
            used_codecs = [cache.codecs if m[5] is None else m[5][2] for r, m in enumerate(msgs)]
            variables, boxes = plan_save(summaries)
            codecs = {}
            for name in variables:
                specs = {json.dumps(s[name]["codec"].get("spec", AUTO), sort_keys=True) for s in summaries}
                if len(specs) != 1:
                    raise TemplateMismatchError(f"variable {name!r}: the ranks ask for different codecs")
                used = [u[name] for r, u in enumerate(used_codecs)
                        if name in u and summaries[r][name].get("dtype") is not None]
                if any(u != used[0] for u in used):
                    raise CheckpointError(f"variable {name!r}: the ranks encoded it with different codecs after a "
                                          "layout change (automatic codec choice); the version was not committed, "
                                          "save again")
                codecs[name] = used[0] if used else {"id": "none"}
            fixed = []
            for r, rows in enumerate(tables):
                shift = {n: tuple(int(a) - int(b) for a, b in zip(box[0], used_starts[r].get(n, box[0])))
                         for n, box in boxes[r].items()}
                fixed.append([(v, f, off, nb, dg, tuple(a + d for a, d in zip(st, shift[v])), cnt)
                              if any(shift[v]) else (v, f, off, nb, dg, st, cnt)
                              for v, f, off, nb, dg, st, cnt in rows])
        except Exception as exc:  # noqa: BLE001 - reaches every rank in the broadcast
            return {0: describe_failure(exc)}
        return Settled([m[1] for m in msgs], fixed, variables, codecs, (summaries, variables, boxes, codecs),
                       phase_record([m[3] for m in msgs]))

    def _commit_root(self, p: Pending, settled: "Settled", levels) -> tuple:
        """Rank 0: write the metadata (root version, or rank 0's node-local version) and apply root retention."""
        extra = {"strategy": "file-per-rank", "asynchronous": self.asynchronous,
                 "stats": settled.stats}
        if levels is not None:
            extra["levels"] = levels
        directory = p.directory if self.levels.enabled else self._path(p.name)
        meta, nbytes, nchunks = metadata_from_rows(settled.variables, settled.tables, settled.codecs, p.values,
                                                   self.comm.Get_size(), p.step, extra)
        raw = commit_version(directory, meta, p.options.fsync)
        total = nbytes, nchunks, slowest(settled.stats)
        flushing = self.flush.name if self.flush is not None else None  # never a version being flushed
        best_effort(f"retention under {self.ckpt.root!r}", lambda: remove_versions(
            [e for e in removable(list_versions(self.ckpt.root), self.ckpt.keep) if e.name != flushing]))
        return total, raw

    def _levels_reached(self, due: dict) -> tuple[str, ...]:
        """Where a version just committed is: the root, or L1 plus the partner copy / parity done for it."""
        if not self.levels.enabled:
            return ("root",)
        return ("L1",) + (("L2",) if due.get("partner") and self.partner is not None else ()) \
            + (("L3",) if due.get("parity") and self.groups else ())

    def _commit_nodes(self, p: Pending, raw: bytes) -> None:
        if self.leader and self.rank != 0:
            commit_version(p.directory, raw, p.options.fsync)

    def _discard(self, name: str) -> None:
        """Remove every trace of a version that failed (root on rank 0, node-local dirs on node leaders)."""
        if self.rank == 0:
            shutil.rmtree(self._path(name), ignore_errors=True)
        if self.levels.enabled and self.leader:
            shutil.rmtree(os.path.join(self.node_dir, name), ignore_errors=True)
        self.comm.Barrier()  # every rank raises after the cleanup is done everywhere

    def _redundancy(self, p: Pending, sizes: list[int], what: str) -> dict:
        """Partner copies (L2) and XOR parity (L3) when due; the description stored in ``extra.levels``."""
        comm = self.comm
        info = {"layout": list(self.layout.node_of), "sizes": sizes, "partner": None, "parity": None}
        if p.due.get("partner") and self.partner is not None:
            moves = [(r, self.partner[r], rank_file(r), sizes[r]) for r in range(comm.Get_size())]
            agree(comm, what + " (partner copies)",
                  lambda: transfer(comm, moves, p.directory, p.directory, p.options.fsync))
            info["partner"] = list(self.partner)
        if p.due.get("parity") and self.groups:
            gcomm, mine = self._group_comm()
            segs = agree(comm, what + " (XOR parity)", lambda: self._encode(gcomm, mine, p, sizes))
            segs = comm.allgather(segs)
            info["parity"] = {"groups": self.groups,
                              "segment": [segs[g[0]] for g in self.groups]}
        return info

    def _group_comm(self):
        if self._parity_comm is None:
            from mpi4py import MPI

            mine = next((i for i, g in enumerate(self.groups) if self.rank in g), None)
            color = MPI.UNDEFINED if mine is None else mine
            key = 0 if mine is None else self.groups[mine].index(self.rank)
            self._parity_comm = (self.comm.Split(color, key), mine)
        return self._parity_comm

    def _encode(self, gcomm, mine, p: Pending, sizes):
        if mine is None:
            return None
        from .levels import parity

        group = self.groups[mine]
        return parity.encode(gcomm, os.path.join(p.directory, rank_file(self.rank)), sizes[self.rank],
                             [sizes[r] for r in group], os.path.join(p.directory, parity_file(self.rank)),
                             p.options.fsync)

    def _retention(self) -> None:
        """Node leaders drop node-local versions beyond ``keep``; local only (rank 0 did the root in the commit,
        before any rank could start a new flush into it).  Never an uncommitted one: with no collective in a
        later save's foreground, a rank of this node may already be writing the next version (leftovers of
        crashed runs are cleared at a run's first save)."""
        flushing = self.flush.name if self.flush is not None else None
        if self.leader:  # bookkeeping on one rank after the commit: it must not raise (a hang otherwise)
            best_effort(f"retention under {self.node_dir!r}", lambda: remove_versions(
                [e for e in removable(list_versions(self.node_dir), self.ckpt.keep)
                 if e.name != flushing and e.committed]))

    # ----------------------------------------------------------------- flush
    def _start_flush(self, p: Pending, raw: bytes, sizes: list[int], local_cost: float = 0.0) -> None:
        self._poll_flush(block=True)  # one flush at a time
        src = os.path.join(p.directory, rank_file(self.rank)) if sizes[self.rank] else None
        dst = os.path.join(self._path(p.name), rank_file(self.rank))
        if self.rank == 0:  # the marker `hpcckpt ls` shows; removed when the flush is committed or failed
            self._flush_marker({"version": p.name, "step": p.step, "ranks": self.comm.Get_size(),
                                "started": time.time(), "pid": os.getpid()})
        self.flush = Flush(p.name, FlushThread(src, dst, p.options.fsync, self.flush_bandwidth),
                           raw if self.rank == 0 else None, local_cost)

    def _flush_marker(self, doc: dict | None) -> None:
        """Rank 0: write (``doc``) or remove (None) ``ROOT/flush-in-progress.json``; best effort."""
        path = os.path.join(self.ckpt.root, FLUSH_MARKER)
        try:
            if doc is None:
                os.unlink(path)
            else:
                atomic_write(path, json.dumps(doc).encode(), fsync=False)
        except FileNotFoundError:
            pass
        except OSError as exc:
            warnings.warn(f"hpcckpt: flush marker {path}: {exc}", stacklevel=3)

    def _poll_flush(self, block: bool) -> bool:
        """Collective: commit the flushed version on the root once every rank's copy is done; True if none left."""
        f = self.flush
        if f is None:
            return True
        if block:
            f.thread.join()
        done = f.thread.done
        error = f.thread.error if done else None
        states = self.comm.allgather((done, None if error is None else f"{type(error).__name__}: {error}",
                                      f.local_cost, f.thread.seconds if done else 0.0))
        if not all(s[0] for s in states):
            return False
        self.flush = None
        failed = {r: s[1] for r, s in enumerate(states) if s[1] is not None}
        path = self._path(f.name)
        if self.rank == 0:
            self._flush_marker(None)
        if not failed and self.auto_levels and self.level_costs is None:  # measured on the first flush
            self._derive_intervals(max(s[2] for s in states), max(s[3] for s in states))
            self._write_levels_file()
        if failed:
            if self.rank == 0:
                shutil.rmtree(path, ignore_errors=True)
                warnings.warn(f"hpcckpt: flushing {f.name} to the shared root failed ({failed}); "
                              "it stays on the node-local levels only", stacklevel=3)
            return True

        def commit():
            if f.meta is None:
                return
            commit_version(path, f.meta, fsync=True)
            best_effort(f"retention under {self.ckpt.root!r}", lambda: remove_versions(
                removable(list_versions(self.ckpt.root), self.ckpt.keep)))

        agree(self.comm, f"commit of the flush of {f.name}", lambda: on_root(self.comm, commit))
        if self.rank == 0:
            logger.info("flushed %s to %s (%.3f s on rank 0)", f.name, path, f.thread.seconds)
        return True

    @property
    def flushing(self) -> str | None:
        return self.flush.name if self.flush is not None else None

    # ------------------------------------------------------------ the others
    def poll(self) -> bool:
        """Collective, non-blocking: commit the pending save and flush if every rank finished; True if idle."""
        if self.pending is not None and self._all_done():
            self.complete()
        flushed = self._poll_flush(block=False)
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
            self._poll_flush(block=False)
        return self.last_result

    def wait(self) -> SaveResult | None:
        """Collective: commit the pending save and wait for the flush in progress (committed even if the save
        fails)."""
        try:
            self.sync()
        finally:
            self._poll_flush(block=True)
        return self.last_result

    def close(self) -> None:
        try:
            self.wait()
        finally:
            if self._parity_comm is not None and self._parity_comm[0] is not None:
                from mpi4py import MPI

                if self._parity_comm[0] != MPI.COMM_NULL:
                    self._parity_comm[0].Free()
                self._parity_comm = None

    def live(self) -> list[VersionEntry]:
        """Committed versions on any level (newest revision of each step), oldest first; collective."""
        self.sync()
        if not self.levels.enabled:
            return None
        names = {n for ns in allgather_checked(self.comm, f"listing {self.node_dir!r}", lambda: [
            e.name for e in list_versions(self.node_dir) if e.committed]) for n in ns}
        root = bcast_checked(self.comm, f"listing {self.ckpt.root!r}", lambda: [
            e.name for e in list_versions(self.ckpt.root) if e.committed])
        return current([_entry(n, True, self._path(n)) for n in sorted(names | set(root))])

    def restore(self, state, step=None, strict=True):
        from .levels.restore import restore_levels

        self.sync()
        return restore_levels(self, state, step, strict)


def _lower_priority() -> None:
    """Run the calling (background) thread at nice 19 so that it yields the cores to the application (Linux)."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (AttributeError, OSError):
        pass


def _verdict(msgs) -> dict | list:
    """Rank 0: the failures of a gather of (failure, file size, ...) by rank, or the file sizes when none failed."""
    bad = {r: m[0] for r, m in enumerate(msgs) if m[0] is not None}
    return bad or [m[1] for m in msgs]


def _layout_key(summaries: dict, specs: dict) -> str:
    """This rank's layout: names, kinds, dtypes, global shapes, boxes (Block) or rows (Ragged), codec specs."""
    return repr([(n, summaries[n], specs[n]) for n in sorted(summaries)])


def _entry(name: str, committed: bool = True, path: str = "") -> VersionEntry:
    parsed = parse_version_name(name)
    return VersionEntry(name, path, parsed.step, parsed.revision, committed)


__all__ = ["Engine", "pop_engine_options", "engine_wanted"]
