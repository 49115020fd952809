"""The collective plan of a load: every rank's checked template in, this rank's shared chunks out.

Two ways, chosen alike on every rank (:func:`directory_way`):

* the distributed chunk directory of hpcckpt.loading.directory, two sparse
  alltoalls whose size per rank is bounded by the chunks it touches and
  directs (:func:`plan_directory`), or only the first when it shows that no
  rank needs a part from another (a restart on the same decomposition:
  read_directory.all_self_sufficient).  Each rank has read what it reads
  before them (who reads what is decided locally: read_directory.chunk_roles),
  so a failed read travels in the first exchange like a failed template
  check, and the load needs no agreement after its reads.  A checkpoint of
  Blocks always takes it; one holding a Ragged table takes it whenever every
  rank has the metadata before the plan (rank 0 broadcast it: on more than
  16 ranks, and in Checkpointer.restore), after one MPI_Scan of 4 int64 per
  table that gives each rank its rows (:func:`scan_rows`,
  hpcckpt.loading.ragged_rows; the last rank's check of every rank's row requests
  rides on the first alltoall).  So a Ragged load there makes the broadcast,
  the Scan and one alltoall (the saved rows) or two (a reshard);
* otherwise (a Ragged table when each rank read the metadata itself:
  hpcckpt.load on at most 16 ranks, where a rank that could not read it does
  not know that the others would scan first): one alltoall of every rank's
  compact requests (hpcckpt.loading.read_plan, :func:`plan_gathered`), then the
  reads and their agreement: two collectives.  A template asking Ragged rows
  of a variable saved as a Block says so in the directory's first alltoall,
  and every rank then takes this way (with an allgather).

A rank's failure (``failure``, from collective.attempt) travels in the first
exchange, so that it costs no collective of its own: every rank raises the
same CheckpointError.  Any problem of the plan (blocks that overlap or leave a
gap, ranks that load different names or kinds, Ragged row requests that
planning.plan_rows refuses) is the same TemplateMismatchError on every rank.
Measured: docs/performance.md, "Many ranks".
"""

from __future__ import annotations

import numpy as np

from hpcckpt.mpi.collective import allgather_payloads, alltoall_payloads, attempt
from hpcckpt.errors import TemplateMismatchError
from hpcckpt.format.metadata import Metadata
from hpcckpt.loading.ragged_rows import COLUMNS, row_range, rows_problem, tally
from hpcckpt.loading.directory import (all_self_sufficient, decide, fast_summary, parts_for_directories,
                             shared_from_assignments, signature_problem)
from hpcckpt.loading.read_plan import encode_requests, rank_reads, target_boxes


def ragged_names(meta: Metadata) -> list[str]:
    """The stored Ragged tables of ``meta``, sorted: the columns of :func:`scan_rows`'s tallies."""
    return sorted(name for name, v in meta.variables.items() if v.kind == "ragged")


def directory_way(meta: Metadata, own: bool) -> bool:
    """Whether a load of ``meta`` is planned through the chunk directory: it holds no Ragged table, or every rank
    has the metadata before the plan (rank 0 broadcast it, or sent it with something else: not ``own``), so
    that every rank knows that the load starts with :func:`scan_rows`.  ``own``: each rank read the metadata
    itself (loading.reads_metadata_itself, on at most 16 ranks): one that could not does not know which way
    the others take, and joins the first alltoall, which the gathered way's requests then pair with."""
    return not ragged_names(meta) or not own


def scan_rows(comm, meta: Metadata, requests: dict | None) -> tuple[dict, str | None]:
    """Collective, one MPI_Scan of :data:`~hpcckpt.loading.ragged_rows.COLUMNS` int64 numbers per stored Ragged table:
    ``(rows, problem)``, this rank's rows ``{name: (lo, hi)}`` of the tables it asks Ragged rows of, and on the
    last rank the first problem of every rank's requests (hpcckpt.loading.ragged_rows), None elsewhere.

    ``requests``: this rank's (None when its template failed: it adds nothing, its failure comes next).  Every
    rank calls it when the load of a checkpoint holding a Ragged table takes the directory way.
    """
    names = ragged_names(meta)
    mine = tally(requests, names)
    scan = np.empty_like(mine)
    comm.Scan(mine, scan)
    rank, size = comm.Get_rank(), comm.Get_size()
    before = (scan - mine).reshape(len(names), COLUMNS)
    rows = {}
    for i, name in enumerate(names):
        request = (requests or {}).get(name)
        if request is not None and request[0] == "ragged":
            rows[name] = row_range(request[1], before[i], meta.variables[name].shape[0], rank, size)
    shapes = {name: meta.variables[name].shape for name in names}
    return rows, rows_problem(names, scan, shapes, size) if rank == size - 1 else None


