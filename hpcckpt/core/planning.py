"""Save and load plans built from region arithmetic: which rank stores or reads which global box.

Rank 0 gathers one small summary per rank and variable (state.summarize_for_save)
and turns them into a plan: the global box each rank writes, the global shape
and dtype of each variable.  Everything a bad state can get wrong (ranks that
disagree on names, dtypes or shapes; blocks that overlap or leave gaps; Ragged
row requests that do not add up) is found here, with a message naming the
variable.  No MPI and no I/O: tested with hypothesis.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hpcckpt.core.encoding import dtype_from_json
from hpcckpt.errors import TemplateMismatchError
from hpcckpt.core.box_index import covering_problem_indexed, tiling_problem_indexed
from hpcckpt.core.regions import even_rows, overlap_pair, overlapping, owned_parts, shared_regions, volume


@dataclass(frozen=True)
class VariablePlan:
    """A variable as it will be stored: kind, dtype (JSON descriptor) and global shape.

    ``replicated``: a Block declared ``replicated=True`` (copies on several
    ranks; each element written once, by the lowest rank holding it).
    """

    kind: str
    dtype: object
    shape: tuple[int, ...]
    replicated: bool = False

    @property
    def nbytes(self) -> int:
        """Bytes of the whole global array."""
        n = dtype_from_json(self.dtype).itemsize
        for s in self.shape:
            n *= s
        return n


def plan_save(summaries: list[dict[str, dict]]) -> tuple[dict[str, VariablePlan], list[dict[str, tuple]], list]:
    """From per-rank summaries, the stored variables, each rank's global box per variable, and replica parts.

    ``summaries[r][name]`` is rank r's summary.  Returns ``(variables, boxes,
    replicas)`` with ``boxes[r][name] = (start, stop)`` and, for each
    replicated Block, ``replicas[r][name] = (owned, shared)``: the boxes rank
    r writes (:func:`hpcckpt.core.regions.owned_parts`) and the regions whose copy
    it hashes for the equality check (:func:`hpcckpt.core.regions.shared_regions`).
    """
    names = common_names(summaries, "state")
    variables: dict[str, VariablePlan] = {}
    boxes: list[dict[str, tuple]] = [{} for _ in summaries]
    replicas: list[dict[str, tuple]] = [{} for _ in summaries]
    for name in sorted(names):
        per_rank = [s[name] for s in summaries]
        kinds = {p["kind"] for p in per_rank}
        if len(kinds) != 1:
            raise TemplateMismatchError(f"variable {name!r} is a Block on some ranks and Ragged on others")
        if kinds == {"block"}:
            variables[name] = _plan_block(name, per_rank, boxes, replicas)
        else:
            variables[name] = _plan_ragged(name, per_rank, boxes)
    return variables, boxes, replicas


def common_names(summaries: list[dict], what: str) -> set[str]:
    """The names every rank gives; else a TemplateMismatchError naming one name, a rank that has it and one that lacks it."""
    names = set(summaries[0])
    for rank, s in enumerate(summaries):
        if set(s) != names:
            name = sorted(set(s) ^ names)[0]
            has, lacks = (rank, 0) if name in s else (0, rank)
            raise TemplateMismatchError(
                f"the {what} names differ between ranks: {name!r} is given on rank {has} but not on rank {lacks}")
    return names


def _plan_block(name: str, per_rank: list[dict], boxes: list[dict], replicas: list[dict]) -> VariablePlan:
    dtype, shape = per_rank[0]["dtype"], per_rank[0]["shape"]
    replicated = bool(per_rank[0].get("replicated"))
    for rank, p in enumerate(per_rank):
        if p["dtype"] != dtype:
            raise TemplateMismatchError(f"variable {name!r}: dtype differs between rank 0 ({dtype}) and rank {rank} ({p['dtype']})")
        if p["shape"] != shape:
            raise TemplateMismatchError(f"variable {name!r}: global shape differs between rank 0 {shape} and rank {rank} {p['shape']}")
        if bool(p.get("replicated")) != replicated:
            on, off = (0, rank) if replicated else (rank, 0)
            raise TemplateMismatchError(f"variable {name!r} is declared Block(..., replicated=True) on rank {on} but "
                                        f"not on rank {off}: every rank must declare it alike")
    starts = np.asarray([p["start"] for p in per_rank], np.int64).reshape(len(per_rank), len(shape))
    stops = np.asarray([p["stop"] for p in per_rank], np.int64).reshape(len(per_rank), len(shape))
    if replicated:
        problem = covering_problem_indexed(starts, stops, shape, label="the block of rank")
    else:
        problem = tiling_problem_indexed(starts, stops, shape, label="the block of rank")
        pair = overlap_pair(starts, stops) if problem is not None else None
        if pair is not None:
            problem = overlap_text(name, starts, stops, pair)
    if problem is not None:
        raise TemplateMismatchError(f"variable {name!r}: blocks do not tile the global array: {problem}")
    for rank, p in enumerate(per_rank):
        boxes[rank][name] = (tuple(p["start"]), tuple(p["stop"]))
    if replicated:
        owned = owned_parts(starts, stops)
        for rank, shared in enumerate(shared_regions(starts, stops, owned)):
            replicas[rank][name] = (owned[rank], shared)
    return VariablePlan("block", dtype, tuple(shape), replicated)


def overlap_text(name: str, starts: np.ndarray, stops: np.ndarray, pair: tuple[int, int]) -> str:
    """Why two ranks' blocks of an undeclared variable may not overlap, and what to do instead."""
    i, j = pair
    if not starts.shape[1]:
        return (f"{name!r} is a 0-d Block, which is the whole array on every rank that holds one, and rank {i} and "
                f"rank {j} both hold it: declare Block(..., replicated=True) if every rank holds the same value, or "
                "save it as a plain value (hpcckpt.PerRank if it differs per rank)")
    box = lambda r: ", ".join(f"{a}:{b}" for a, b in zip(starts[r].tolist(), stops[r].tolist()))  # noqa: E731
    return (f"the block of rank {i} [{box(i)}] and the block of rank {j} [{box(j)}] overlap, and {name!r} is not declared replicated: "
            "blocks of different ranks must be disjoint, unless every rank declares Block(..., replicated=True) "
            "for copies that are equal (each element is then saved once and the copies are compared)")


