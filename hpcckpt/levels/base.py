"""The Level interface: a redundancy level of the node-local checkpoints, with its options, save half and restore half.

Built in (levels/registry.py registers them, in the order the commit runs
them): :class:`~hpcckpt.levels.partner.PartnerLevel` (L2, a copy of each
rank's file on the next node), :class:`~hpcckpt.levels.parity.ParityLevel`
(L3, XOR parity over groups of ranks on distinct nodes) and
:class:`~hpcckpt.levels.rs.ReedSolomonLevel` (RS, Reed-Solomon parity: m
losses per group of k + m) protect against the loss of nodes;
:class:`~hpcckpt.levels.pmem.PmemLevel` (PM, each rank's file kept in a
persistent-memory image) against a crash of the processes only.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, fields
from typing import Any

from hpcckpt.errors import CheckpointError
from hpcckpt.storage import POSIX, Storage


def check_int(name: str, value, low: int, optional: bool = False) -> None:
    """A CheckpointError unless ``value`` is an integer >= ``low`` (or None, when ``optional``)."""
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise CheckpointError(f"{name} must be an integer >= {low}, got {value!r}")


@dataclass(frozen=True)
class Lost:
    """What a rebuild plan starts from (the same on every rank): the ranks whose own data file is on no node,
    every rank's inventory of the version directory (file name -> size), every rank's data file size
    (``extra.levels.sizes``) and the copies moved in first ``(from, to, name, size)``."""

    ranks: list[int]
    inventories: list[dict[str, int]]
    sizes: list
    moves: list


@dataclass(frozen=True)
class Attempt:
    """One restore attempt of version ``name`` (the same on every rank): the state to fill, the committed
    versions each rank's node directory holds (``local_sets``) and the root holds (``root_names``), the load's
    ``strict`` and ``cast``, and the engine's NodeLevels ``node`` and shared ``root``."""

    state: Any
    name: str
    local_sets: list[set[str]]
    root_names: list[str]
    strict: bool
    cast: bool
    node: Any
    root: str


