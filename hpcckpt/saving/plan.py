"""The plan stage of every save: which box of each variable a rank writes, and with which codec.

The plan is made on rank 0 from every rank's summary (gather, plan, scatter,
broadcast: :func:`replan`) and kept in a :class:`PlanCache` while no rank's
layout changes.  The cache is used in one of two ways, by the kind of writer:

* agreed before the data moves (:func:`agree_plan`; blocking saves and every
  incremental save): one allreduce in which each rank says whether its layout
  still matches the cache, and rank 0 hands out its part (the version's
  directory, the strategy); what each rank receives is bounded whatever the
  rank count (a few fields, the reduction's tree: O(log P) messages).  A repeated save of the same layout then needs no
  planning collective, and a collective transport runs over a plan that every
  rank holds.
* checked at the commit (:func:`plan_locally`, :func:`check_at_commit` + :func:`reconcile`; a full save
  after a commit that set ``PlanCache.checked_at_commit``: each rank writes
  its own file, background or on the node-local levels, or a repeated
  file-per-rank save; saving/run.py): nothing collective before the
  data move.  A rank whose layout changed plans its own part; rank 0 checks
  what the allreduce would have checked (failures, the ranks' digests, one
  version name) and reconciles every rank's plan when the commit gathers them,
  or fails the version on every rank.

Pure apart from :func:`replan` and :func:`agree_plan`, which call MPI through
hpcckpt.mpi.collective's helpers (and agreement.check_digests) and nothing else.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import reduce
from typing import NamedTuple

from hpcckpt.mpi.agreement import check_digests, mismatch, replica_mismatch
from hpcckpt.codecs.core import AUTO
from hpcckpt.codecs.pipeline import decide_alone, default_threads
from hpcckpt.mpi.collective import allreduce_checked, attempt, root_phase_scattered
from hpcckpt.core.encoding import dtype_from_json
from hpcckpt.errors import CheckpointError, TemplateMismatchError
from hpcckpt.options import SaveOptions
from hpcckpt.core.planning import plan_save
from hpcckpt.saving.messages import Described, OwnPlan, WrittenPart
from hpcckpt.saving.stages import measure_codecs, plan_variables


@dataclass
class PlanCache:
    """The agreed plan of the last save of a Checkpointer (or engine), reused while no rank's layout changed.

    Every rank keeps ``key`` (its layout when the plan was made: what it
    holds, the codec specs, the options), its own ``boxes`` (``{name: (lo,
    hi)}``), the agreed ``codecs`` and planned ``variables``, the node
    ``layout`` (for transports that need it) and the global byte count (for
    ``strategy="auto"``).  Rank 0 also keeps every rank's ``summaries`` and
    ``all_boxes``: what :func:`reconcile` checks a changed rank against.
    """

    key: str | None = None
    boxes: dict | None = None
    codecs: dict | None = None
    variables: dict | None = None
    layout: object = None
    total_bytes: int = 0
    summaries: list | None = None
    all_boxes: list | None = None
    expect_hit: bool = False  # agreed: whether the next save checks the cache first (see agree_plan)
    replicas: dict | None = None  # this rank's {name: (owned boxes, shared regions)} of replicated Blocks
    checked_at_commit: bool = False  # agreed: the next blocking save plans locally, checked at its commit
    options: SaveOptions | None = None  # the options of the save that set checked_at_commit

    @property
    def has_replicated(self) -> bool:
        """Whether the plan holds a Block declared replicated (the same answer on every rank)."""
        return any(v.replicated for v in (self.variables or {}).values())

    def invalidate(self) -> None:
        self.key = None
        self.expect_hit = self.checked_at_commit = False

    @property
    def valid(self) -> bool:
        return self.key is not None

    def adopt(self, key: str, replanned: tuple, rank: int, settled=None) -> None:
        """Take the plan a commit reconciled: ``replanned`` is the broadcast ``(variables, every rank's boxes,
        codecs)``; ``settled`` rank 0's :class:`Reconciled` (its summaries and boxes are kept there only)."""
        variables, all_boxes, codecs = replanned
        self.key, self.variables, self.boxes, self.codecs, self.replicas = key, variables, all_boxes[rank], codecs, {}
        self.total_bytes = sum(v.nbytes for v in variables.values())
        self.summaries, self.all_boxes = (settled.summaries, all_boxes) if settled is not None else (None, None)