def _plan_ragged(name: str, per_rank: list[dict], boxes: list[dict]) -> VariablePlan:
    described = [(r, p) for r, p in enumerate(per_rank) if p["dtype"] is not None]
    if not described:
        raise TemplateMismatchError(f"variable {name!r}: Ragged has no rows on any rank, so its dtype is unknown; "
                                    "pass an empty array of the right dtype instead of None")
    first_rank, first = described[0]
    for rank, p in described:
        if p["dtype"] != first["dtype"] or p["trailing"] != first["trailing"]:
            raise TemplateMismatchError(
                f"variable {name!r}: Ragged rows differ in dtype or trailing shape between rank {first_rank} "
                f"({first['dtype']}, {first['trailing']}) and rank {rank} ({p['dtype']}, {p['trailing']})")
    trailing = tuple(first["trailing"])
    row = 0
    for rank, p in enumerate(per_rank):
        boxes[rank][name] = ((row,) + (0,) * len(trailing), (row + p["rows"],) + trailing)
        row += p["rows"]
    return VariablePlan("ragged", first["dtype"], (row,) + trailing)


def plan_rows(requests: list[int | None], total: int, name: str) -> list[tuple[int, int]]:
    """Row ranges ``[lo, hi)`` each rank loads of a table of ``total`` rows.

    ``requests[r]`` is None for an even split (all ranks must then ask for one)
    or a row count; counts must add up to ``total``.
    """
    n = len(requests)
    if all(r is None for r in requests):
        return [even_rows(total, n, r) for r in range(n)]
    if any(r is None for r in requests):
        raise TemplateMismatchError(f"variable {name!r}: some ranks give Ragged(rows=...) and others do not")
    if any(r < 0 for r in requests):
        raise TemplateMismatchError(f"variable {name!r}: a negative Ragged row count was requested")
    if sum(requests) != total:
        raise TemplateMismatchError(
            f"variable {name!r}: the ranks ask for {sum(requests)} rows in all but the checkpoint holds {total}")
    out, lo = [], 0
    for r in requests:
        out.append((lo, lo + r))
        lo += r
    return out


def plan_shared_reads(chunk_starts: np.ndarray, chunk_stops: np.ndarray,
                      boxes: list[tuple | None]) -> dict[int, tuple[int, list[tuple[int, tuple, tuple]]]]:
    """Which rank reads each chunk that several ranks need, and what each of them gets.

    ``boxes[r]`` is rank r's target box ``(start, stop)`` (None or empty for
    nothing).  Returns ``{chunk: (reader, [(rank, lo, hi), ...])}`` for every
    chunk overlapped by two or more ranks, where ``[lo, hi)`` is the global
    part rank gets.  The reader is the rank with the largest part (lowest rank
    on ties), so each byte is read once and the least data moves.  Chunks that
    one rank alone needs are not listed: that rank reads them itself.
    """
    hits = [(rank, box, overlapping(chunk_starts, chunk_stops, box[0], box[1]))
            for rank, box in enumerate(boxes) if box is not None]
    if not hits:
        return {}
    shared = np.bincount(np.concatenate([k for _, _, k in hits]), minlength=len(chunk_starts)) > 1
    users: dict[int, list[tuple[int, tuple, tuple]]] = {}
    for rank, (start, stop), ks in hits:  # only the chunks several ranks need: the vectorised intersections
        ks = ks[shared[ks]]
        lo = np.maximum(chunk_starts[ks], np.asarray(start, np.int64).reshape(1, -1)).tolist()
        hi = np.minimum(chunk_stops[ks], np.asarray(stop, np.int64).reshape(1, -1)).tolist()
        for k, a, b in zip(ks.tolist(), lo, hi):
            users.setdefault(k, []).append((rank, tuple(a), tuple(b)))
    plan = {}
    for k, parts in users.items():
        if len(parts) > 1:
            sizes = [volume(b - a for a, b in zip(lo, hi)) for _, lo, hi in parts]
            reader = parts[max(range(len(parts)), key=lambda i: (sizes[i], -parts[i][0]))][0]
            plan[k] = (reader, parts)
    return plan
