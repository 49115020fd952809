"""Runtime malleability under mpiexec (driven by tests/loading/test_redistribute.py).

    mpiexec -n N python malleable.py mix SEED...     random holder / template subsets of N ranks, exact data
    mpiexec -n 4 python malleable.py shrink ROOT SEED  4 -> 3 in-process, with an incremental Checkpointer
    mpiexec -n 2 python malleable.py grow ROOT SEED    2 -> 4 with MPI.Comm_spawn + Merge, the same checks
    mpiexec -n M python malleable.py check ROOT SEED   the version saved after the resize, loaded on M ranks
    mpiexec -n N python malleable.py bad               bad inputs: the same CheckpointError on every rank
    mpiexec -n N python malleable.py resize-bad ROOT   rank 0 leaving a Checkpointer: an error on every rank

The state of case SEED (a 2-D float64 and a 3-D big-endian int16 Block, a
structured Ragged table, replicated values and a PerRank) is the same on any
rank count; each decomposition (Blocks and Ragged row counts) is drawn from the
seed and the rank count, so data crosses every boundary.  Prints "OK rank R"
on success; any mismatch raises (non-zero exit).
"""

from __future__ import annotations

import os
import sys

import numpy as np
from mpi4py import MPI

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "support"))  # for decompositions.py

import hpcckpt  # noqa: E402
from decompositions import global_array, grid_blocks  # noqa: E402

PARTICLE = np.dtype([("id", "<i8"), ("pos", ">f4", (2,))])


def case(seed: int) -> dict:
    """The global state of case ``seed``."""
    rng = np.random.default_rng([seed, 1])
    rows = int(rng.integers(0, 40))
    table = np.zeros(rows, PARTICLE)
    table["id"] = np.arange(rows) * 5 + seed
    table["pos"] = rng.standard_normal((rows, 2)).astype(">f4")
    shape2 = tuple(int(x) for x in rng.integers(1, 14, size=2))
    shape3 = tuple(int(x) for x in rng.integers(1, 6, size=3))
    return {"u": global_array(shape2, np.float64, seed), "m": global_array(shape3, ">i2", seed + 1), "table": table}


def moved(u):
    """u after the step taken once resized: its first row plus one."""
    u = u.copy()
    u[0] += 1.0
    return u


def row_counts(rng, total: int, n: int) -> list[int]:
    cuts = sorted(int(x) for x in rng.integers(0, total + 1, size=n - 1))
    bounds = [0, *cuts, total]
    return [bounds[i + 1] - bounds[i] for i in range(n)]


def part(g, box):
    return np.ascontiguousarray(g[tuple(slice(a, b) for a, b in zip(*box))])


def layout(seed: int, c: dict, n: int, salt: int) -> dict:
    """Per position 0..n-1 of a decomposition: its boxes of u and m and its table rows."""
    rng = np.random.default_rng([seed, n, salt])
    counts = row_counts(rng, len(c["table"]), n)
    return {"u": grid_blocks(rng, c["u"].shape, n), "m": grid_blocks(rng, c["m"].shape, n),
            "rows": [(sum(counts[:i]), sum(counts[:i + 1])) for i in range(n)]}


def held_state(c: dict, lay: dict, i: int, step: int) -> dict:
    """What position i of a decomposition holds."""
    lo, hi = lay["rows"][i]
    return {"u": hpcckpt.Block(part(c["u"], lay["u"][i]), lay["u"][i][0], c["u"].shape),
            "grid": {"m": hpcckpt.Block(part(c["m"], lay["m"][i]), lay["m"][i][0], c["m"].shape)},
            "table": hpcckpt.Ragged(c["table"][lo:hi].copy() if hi > lo or i % 2 else None),
            "step": step, "meta": {"name": "case", "dt": 0.25}, "mine": hpcckpt.PerRank(i * 10)}


def template(c: dict, lay: dict, i: int, even_rows: bool = False) -> dict:
    """The template of position i of a decomposition (fresh arrays, poisoned; Fortran order for m)."""
    (us, ue), (ms, me) = lay["u"][i], lay["m"][i]
    u = np.full(tuple(b - a for a, b in zip(us, ue)), np.nan)
    m = np.asfortranarray(np.full(tuple(b - a for a, b in zip(ms, me)), -1, ">i2"))
    lo, hi = lay["rows"][i]
    return {"u": hpcckpt.Block(u, us, c["u"].shape), "grid": {"m": hpcckpt.Block(m, ms, c["m"].shape)},
            "table": hpcckpt.Ragged() if even_rows else hpcckpt.Ragged(rows=hi - lo),
            "step": None, "meta": None, "mine": hpcckpt.PerRank(-1, resize=True)}


