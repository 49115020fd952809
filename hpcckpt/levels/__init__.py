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
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from hpcckpt.errors import CheckpointError
from hpcckpt.transport.topology import NodeLayout

#: Options of the asynchronous / multi-level engine (Checkpointer keyword arguments).
ENGINE_OPTIONS = ("asynchronous", "staging_bytes", "skip_if_busy", "local_dir", "partner_every", "parity_every",
                  "parity_group", "rs_every", "rs_group", "flush_every", "flush_bandwidth", "level_costs",
                  "local_failure_fraction", "level_method", "level_mtbf", "pmem_dir", "pmem_every", "pmem_block",
                  "precopy")

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
class LevelOptions:
    """``local_dir`` turns the levels on; the ``*_every`` options are intervals counted in checkpoints.

    ``partner_every=k`` (0: never) sends every k-th checkpoint to the partner
    node; ``parity_every=k`` (0: never) computes XOR parity for every k-th in
    groups of ``parity_group`` ranks on distinct nodes (default 8, as SCR);
    ``flush_every=k`` flushes every k-th checkpoint to the shared root (the
    first checkpoint always reaches it); ``rs_every=k`` (0: never) computes
    Reed-Solomon parity for every k-th in groups of at least ``k + m`` ranks
    on distinct nodes, ``rs_group=(k, m)`` (default (6, 2): SCR's set of 8
    tolerating 2 failures); ``pmem_every=k`` (0: never) stores every k-th in
    the persistent-memory tier.
    """

    local_dir: str | None = None
    partner_every: int = 0
    parity_every: int = 0
    parity_group: int = 8
    flush_every: int = 1
    rs_every: int = 0
    rs_group: tuple[int, int] = (6, 2)
    pmem_every: int = 0

    def __post_init__(self):
        for name, low in (("partner_every", 0), ("parity_every", 0), ("flush_every", 1), ("parity_group", 2),
                          ("rs_every", 0), ("pmem_every", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise CheckpointError(f"{name} must be an integer >= {low}, got {value!r}")
        try:
            k, m = self.rs_group
            ok = all(isinstance(v, int) and not isinstance(v, bool) for v in (k, m)) and k >= 1 and m >= 1 \
                and k + m <= 256
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise CheckpointError(f"rs_group must be (k, m): integers k >= 1 data and m >= 1 check shards with "
                                  f"k + m <= 256, got {self.rs_group!r}")
        object.__setattr__(self, "rs_group", (k, m))
        if self.local_dir is None and (self.partner_every or self.parity_every or self.rs_every or self.pmem_every):
            raise CheckpointError("partner_every/parity_every/rs_every/pmem_every need local_dir (the node-local "
                                  "level L1)")

    @property
    def enabled(self) -> bool:
        return self.local_dir is not None

    def due(self, count: int) -> dict:
        """Which levels the ``count``-th checkpoint (0-based) of this run reaches besides L1."""
        every = lambda k: bool(k) and count % k == 0  # noqa: E731
        return {"partner": every(self.partner_every), "parity": every(self.parity_every),
                "rs": every(self.rs_every), "pmem": every(self.pmem_every), "flush": every(self.flush_every)}


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

    f = float(local_fraction)
    if not 0.0 < f < 1.0:
        raise CheckpointError(f"local_failure_fraction must be in (0, 1), got {local_fraction!r}")
    if method not in LEVEL_METHODS:
        raise CheckpointError(f"level_method must be one of {LEVEL_METHODS}, got {method!r}")
    if isinstance(mtbf, bool) or not isinstance(mtbf, (int, float)) or not 0 < mtbf < float("inf"):
        raise CheckpointError(f"level_mtbf must be a positive number of seconds, got {mtbf!r}")
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


def partners(layout: NodeLayout) -> list[int] | None:
    """partner[r]: the rank with r's position on the next node (None when there is a single node)."""
    n = layout.nnodes
    if n < 2:
        return None
    out = []
    for r, node in enumerate(layout.node_of):
        here = layout.ranks_on(node)
        there = layout.ranks_on((node + 1) % n)
        out.append(there[here.index(r) % len(there)])
    return out


def parity_groups(layout: NodeLayout, size: int, least: int = 2) -> list[list[int]]:
    """Groups of ``size`` ranks (a last group shorter than ``least`` joins the previous), each on distinct nodes.

    Ranks with the same position on their node form the candidates, taken
    node by node, so no group holds two ranks of one node.  Ranks in no group
    (fewer than ``least`` candidates: a single node for XOR parity, fewer than
    k + m nodes for Reed-Solomon) get no parity.
    """
    by_position: dict[int, list[int]] = {}
    for node in range(layout.nnodes):
        for pos, r in enumerate(layout.ranks_on(node)):
            by_position.setdefault(pos, []).append(r)
    groups = []
    for _, ranks in sorted(by_position.items()):
        chunks = [ranks[i:i + size] for i in range(0, len(ranks), size)]
        if len(chunks) > 1 and len(chunks[-1]) < least:
            chunks[-2].extend(chunks.pop())
        groups.extend(c for c in chunks if len(c) >= least)
    return groups