def replan(comm, what: str, local: Described | None, failure, options: SaveOptions, cache: PlanCache) -> None:
    """Plan on rank 0 from every rank's summary (a layout changed, or the first save); fills ``cache``.

    Collectives: gather of the summaries, broadcast of the verdict with the
    variables and codecs, scatter of the boxes.  ``failure``: this rank's
    failure to describe its state (every rank then raises the same
    CheckpointError).
    """
    _plan(comm, what, local, failure, options, cache)


def _plan(comm, what, local: Described | None, failure, options: SaveOptions, cache: PlanCache, payload=None,
          root_part=None) -> tuple:
    """The new plan of :func:`replan` and :func:`plan_at_once`: ``(rank 0's part, every rank's payload)``.

    collective.root_phase_scattered: gather of ``(failure, (codec-measured
    summary, payload))``; rank 0 plans and broadcasts ``root_part``, every
    rank's payload and the plan, or every failure; the boxes are scattered;
    ``cache`` holds the plan afterwards (rank 0 also every rank's summary and
    boxes, for :func:`reconcile`).
    """
    if failure is None:
        measured, failure = attempt(lambda: measure_codecs(local, options))
    else:
        measured = None
    cache.summaries = cache.all_boxes = None

    def on_root(msgs):
        summaries = [m[0] for m in msgs]
        variables, boxes, codecs, replicas = plan_variables(summaries, options)
        cache.summaries, cache.all_boxes = summaries, boxes
        total = sum(v.nbytes for v in variables.values())
        return (root_part, [m[1] for m in msgs], variables, codecs, total), list(zip(boxes, replicas))

    shared, (cache.boxes, cache.replicas) = root_phase_scattered(comm, lambda: _named(what, root_part), failure,
                                                                 (measured, payload), on_root)
    root, payloads, cache.variables, cache.codecs, cache.total_bytes = shared
    cache.key = local.key
    return root, payloads


def _named(what, root) -> str:
    """The operation's name for errors: ``what``, or ``what(root)`` when it is a function of rank 0's part."""
    return what(root) if callable(what) else what


class Ballot(NamedTuple):
    """What each rank puts into the cache-hit exchange of :func:`agree_plan`, and what the ranks' ballots
    combine into (:func:`merge_ballots`): of bounded size whatever the rank count (a failure rides beside it:
    collective.allreduce_checked).

    ``unchanged``: every rank's layout matches the cached plan; ``low`` /
    ``high``: the smallest and largest digest of the ranks (mpi/agreement.py: equal exactly when the ranks
    agree, or one is None when a rank failed); ``root``: rank 0's part (None
    from the other ranks); ``report``: the ranks' reports combined by the
    caller's function (None without one).
    """

    unchanged: bool
    low: str | None
    high: str | None
    root: object
    report: object


def merge_ballots(a: Ballot, b: Ballot, combine=None) -> Ballot:
    """Two ballots as one (associative and commutative, as an MPI reduction needs; never raises, since it runs
    inside the reduction); the reports as :func:`merge_reports` merges them."""
    lows, highs = [d for d in (a.low, b.low) if d is not None], [d for d in (a.high, b.high) if d is not None]
    return Ballot(a.unchanged and b.unchanged, min(lows) if lows else None,
                  max(highs) if highs else None, a.root if a.root is not None else b.root,
                  merge_reports(a.report, b.report, combine))


def merge_reports(a, b, combine=None):
    """Two ranks' reports as one through ``combine``; None (a rank that failed before it made its report, or
    no ``combine``: no reports) leaves the other one."""
    if combine is None:
        return None
    return b if a is None else a if b is None else combine(a, b)