def load_boxes(meta: Metadata, requests: dict, rows: dict) -> dict | None:
    """``{name: (start, stop)}`` of this rank's requests: a Block's box, a Ragged table's rows (``rows``, from
    :func:`scan_rows`) times its trailing dimensions; None when it asks Ragged rows that ``rows`` does not place
    (of a stored Block: then every rank takes :func:`plan_gathered`)."""
    boxes = {}
    for name, request in requests.items():
        if request[0] == "block":
            boxes[name] = (tuple(request[1]), tuple(request[2]))
        elif name in rows:
            trailing = meta.variables[name].shape[1:]
            boxes[name] = ((rows[name][0],) + (0,) * len(trailing), (rows[name][1],) + tuple(trailing))
        else:
            return None
    return boxes


def plan_directory(comm, what: str, meta: Metadata, local: dict | None, boxes: dict | None, roles: dict | None,
                   failure, rows_problem: str | None = None) -> tuple[dict, bool] | None:
    """Collective: ``(shared, reread)`` of this rank, or None when a rank asked for Ragged rows that the
    directory cannot place (then every rank takes :func:`plan_gathered`).

    ``boxes``: :func:`load_boxes` of this rank (None with a failure, or for
    such Ragged rows); ``roles``: read_directory.chunk_roles of those boxes
    (None when ``boxes`` is).  ``rows_problem``: the last rank's
    :func:`scan_rows` problem, told to every rank here, which all raise it as
    one TemplateMismatchError (after any rank's failure).  ``shared`` is
    read_plan.rank_reads's form (``{name: {chunk: (sender, parts)}}``) for the
    chunks whose parts move between ranks; ``reread``: some rank reads a chunk
    after the plan (read_directory.decide), so the load agrees once more.

    The first alltoall also gives every rank every rank's
    read_directory.fast_summary: when no rank needs a part from another and
    the boxes tile the arrays, the plan ends there (one collective, ``shared``
    empty); otherwise the directory decides in the second.
    """
    rank, size = comm.Get_rank(), comm.Get_size()
    ragged = failure is None and boxes is None
    if failure is None and not ragged:
        planned, failure = attempt(lambda: (parts_for_directories(meta, roles, size), fast_summary(
            meta, boxes, roles, _signature(local), rank)))
    if failure is not None or ragged or rows_problem is not None:  # told to every rank: they all take one way
        mine = [{"ragged": ragged, "problem": rows_problem}] * size  # a failure takes every slot instead
    else:
        routed, summary = planned  # a slot with nothing else to carry is the bare summary (an int, or None)
        mine = [{"parts": routed[d], "fast": summary} if d in routed else summary for d in range(size)]
        if rank != 0:
            mine[0] = dict(mine[0] if isinstance(mine[0], dict) else {"fast": summary}, signature=_signature(local))
    received = [m if isinstance(m, dict) else {"fast": m} for m in alltoall_payloads(comm, what, failure, mine)]
    _raise_problem(what, received)
    if any(m.get("ragged") for m in received):
        return None
    names = sorted(roles)
    if all_self_sufficient([m.get("fast") for m in received]):  # the same answer on every rank: nothing moves
        return {name: {} for name in names}, False
    verdict, failure = attempt(lambda: _directory(meta, names, local, received, rank, size))
    problem, assignments, reread = verdict if verdict is not None else (None, {}, False)
    if failure is not None or problem is not None:
        answer = [{"problem": problem}] * size  # a failure takes every slot instead
    else:
        answer = [{"assigned": assignments[d]} if d in assignments else None for d in range(size)]
        if reread:  # every rank learns that an agreement follows the reads after the plan
            answer = [dict(m or {}, reread=True) for m in answer]
    replies = [m or {} for m in alltoall_payloads(comm, what, failure, answer)]
    _raise_problem(what, replies)
    shared = shared_from_assignments([m.get("assigned") for m in replies], names)
    return shared, any(m.get("reread") for m in replies)


def _raise_problem(what: str, received: list) -> None:
    """The TemplateMismatchError of the lowest rank that sent a problem (the same on every rank), if one did."""
    problem = next((m["problem"] for m in received if m.get("problem")), None)
    if problem is not None:
        raise TemplateMismatchError(f"{what} failed: {problem}")


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
    mine = encode_requests(local["requests"]) if failure is None else None
    received = (alltoall_payloads(comm, what, failure, [mine] * comm.Get_size()) if alltoall
                else allgather_payloads(comm, what, failure, mine))
    try:  # the same inputs on every rank: the same checks pass or fail everywhere; then this rank's part
        return rank_reads(meta, target_boxes(received, meta), comm.Get_rank())
    except TemplateMismatchError as exc:
        raise TemplateMismatchError(f"{what} failed: {exc}") from None
