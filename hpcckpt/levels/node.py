"""The node-local levels as destinations of a save's commit: L1 directories, L2 partner copies, L3 parity, RS, L4 flush.

One :class:`NodeLevels` per engine (``Checkpointer(local_dir=...)``).  The
save pipeline writes each rank's data file into its node directory (L1); the
commit then calls, in this order and on every rank:

1. :meth:`protect` (collective): partner copies, XOR and Reed-Solomon parity when due; the
   description stored in the metadata's ``extra.levels``.
2. rank 0 commits the metadata in its node directory, then
   :meth:`commit_nodes` (collective): every other node leader commits the same
   bytes in its node directory.
3. :meth:`retain` (local): node leaders drop versions beyond ``keep``.
4. :meth:`start_flush` when due: a background copy of each rank's file to the
   shared root (L4), committed by :meth:`poll_flush` (collective) at a later
   call once every rank's copy is done.

:meth:`discard` (collective) removes every trace of a version that failed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
import warnings
from dataclasses import dataclass

from hpcckpt.root.catalog import list_versions, removable, remove_versions
from hpcckpt.mpi.collective import agree, best_effort, on_root
from hpcckpt.storage.commit import commit_version
from hpcckpt.errors import CheckpointError
from hpcckpt.core.log import logger
from hpcckpt.core.names import METADATA_FILE, rank_file
from hpcckpt.storage.posix import atomic_write
from hpcckpt.transport.topology import node_layout, ranks_per_node_setting
from hpcckpt.levels import DEFAULT_LEVEL_MTBF, DEFAULT_LOCAL_FAILURE_FRACTION, FLUSH_MARKER, LEVELS_FILE, LevelOptions, derived_flush_every, \
    node_dir, node_leader, parity_groups, partners
from hpcckpt.levels.flush import FlushThread
from hpcckpt.levels.parity import ParityLevel
from hpcckpt.levels.partner import PartnerLevel
from hpcckpt.levels import rs_coder
from hpcckpt.levels.pmem import DEFAULT_BLOCK, PmemImage, PmemLevel, image_path
from hpcckpt.levels.rs import ReedSolomonLevel

#: The redundancy levels, in the order the commit runs them (levels/base.py).
LEVELS = (PartnerLevel(), ParityLevel(), ReedSolomonLevel(), PmemLevel())


@dataclass
class Flush:
    """A flush in progress: each rank's copy thread; rank 0 holds the metadata to commit on the root."""

    name: str
    thread: FlushThread
    meta: bytes | None
    references: frozenset = frozenset()  # versions the flushed version points into (incremental)
    local_cost: float = 0.0  # seconds this rank spent on the version's local levels (for derived intervals)


