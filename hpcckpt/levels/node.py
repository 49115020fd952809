"""The node-local levels as destinations of a save's commit: L1 directories, L2 partner copies, L3 parity, RS, L4 flush.

One :class:`NodeLevels` per engine (``Checkpointer(local_dir=...)``).  The
save pipeline writes each rank's data file into its node directory (L1); the
commit then calls, in this order and on every rank:

1. :meth:`protect` (collective): each registered Level due (levels/base.py:
   partner copies, XOR and Reed-Solomon parity, the persistent-memory tier);
   their descriptions are stored in the metadata's ``extra.levels``.
2. rank 0 commits the metadata in its node directory, then
   :meth:`commit_nodes` (collective): every other node leader commits the same
   bytes in its node directory.
3. :meth:`retain` (local): node leaders drop versions beyond ``keep``.
4. :meth:`start_flush` when due: a background copy of each rank's file to the
   shared root (L4, in the root's own storage: a bucket too), committed by :meth:`poll_flush` (collective) at a later
   call once every rank's copy is done.

:meth:`discard` (collective) removes every trace of a version that failed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import dataclass

from hpcckpt.core.warn import warn
from hpcckpt.root.catalog import list_versions, removable, remove_versions
from hpcckpt.mpi.collective import agree, best_effort, on_root
from hpcckpt.storage.commit import commit_version
from hpcckpt.core.log import logger
from hpcckpt.core.names import METADATA_FILE, rank_file
from hpcckpt.storage.base import Storage
from hpcckpt.transport.topology import node_layout, ranks_per_node_setting
from hpcckpt.levels import FLUSH_MARKER, LEVELS_FILE, LevelOptions, derived_flush_every, node_dir, node_leader
from hpcckpt.levels.base import Level
from hpcckpt.levels.flush import FlushThread
from hpcckpt.root.file_manifest import tracked_file


@dataclass
class Flush:
    """A flush in progress: each rank's copy thread; rank 0 holds the metadata to commit on the root."""

    name: str
    thread: FlushThread
    meta: bytes | None
    references: frozenset = frozenset()  # versions the flushed version points into (incremental)
    local_cost: float = 0.0  # seconds this rank spent on the version's local levels (for derived intervals)


