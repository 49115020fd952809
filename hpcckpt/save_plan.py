"""The plan stage of every save: which box of each variable a rank writes, and with which codec.

The plan is made on rank 0 from every rank's summary (gather, plan, scatter,
broadcast: :func:`replan`) and kept in a :class:`PlanCache` while no rank's
layout changes.  The cache is used in one of two ways, by the kind of writer:

* agreed before the data moves (:func:`agree_plan`; blocking saves and every
  incremental save): one allgather in which each rank says whether its layout
  still matches the cache, and rank 0 hands out its part (the version's
  directory, the strategy).  A repeated save of the same layout then needs no
  planning collective, and a collective transport runs over a plan that every
  rank holds.
* checked at the commit (:func:`plan_locally` + :func:`reconcile`;
  asynchronous full saves): nothing collective before the background writer
  starts.  A rank whose layout changed plans its own part; rank 0 reconciles
  every rank's plan when the commit gathers them, or fails the version on every
  rank.

Pure apart from :func:`replan` and :func:`agree_plan` (which call MPI through
``comm`` and nothing else).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from .agreement import check_digests
from .codecs.core import AUTO
from .codecs.pipeline import decide_alone, default_threads
from .collective import attempt, collective_error, raise_if_failed
from .encoding import dtype_from_json
from .errors import CheckpointError, TemplateMismatchError
from .options import SaveOptions
from .planning import plan_save
from .save_stages import measure_codecs, plan_variables


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

    @property
    def has_replicated(self) -> bool:
        """Whether the plan holds a Block declared replicated (the same answer on every rank)."""
        return any(v.replicated for v in (self.variables or {}).values())

    def invalidate(self) -> None:
        self.key = None
        self.expect_hit = False

    @property
    def valid(self) -> bool:
        return self.key is not None

    def adopt(self, key: str, variables: dict, boxes: dict, codecs: dict, summaries=None, all_boxes=None) -> None:
        """Take a plan agreed elsewhere (a reconciled one, broadcast by the commit)."""
        self.key, self.variables, self.boxes, self.codecs, self.replicas = key, variables, boxes, codecs, {}
        self.total_bytes = sum(v.nbytes for v in variables.values())
        self.summaries, self.all_boxes = summaries, all_boxes


def replan(comm, what: str, local: dict | None, failure, options: SaveOptions, cache: PlanCache) -> None:
    """Plan on rank 0 from every rank's summary (a layout changed, or the first save); fills ``cache``.

    Collectives: gather of the summaries, broadcast of the verdict with the
    variables and codecs, scatter of the boxes.  ``failure``: this rank's
    failure to describe its state (every rank then raises the same
    CheckpointError).
    """
    _plan(comm, what, local, failure, options, cache)


def _plan(comm, what, local: dict | None, failure, options: SaveOptions, cache: PlanCache, payload=None,
          root_part=None) -> tuple:
    """The new plan of :func:`replan` and :func:`plan_at_once`: ``(rank 0's part, every rank's payload)``.

    Gather of ``(failure, codec-measured summary, payload)``; rank 0 plans and
    broadcasts its verdict, ``root_part``, every rank's payload and the plan;
    the boxes are scattered; ``cache`` holds the plan afterwards.
    """
    if failure is None:
        measured, failure = attempt(lambda: measure_codecs(local, options))
    else:
        measured = None
    msgs = comm.gather((failure, measured, payload), root=0)
    shared = plan = None
    if comm.Get_rank() == 0:
        plan, bad = attempt(lambda: _plan_on_root([(m[0], m[1]) for m in msgs], options))
        shared = (bad, root_part, [m[2] for m in msgs], *((plan[0], plan[2], plan[3]) if plan else (None, None, 0)))
    bad, root, payloads, variables, codecs, total = comm.bcast(shared, root=0)
    raise_if_failed(comm, what(root) if callable(what) else what, [bad])
    cache.variables, cache.codecs, cache.total_bytes = variables, codecs, total
    cache.boxes, cache.replicas = comm.scatter(list(zip(plan[1], plan[4])) if plan else None, root=0)
    cache.summaries = [m[1] for m in msgs] if plan else None
    cache.all_boxes = plan[1] if plan else None
    cache.key = local["key"]
    return root, payloads


def _plan_on_root(msgs: list, options: SaveOptions) -> tuple:
    """Rank 0: ``(variables, boxes per rank, codecs, global bytes, replica parts per rank)``, or the ranks' own
    failures raised as one."""
    bad = {r: f for r, (f, _) in enumerate(msgs) if f is not None}
    if bad:
        raise collective_error("describing the state", bad, len(msgs))
    summaries = [m[1] for m in msgs]
    variables, boxes, codecs, replicas = plan_variables(summaries, options)
    return variables, boxes, codecs, sum(v.nbytes for v in variables.values()), replicas


def agree_plan(comm, what, local: dict | None, failure, options: SaveOptions, cache: PlanCache,
               root_part=None, report=None) -> tuple:
    """Collective: the plan every rank writes with; ``(rank 0's part, every rank's report, cache hit)``.

    Two ways, chosen alike on every rank from the outcome of the last save
    (``cache.expect_hit``):

    * the cache is expected to hold (the last save reused it, or planned
      afresh): one allgather of ``(failure, layout unchanged, root_part,
      report, digest)``, then :func:`replan` only when some rank's layout
      changed; a repeated save of the same layout makes no other collective;
    * layouts are changing (the last save missed), or there is no plan yet:
      :func:`plan_at_once`, a gather, one broadcast and a scatter, instead of
      the allgather plus a new plan.

    When the digests differ (the ranks passed different steps, options,
    names, kinds or replicated values: agreement.py) every rank raises the
    same error naming what differs.  ``what``: the operation's name for
    errors, or a function of rank 0's part that gives it.  A failure on any
    rank raises the same CheckpointError everywhere, with the cache invalidated.
    """
    if not cache.expect_hit:
        return plan_at_once(comm, what, local, failure, options, cache, root_part, report)
    everyone = comm.allgather((failure, local is not None and local["key"] == cache.key, root_part, report,
                               local["digest"] if local is not None else None))
    root = everyone[0][2]
    name = what(root) if callable(what) else what
    try:
        raise_if_failed(comm, name, [e[0] for e in everyone])
        check_digests(comm, name, [e[4] for e in everyone], local["details"] if local is not None else None)
        hit = all(e[1] for e in everyone)
        if not hit:
            cache.invalidate()
            replan(comm, name, local, None, options, cache)
            cache.expect_hit = False  # the layout changes: the next save plans at once
    except CheckpointError:
        cache.invalidate()
        raise
    return root, [e[3] for e in everyone], hit


def plan_at_once(comm, what, local: dict | None, failure, options: SaveOptions, cache: PlanCache,
                 root_part=None, report=None) -> tuple:
    """Collective: a new plan without asking first whether the cached one holds; as :func:`agree_plan` returns.

    Gather of ``(failure, codec-measured summary, layout unchanged, report,
    digest)``; rank 0 plans and broadcasts its verdict, its part, every
    rank's report and digest, and the plan; the boxes are scattered.  When
    every rank's layout turns out unchanged, the next save checks the cache
    again (``expect_hit``).
    """
    fresh = cache.key is None
    payload = (local is not None and local["key"] == cache.key, report, local["digest"] if local is not None else None)
    try:
        root, payloads = _plan(comm, what, local, failure, options, cache, payload, root_part)
        check_digests(comm, what(root) if callable(what) else what, [p[2] for p in payloads],
                      local["details"] if local is not None else None)
    except CheckpointError:
        cache.invalidate()
        raise
    cache.expect_hit = fresh or all(p[0] for p in payloads)
    return root, [p[1] for p in payloads], False


def plan_locally(local: dict, cache: PlanCache, options: SaveOptions) -> tuple[dict, dict, tuple | None]:
    """No MPI: ``(box starts, codecs, own)`` of an asynchronous save planned against the cached plan.

    With this rank's layout unchanged the cached plan stands (``own`` is None).
    Otherwise this rank plans its own part: Blocks start where they say,
    a Ragged keeps its cached row offset (the commit shifts it, see
    :func:`reconcile`), and each variable's codec is decided by this rank
    alone (codecs.pipeline.decide_alone: an automatic choice keeps the agreed one); ``own`` is
    ``(summaries, starts, codecs)`` for the commit to check.
    """
    if local["key"] == cache.key:
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
    return starts, codecs, (summaries, starts, codecs)


@dataclass
class Reconciled:
    """Rank 0's plan for the commit of an asynchronous save: chunk rows fixed to it; ``changed`` if re-planned."""

    tables: list
    variables: dict
    codecs: dict
    all_boxes: list | None = None
    summaries: list | None = None

    @property
    def changed(self) -> bool:
        return self.all_boxes is not None


def reconcile(cache: PlanCache, tables: list, owns: list) -> Reconciled:
    """Rank 0, pure: the plan the version commits with, given each rank's rows and ``own`` plan (or None).

    When every rank used the cached plan it stands.  Otherwise the plan is
    redone from every rank's current summary: it must be valid (names, dtypes,
    tiling), every rank must have encoded a variable with the same codec, and
    the rows of a box that moved (a Ragged whose row offset changed) are
    shifted to the new offsets.  Raises CheckpointError otherwise.
    """
    if all(o is None for o in owns):
        return Reconciled(tables, cache.variables, cache.codecs)
    summaries = [cache.summaries[r] if o is None else o[0] for r, o in enumerate(owns)]
    used_starts = [{n: b[0] for n, b in cache.all_boxes[r].items()} if o is None else o[1]
                   for r, o in enumerate(owns)]
    used_codecs = [cache.codecs if o is None else o[2] for o in owns]
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
