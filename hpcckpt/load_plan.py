"""The collective plan of a load: every rank's checked template in, this rank's boxes and shared chunks out.

Two ways, chosen alike on every rank:

* Blocks only (the checkpoint holds no Ragged table, and no rank asks for
  one): the distributed chunk directory of hpcckpt.read_directory, two sparse
  alltoalls whose size per rank is bounded by the chunks it touches and
  directs;
* otherwise: one allgather of every rank's compact requests
  (hpcckpt.read_plan), as a Ragged table's row offsets depend on every rank's
  row count.

The template check's failure (``failure``, from collective.attempt) travels
in the first exchange, so that it costs no collective of its own: every rank
raises the same CheckpointError.  Any problem of the plan (blocks that overlap
or leave a gap, ranks that load different names or kinds) is the same
TemplateMismatchError on every rank.
"""

from __future__ import annotations

from .collective import attempt, raise_if_failed
from .errors import TemplateMismatchError
from .metadata import Metadata
from .read_directory import decide, parts_for_directories, shared_from_assignments, signature_problem
from .read_plan import encode_requests, rank_reads, target_boxes


def plan_load(comm, what: str, meta: Metadata, local: dict | None, failure) -> tuple[dict, dict]:
    """Collective: ``(boxes, shared)`` of this rank (read_plan.rank_reads's form); see the module docstring."""
    rank, size = comm.Get_rank(), comm.Get_size()
    if any(v.kind == "ragged" for v in meta.variables.values()):
        return _gathered(comm, what, meta, local, failure)
    ragged = local is not None and any(r[0] == "ragged" for r in local["requests"].values())
    if failure is None:
        boxes = {n: (tuple(r[1]), tuple(r[2])) for n, r in local["requests"].items() if r[0] == "block"}
        routed, failure = attempt(lambda: parts_for_directories(meta, boxes, size))
    if failure is not None or ragged:  # told to every rank: they all take the same way
        mine = [{"failure": failure, "ragged": ragged}] * size
    else:
        mine = [{"parts": routed.get(d)} if d in routed else None for d in range(size)]
        if rank != 0:
            mine[0] = dict(mine[0] or {}, signature=_signature(local))
    received = [m or {} for m in comm.alltoall(mine)]
    raise_if_failed(comm, what, [m.get("failure") for m in received])
    if any(m.get("ragged") for m in received):
        return _gathered(comm, what, meta, local, None)
    names = sorted(n for n, r in local["requests"].items() if r[0] == "block")
    verdict, failure = attempt(lambda: _directory(meta, names, local, received, rank, size))
    problem, assignments = verdict if verdict is not None else (None, {})
    if failure is not None or problem is not None:
        answer = [{"failure": failure, "problem": problem}] * size
    else:
        answer = [{"assigned": assignments[d]} if d in assignments else None for d in range(size)]
    replies = [m or {} for m in comm.alltoall(answer)]
    raise_if_failed(comm, what, [m.get("failure") for m in replies])
    problem = next((m["problem"] for m in replies if m.get("problem")), None)  # the lowest rank's: the same everywhere
    if problem is not None:
        raise TemplateMismatchError(f"{what} failed: {problem}")
    shared = shared_from_assignments([m.get("assigned") for m in replies], names)
    return boxes, shared


def _signature(local: dict) -> tuple:
    return tuple((name, local["requests"][name][0]) for name in sorted(local["requests"]))


def _directory(meta: Metadata, names: list, local: dict, received: list, rank: int, size: int):
    """Round 2 on this rank: rank 0 checks the signatures first, then every rank its chunks (read_directory)."""
    if rank == 0:
        problem = signature_problem([_signature(local)] + [m.get("signature") for m in received[1:]])
        if problem is not None:
            return problem, {}
    return decide(meta, names, [m.get("parts") for m in received], rank, size)


def _gathered(comm, what: str, meta: Metadata, local: dict | None, failure) -> tuple[dict, dict]:
    """The allgather way: every rank's compact requests, checked alike, then this rank's part (read_plan)."""
    pairs = comm.allgather((failure, None if failure else encode_requests(local["requests"])))
    raise_if_failed(comm, what, [f for f, _ in pairs])
    try:  # the same inputs on every rank: the same checks pass or fail everywhere; then this rank's part
        return rank_reads(meta, target_boxes([e for _, e in pairs], meta), comm.Get_rank())
    except TemplateMismatchError as exc:
        raise TemplateMismatchError(f"{what} failed: {exc}") from None
