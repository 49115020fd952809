"""The Level interface: a redundancy level of the node-local checkpoints, run as a destination of the commit.

Built in: :class:`~hpcckpt.levels.partner.PartnerLevel` (L2, a copy of each
rank's file on the next node) and :class:`~hpcckpt.levels.parity.ParityLevel`
(L3, XOR parity over groups of ranks on distinct nodes) and
:class:`~hpcckpt.levels.rs.ReedSolomonLevel` (RS, Reed-Solomon parity: m losses
per group of k + m) protect against the loss of nodes;
:class:`~hpcckpt.levels.pmem.PmemLevel` (PM, each rank's file kept in a
persistent-memory image) against a crash of the processes only.
``LEVELS`` lists them in the order the commit runs them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod


class Level(ABC):
    """One redundancy level.  Its ``key`` names it in LevelOptions (``<key>_every``), in ``due`` and in the
    metadata's ``extra.levels``; ``label`` is what SaveResult.levels and restores report.

    Call order, for each version committed on the node-local levels (every
    rank of the Checkpointer's communicator, in the commit, after every rank's
    data file is written into its node directory):

    1. ``available(node)`` (local; the same answer on every rank): whether
       this node layout lets the level protect anything (a partner copy needs
       two nodes).  Not available: the level is skipped, and reported so once.
    2. when due and available, ``protect(node, directory, sizes, fsync, what)``
       (collective): make the version's files recoverable after the loss of
       a node, finishing every message exchange even when this rank fails
       (then raise: the commit turns it into one CheckpointError everywhere
       and the version is not committed).  Returns the JSON description
       stored under ``extra.levels[key]``, which the restore reads to plan a
       rebuild (levels/restore.py).

    Capability flag: ``recovers`` (what the level rebuilds: "any lost node"
    for partner copies, "one member per group" for XOR parity, "m members per
    group" for Reed-Solomon).  A new level
    subclasses this, is added to ``LEVELS``, and passes
    ``hpcckpt.testing.LevelTests``.
    """

    key: str = ""
    label: str = ""
    recovers: str = ""

    @abstractmethod
    def available(self, node) -> bool:
        """Whether the node layout of ``node`` (a NodeLevels) lets this level protect anything."""

    @abstractmethod
    def protect(self, node, directory: str, sizes: list[int], fsync: bool, what: str):
        """Collective: protect the version at ``directory`` (``sizes``: every rank's data file size); its
        description for ``extra.levels``."""