class NodeLevels:
    """The node-local levels of one engine: L1 directories, every registered Level, the L4 flush.

    Read-only attributes: ``options`` (the LevelOptions given), ``levels``
    (the Intervals in effect), ``all_levels`` (every registered Level with
    its options, in the order the commit runs them), ``auto_levels`` (the
    intervals are derived), ``level_costs`` (the costs they were derived
    from, once known), ``layout``, ``node_dir``, ``leader``, ``storage``
    (where the node directories live: every file of L1 to L3, RS and PM
    goes through it, and each Level gets it too) and ``root_storage``
    (where the root lives, ``storage`` unless given: the L4 flush writes
    there, levels.json and the flush marker live there, a restore from L4
    reads there; an object store's bucket, say, while the node directories
    stay on a node-local file system).
    """

    def __init__(self, comm, root: str, keep: int | None, ranks_per_node: int | None, options: LevelOptions,
                 storage: Storage = Level.storage, root_storage: Storage | None = None):
        self.comm, self.root, self.keep, self.options, self.storage = comm, root, keep, options, storage
        self.root_storage = storage if root_storage is None else root_storage
        self.rank = comm.Get_rank()
        # no explicit interval: derive them (partner copy every checkpoint, flush_every from Benoit et al.'s
        # multi-level optimum with the given costs, or with the costs measured on the first checkpoint)
        self.auto_levels = options.derived
        self.level_costs: tuple | None = None  # (local, flush) seconds the intervals were derived from
        self.flush: Flush | None = None
        self.on_root: set[str] = set()  # versions committed on the root, or being flushed there
        self._group_comms: dict = {}  # group communicators of the parity levels, by their groups
        self._simulated = ranks_per_node_setting(ranks_per_node) is not None
        self.layout = node_layout(comm, ranks_per_node)
        self.node_dir = self.node_directory(options.local_dir)
        self.leader = node_leader(self.layout, self.rank)
        self.all_levels = options.make_levels()
        for level in self.all_levels:
            level.storage = storage
            level.start(self)
        unavailable = [level for level in self.all_levels if not level.available(self)]
        self.levels = options.intervals({level.key for level in unavailable})
        if self.auto_levels and options.level_costs is not None:
            self._derive_intervals(*options.level_costs)
        agree(comm, f"creating {self.node_dir!r}", lambda: storage.make_directories(self.node_dir))
        reasons = [level.unavailable(self) for level in unavailable if self.levels.every[level.key]]
        if self.rank == 0 and reasons:
            warn("hpcckpt: " + "; ".join(reasons))
        self._node_dirs = [node_dir(options.local_dir, self.layout, r, self._simulated)
                           for r in (self.layout.ranks_on(k)[0] for k in range(self.layout.nnodes))]
        self._write_levels_file()

    # ------------------------------------------------------------ bookkeeping
    def _write_levels_file(self) -> None:
        """Rank 0: ``ROOT/levels.json``, where ``hpcckpt ls`` finds the node-local levels (best effort)."""
        if self.rank != 0:
            return
        doc = {"local_dir": os.path.abspath(self.options.local_dir), "simulated_nodes": self._simulated,
               "node_dirs": [os.path.abspath(d) for d in self._node_dirs], "ranks": self.comm.Get_size()}
        for level in self.all_levels:
            doc.update(level.settings(self.levels.every[level.key]))
        doc.update({"flush_every": self.levels.flush_every,
                    "derived_from_costs": list(self.level_costs) if self.level_costs else None,
                    "local_failure_fraction": self.options.local_failure_fraction if self.auto_levels else None,
                    "level_method": self.options.level_method if self.auto_levels else None})
        try:
            self.root_storage.atomic_write(os.path.join(self.root, LEVELS_FILE), json.dumps(doc, indent=1).encode(),
                                      fsync=False)
        except OSError as exc:
            warn(f"hpcckpt: cannot write {LEVELS_FILE} under {self.root!r}: {exc}")

    def _derive_intervals(self, local_cost: float, flush_cost: float) -> None:
        """Set ``flush_every`` from the two levels' costs (the same inputs, hence result, on every rank)."""
        o = self.options
        k = derived_flush_every(local_cost, flush_cost, o.local_failure_fraction, o.level_method, o.level_mtbf)
        self.level_costs = (local_cost, flush_cost)
        self.levels = dataclasses.replace(self.levels, flush_every=k)
        if self.rank == 0:
            logger.info("multi-level intervals (%s): local level %.3g s, L4 flush %.3g s, %.0f%% of failures local: "
                        "flush every %d checkpoint(s)", o.level_method, local_cost, flush_cost,
                        100 * o.local_failure_fraction, k)

    def node_directory(self, base: str) -> str:
        """This rank's directory under ``base`` (a node-local file system): ``base/node-<k>`` with simulated nodes."""
        return node_dir(base, self.layout, self.rank, self._simulated)

    def path(self, name: str) -> str:
        """A version's directory on this rank's node."""
        return os.path.join(self.node_dir, name)

    def clear_leftovers(self) -> list[str]:
        """Node leaders: remove uncommitted versions of the node directory; the names left there (any rank)."""
        if self.leader:
            remove_versions([e for e in list_versions(self.node_dir, self.storage) if not e.committed])
        return [e.name for e in list_versions(self.node_dir, self.storage)]

    def reached(self, due: dict) -> tuple[str, ...]:
        """Where a version just committed is: L1 plus the levels that protected it."""
        return ("L1",) + tuple(level.label for level in self.all_levels if due.get(level.key) and level.available(self))

    # ------------------------------------------------------------ commit destinations
    def protect(self, directory: str, sizes: list[int], due: dict, fsync: bool, what: str) -> dict:
        """Collective: every Level due and available protects the version; the description for ``extra.levels``."""
        info = {"layout": list(self.layout.node_of), "sizes": sizes, **{level.key: None for level in self.all_levels}}
        for level in self.all_levels:
            if due.get(level.key) and level.available(self):
                info[level.key] = level.protect(self, directory, sizes, fsync, what)
        return info

    def group_comm(self, groups: list[list[int]]):
        """``(communicator of this rank's group of ``groups`` or COMM_NULL, group index or None)``, split once
        (collective the first time for these groups)."""
        index = tuple(map(tuple, groups))
        if index not in self._group_comms:
            from mpi4py import MPI

            mine = next((i for i, g in enumerate(groups) if self.rank in g), None)
            color = MPI.UNDEFINED if mine is None else mine
            key = 0 if mine is None else groups[mine].index(self.rank)
            self._group_comms[index] = (self.comm.Split(color, key), mine)
        return self._group_comms[index]

    def commit_nodes(self, directory: str, raw: bytes, fsync: bool, what: str) -> None:
        """Collective: every node leader but rank 0 (which committed first) commits ``raw`` in its node directory."""
        agree(self.comm, what, lambda: self.leader and self.rank != 0 and commit_version(directory, raw, fsync,
                                                                                         self.storage))

    def retain(self) -> None:
        """Node leaders drop node-local versions beyond ``keep``; local only (rank 0 did the root in the commit,
        before any rank could start a new flush into it).  Never an uncommitted one: with no collective in a
        later save's foreground, a rank of this node may already be writing the next version (leftovers of
        crashed runs are cleared at a run's first save)."""
        flushing = self.flushing
        if self.leader:  # bookkeeping on one rank after the commit: it must not raise (a hang otherwise)
            best_effort(f"retention under {self.node_dir!r}", lambda: remove_versions(
                [e for e in removable(list_versions(self.node_dir, self.storage), self.keep)
                 if e.name != flushing and e.committed]))

    def discard(self, name: str) -> None:
        """Node leaders remove a version that failed from their node directory (the caller then synchronises)."""
        if self.leader:
            self.storage.discard_tree(self.path(name))

    # ------------------------------------------------------------------ flush
    @property
    def flushing(self) -> str | None:
        return self.flush.name if self.flush is not None else None

    def start_flush(self, name: str, step: int, raw: bytes | None, references, sizes: list[int], fsync: bool,
                    local_cost: float = 0.0) -> None:
        """Collective (it first commits the flush before, one at a time): copy this rank's file to the root."""
        self.poll_flush(block=True)
        copies = [(os.path.join(self.path(name), rank_file(self.rank)), os.path.join(self.root, name,
                                                                                    rank_file(self.rank)))]
        copies = copies if sizes[self.rank] else []
        blocks = os.path.join(self.path(name), tracked_file(self.rank))  # the in-place blocks of tracked files
        if self.storage.is_file(blocks):
            copies.append((blocks, os.path.join(self.root, name, tracked_file(self.rank))))
        if self.rank == 0:  # the marker `hpcckpt ls` shows; removed when the flush is committed or failed
            self.flush_marker({"version": name, "step": step, "ranks": self.comm.Get_size(),
                               "started": time.time(), "pid": os.getpid()})
        self.on_root.add(name)
        self.flush = Flush(name, FlushThread(self.storage, self.root_storage, copies, fsync,
                                             self.options.flush_bandwidth),
                           raw if self.rank == 0 else None, frozenset(references or ()), local_cost)

    def flush_marker(self, doc: dict | None) -> None:
        """Rank 0: write (``doc``) or remove (None) ``ROOT/flush-in-progress.json``; best effort."""
        path = os.path.join(self.root, FLUSH_MARKER)
        try:
            if doc is None:
                self.root_storage.remove_file(path)
            else:
                self.root_storage.atomic_write(path, json.dumps(doc).encode(), fsync=False)
        except FileNotFoundError:
            pass
        except OSError as exc:
            warn(f"hpcckpt: flush marker {path}: {exc}")

    def poll_flush(self, block: bool) -> bool:
        """Collective: commit the flushed version on the root once every rank's copy is done; True if none left.

        An incremental version is committed on the root only when the versions
        it points into are committed there (their own flush may have failed):
        otherwise it stays on the node-local levels, with a warning.
        """
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
        path = os.path.join(self.root, f.name)
        if self.rank == 0:
            self.flush_marker(None)
        if not failed and self.auto_levels and self.level_costs is None:  # measured on the first flush
            self._derive_intervals(max(s[2] for s in states), max(s[3] for s in states))
            self._write_levels_file()
        if failed:
            self.on_root.discard(f.name)
            if self.rank == 0:
                self.root_storage.discard_tree(path)
                warn(f"hpcckpt: flushing {f.name} to the shared root failed ({failed}); "
                     "it stays on the node-local levels only")
            return True

        def commit():
            if f.meta is None:
                return
            missing = sorted(v for v in f.references
                             if not self.root_storage.is_file(os.path.join(self.root, v, METADATA_FILE)))
            if missing:
                self.on_root.discard(f.name)
                self.root_storage.discard_tree(path)
                warn(f"hpcckpt: {f.name} is not committed on the shared root: the versions it builds on "
                     f"({missing}) are not there; it stays on the node-local levels only")
                return
            commit_version(path, f.meta, fsync=True, storage=self.root_storage)
            best_effort(f"retention under {self.root!r}", lambda: remove_versions(
                removable(list_versions(self.root, self.root_storage), self.keep)))

        agree(self.comm, f"commit of the flush of {f.name}", lambda: on_root(self.comm, commit))
        if self.rank == 0:
            logger.info("flushed %s to %s (%.3f s on rank 0)", f.name, path, f.thread.seconds)
        return True

    def close(self) -> None:
        """Free the parity levels' group communicators (after the last flush was waited for)."""
        from mpi4py import MPI

        for gcomm, _ in self._group_comms.values():
            if gcomm != MPI.COMM_NULL:
                gcomm.Free()
        self._group_comms = {}