def agree_plan(comm, what, local: Described | None, failure, options: SaveOptions, cache: PlanCache,
               root_part=None, report=None, combine=None) -> tuple:
    """Collective: the plan every rank writes with; ``(rank 0's part, the ranks' reports combined, cache hit)``.

    Two ways, chosen alike on every rank from the outcome of the last save
    (``cache.expect_hit``):

    * the cache is expected to hold (the last save reused it, or planned
      afresh): one allreduce of each rank's :class:`Ballot` (layout
      unchanged, its digest as the low and high end, ``root_part`` from rank
      0, ``report``) and its failure, whose result has the same few fields
      whatever the rank count; then :func:`replan` only when some rank's layout changed.  A
      repeated save of the same layout makes no other collective;
    * layouts are changing (the last save missed), or there is no plan yet:
      :func:`plan_at_once`, a gather, one broadcast and a scatter, instead of
      the allreduce plus a new plan.

    ``report``: what this rank tells the others (chain_cache.held: the base
    indexes it holds), or None; merged pairwise by ``combine`` (associative
    and commutative: an intersection, a union), which must be the same
    function on every rank (each rank applies its own inside the reduction);
    returned combined, or None when ``combine`` is None.  When some rank failed, one more allgather names the
    ranks and their failures; when the digests differ (the ranks passed
    different steps, options, names, kinds or replicated values:
    mpi/agreement.py), one more allgather names what differs: every rank raises
    the same error, and the cache is invalidated.  ``what``: the operation's
    name for errors, or a function of rank 0's part that gives it.
    """
    if not cache.expect_hit:
        return plan_at_once(comm, what, local, failure, options, cache, root_part, report, combine)
    digest = local.digest if local is not None else None
    mine = Ballot(failure is None and local is not None and local.key == cache.key, digest, digest,
                  root_part if comm.Get_rank() == 0 else None, report)
    try:
        agreed = allreduce_checked(comm, lambda ballot: _named(what, ballot.root), failure, mine,
                                   lambda a, b: merge_ballots(a, b, combine))
        name = _named(what, agreed.root)
        check_digests(comm, name, [agreed.low, agreed.high], local.details if local is not None else None)
        if not agreed.unchanged:
            cache.invalidate()
            replan(comm, name, local, None, options, cache)
            cache.expect_hit = False  # the layout changes: the next save plans at once
    except CheckpointError:
        cache.invalidate()
        raise
    return agreed.root, agreed.report, agreed.unchanged


def plan_at_once(comm, what, local: Described | None, failure, options: SaveOptions, cache: PlanCache,
                 root_part=None, report=None, combine=None) -> tuple:
    """Collective: a new plan without asking first whether the cached one holds; as :func:`agree_plan` returns.

    Gather of ``(failure, codec-measured summary, layout unchanged, report,
    digest)``; rank 0 plans and broadcasts its verdict, its part, every
    rank's report and digest, and the plan; the boxes are scattered.  When
    every rank's layout turns out unchanged, the next save checks the cache
    again (``expect_hit``).
    """
    fresh = cache.key is None
    payload = (local is not None and local.key == cache.key, report, local.digest if local is not None else None)
    try:
        root, payloads = _plan(comm, what, local, failure, options, cache, payload, root_part)
        check_digests(comm, _named(what, root), [p[2] for p in payloads],
                      local.details if local is not None else None)
    except CheckpointError:
        cache.invalidate()
        raise
    cache.expect_hit = fresh or all(p[0] for p in payloads)
    return root, reduce(lambda a, b: merge_reports(a, b, combine), [p[1] for p in payloads]), False


def plan_locally(local: Described, cache: PlanCache, options: SaveOptions) -> tuple[dict, dict, OwnPlan | None]:
    """No MPI: ``(box starts, codecs, own)`` of a save planned on this rank against the cached plan.

    With this rank's layout unchanged the cached plan stands (``own`` is None).
    Otherwise this rank plans its own part: Blocks start where they say,
    a Ragged keeps its cached row offset (the commit shifts it, see
    :func:`reconcile`), and each variable's codec is decided by this rank
    alone (codecs.pipeline.decide_alone: an automatic choice keeps the agreed one); ``own`` is
    that plan, for the commit to check.
    """
    if local.key == cache.key:
        return {n: b[0] for n, b in cache.boxes.items()}, cache.codecs, None
    summaries = measure_codecs(local, options)
    starts, codecs = {}, {}
    for name, s in summaries.items():
        old = cache.boxes.get(name)
        if s["kind"] == "block":
            starts[name] = tuple(s["start"])
        else:  # Ragged: the row offset depends on the other ranks; fixed at the commit
            starts[name] = (int(old[0][0]) if old else 0,) + (0,) * len(s["trailing"] or ())
        if s.get("dtype") is None:
            continue
        codecs[name] = decide_alone(name, dtype_from_json(s["dtype"]), s["codec"],
                                    options.codec_threads or default_threads(), cache.codecs.get(name))
    return starts, codecs, OwnPlan(summaries, starts, codecs)


