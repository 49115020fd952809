"""Multi-level checkpointing (the VeloC / SCR / FTI model), on top of the core format.

* L1 ``local``: every rank writes its chunk file into a node-local directory
  (``local_dir``; with simulated nodes, ``local_dir/node-<k>`` per node).
* L2 ``partner``: each rank's file is also copied into the node-local
  directory of a partner rank on the next node (same file name, same place),
  so a node's loss leaves a copy of each of its files on another node.
* L3 ``parity``: XOR parity across groups of ranks on distinct nodes (SCR's
  distributed XOR: rank i of a group of g stores one segment of parity), so
  any one lost member of each group can be rebuilt.
* ``rs``: Reed-Solomon parity (ISA-L via PyECLib) across groups of at least k + m ranks on
  distinct nodes (``rs_group=(k, m)``), so any m lost members of each group
  can be rebuilt (levels/rs.py).
* PM ``pmem``: each rank's data file also kept in place in a memory-mapped
  image on a persistent-memory (DAX) or memory file system (``pmem_dir``),
  two crash-consistent slots updated block by block (levels/pmem.py); the
  restore on the same ranks maps it instead of reading the L1 file.
* L4 ``flush``: the shared root, copied from L1 in a background thread and
  committed (metadata written) at a later call into the Checkpointer.

Every level holds the core's format: a version directory with ``metadata.json``
and ``data/part-<rank>.bin`` (parity segments sit beside it in ``parity/``),
so the ordinary reader loads from any of them (PM keeps copies of data files
only, served to the reader from the map: docs/format.md, section 10).  The metadata's ``extra.levels``
records the node layout, partners, parity groups and file sizes that a rebuild
needs.

Each level is a plug-in (levels/base.py): its options, save half and restore
half in its own module, found through the registry ``levels.registry.LEVELS``.
:class:`LevelOptions` sorts the Checkpointer keywords into every registered
level's options; :class:`Intervals` says which levels a checkpoint reaches.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from hpcckpt.errors import CheckpointError
from hpcckpt.transport.topology import NodeLayout
from hpcckpt.levels.base import Level, check_int
from hpcckpt.levels.parity import parity_groups
from hpcckpt.levels.partner import partners
from hpcckpt.levels.registry import LEVELS

#: Fraction of failures that the node-local levels (L1 + partner copy) recover from, when the user says nothing:
#: most failures take out one node (Moody et al., SC10, report 85% or more recoverable without the file system).
DEFAULT_LOCAL_FAILURE_FRACTION = 0.85

#: How the derived intervals are computed (``level_method=``): Benoit et al.'s first-order formula or the learned
#: model of hpcckpt.policy.learned_levels.
LEVEL_METHODS = ("formula", "learned")

#: Platform MTBF (seconds) the learned model assumes when ``level_mtbf`` is not given (the default policy's prior).
DEFAULT_LEVEL_MTBF = 86400.0

#: Job length the learned model is asked about, in MTBFs: a long job (its ratio hardly depends on the length).
LEARNED_WORK_MTBFS = 100.0

#: Files in the shared root that describe the levels (read by ``hpcckpt ls``), written by rank 0.
LEVELS_FILE = "levels.json"
FLUSH_MARKER = "flush-in-progress.json"


@dataclass(frozen=True)
class Intervals:
    """The intervals in effect, counted in checkpoints (0: never): each level's by key, and the L4 flush's."""

    every: Mapping[str, int]
    flush_every: int

    def due(self, count: int) -> dict:
        """Which levels the ``count``-th checkpoint (0-based) of this run reaches besides L1 (and ``"flush"``)."""
        every = lambda k: bool(k) and count % k == 0  # noqa: E731
        return {**{key: every(k) for key, k in self.every.items()}, "flush": every(self.flush_every)}


@dataclass(frozen=True)
class LevelOptions:
    """The node-local levels' options: ``local_dir`` turns them on; ``levels`` holds every registered level's own
    options (its ``Options``, by key: levels/base.py), the other fields the L4 flush and the derived intervals.

    ``flush_every=k`` flushes every k-th checkpoint to the shared root (the
    first checkpoint always reaches it), at most ``flush_bandwidth`` bytes/s.
    When no interval is given (no ``flush_every``, no ``<key>_every`` of a
    level that takes part in the derivation), the intervals are derived:
    ``flush_every`` from ``level_costs`` (or the costs measured on the first
    checkpoint), ``local_failure_fraction``, ``level_method`` and
    ``level_mtbf`` (:func:`derived_flush_every`), each level's from its
    ``derived_every``.  :meth:`from_kwargs` sorts the Checkpointer keywords
    into this object; an invalid one is a CheckpointError.
    """

    local_dir: str | None = None
    flush_every: int | None = None
    flush_bandwidth: float | None = None
    level_costs: tuple[float, float] | None = None
    local_failure_fraction: float = DEFAULT_LOCAL_FAILURE_FRACTION
    level_method: str = "formula"
    level_mtbf: float = DEFAULT_LEVEL_MTBF
    levels: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_kwargs(cls, **keywords) -> LevelOptions:
        """The options from Checkpointer keywords: this class's fields and every registered level's options."""
        own = {f.name for f in fields(cls)} - {"levels"}
        owner = {name: key for key, level in LEVELS.items() for name in level.keywords()}
        unknown = sorted(set(keywords) - own - set(owner))
        if unknown:
            raise CheckpointError(f"unknown level option(s) {unknown}; the levels take {sorted(owner)}")
        levels = {key: level.Options(**{n: keywords[n] for n in level.keywords() if n in keywords})
                  for key, level in LEVELS.items()}
        return cls(levels=levels, **{n: v for n, v in keywords.items() if n in own})

    def __post_init__(self):
        for key in self.levels:
            LEVELS.get(key)  # an unknown level: a CheckpointError
        object.__setattr__(self, "levels", {key: self.levels[key] if key in self.levels else level.Options()
                                            for key, level in LEVELS.items()})
        if self.local_dir is not None:
            object.__setattr__(self, "local_dir", os.fspath(self.local_dir))
        check_int("flush_every", self.flush_every, 1, optional=True)
        bandwidth = self.flush_bandwidth
        if bandwidth is not None and (isinstance(bandwidth, bool) or not bandwidth > 0):
            raise CheckpointError(f"flush_bandwidth must be a positive number of bytes/s or None, got {bandwidth!r}")
        if self.level_costs is not None:
            try:
                local_cost, flush_cost = (float(c) for c in self.level_costs)
            except (TypeError, ValueError):
                raise CheckpointError(f"level_costs must be (local seconds, flush seconds), got "
                                      f"{self.level_costs!r}") from None
            object.__setattr__(self, "level_costs", (local_cost, flush_cost))
        check_derivation(self.local_failure_fraction, self.level_method, self.level_mtbf)
        deriving = self.level_costs is not None or self.level_method != "formula"
        if self.local_dir is None:
            given = ["level_costs"] * (self.level_costs is not None) + ["level_method"] * \
                (self.level_method != "formula") + [n for level in self.make_levels() for n in level.needs_local_dir()]
            if given:
                raise CheckpointError(f"{' and '.join(given)} {'needs' if len(given) == 1 else 'need'} local_dir")
            if any(level.interval(False) for level in self.make_levels()):
                raise CheckpointError(f"{'/'.join(f'{key}_every' for key in self.levels)} need local_dir (the "
                                      "node-local level L1)")
        elif deriving and not self.derived:
            raise CheckpointError("level_costs and level_method derive partner_every/flush_every: give one or the "
                                  "other")

    @property
    def enabled(self) -> bool:
        return self.local_dir is not None

    @property
    def derived(self) -> bool:
        """Whether the intervals are derived: none given, for the flush or a level that takes part."""
        return self.flush_every is None and all(
            level.given_every is None for level in self.make_levels() if level.derived_every is not None)

    def make_levels(self) -> tuple[Level, ...]:
        """A fresh instance of every level with its options, in the registry's order."""
        return tuple(LEVELS.get(key)(options) for key, options in self.levels.items())

    def intervals(self, unavailable: Collection[str] = ()) -> Intervals:
        """The intervals in effect before any cost is known; when derived, the levels named in ``unavailable``
        (keys: levels that protect nothing on this node layout) get none."""
        derived = self.derived
        return Intervals({level.key: 0 if derived and level.key in unavailable else level.interval(derived)
                          for level in self.make_levels()}, 1 if self.flush_every is None else self.flush_every)