class NodeLevels:
    """The levels of one engine: where each rank's node directory is, what is due, and the flush in progress."""

    def __init__(self, comm, root: str, keep: int | None, local_dir, ranks_per_node, partner_every, parity_every,
                 parity_group, flush_every, flush_bandwidth, level_costs,
                 local_failure_fraction: float = DEFAULT_LOCAL_FAILURE_FRACTION, rs_every=None, rs_group=(6, 2),
                 level_method: str = "formula", level_mtbf: float = DEFAULT_LEVEL_MTBF, pmem_dir=None,
                 pmem_every: int | None = None, pmem_block: int = DEFAULT_BLOCK):
        self.comm, self.root, self.keep = comm, root, keep
        self.rank = comm.Get_rank()
        # no explicit interval: derive them (partner copy every checkpoint, flush_every from Benoit et al.'s
        # multi-level optimum with the given costs, or with the costs measured on the first checkpoint)
        self.auto_levels = partner_every is parity_every is flush_every is rs_every is None
        if (level_costs is not None or level_method != "formula") and not self.auto_levels:
            raise CheckpointError("level_costs and level_method derive partner_every/flush_every: give one or the "
                                  "other")
        self.local_failure_fraction = local_failure_fraction
        self.level_method, self.level_mtbf = level_method, level_mtbf
        self.level_costs: tuple | None = None  # (local, flush) seconds the intervals were derived from
        if pmem_every is None:
            pmem_every = 0 if pmem_dir is None else 1
        elif pmem_every and pmem_dir is None:
            raise CheckpointError("pmem_every needs pmem_dir (the persistent-memory tier's directory)")
        self.levels = LevelOptions(os.fspath(local_dir), partner_every or 0, parity_every or 0, parity_group,
                                   1 if flush_every is None else flush_every, rs_every or 0, rs_group, pmem_every)
        if self.auto_levels:
            derived_flush_every(1.0, 1.0, local_failure_fraction, level_method, level_mtbf)  # validates them
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
        self.flush: Flush | None = None
        self.on_root: set[str] = set()  # versions committed on the root, or being flushed there
        self._group_comms: dict = {}  # group communicators of the parity levels, by their groups
        simulated = ranks_per_node_setting(ranks_per_node) is not None
        self.layout = node_layout(comm, ranks_per_node)
        self.node_dir = node_dir(self.levels.local_dir, self.layout, self.rank, simulated)
        self.leader = node_leader(self.layout, self.rank)
        self.partner = partners(self.layout)
        self.groups = parity_groups(self.layout, self.levels.parity_group)
        if self.levels.rs_every:  # the same refusal on every rank, even if only one lacks the library
            why = next((w for w in comm.allgather(rs_coder.missing()) if w is not None), None)
            if why is not None:
                raise CheckpointError(why)
        self.rs_groups = parity_groups(self.layout, sum(self.levels.rs_group), least=sum(self.levels.rs_group))
        if self.auto_levels and self.partner is not None:
            self.levels = dataclasses.replace(self.levels, partner_every=1)
        agree(comm, f"creating {self.node_dir!r}", lambda: os.makedirs(self.node_dir, exist_ok=True))
        #: this rank's persistent-memory image (levels/pmem.py), or None without ``pmem_dir``
        self.pmem = None if pmem_dir is None else PmemImage(
            image_path(node_dir(os.fspath(pmem_dir), self.layout, self.rank, simulated), self.rank), self.rank,
            comm.Get_size(), pmem_block)
        if self.rank == 0 and any(getattr(self.levels, f"{level.key}_every") and not level.available(self)
                                  for level in LEVELS):
            warnings.warn("hpcckpt: a single node: partner copies and parity protect nothing and are skipped"
                          if self.layout.nnodes < 2 else
                          f"hpcckpt: rs_group={self.levels.rs_group} needs {sum(self.levels.rs_group)} nodes, this run "
                          f"has {self.layout.nnodes}: Reed-Solomon parity protects nothing and is skipped",
                          stacklevel=4)
        self._node_dirs = [node_dir(self.levels.local_dir, self.layout, r, simulated)
                           for r in (self.layout.ranks_on(k)[0] for k in range(self.layout.nnodes))]
        self._simulated = simulated
        self._write_levels_file()

    # ------------------------------------------------------------ bookkeeping
    def _write_levels_file(self) -> None:
        """Rank 0: ``ROOT/levels.json``, where ``hpcckpt ls`` finds the node-local levels (best effort)."""
        if self.rank != 0:
            return
        doc = {"local_dir": os.path.abspath(self.levels.local_dir), "simulated_nodes": self._simulated,
               "node_dirs": [os.path.abspath(d) for d in self._node_dirs], "ranks": self.comm.Get_size(),
               "partner_every": self.levels.partner_every, "parity_every": self.levels.parity_every,
               "parity_group": self.levels.parity_group, "rs_every": self.levels.rs_every,
               "rs_group": list(self.levels.rs_group), "flush_every": self.levels.flush_every,
               "pmem_every": self.levels.pmem_every,
               "derived_from_costs": list(self.level_costs) if self.level_costs else None,
               "local_failure_fraction": self.local_failure_fraction if self.auto_levels else None,
               "level_method": self.level_method if self.auto_levels else None}
        try:
            atomic_write(os.path.join(self.root, LEVELS_FILE), json.dumps(doc, indent=1).encode(), fsync=False)
        except OSError as exc:
            warnings.warn(f"hpcckpt: cannot write {LEVELS_FILE} under {self.root!r}: {exc}", stacklevel=4)

    def _derive_intervals(self, local_cost: float, flush_cost: float) -> None:
        """Set ``flush_every`` from the two levels' costs (the same inputs, hence result, on every rank)."""
        k = derived_flush_every(local_cost, flush_cost, self.local_failure_fraction, self.level_method, self.level_mtbf)
        self.level_costs = (local_cost, flush_cost)
        self.levels = dataclasses.replace(self.levels, flush_every=k)
        if self.rank == 0:
            logger.info("multi-level intervals (%s): local level %.3g s, L4 flush %.3g s, %.0f%% of failures local: "
                        "flush every %d checkpoint(s)", self.level_method, local_cost, flush_cost,
                        100 * self.local_failure_fraction, k)

    def path(self, name: str) -> str:
        """A version's directory on this rank's node."""
        return os.path.join(self.node_dir, name)

    def clear_leftovers(self) -> list[str]:
        """Node leaders: remove uncommitted versions of the node directory; the names left there (any rank)."""
        if self.leader:
            remove_versions([e for e in list_versions(self.node_dir) if not e.committed])
        return [e.name for e in list_versions(self.node_dir)]

    def reached(self, due: dict) -> tuple[str, ...]:
        """Where a version just committed is: L1 plus the levels that protected it."""
        return ("L1",) + tuple(level.label for level in LEVELS if due.get(level.key) and level.available(self))

    # ------------------------------------------------------------ commit destinations
    def protect(self, directory: str, sizes: list[int], due: dict, fsync: bool, what: str) -> dict:
        """Collective: every Level due and available protects the version; the description for ``extra.levels``."""
        info = {"layout": list(self.layout.node_of), "sizes": sizes, **{level.key: None for level in LEVELS}}
        for level in LEVELS:
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
        agree(self.comm, what, lambda: self.leader and self.rank != 0 and commit_version(directory, raw, fsync))

    def retain(self) -> None:
        """Node leaders drop node-local versions beyond ``keep``; local only (rank 0 did the root in the commit,
        before any rank could start a new flush into it).  Never an uncommitted one: with no collective in a
        later save's foreground, a rank of this node may already be writing the next version (leftovers of
        crashed runs are cleared at a run's first save)."""
        flushing = self.flushing
        if self.leader:  # bookkeeping on one rank after the commit: it must not raise (a hang otherwise)
            best_effort(f"retention under {self.node_dir!r}", lambda: remove_versions(
                [e for e in removable(list_versions(self.node_dir), self.keep)
                 if e.name != flushing and e.committed]))

    def discard(self, name: str) -> None:
        """Node leaders remove a version that failed from their node directory (the caller then synchronises)."""
        if self.leader:
            shutil.rmtree(self.path(name), ignore_errors=True)

    # ------------------------------------------------------------------ flush
    @property
    def flushing(self) -> str | None:
        return self.flush.name if self.flush is not None else None

    def start_flush(self, name: str, step: int, raw: bytes | None, references, sizes: list[int], fsync: bool,
                    local_cost: float = 0.0) -> None:
        """Collective (it first commits the flush before, one at a time): copy this rank's file to the root."""
        self.poll_flush(block=True)
        src = os.path.join(self.path(name), rank_file(self.rank)) if sizes[self.rank] else None
        dst = os.path.join(self.root, name, rank_file(self.rank))
        if self.rank == 0:  # the marker `hpcckpt ls` shows; removed when the flush is committed or failed
            self.flush_marker({"version": name, "step": step, "ranks": self.comm.Get_size(),
                               "started": time.time(), "pid": os.getpid()})
        self.on_root.add(name)
        self.flush = Flush(name, FlushThread(src, dst, fsync, self.flush_bandwidth), raw if self.rank == 0 else None,
                           frozenset(references or ()), local_cost)

    def flush_marker(self, doc: dict | None) -> None:
        """Rank 0: write (``doc``) or remove (None) ``ROOT/flush-in-progress.json``; best effort."""
        path = os.path.join(self.root, FLUSH_MARKER)
        try:
            if doc is None:
                os.unlink(path)
            else:
                atomic_write(path, json.dumps(doc).encode(), fsync=False)
        except FileNotFoundError:
            pass
        except OSError as exc:
            warnings.warn(f"hpcckpt: flush marker {path}: {exc}", stacklevel=4)

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
                shutil.rmtree(path, ignore_errors=True)
                warnings.warn(f"hpcckpt: flushing {f.name} to the shared root failed ({failed}); "
                              "it stays on the node-local levels only", stacklevel=4)
            return True

        def commit():
            if f.meta is None:
                return
            missing = sorted(v for v in f.references if not os.path.isfile(os.path.join(self.root, v, METADATA_FILE)))
            if missing:
                self.on_root.discard(f.name)
                shutil.rmtree(path, ignore_errors=True)
                warnings.warn(f"hpcckpt: {f.name} is not committed on the shared root: the versions it builds on "
                              f"({missing}) are not there; it stays on the node-local levels only", stacklevel=6)
                return
            commit_version(path, f.meta, fsync=True)
            best_effort(f"retention under {self.root!r}", lambda: remove_versions(
                removable(list_versions(self.root), self.keep)))

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
