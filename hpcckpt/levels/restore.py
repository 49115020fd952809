"""Restore from the fastest level that holds a whole version, rebuilding lost files first.

For each committed version, newest first:

0. the persistent-memory tier (PM), when configured: if every rank's image
   holds the version (written by as many ranks), each rank's own data file is
   read from the mapped image, the rest as from L1 (fetched from other nodes
   where this node lacks them); a node directory that lost the version gets
   its files back from the map.
1. node-local (L1): every rank lists what its node directory holds; if every
   data file is at its owner's node, load straight from there (L1).  A file
   missing at its owner but present on another node (a partner copy) is sent
   over (L2).  A file present nowhere is rebuilt from XOR parity when it is the
   only loss of its parity group (L3), or else from Reed-Solomon parity when
   no stripe of its group lost more than m shards, counting the shards found
   damaged by their checksums (RS).  Then the ordinary collective load reads
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
import warnings

from hpcckpt.root.catalog import list_versions
from hpcckpt.mpi.collective import agree, allgather_checked, bcast_checked, best_effort
from hpcckpt.storage.commit import commit_version
from hpcckpt.errors import CheckpointError, TemplateMismatchError
from hpcckpt.loading.load import load_version
from hpcckpt.format.metadata import Metadata, parse
from hpcckpt.core.names import METADATA_FILE, parity_file, parse_version_name, rank_file, split_reference
from hpcckpt.storage.metadata_file import read_metadata_bytes
from hpcckpt.storage import POSIX
from hpcckpt.storage.posix import atomic_write
from hpcckpt.levels.fetch import expected_sizes, fetcher, inventory
from hpcckpt.levels.partner import transfer
from hpcckpt.levels.pmem import PmemStorage


def plan_rebuild(meta: Metadata, inv: list[dict[str, int]], size: int):
    """(plan, None) or (None, why): the moves (L2) and parity rebuilds (L3, or RS) that make every file local.

    An RS plan names the lost ranks (``"rs"``); whether their groups can be
    rebuilt is known only once the survivors checked their shards (rs.restore).
    """
    levels = meta.extra.get("levels") if isinstance(meta.extra, dict) else None
    if meta.nranks != size or not isinstance(levels, dict):
        return {"level": "L1", "moves": [], "rebuild": []}, None  # the load fetches what each rank reads
    ends = expected_sizes(meta)
    sizes = levels.get("sizes") or [0] * size
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
        return {"level": "L2" if moves else "L1", "moves": moves, "rebuild": []}, None
    parity = levels.get("parity")
    if parity:
        rebuild, why = _xor_plan(parity, lost, inv, sizes, moves)
        if rebuild is not None:
            return {"level": "L3", "moves": moves, "rebuild": rebuild}, None
    if levels.get("rs"):
        return {"level": "RS", "moves": moves, "rebuild": [], "rs": lost}, None
    if parity:
        return None, why
    return None, (f"the files of rank(s) {lost} are on no surviving node and this version has no "
                  f"{'parity' if levels.get('partner') else 'partner copy or parity'}")


def _xor_plan(parity: dict, lost: list[int], inv: list[dict[str, int]], sizes: list, moves: list):
    """(XOR rebuilds, None) or (None, why) for the ``lost`` ranks."""
    rebuild = []
    for gi, group in enumerate(parity["groups"]):
        gone = [o for o in lost if o in group]
        if not gone:
            continue
        if len(gone) > 1:
            return None, (f"rank(s) {gone} of parity group {group} are lost together: XOR parity rebuilds at most "
                          "one member per group")
        x, seg = gone[0], int(parity["segment"][gi])
        for j in group:
            if j == x:
                continue
            has_data = int(sizes[j]) == 0 or inv[j].get(rank_file(j)) == int(sizes[j]) or any(
                m[1] == j for m in moves)
            if not has_data or (seg and inv[j].get(parity_file(j)) != seg):
                return None, (f"rank {x} of parity group {group} is lost and rank {j}'s "
                              f"{'data' if not has_data else 'parity'} is missing too")
        rebuild.append((gi, list(group), x, seg, int(sizes[x])))
    ungrouped = [o for o in lost if not any(o in g for g in parity["groups"])]
    if ungrouped:
        return None, f"rank(s) {ungrouped} are lost and belong to no parity group"
    return rebuild, None


def _order(name: str):
    return parse_version_name(name)


def restore_levels(engine, state, step, strict, cast=False):
    comm, rank = engine.comm, engine.rank
    ckpt, node = engine.ckpt, engine.node
    local_sets = [set(ns) for ns in allgather_checked(comm, f"listing {node.node_dir!r}", lambda: [
        e.name for e in list_versions(node.node_dir) if e.committed])]
    local_any = set().union(*local_sets)
    root_names = bcast_checked(comm, f"listing {ckpt.root!r}", lambda: [
        e.name for e in list_versions(ckpt.root) if e.committed])
    names = sorted(local_any | set(root_names), key=_order, reverse=True)
    if step is not None:
        names = [n for n in names if _order(n)[0] == step]
        if not names:
            raise CheckpointError(f"no committed version of step {step} under {ckpt.root!r} or {node.levels.local_dir!r}")
    if not names:
        raise CheckpointError(f"no committed checkpoint under {ckpt.root!r} or {node.levels.local_dir!r}")
    reasons = []
    for name in names:
        if node.pmem is not None and (name in local_sets[0] or name in root_names):
            out, why = _try_pmem(engine, state, name, local_sets, root_names, strict, cast)
            if why is None:
                _report(rank, name, "PM", reasons)
                ckpt.last_restored = ckpt.chain_base = node.path(name)
                engine.restored_level = "PM"
                return out
            reasons.append(f"{name} cannot be restored from the persistent-memory tier: {why}")
        if name in local_any:
            out, level, why = _try_local(engine, state, name, local_sets, strict, cast)
            if why is None:
                _report(rank, name, level, reasons)
                ckpt.last_restored = ckpt.chain_base = node.path(name)
                engine.restored_level = level
                return out
            reasons.append(f"{name} cannot be restored from the node-local levels: {why}")
        if name in root_names:
            path = os.path.join(ckpt.root, name)
            try:
                out = load_version(state, path, comm, strict=strict, expect_step=_order(name)[0], cast=cast)
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
        warnings.warn(f"hpcckpt: restoring {name} from {where}; " + "; ".join(reasons), stacklevel=4)


def _try_pmem(engine, state, name: str, local_sets, root_names, strict, cast=False):
    """(restored state, None) or (None, why); collective.  Rank 0 reads the metadata from its node directory
    (else from the root, where every file is).  Before the load, ranks whose node directory lost their file
    write it from the map (removed again if the load fails), so that the files other ranks read can be fetched
    from their node (levels/fetch.py)."""
    comm, rank, node = engine.comm, engine.rank, engine.node
    what = f"restore of {name} from the persistent-memory tier"
    vdir = node.path(name)
    directory = vdir if name in local_sets[0] else os.path.join(engine.ckpt.root, name)

    def held():
        try:
            return node.pmem.holding(name) is not None
        except OSError:
            return False

    missing = [r for r, h in enumerate(comm.allgather(held())) if not h]
    if missing:
        return None, (f"rank(s) {missing} hold no image of it (a tier gone, another rank count, or an older "
                      "version)")
    own = os.path.join(directory, rank_file(rank))
    opened = node.pmem.open_version(name)  # None if rewritten since: this rank then reads its L1 file
    storage = PmemStorage(own, *opened) if opened is not None else POSIX
    refilled = os.path.join(vdir, rank_file(rank))

    def refill():
        if opened is not None and opened[1]["length"] and not os.path.isfile(refilled):
            os.makedirs(os.path.dirname(refilled), exist_ok=True)
            atomic_write(refilled, storage.mapped_bytes())
            return True
        return False

    wrote = False
    try:
        wrote = agree(comm, what + " (node-local files from the map)", refill)
        out = load_version(state, directory, comm, strict=strict, expect_step=_order(name)[0], storage=storage,
                           cast=cast, before_reads=fetcher(comm, vdir, node.layout.node_of, what)
                           if directory == vdir else None)
        raw = comm.bcast(agree(comm, what, lambda: read_metadata_bytes(directory) if rank == 0 else None), root=0)
        agree(comm, what, lambda: node.leader and name not in local_sets[rank] and commit_version(vdir, raw))
    except CheckpointError as exc:
        if wrote:  # unverified bytes: not left for the node-local levels to trust
            best_effort(f"removing {refilled!r}", lambda: os.unlink(refilled))
        if isinstance(exc, TemplateMismatchError):
            raise
        return None, str(exc)
    finally:
        if opened is not None:
            storage.close()
    return out, None


def _try_local(engine, state, name: str, local_sets, strict, cast=False):
    """(restored state, level, None) or (None, None, why); collective."""
    from mpi4py import MPI

    from hpcckpt.levels import parity, rs

    comm, rank = engine.comm, engine.rank
    what = f"restore of {name} from the node-local levels"
    vdir = engine.node.path(name)
    src = next(r for r, s in enumerate(local_sets) if name in s)

    try:
        raw = comm.bcast(agree(comm, what, lambda: read_metadata_bytes(vdir) if rank == src else None), root=src)
        meta = agree(comm, what, lambda: parse(raw, source=os.path.join(vdir, METADATA_FILE)))
    except CheckpointError as exc:
        return None, None, str(exc)
    inv = comm.allgather(inventory(vdir, [f for f in meta.files if split_reference(f) is not None]))
    plan, why = plan_rebuild(meta, inv, comm.Get_size())
    if why is not None:
        return None, None, why
    try:
        if plan["moves"]:
            agree(comm, what + " (partner copies)", lambda: transfer(comm, plan["moves"], vdir, vdir))
        if plan.get("rs"):
            inv = comm.allgather(inventory(vdir))  # with the partner copies just moved in
            rs.restore(comm, meta.extra["levels"]["rs"], meta.extra["levels"]["sizes"], inv, plan["rs"], vdir, what)
        if plan["rebuild"]:
            mine = next((r for r in plan["rebuild"] if rank in r[1]), None)
            gcomm = comm.Split(MPI.UNDEFINED if mine is None else mine[0],
                               0 if mine is None else mine[1].index(rank))
            try:
                def rebuild():
                    if mine is None:
                        return
                    _, group, x, seg, lost_size = mine
                    sizes = meta.extra["levels"]["sizes"]
                    parity.rebuild(gcomm, group.index(x), os.path.join(vdir, rank_file(rank)), int(sizes[rank]),
                                   os.path.join(vdir, parity_file(rank)), seg, lost_size,
                                   os.path.join(vdir, rank_file(x)))
                agree(comm, what + " (XOR parity)", rebuild)
            finally:
                if gcomm != MPI.COMM_NULL:
                    gcomm.Free()
        agree(comm, what, lambda: engine.node.leader and name not in local_sets[rank] and (
            os.makedirs(vdir, exist_ok=True), commit_version(vdir, raw)))
        out = load_version(state, vdir, comm, strict=strict, expect_step=_order(name)[0], cast=cast,
                           before_reads=fetcher(comm, vdir, engine.node.layout.node_of, what))
    except TemplateMismatchError:
        raise
    except CheckpointError as exc:
        return None, None, str(exc)
    return out, plan["level"], None