def keyword_names() -> tuple[str, ...]:
    """Every Checkpointer keyword of the node-local levels: LevelOptions' own and every registered level's."""
    return tuple(f.name for f in fields(LevelOptions) if f.name != "levels") + tuple(
        name for level in LEVELS.values() for name in level.keywords())


def check_derivation(local_fraction: float, method: str, mtbf: float) -> None:
    """A CheckpointError unless these can derive intervals: a fraction in (0, 1), a known method, a positive MTBF."""
    try:
        f = float(local_fraction)
    except (TypeError, ValueError):
        f = float("nan")
    if not 0.0 < f < 1.0:
        raise CheckpointError(f"local_failure_fraction must be in (0, 1), got {local_fraction!r}")
    if method not in LEVEL_METHODS:
        raise CheckpointError(f"level_method must be one of {LEVEL_METHODS}, got {method!r}")
    if isinstance(mtbf, bool) or not isinstance(mtbf, (int, float)) or not 0 < mtbf < float("inf"):
        raise CheckpointError(f"level_mtbf must be a positive number of seconds, got {mtbf!r}")


def derived_flush_every(local_cost: float, flush_cost: float,
                        local_fraction: float = DEFAULT_LOCAL_FAILURE_FRACTION, method: str = "formula",
                        mtbf: float = DEFAULT_LEVEL_MTBF) -> int:
    """How many checkpoints per L4 flush, from a two-level multi-level optimum.

    Two levels: "local" (L1 + partner copy, cost ``local_cost`` seconds) and
    L4 (cost ``flush_cost``); a fraction ``local_fraction`` of the failures is
    recoverable from the local level, the rest needs L4.  With failure rates
    ``lambda_local = f / M`` and ``lambda_L4 = (1 - f) / M``:

    * ``method="formula"``: :func:`hpcckpt.policy.multilevel_intervals` (Benoit
      et al.'s first-order optimum) gives the integer nested pattern; its
      ``counts[0]`` (about ``sqrt(f / (1 - f) * flush_cost / local_cost)``) is
      ``flush_every``.  M cancels out of the ratio.
    * ``method="learned"``: the learned model
      (:func:`hpcckpt.policy.learned_levels.predict`) for these costs, restart
      costs equal to them, ``M = mtbf`` and a job of
      :data:`LEARNED_WORK_MTBFS` MTBFs; its ratio is ``flush_every``.

    The interval between checkpoints themselves stays with the Checkpointer's policy.
    """
    from hpcckpt.policy import multilevel_intervals
    from hpcckpt.policy.learned_levels import predict
    from hpcckpt.policy.multilevel import LevelConfig

    check_derivation(local_fraction, method, mtbf)
    f = float(local_fraction)
    costs = (max(float(local_cost), 1e-6), max(float(flush_cost), 1e-6))
    if method == "learned":
        config = LevelConfig(costs, costs, (f / mtbf, (1.0 - f) / mtbf), LEARNED_WORK_MTBFS * mtbf)
        return predict(config, with_makespan=False).ratios[0]
    return int(multilevel_intervals(costs, [f, 1.0 - f]).counts[0])


def node_dir(local_dir: str, layout: NodeLayout, rank: int, simulated: bool) -> str:
    """This rank's node-local directory: ``local_dir/node-<k>`` with simulated nodes, else ``local_dir``."""
    base = os.fspath(local_dir)
    return os.path.join(base, f"node-{layout.node_of[rank]}") if simulated else base


def node_leader(layout: NodeLayout, rank: int) -> bool:
    """Whether ``rank`` is the lowest rank of its node (the one that writes per-node files)."""
    return layout.ranks_on(layout.node_of[rank])[0] == rank


__all__ = ["LEVELS", "Level", "LevelOptions", "Intervals", "keyword_names", "check_derivation", "derived_flush_every",
           "node_dir", "node_leader", "partners", "parity_groups", "DEFAULT_LOCAL_FAILURE_FRACTION", "LEVEL_METHODS",
           "DEFAULT_LEVEL_MTBF", "LEVELS_FILE", "FLUSH_MARKER"]
