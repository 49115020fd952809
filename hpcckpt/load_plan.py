"""The collective plan of a load: every rank's checked template in, this rank's shared chunks out.

Two ways, chosen alike on every rank:

* Blocks only (the checkpoint holds no Ragged table, and no rank asks for
  one): the distributed chunk directory of hpcckpt.read_directory, two sparse
  alltoalls whose size per rank is bounded by the chunks it touches and
  directs (:func:`plan_directory`), or only the first when it shows that no
  rank needs a part from another (a restart on the same decomposition:
  read_directory.all_self_sufficient).  Each rank has read what it reads
  before them (who reads what is decided locally: read_directory.chunk_roles),
  so a failed read travels in the first exchange like a failed template
  check, and the load needs no agreement after its reads;
* otherwise: one allgather of every rank's compact requests
  (hpcckpt.read_plan, :func:`plan_gathered`), as a Ragged table's row offsets
  depend on every rank's row count; the reads follow the plan.

A rank's failure (``failure``, from collective.attempt) travels in the first
exchange, so that it costs no collective of its own: every rank raises the
same CheckpointError.  Any problem of the plan (blocks that overlap or leave a
gap, ranks that load different names or kinds) is the same
TemplateMismatchError on every rank.
"""

from __future__ import annotations

from .collective import attempt, raise_if_failed
from .errors import TemplateMismatchError
from .metadata import Metadata
from .read_directory import (all_self_sufficient, decide, fast_summary, parts_for_directories,
                             shared_from_assignments, signature_problem)
from .read_plan import encode_requests, rank_reads, target_boxes


def directory_way(meta: Metadata) -> bool:
    """Whether a load of ``meta`` is planned through the chunk directory (it holds no Ragged table)."""
    return not any(v.kind == "ragged" for v in meta.variables.values())


def plan_directory(comm, what: str, meta: Metadata, local: dict | None, roles: dict | None,
                   failure) -> tuple[dict, bool] | None:
    """Collective: ``(shared, reread)`` of this rank, or None when a rank asked for Ragged rows (then every
    rank takes :func:`plan_gathered`).

    ``roles``: read_directory.chunk_roles of this rank's Blocks (None with a
    failure, or when this rank asks for Ragged rows).  ``shared`` is
    read_plan.rank_reads's form (``{name: {chunk: (sender, parts)}}``) for the
    chunks whose parts move between ranks; ``reread``: some rank reads a chunk
    after the plan (read_directory.decide), so the load agrees once more.

    The first alltoall also gives every rank every rank's
    read_directory.fast_summary: when no rank needs a part from another and
    the boxes tile the arrays, the plan ends there (one collective, ``shared``
    empty); otherwise the directory decides in the second.
    """
    rank, size = comm.Get_rank(), comm.Get_size()
    ragged = failure is None and any(r[0] == "ragged" for r in local["requests"].values())
    if failure is None and not ragged:
        planned, failure = attempt(lambda: (parts_for_directories(meta, roles, size), fast_summary(
            meta, _boxes(local), roles, _signature(local), rank)))
    if failure is not None or ragged:  # told to every rank: they all take the same way
        mine = [{"failure": failure, "ragged": ragged}] * size
    else:
        routed, summary = planned  # a slot with nothing else to carry is the bare summary (an int, or None)
        mine = [{"parts": routed[d], "fast": summary} if d in routed else summary for d in range(size)]
        if rank != 0:
            mine[0] = dict(mine[0] if isinstance(mine[0], dict) else {"fast": summary}, signature=_signature(local))
    received = [m if isinstance(m, dict) else {"fast": m} for m in comm.alltoall(mine)]
    raise_if_failed(comm, what, [m.get("failure") for m in received])
    if any(m.get("ragged") for m in received):
        return None
    names = sorted(roles)
    if all_self_sufficient([m.get("fast") for m in received]):  # the same answer on every rank: nothing moves
        return {name: {} for name in names}, False
    verdict, failure = attempt(lambda: _directory(meta, names, local, received, rank, size))
    problem, assignments, reread = verdict if verdict is not None else (None, {}, False)
    if failure is not None or problem is not None:
        answer = [{"failure": failure, "problem": problem}] * size
    else:
        answer = [{"assigned": assignments[d]} if d in assignments else None for d in range(size)]
        if reread:  # every rank learns that an agreement follows the reads after the plan
            answer = [dict(m or {}, reread=True) for m in answer]
    replies = [m or {} for m in comm.alltoall(answer)]
    raise_if_failed(comm, what, [m.get("failure") for m in replies])
    problem = next((m["problem"] for m in replies if m.get("problem")), None)  # the lowest rank's: the same everywhere
    if problem is not None:
        raise TemplateMismatchError(f"{what} failed: {problem}")
    shared = shared_from_assignments([m.get("assigned") for m in replies], names)
    return shared, any(m.get("reread") for m in replies)


def _boxes(local: dict) -> dict:
    return {name: (tuple(r[1]), tuple(r[2])) for name, r in local["requests"].items()}


def _signature(local: dict) -> tuple:
    return tuple((name, local["requests"][name][0]) for name in sorted(local["requests"]))


def _directory(meta: Metadata, names: list, local: dict, received: list, rank: int, size: int):
    """Round 2 on this rank: rank 0 checks the signatures first, then every rank its chunks (read_directory)."""
    if rank == 0:
        problem = signature_problem([_signature(local)] + [m.get("signature") for m in received[1:]])
        if problem is not None:
            return problem, {}, False
    return decide(meta, names, [m.get("parts") for m in received], rank, size)


def plan_gathered(comm, what: str, meta: Metadata, local: dict | None, failure,
                  alltoall: bool = False) -> tuple[dict, dict]:
    """Collective, the allgather way: ``(boxes, shared)`` of this rank from every rank's compact requests,
    checked alike (read_plan).

    ``alltoall``: the requests go by an alltoall of the same message to every rank instead of an allgather,
    when this is the load's first exchange and the ranks read the metadata themselves
    (loading.reads_metadata_itself): a rank that could not read it does not know which way the others take,
    and sends its failure in :func:`plan_directory`'s first alltoall, which this one then pairs with.
    """
    mine = {"failure": failure} if failure is not None else {"requests": encode_requests(local["requests"])}
    received = comm.alltoall([mine] * comm.Get_size()) if alltoall else comm.allgather(mine)
    raise_if_failed(comm, what, [m.get("failure") for m in received])
    try:  # the same inputs on every rank: the same checks pass or fail everywhere; then this rank's part
        return rank_reads(meta, target_boxes([m["requests"] for m in received], meta), comm.Get_rank())
    except TemplateMismatchError as exc:
        raise TemplateMismatchError(f"{what} failed: {exc}") from None
