"""The messages between the save stages: what a rank describes, what it wrote, what rank 0 commits and reports.

Frozen dataclasses, one per hand-over, so that every stage reads fields by
name and every kind of save (blocking or asynchronous, full or incremental,
on the root or the levels) sends the same message at the same step::

    describe  -> Described         this rank's state, read now (stages.describe_state)
    plan      -> OwnPlan           this rank's own plan, when its layout left the cached one (plan.plan_locally)
    write     -> WrittenPart       this rank's part of the commit, gathered to rank 0
    commit    <- VersionToCommit   where and what rank 0 commits (pipeline.commit_on_root)
              -> CommitReport      what every rank learns of the commit (broadcast from rank 0)

Frozen means no stage rebinds a field of a message it received; the dicts
inside are not copied (a Described refers to the caller's arrays: zero copy).
Pure: no MPI, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpcckpt.storage import POSIX, Storage


@dataclass(frozen=True)
class Described:
    """This rank's part of one save, read from its state at the call (no MPI).

    ``summaries``: what it holds, by variable, for the planner (stages.measure_codecs adds the codec
    summaries in a copy); ``distributed``: the Block/Ragged objects; ``specs``: each variable's codec spec
    (JSON); ``arrays``: its buffers (host or device arrays, or None); ``values``: the replicated values in
    their JSON form (rank 0 only, None elsewhere: rank 0 commits them); ``per_rank``: this rank's PerRank
    values in their JSON form (collected at the commit); ``key``: the layout the plan cache compares
    (stages.layout_key); ``details`` and ``digest``: what every rank must agree on (mpi/agreement.py: the
    step, the options, names and kinds, the replicated values).
    """

    summaries: dict
    distributed: dict
    specs: dict
    arrays: dict
    values: dict | None
    per_rank: dict
    key: str
    details: dict
    digest: str


@dataclass(frozen=True)
class OwnPlan:
    """The plan a rank made alone because its layout changed since the cached plan (plan.plan_locally), for
    rank 0 to reconcile at the commit: its codec-measured ``summaries``, the box ``starts`` it wrote at and
    the ``codecs`` it encoded with, by variable."""

    summaries: dict
    starts: dict
    codecs: dict


@dataclass(frozen=True)
class WrittenPart:
    """What one rank wrote for a version: its part of the commit, gathered to rank 0.

    ``stats``: its phase seconds, timeline and stored bytes (core/stats.phase_record); ``part``: its chunk
    rows, or an incremental save's rows, hashes and references (Selection.commit_part), None when it wrote
    nothing; ``per_rank``: its PerRank values (JSON form); ``replicas``: its digests of the regions of
    replicated Blocks other ranks hold too (compared at the commit: agreement.replica_mismatch);
    ``files``: its records of the tracked output files (hpcckpt.root.files), None when none are tracked.

    A save whose plan is checked at the commit (saving/plan.py) adds what the plan stage would have agreed:
    ``version``, the version name it wrote; ``own``, the plan it made itself when its layout changed (else
    None); ``details``, its agreement entries (None when the plan was
    agreed); ``other_options``: it asked for other options than the plan was agreed for and wrote nothing.
    ``file_bytes``: the size of its file of the version (what the node-local levels protect).
    """

    stats: dict
    part: list | dict | None
    per_rank: dict | None
    replicas: dict
    files: list | None = None
    version: str | None = None
    own: OwnPlan | None = None
    details: dict | None = None
    other_options: bool = False
    file_bytes: int = 0


@dataclass(frozen=True)
class VersionToCommit:
    """What rank 0 commits, besides the plan and the ranks' parts: the version's place and its record.

    ``directory``: the version; ``step``: its step; ``extra``: the version's ``extra`` before the commit adds
    the ranks' ``stats`` (and the tracked ``files``, and the ``levels`` reached: in that order);
    ``info``: the incremental policy's outcome (Selection.info; None for a plain full save);
    ``tracked``: the ranks' tracked-file records are committed; ``levels``: what the node-local levels
    protected (levels.node.NodeLevels.protect), or None; ``synced``: the writers fsynced ``data/`` and the
    parent already (commit.commit_version).
    """

    directory: str
    step: int | None
    extra: dict
    info: dict | None
    fsync: bool
    storage: Storage = POSIX
    synced: bool = False
    tracked: bool = False
    levels: dict | None = None


@dataclass(frozen=True)
class CommitReport:
    """What every rank learns of a commit, broadcast by rank 0 (its metadata bytes stay there unless asked).

    ``nbytes``, ``nchunks``: the stored bytes of all ranks and the chunks in the version's index;
    ``summary``: an incremental save's figures (incremental/rules.incremental_metadata), None for a plain full
    save; ``chain``: the new version's index key and index for the next incremental save, or None;
    ``phases``: the slowest rank's seconds per phase; ``straggler``: the slowest rank of the longest phase, in
    words; ``replanned``: ``(variables, every rank's boxes, codecs)`` when rank 0 reconciled a changed layout
    (saving/plan.Reconciled.replanned), else None; ``metadata``: the committed metadata bytes, when the
    node-local levels commit them on every node, else None.
    """

    nbytes: int
    nchunks: int
    summary: dict | None
    chain: tuple | None
    phases: dict
    straggler: str
    replanned: tuple | None = None
    metadata: bytes | None = None
