"""Restore from the fastest level that holds a whole version, rebuilding lost files first.

For each committed version, newest first (the restore halves of the
registered levels, levels/base.py, in the registry's order):

0. a level that holds whole versions itself (``Level.serves``; built in: the
   persistent-memory tier PM, when configured: if every rank's image holds
   the version, each rank's own data file is read from the mapped image, the
   rest as from L1).
1. node-local (L1): every rank lists what its node directory holds; if every
   data file is at its owner's node, load straight from there (L1).  A file
   missing at its owner but present on another node (a partner copy) is sent
   over (L2).  Files present nowhere are rebuilt by the first level whose
   description the version records and whose ``plan_rebuild`` can (built
   in: XOR parity, L3, when each is the only loss of its parity group; else
   Reed-Solomon parity, RS, when no stripe of its group lost more than m
   shards, counting the shards found damaged by their checksums).  Then the
   ordinary collective load reads
   each rank's node directory, once the data files its ranks read and it
   lacks were fetched from the nodes that hold them (levels/fetch.py: a
   Ragged table split otherwise than saved, a Block on another
   decomposition, another rank count).
2. the shared root (L4), the same version, when it was flushed there.

A version that cannot be rebuilt (say, two lost nodes in one XOR parity group) is
skipped with a warning that names the lost ranks and the group; the search goes
on to the root and to older versions.  When the rank count changed, the
rebuild is skipped and the files each rank reads are fetched from whichever
node of the run holds them; a version with a file on no node of the run is
skipped (to the root, or older versions) with a warning that names it.
"""

from __future__ import annotations

import os

from hpcckpt.core.warn import warn
from hpcckpt.root.catalog import list_versions
from hpcckpt.mpi.collective import agree, allgather_checked, bcast_checked
from hpcckpt.storage.commit import commit_version
from hpcckpt.errors import CheckpointError, TemplateMismatchError
from hpcckpt.loading.load import load_version
from hpcckpt.format.metadata import Metadata, parse
from hpcckpt.core.names import METADATA_FILE, parse_version_name, rank_file, split_reference
from hpcckpt.storage.metadata_file import read_metadata_bytes
from hpcckpt.levels.base import Attempt, Level, Lost
from hpcckpt.levels.fetch import expected_sizes, fetcher, inventory
from hpcckpt.levels.partner import PartnerLevel, transfer


def plan_rebuild(meta: Metadata, inv: list[dict[str, int]], size: int, levels: tuple[Level, ...]):
    """(plan, None) or (None, why): the moves (a file missing at its owner taken from a node that holds it) and
    the rebuild (by the first of ``levels`` whose description the version records that can) that make every
    file local.  Pure: the same answer on every rank.

    A plan is ``{"level": label, "moves": [(from, to, name, size)...], "rebuild": None or (Level, its plan)}``.
    """
    described = meta.extra.get("levels") if isinstance(meta.extra, dict) else None
    if meta.nranks != size or not isinstance(described, dict):
        return {"level": "L1", "moves": [], "rebuild": None}, None  # the load fetches what each rank reads
    ends = expected_sizes(meta)
    sizes = described.get("sizes") or [0] * size
    owners = {rank_file(o): o for o in range(size)}
    moves, lost = [], []
    for name, end in sorted(ends.items()):
        ref = split_reference(name)
        o = owners.get(ref[1] if ref is not None else name)
        if o is None:
            return None, f"{name} is not a file-per-rank file of this layout"
        if ref is not None:  # an older version's file: used where it is, never moved or rebuilt
            if inv[o].get(name, -1) < end:
                return None, (f"{name} (an older version's data this incremental version uses) is not on rank "
                              f"{o}'s node: node-local rebuilds cover a version's own files only")
            continue
        n = max(end, int(sizes[o]))
        if inv[o].get(name) == n:
            continue
        holders = [r for r in range(size) if inv[r].get(name) == n]
        if holders:
            moves.append((holders[0], o, name, n))
        else:
            lost.append(o)
    if not lost:
        return {"level": PartnerLevel.label if moves else "L1", "moves": moves, "rebuild": None}, None
    whys = []
    for level in levels:
        if described.get(level.key):
            plan, why = level.plan_rebuild(described[level.key], Lost(lost, inv, sizes, moves))
            if plan is not None:
                return {"level": level.label, "moves": moves, "rebuild": (level, plan)}, None
            if why is not None:
                whys.append(why)
    if whys:
        return None, whys[0]
    return None, f"the files of rank(s) {lost} are on no surviving node and no level of this version rebuilds them"


def _order(name: str):
    return parse_version_name(name)