def check(c: dict, lay: dict, i: int, tmpl: dict, out: dict, nold: int, step: int, even_rows: bool = False) -> None:
    """Exact data at position i of the new decomposition."""
    assert np.array_equal(tmpl["u"].local, part(c["u"], lay["u"][i])), "u differs"
    assert np.array_equal(tmpl["grid"]["m"].local, part(c["m"], lay["m"][i])), "m differs"
    assert out["u"] is tmpl["u"] and out["grid"]["m"] is tmpl["grid"]["m"]
    n = len(lay["u"])
    lo, hi = (i * len(c["table"]) // n, (i + 1) * len(c["table"]) // n) if even_rows else lay["rows"][i]
    assert out["table"].local.tobytes() == c["table"][lo:hi].tobytes(), "table rows differ"
    assert out["table"].local.dtype == PARTICLE
    assert out["step"] == step and out["meta"] == {"name": "case", "dt": 0.25}
    assert out["mine"].value == (i * 10 if i < nold else -1), out["mine"]


def mix(seeds) -> None:
    """Random subsets of the ranks hold (old) and receive (new), overlapping or not, for every seed."""
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    for seed in seeds:
        c = case(seed)
        rng = np.random.default_rng([seed, size, 99])
        old = sorted(rng.choice(size, int(rng.integers(1, size + 1)), replace=False).tolist())
        new = sorted(rng.choice(size, int(rng.integers(1, size + 1)), replace=False).tolist())
        lay_old, lay_new = layout(seed, c, len(old), 1), layout(seed, c, len(new), 2)
        even = bool(seed % 2)
        held = held_state(c, lay_old, old.index(rank), seed) if rank in old else None
        tmpl = template(c, lay_new, new.index(rank), even) if rank in new else None
        cast = seed % 3 == 0  # u into float32 (its values are exact there), as hpcckpt.load(cast=True) would
        if cast and tmpl is not None:
            tmpl["u"].local = tmpl["u"].local.astype(np.float32)
        out = hpcckpt.redistribute(comm, held, tmpl, cast=cast)
        if cast and tmpl is not None:
            assert tmpl["u"].local.dtype == np.float32
        if rank in new:
            check(c, lay_new, new.index(rank), tmpl, out, len(old), seed, even)
        else:
            assert out is None
    print(f"OK rank {rank}", flush=True)


def resized_run(comm, ck, root: str, seed: int, c: dict, lay_new: dict, nold: int, out: dict) -> None:
    """After a resize, on the new ranks: the Checkpointer saves an incremental step 2; it restores exactly here."""
    i = comm.Get_rank()
    block = out["u"]
    if block.offset[0] == 0 and block.local.size:
        block.local[0] += 1.0  # the state moves on after the resize: step 2 differs from step 1 in u's first row
    result = ck.save(out, 2)
    assert result.kind == "incremental" and result.incremental["referenced_bytes"] > 0, result.incremental
    fresh = template(c, lay_new, i)
    back = ck.restore(fresh)
    assert np.array_equal(fresh["u"].local, part(moved(c["u"]), lay_new["u"][i]))
    assert np.array_equal(fresh["grid"]["m"].local, part(c["m"], lay_new["m"][i]))
    assert back["table"].local.tobytes() == out["table"].local.tobytes() and back["step"] == seed
    ck.close()


def first_save(comm, root: str, seed: int, c: dict, lay_old: dict):
    """The old ranks' Checkpointer, its incremental step 1 saved, and what this rank holds."""
    ck = hpcckpt.Checkpointer(root, comm, keep=5, incremental=True, block_bytes=64, full_threshold=0.95, track_failures=False,
                              handle_signals=False)
    held = held_state(c, lay_old, comm.Get_rank(), seed)
    ck.save(held, 1)
    return ck, held


def shrink(root: str, seed: int) -> None:
    """4 -> 3 in-process: rank 3 hands its data over and leaves; the others continue on a communicator of 3."""
    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    assert world.Get_size() == 4
    c = case(seed)
    lay_old, lay_new = layout(seed, c, 4, 1), layout(seed, c, 3, 2)
    ck, held = first_save(world, root, seed, c, lay_old)
    tmpl = template(c, lay_new, rank) if rank < 3 else None
    out = hpcckpt.redistribute(world, held, tmpl)
    new = world.Split(0 if rank < 3 else MPI.UNDEFINED, rank)
    if rank == 3:
        assert out is None and new == MPI.COMM_NULL
        ck.resize(None)
        print(f"OK rank {rank} left", flush=True)
        return
    check(c, lay_new, rank, tmpl, out, 4, seed)
    ck.resize(new)
    resized_run(new, ck, root, seed, c, lay_new, 4, out)
    print(f"OK rank {rank}", flush=True)


def grow(root: str, seed: int) -> None:
    """2 -> 4: the two ranks spawn two more and merge with them; every rank of the 4 then holds a part."""
    parent = MPI.Comm.Get_parent()
    c = case(seed)
    lay_old, lay_new = layout(seed, c, 2, 1), layout(seed, c, 4, 2)
    if parent == MPI.COMM_NULL:  # an original rank
        world = MPI.COMM_WORLD
        assert world.Get_size() == 2
        ck, held = first_save(world, root, seed, c, lay_old)
        inter = world.Spawn(sys.executable, [os.path.abspath(__file__), "grow", root, str(seed)], maxprocs=2, root=0)
        merged = inter.Merge(high=False)  # the originals keep ranks 0 and 1
        ck.resize(merged)
    else:  # a joining rank
        merged = parent.Merge(high=True)
        held = None
        ck = hpcckpt.Checkpointer.join(merged)
    rank = merged.Get_rank()
    tmpl = template(c, lay_new, rank)
    out = hpcckpt.redistribute(merged, held, tmpl)
    check(c, lay_new, rank, tmpl, out, 2, seed)
    resized_run(merged, ck, root, seed, c, lay_new, 2, out)
    print(f"OK rank {rank}", flush=True)
    merged.Barrier()
    if parent != MPI.COMM_NULL:
        parent.Disconnect()
    else:
        inter.Disconnect()


def check_saved(root: str, seed: int) -> None:
    """The step 2 saved after a resize, restored by a fresh Checkpointer on this run's rank count."""
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    c = case(seed)
    lay = layout(seed, c, comm.Get_size(), 3)
    tmpl = template(c, lay, rank, even_rows=True)
    ck = hpcckpt.Checkpointer(root, comm, track_failures=False, handle_signals=False)
    assert ck.latest() == 2 and ck.steps() == [1, 2]
    out = ck.restore(tmpl)
    assert np.array_equal(tmpl["u"].local, part(moved(c["u"]), lay["u"][rank]))
    assert np.array_equal(tmpl["grid"]["m"].local, part(c["m"], lay["m"][rank]))
    n = comm.Get_size()
    lo, hi = rank * len(c["table"]) // n, (rank + 1) * len(c["table"]) // n
    assert out["table"].local.tobytes() == c["table"][lo:hi].tobytes() and out["step"] == seed
    ck.close()
    print(f"OK rank {rank}", flush=True)


def bad() -> None:
    """Each bad input raises a CheckpointError on every rank, and the communicator still works after."""
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    c = case(3)
    lay = layout(3, c, size, 1)
    held = held_state(c, lay, rank, 3)
    biggest = max(range(size), key=lambda r: np.prod([b - a for a, b in zip(*lay["u"][r])]))  # its block left out
    cases = {
        "dtype": lambda: {**template(c, lay, rank), "u": hpcckpt.Block(
            np.zeros(tuple(b - a for a, b in zip(*lay["u"][rank])), np.float32), lay["u"][rank][0], c["u"].shape)},
        "gap": lambda: {**template(c, lay, rank), "u": hpcckpt.Block(np.zeros((0, 0)), (0, 0), c["u"].shape)}
        if rank == biggest else template(c, lay, rank),
        "rows": lambda: {**template(c, lay, rank), "table": hpcckpt.Ragged(rows=len(c["table"]) + 1)},
        "missing": lambda: {**template(c, lay, rank), "extra": hpcckpt.Block(np.zeros(2))},
    }
    for what, make in cases.items():
        try:
            hpcckpt.redistribute(comm, held, make())
        except hpcckpt.CheckpointError as exc:
            assert comm.allreduce(1) == size, what
            print(f"rank {rank} {what}: {exc}", flush=True)
        else:
            raise AssertionError(f"{what}: no error")
    values = dict(held, step=rank)  # replicated values that differ between holders
    try:
        hpcckpt.redistribute(comm, values, template(c, lay, rank))
    except hpcckpt.CheckpointError as exc:
        assert size == 1 or "replicated" in str(exc), exc
        assert size > 1
    else:
        assert size == 1
    for held_, tmpl_ in ((None, template(c, lay, rank)), (held, None)):
        try:
            hpcckpt.redistribute(comm, held_, tmpl_)
        except hpcckpt.CheckpointError:
            pass
        else:
            raise AssertionError("no holder / no template: no error")
    out = hpcckpt.redistribute(comm, held, template(c, lay, rank))  # and a good one still works afterwards
    assert out["step"] == 3
    print(f"OK rank {rank}", flush=True)


def resize_bad(root: str) -> None:
    """Rank 0 leaving a resized Checkpointer: a CheckpointError there and on every rank of the new communicator."""
    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    ck = hpcckpt.Checkpointer(root, world, track_failures=False, handle_signals=False)
    new = world.Split(0 if rank > 0 else MPI.UNDEFINED, rank)
    try:
        ck.resize(None if rank == 0 else new)
    except hpcckpt.CheckpointError as exc:
        assert "rank 0" in str(exc), exc
    else:
        raise AssertionError("rank 0 left without an error")
    ck.close()  # the failed resize changed nothing: the Checkpointer still works on the old communicator
    print(f"OK rank {rank}", flush=True)


if __name__ == "__main__":
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "mix":
        mix([int(s) for s in args])
    elif mode == "shrink":
        shrink(args[0], int(args[1]))
    elif mode == "grow":
        grow(args[0], int(args[1]))
    elif mode == "check":
        check_saved(args[0], int(args[1]))
    elif mode == "resize-bad":
        resize_bad(args[0])
    elif mode == "bad":
        bad()
    else:
        raise SystemExit(f"unknown mode {mode!r}")
