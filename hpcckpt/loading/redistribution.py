"""Runtime malleability: move a distributed state from one decomposition to another in memory.

``redistribute(comm, held, template)`` is a reshard load whose source is the
memory of the ranks that hold the state instead of a checkpoint's files:

* the holders' state is planned as a save is (planning.plan_save: every Block
  tiles its array, Ragged rows are concatenated in rank order), and that plan
  is the source's chunk table: chunk ``k`` is holder ``k``'s part, its
  ``file`` column the holder's rank in ``comm``;
* the template is checked and planned exactly as a load's is
  (loading.check_template, loading.plan_targets: blocks tile, Ragged rows are
  split evenly or as asked);
* every target rank receives straight from the holders whose parts overlap its
  box (regions.shared_parts), with non-blocking point-to-point messages; no
  file is written and no rank sees more than its own parts.  A rank holds, on
  top of what it holds and what it will hold, only copies of the parts it sends
  that are not contiguous in its array and buffers for parts it receives that
  cannot go straight into its target: as in a reshard load.

Replicated values must be equal on every holder (checked by digest) and are
delivered from the lowest holding rank, PerRank values follow the load's rule
(hpcckpt.PerRank, entry i for target rank i), so a redistribution returns
exactly what a save on the holders and a load into the template would.
"""

from __future__ import annotations

import json

import numpy as np
import xxhash

from hpcckpt.core.arrays import byte_view
from hpcckpt.mpi.collective import agree, allgather_checked, resolve_comm
from hpcckpt.core.devices import as_local_array, copy_into, is_device_array
from hpcckpt.core.encoding import decode_value, dtype_from_json, encode_per_rank, encode_value
from hpcckpt.errors import CheckpointError, TemplateMismatchError
from hpcckpt.loading.load import plan_targets, read_template, restored_state
from hpcckpt.format.metadata import ChunkTable, Metadata, Variable
from hpcckpt.core.planning import plan_save
from hpcckpt.loading.reader import allocate
from hpcckpt.core.regions import shared_parts, volume
from hpcckpt.state import Block, PerRank, split_state, summarize_for_save
from hpcckpt.stateful import deliver, flatten, materialize

_WHAT = "redistribution"
_PART_TAG = 7312


def redistribute(comm, held, template, *, strict: bool = True, cast: bool = False):
    """Collectively move the state ``held`` by some ranks of ``comm`` into the ``template`` of others.

    Every rank of ``comm`` (a communicator spanning the old and the new
    decomposition) calls it with what it holds now (a state as for
    :func:`hpcckpt.save`; None on a rank that is joining) and the template of
    what it will hold (as for :func:`hpcckpt.load`; None on a rank that is
    leaving).  Holders are the old decomposition in ``comm`` rank order,
    template ranks the new one.  Returns, on a rank with a template, the
    restored state as a load does (Blocks filled in place, new Ragged rows,
    replicated values, PerRanks; a Stateful template gets ``load_state_dict``);
    None on a leaving rank, whose data has been handed over once it returns.
    Template arrays must not share memory with held ones (except an unchanged
    block passed as both).  Any bad input is the same CheckpointError on every
    rank, raised before any data moves.  ``strict=False`` lets the template omit
    variables that are held; ``cast=True`` fills a template dtype that differs
    from the held one by casting, as :func:`hpcckpt.load` does.  Messages
    speak of the held state as "the checkpoint": it is checked as one.
    """
    comm = resolve_comm(comm)
    rank = comm.Get_rank()
    mine: dict = {}  # what this rank holds (_held), and its template read and checked (read_template)

    def describe():
        if held is not None:
            mine["held"] = _held(held)
            return mine["held"]["summary"]
        return None

    described = allgather_checked(comm, _WHAT, describe)  # 1: what every rank holds
    holders = [r for r, d in enumerate(described) if d is not None]
    meta = _same_everywhere(lambda: _source_metadata(described, holders))  # the same inputs on every rank
    held_local = mine.get("held")

    def request():
        local = None if template is None else read_template(template, meta, strict, cast)
        mine["local"] = local
        values = held_local["values"] if rank == holders[0] else None  # the lowest holder's values, sent once
        return None if local is None else local["requests"], values

    asked = allgather_checked(comm, _WHAT, request)  # 2: every template's requests, and the replicated values
    meta.values.update(asked[holders[0]][1])
    requests = [q for q, _ in asked]
    local = mine["local"]
    targets = [r for r, q in enumerate(requests) if q is not None]
    boxes = _same_everywhere(lambda: _target_boxes(requests, targets, meta))
    outs = agree(comm, _WHAT, lambda: {} if local is None else {  # 3: the targets exist on every rank
        name: _target(name, value, boxes[rank][name], local["dtypes"].get(name, meta.variables[name].dtype))
        for name, value in sorted(local["distributed"].items())})
    _move(comm, meta, held_local, boxes, outs)
    if local is None:
        return None
    values = {name: decode_value(meta.values[name], repr(name)) for name in local["replicated"]}
    restored = restored_state(local, outs, values, targets.index(rank), len(targets))
    deliver(template, restored)
    return restored


def _held(held) -> dict:
    """This holder's flat state, its summary for the plan, and its replicated values in their JSON form."""
    flat = flatten(materialize(held))
    distributed, replicated = split_state(flat)
    summaries = {name: summarize_for_save(name, value) for name, value in distributed.items()}
    per_rank = {name: encode_value(v.value, repr(name)) for name, v in replicated.items() if isinstance(v, PerRank)}
    values = {name: encode_value(v, repr(name)) for name, v in replicated.items() if not isinstance(v, PerRank)}
    digest = xxhash.xxh3_64_hexdigest(json.dumps([sorted(per_rank), values], sort_keys=True).encode())
    return {"distributed": distributed, "values": values,
            "summary": {"blocks": summaries, "per_rank": per_rank, "values": sorted(values), "digest": digest}}