@dataclass
class Reconciled:
    """Rank 0's plan for a commit: every rank's chunk rows, the variables and codecs; ``changed`` if re-planned."""

    tables: list
    variables: dict
    codecs: dict
    all_boxes: list | None = None
    summaries: list | None = None

    @property
    def changed(self) -> bool:
        return self.all_boxes is not None

    @property
    def replanned(self) -> tuple | None:
        """What every rank adopts of a re-planned layout (PlanCache.adopt): ``(variables, every rank's boxes,
        codecs)``, or None when the cached plan stands."""
        return (self.variables, self.all_boxes, self.codecs) if self.changed else None


def reconcile(cache: PlanCache, tables: list, owns: list) -> Reconciled:
    """Rank 0, pure: the plan the version commits with, given each rank's rows and OwnPlan (or None).

    When every rank used the cached plan it stands.  Otherwise the plan is
    redone from every rank's current summary: it must be valid (names, dtypes,
    tiling), every rank must have encoded a variable with the same codec, and
    the rows of a box that moved (a Ragged whose row offset changed) are
    shifted to the new offsets.  Raises CheckpointError otherwise.
    """
    if all(o is None for o in owns):
        return Reconciled(tables, cache.variables, cache.codecs)
    summaries = [cache.summaries[r] if o is None else o.summaries for r, o in enumerate(owns)]
    used_starts = [{n: b[0] for n, b in cache.all_boxes[r].items()} if o is None else o.starts
                   for r, o in enumerate(owns)]
    used_codecs = [cache.codecs if o is None else o.codecs for o in owns]
    variables, boxes, replicas = plan_save(summaries)
    for mine in replicas:  # without shared regions no two ranks' blocks overlap: each rank wrote its own
        for name, (_, shared) in mine.items():
            if shared:
                raise CheckpointError(f"variable {name!r}: the replicated Blocks changed their layout in an "
                                      "asynchronous save, which plans without a collective; this version was not "
                                      "committed, and the next save plans collectively")
    codecs = {}
    for name in variables:
        specs = {json.dumps(s[name]["codec"].get("spec", AUTO), sort_keys=True) for s in summaries}
        if len(specs) != 1:
            raise TemplateMismatchError(f"variable {name!r}: the ranks ask for different codecs")
        used = [u[name] for r, u in enumerate(used_codecs) if name in u and summaries[r][name].get("dtype") is not None]
        if any(u != used[0] for u in used):
            raise CheckpointError(f"variable {name!r}: the ranks encoded it with different codecs after a layout "
                                  "change (automatic codec choice); the version was not committed, save again")
        codecs[name] = used[0] if used else {"id": "none"}
    fixed = []
    for r, rows in enumerate(tables):
        shift = {n: tuple(int(a) - int(b) for a, b in zip(box[0], used_starts[r].get(n, box[0])))
                 for n, box in boxes[r].items()}
        fixed.append([(v, f, off, nb, dg, tuple(a + d for a, d in zip(st, shift[v])), cnt)
                      if any(shift[v]) else (v, f, off, nb, dg, st, cnt) for v, f, off, nb, dg, st, cnt in rows])
    return Reconciled(fixed, variables, codecs, boxes, summaries)


def check_at_commit(parts: list[WrittenPart]) -> None:
    """Rank 0, pure: what the plan stage's allreduce checks for an agreed plan, checked instead when the commit
    gathers the parts of a save planned locally (:func:`plan_locally`); CheckpointError if any differs.

    From each rank's part: its ``details`` (mpi/agreement.py: step, options,
    names, kinds, replicated values; None from a rank whose plan was agreed),
    its ``version`` name (one, or the ranks passed different steps) and its
    ``replicas``, the digests of the regions of replicated Blocks it shares
    (agreement.replica_mismatch).
    """
    differ = mismatch([p.details for p in parts]) or replica_mismatch([p.replicas for p in parts])
    if differ is not None:
        raise differ
    names = {p.version for p in parts}
    if len(names) != 1:
        raise CheckpointError(f"the ranks saved different versions {sorted(names)} (different steps?)")