def restore_levels(engine, state, step, strict, cast=False):
    comm, rank = engine.comm, engine.rank
    ckpt, node = engine.ckpt, engine.node
    local_sets = [set(ns) for ns in allgather_checked(comm, f"listing {node.node_dir!r}", lambda: [
        e.name for e in list_versions(node.node_dir, node.storage) if e.committed])]
    local_any = set().union(*local_sets)
    root_names = bcast_checked(comm, f"listing {ckpt.root!r}", lambda: [
        e.name for e in list_versions(ckpt.root, node.root_storage) if e.committed])
    names = sorted(local_any | set(root_names), key=_order, reverse=True)
    local_dir = node.options.local_dir
    if step is not None:
        names = [n for n in names if _order(n)[0] == step]
        if not names:
            raise CheckpointError(f"no committed version of step {step} under {ckpt.root!r} or {local_dir!r}")
    if not names:
        raise CheckpointError(f"no committed checkpoint under {ckpt.root!r} or {local_dir!r}")
    reasons = []
    for name in names:
        attempt = Attempt(state, name, local_sets, root_names, strict, cast, node, ckpt.root)
        for level in node.all_levels:
            if level.serves(attempt):
                out, why = level.load(attempt)
                if why is None:
                    _report(rank, name, level.label, reasons)
                    ckpt.last_restored = ckpt.chain_base = node.path(name)
                    engine.restored_level = level.label
                    return out
                reasons.append(f"{name} cannot be restored from {level.title}: {why}")
        if name in local_any:
            out, level, why = _try_local(engine, attempt)
            if why is None:
                _report(rank, name, level, reasons)
                ckpt.last_restored = ckpt.chain_base = node.path(name)
                engine.restored_level = level
                return out
            reasons.append(f"{name} cannot be restored from the node-local levels: {why}")
        if name in root_names:
            path = os.path.join(ckpt.root, name)
            try:
                out = load_version(state, path, comm, strict=strict, expect_step=_order(name)[0], cast=cast,
                                   storage=node.root_storage)
            except TemplateMismatchError:
                raise
            except CheckpointError as exc:  # agreed: every rank goes on to the next version alike
                reasons.append(f"{name} on the shared root cannot be read: {exc}")
                continue
            _report(rank, name, "L4", reasons)
            ckpt.last_restored = ckpt.chain_base = path
            engine.restored_level = "L4"
            return out
    raise CheckpointError("no restorable checkpoint: " + "; ".join(reasons))


def _report(rank: int, name: str, level: str, reasons: list[str]) -> None:
    if rank == 0 and reasons:
        where = "the shared root (L4)" if level == "L4" else f"the node-local levels ({level})"
        warn(f"hpcckpt: restoring {name} from {where}; " + "; ".join(reasons))


def _try_local(engine, attempt: Attempt):
    """(restored state, level, None) or (None, None, why); collective."""
    comm, rank, node, name = engine.comm, engine.rank, engine.node, attempt.name
    storage = node.storage
    what = f"restore of {name} from the node-local levels"
    vdir = node.path(name)
    src = next(r for r, s in enumerate(attempt.local_sets) if name in s)

    try:
        raw = bcast_checked(comm, what, lambda: read_metadata_bytes(vdir, storage), root=src)
        meta = agree(comm, what, lambda: parse(raw, source=os.path.join(vdir, METADATA_FILE)))
        inv = allgather_checked(comm, what, lambda: inventory(storage, vdir, [f for f in meta.files
                                                                              if split_reference(f) is not None]))
    except CheckpointError as exc:
        return None, None, str(exc)
    plan, why = plan_rebuild(meta, inv, comm.Get_size(), node.all_levels)
    if why is not None:
        return None, None, why
    try:
        if plan["moves"]:
            agree(comm, what + " (partner copies)", lambda: transfer(storage, comm, plan["moves"], vdir, vdir))
        if plan["rebuild"] is not None:
            level, steps = plan["rebuild"]
            described = meta.extra["levels"]
            level.rebuild(comm, described[level.key], steps, vdir, described["sizes"], what)
        agree(comm, what, lambda: node.leader and name not in attempt.local_sets[rank] and (
            storage.make_directories(vdir), commit_version(vdir, raw, storage=storage)))
        out = load_version(attempt.state, vdir, comm, strict=attempt.strict, expect_step=_order(name)[0],
                           storage=storage, cast=attempt.cast,
                           before_reads=fetcher(storage, comm, vdir, node.layout.node_of, what))
    except TemplateMismatchError:
        raise
    except CheckpointError as exc:
        return None, None, str(exc)
    return out, plan["level"], None