class Level(ABC):
    """One redundancy level, registered under its ``key`` in ``levels.registry.LEVELS``.

    ``key`` names it in ``due``, in the metadata's ``extra.levels`` and in its
    interval option ``<key>_every``; ``label`` is what SaveResult.levels and
    restores report; ``title`` names it in messages.  ``Options`` is a frozen
    dataclass whose fields are the level's Checkpointer keywords, one of them
    ``<key>_every`` (an int, None when not given), validated in its
    ``__post_init__`` (a CheckpointError); the level is built as
    ``Level(options)`` once per Checkpointer.

    Save half, for each version committed on the node-local levels (every
    rank of the Checkpointer's communicator, in the commit, after every
    rank's data file is written into its node directory), in this order:

    1. ``start(node)`` (all ranks, collective; once, when the Checkpointer
       starts, after the node layout is known): set up what the level needs
       (groups, partners, an image); raise the same CheckpointError on every
       rank when it cannot run.
    2. ``available(node)`` (all ranks, local; the same answer on every rank):
       whether this node layout lets the level protect anything (a partner
       copy needs two nodes).  Not available: the level is skipped, and
       reported so once (``unavailable(node)`` says why).
    3. when due and available, ``protect(node, directory, sizes, fsync,
       what)`` (all ranks, collective): make the version's files recoverable,
       finishing every message exchange even when this rank fails (then
       raise: the commit turns it into one CheckpointError everywhere and the
       version is not committed).  Returns the JSON description stored under
       ``extra.levels[key]``, which the restore half reads.

    Restore half, for each committed version, newest first (every rank, the
    same calls in the same order), each description read from the version's
    metadata (so a version is restored by the levels that protected it,
    whatever this run configures):

    1. ``serves(attempt)`` (all ranks, local; the same answer everywhere):
       whether this level holds whole versions itself; then ``load(attempt)``
       (all ranks, collective): ``(state, None)``, or ``(None, why)`` and the
       restore goes on to the node-local levels.
    2. on the node-local levels, once the files missing at their owner but
       held by another node were moved over: ``plan_rebuild(description,
       lost)`` (all ranks, pure, the same answer everywhere) of each level
       whose description the version records, in the registry's order:
       ``(plan, None)``, ``(None, why)`` (it cannot rebuild them), or
       ``(None, None)`` (it rebuilds nothing: partner copies are found by the
       moves).  The first plan is run: ``rebuild(comm, description, plan,
       directory, sizes, what)`` (all ranks, collective, finishing its
       exchanges even when this rank fails).

    Capability flag: ``recovers`` (what the level rebuilds: "any lost node"
    for partner copies, "one member per group" for XOR parity, "m members
    per group" for Reed-Solomon).  ``storage``: where the node directories
    live; every file the level reads or writes there goes through it
    (NodeLevels gives each level its own before ``start``; POSIX otherwise).  A new level subclasses this, registers
    itself (``LEVELS.register``), and passes ``hpcckpt.testing.LevelTests``.
    """

    key: str = ""
    label: str = ""
    title: str = ""
    recovers: str = ""
    Options: type
    storage: Storage = POSIX
    #: The interval the level takes when the intervals are derived from the costs (no interval given for any
    #: level that takes part); None: the level takes no part in the derivation.
    derived_every: int | None = 0

    def __init__(self, options=None):
        self.options = self.Options() if options is None else options

    # ------------------------------------------------------------ options
    @classmethod
    def keywords(cls) -> tuple[str, ...]:
        """The Checkpointer keywords of this level: its Options' fields."""
        return tuple(f.name for f in fields(cls.Options))

    @property
    def given_every(self) -> int | None:
        """The interval given (``<key>_every``), None when not given."""
        return getattr(self.options, f"{self.key}_every")

    def interval(self, derived: bool) -> int:
        """The interval in effect: the one given, else ``derived_every`` when derived, else 0 (never)."""
        if self.given_every is not None:
            return self.given_every
        return self.derived_every if derived and self.derived_every else 0

    def needs_local_dir(self) -> list[str]:
        """The names of the options given, besides the interval, that only the node-local levels use."""
        return []

    def settings(self, every: int) -> dict:
        """The level's settings in ``ROOT/levels.json`` (what ``hpcckpt ls`` shows), its interval ``every``."""
        return {f"{self.key}_every": every}

    # ------------------------------------------------------------ save half
    def start(self, node) -> None:
        """All ranks, collective, once: set up what the level needs on the node layout of ``node``."""

    @abstractmethod
    def available(self, node) -> bool:
        """Whether the node layout of ``node`` (a NodeLevels) lets this level protect anything."""

    def unavailable(self, node) -> str:
        """Why the level protects nothing on this node layout (warned once when it is asked for)."""
        return f"{self.title} ({self.label}): nothing to protect with on {node.layout.nnodes} node(s), skipped"

    @abstractmethod
    def protect(self, node, directory: str, sizes: list[int], fsync: bool, what: str):
        """Collective: protect the version at ``directory`` (``sizes``: every rank's data file size); its
        description for ``extra.levels``."""

    # ------------------------------------------------------------ restore half
    def serves(self, attempt: Attempt) -> bool:
        """Whether this level loads whole versions itself and may hold ``attempt.name``."""
        return False

    def load(self, attempt: Attempt):
        """Collective: ``(restored state, None)`` or ``(None, why)``."""
        raise NotImplementedError(f"{type(self).__name__} serves no whole version")

    def plan_rebuild(self, description, lost: Lost):
        """Pure: ``(plan, None)``, ``(None, why)`` or ``(None, None)`` (this level rebuilds nothing)."""
        return None, None

    def rebuild(self, comm, description, plan, directory: str, sizes: list, what: str) -> None:
        """Collective: rebuild the lost files into ``directory`` following ``plan``."""
        raise NotImplementedError(f"{type(self).__name__} rebuilds nothing")