def _same_everywhere(plan):
    """A plan every rank computes from the same gathered inputs: the same answer, or the same error, everywhere."""
    try:
        return plan()
    except CheckpointError as exc:
        raise type(exc)(f"{_WHAT} failed: {exc}") from None


def _source_metadata(described: list, holders: list) -> Metadata:
    """The holders' state as a version's metadata: the save plan's variables, each holder's part one chunk."""
    if not holders:
        raise CheckpointError("no rank holds a state: pass what each rank holds now (None only on joining ranks)")
    first = described[holders[0]]
    for r in holders:
        if described[r]["digest"] != first["digest"]:
            raise TemplateMismatchError(
                f"rank {r} and rank {holders[0]} hold different replicated values (or PerRank names): they must be "
                "equal on every holding rank (wrap values that differ per rank in hpcckpt.PerRank)")
    try:
        plans, boxes, _ = plan_save([described[r]["blocks"] for r in holders])
    except TemplateMismatchError as exc:
        raise TemplateMismatchError(f"the held state: {exc}") from None
    copies = sorted(name for name, plan in plans.items() if plan.replicated)
    if copies:  # each holder's part is one chunk here: copies on several holders would be several chunks
        raise CheckpointError(f"redistribute does not take replicated Blocks yet ({copies}): pass them as held by "
                              "one rank each (replicated=False on all but one), or checkpoint and restart")
    variables = {}
    for name, plan in plans.items():
        dtype = dtype_from_json(plan.dtype)
        rows = [(r, 0, volume(b - a for a, b in zip(*box[name])) * dtype.itemsize, "", box[name][0],
                 tuple(b - a for a, b in zip(*box[name]))) for r, box in zip(holders, boxes)]
        variables[name] = Variable(name, plan.kind, dtype, plan.shape, ChunkTable.from_rows(rows, len(plan.shape)))
    values = {name: None for name in first["values"]}  # filled with the lowest holder's values once gathered
    values.update({name: encode_per_rank([described[r]["per_rank"][name] for r in holders])
                   for name in first["per_rank"]})
    return Metadata(step=None, files=[], variables=variables, values=values, nranks=len(holders), created="")


def _target_boxes(requests: list, targets: list, meta: Metadata) -> dict:
    """``{rank: {name: (start, stop)}}`` for the ranks with a template, planned as a load's targets are."""
    if not targets:
        raise CheckpointError("no rank passes a template: pass what each rank will hold (None only on leaving ranks)")
    planned = plan_targets([requests[r] for r in targets], meta)
    return dict(zip(targets, planned))


def _target(name: str, value, box: tuple, dtype) -> tuple:
    """``(start, stop, array)`` this rank fills for ``name``: a Block's own array, new rows (of ``dtype``) for a
    Ragged."""
    start, stop = box
    out = value.local if isinstance(value, Block) else allocate(tuple(b - a for a, b in zip(start, stop)), dtype, name)
    return start, stop, out


def _move(comm, meta: Metadata, held_local: dict | None, boxes: dict, outs: dict) -> None:
    """Send every held part to the target ranks it overlaps and receive this rank's parts (in plan order)."""
    rank = comm.Get_rank()
    targets = sorted(boxes)
    sends, recvs, incoming = [], [], []
    for name in sorted(meta.variables):
        var = meta.variables[name]
        t_ranks = [t for t in targets if name in boxes[t]]
        t_starts, t_stops = (np.asarray([boxes[t][name][j] for t in t_ranks], np.int64).reshape(
            len(t_ranks), len(var.shape)) for j in (0, 1))
        if held_local is not None:
            k = int(np.nonzero(var.chunks.file == rank)[0][0])
            src_start, src_stop = tuple(var.chunks.start[k].tolist()), tuple(var.chunks.stop[k].tolist())
            for i, (lo, hi) in shared_parts(t_starts, t_stops, src_start, src_stop):
                part = as_local_array(held_local["distributed"][name].local)[_local(lo, hi, src_start)]
                if t_ranks[i] == rank:
                    start, _, out = outs[name]
                    copy_into(out[_local(lo, hi, start)], part)
                else:
                    part = part if part.flags.c_contiguous else np.ascontiguousarray(part)
                    sends.append(comm.Isend(byte_view(part), dest=t_ranks[i], tag=_PART_TAG))
        if name in outs:
            start, stop, out = outs[name]
            for k, (lo, hi) in shared_parts(var.chunks.start, var.chunks.stop, start, stop):
                src = int(var.chunks.file[k])
                if src == rank:
                    continue
                sel = _local(lo, hi, start)
                view = out[sel]
                if view.flags.c_contiguous and not is_device_array(view) and view.dtype == var.dtype:
                    buf = view
                else:
                    buf = np.empty(view.shape, dtype=var.dtype)
                    incoming.append((out, sel, buf))
                recvs.append(comm.Irecv(byte_view(buf), source=src, tag=_PART_TAG))
    if sends or recvs:
        from mpi4py import MPI

        MPI.Request.Waitall(recvs + sends)  # everything was checked before: nothing here can fail half-way
    for out, sel, buf in incoming:
        copy_into(out[sel], buf)


def _local(lo, hi, origin) -> tuple:
    """The slices of the global box ``[lo, hi)`` in an array whose first element is at global ``origin``."""
    return tuple(slice(int(a) - int(o), int(b) - int(o)) for a, b, o in zip(lo, hi, origin))
