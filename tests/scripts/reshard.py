"""Save or load random uneven N-d decompositions under mpiexec (driven by tests/loading/test_reshard.py).

    mpiexec -n N python reshard.py save ROOT SEED...     writes ROOT/n<N>/case<SEED>
    mpiexec -n M python reshard.py load ROOT N1,N2.. SEED...   loads every ROOT/n<Ni>/case<SEED>, checks exact data

Every rank derives the same case (shape, decomposition, data) from the seed
with numpy's seeded RNG; the save decomposition depends on N, the load one on
M, so what is read crosses every boundary.  Prints "OK rank R checked K" on
success; any mismatch raises (non-zero exit).
"""

from __future__ import annotations

import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "support"))  # for decompositions.py

from decompositions import global_array, grid_blocks  # noqa: E402

STRATEGIES = ["auto", "file-per-rank", "aggregated", "shared-file"]
PARTICLE = np.dtype([("id", "<i8"), ("pos", ">f4", (2,))])


def case(seed: int):
    """Shape, dtypes and data of case ``seed`` (independent of the rank count)."""
    rng = np.random.default_rng([seed, 0])
    ndim = 2 + seed % 2  # 2-D and 3-D cases
    shape = tuple(int(x) for x in rng.integers(1, 9, size=ndim))
    total_rows = int(rng.integers(0, 30))
    table = np.zeros(total_rows, PARTICLE)
    table["id"] = np.arange(total_rows) * 3 + seed
    table["pos"] = rng.standard_normal((total_rows, 2)).astype(">f4")
    return {"shape": shape, "u": global_array(shape, np.float64, seed), "m": global_array(shape, ">i2", seed + 1),
            "table": table, "chunk_bytes": int(rng.integers(8, 200)), "strategy": STRATEGIES[seed % len(STRATEGIES)]}


def row_counts(rng, total: int, n: int) -> list[int]:
    cuts = sorted(int(x) for x in rng.integers(0, total + 1, size=n - 1))
    bounds = [0, *cuts, total]
    return [bounds[i + 1] - bounds[i] for i in range(n)]


def part(g, box):
    return np.ascontiguousarray(g[tuple(slice(a, b) for a, b in zip(*box))])


def save(comm, root: str, seed: int) -> None:
    import hpcckpt

    c = case(seed)
    n, r = comm.Get_size(), comm.Get_rank()
    rng = np.random.default_rng([seed, 1, n])
    boxes_u, boxes_m = grid_blocks(rng, c["shape"], n), grid_blocks(rng, c["shape"], n)
    counts = row_counts(rng, len(c["table"]), n)
    lo = sum(counts[:r])
    u_local = part(c["u"], boxes_u[r])
    m_local = np.asfortranarray(part(c["m"], boxes_m[r]))  # Fortran order on save
    state = {"u": hpcckpt.Block(u_local, boxes_u[r][0], c["shape"]),
             "m": hpcckpt.Block(m_local, boxes_m[r][0], c["shape"]),
             "table": hpcckpt.Ragged(c["table"][lo:lo + counts[r]]),
             "seed": seed, "shape": list(c["shape"])}
    path = os.path.join(root, f"n{n}", f"case{seed}")
    hpcckpt.save(state, path, comm=comm, chunk_bytes=c["chunk_bytes"], strategy=c["strategy"])


def load(comm, root: str, saved_n: int, seed: int) -> None:
    import hpcckpt

    c = case(seed)
    m, r = comm.Get_size(), comm.Get_rank()
    rng = np.random.default_rng([seed, 2, m, saved_n])
    boxes_u, boxes_m = grid_blocks(rng, c["shape"], m), grid_blocks(rng, c["shape"], m)
    counts = row_counts(rng, len(c["table"]), m)
    (su, eu), (sm, em) = boxes_u[r], boxes_m[r]
    u = np.full(np.subtract(eu, su), np.nan)
    big = np.zeros(tuple(2 * x + 1 for x in np.subtract(em, sm)), ">i2")
    mm = big[tuple(slice(0, 2 * x, 2) for x in np.subtract(em, sm))]  # a strided target
    template = {"u": hpcckpt.Block(u, su, c["shape"]), "m": hpcckpt.Block(mm, sm, c["shape"]),
                "table": hpcckpt.Ragged(rows=counts[r]), "seed": None, "shape": None}
    path = os.path.join(root, f"n{saved_n}", f"case{seed}")
    got = hpcckpt.load(template, path, comm=comm)
    where = f"{saved_n}->{m} ranks, case {seed}, rank {r}"
    assert np.array_equal(u, part(c["u"], boxes_u[r])), where
    assert mm.dtype == np.dtype(">i2") and np.array_equal(mm, part(c["m"], boxes_m[r])), where
    assert np.count_nonzero(big) == np.count_nonzero(mm), where  # nothing outside the strided view
    lo = sum(counts[:r])
    assert got["table"].local.dtype == PARTICLE, where
    assert got["table"].local.tobytes() == c["table"][lo:lo + counts[r]].tobytes(), where
    assert got["seed"] == seed and got["shape"] == list(c["shape"]), where
    # and the even split
    got = hpcckpt.load({**template, "table": hpcckpt.Ragged()}, path, comm=comm)
    t = len(c["table"])
    assert got["table"].local.tobytes() == c["table"][r * t // m:(r + 1) * t // m].tobytes(), where


def main(argv) -> int:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    mode, root = argv[1], argv[2]
    checked = 0
    if mode == "save":
        for seed in map(int, argv[3:]):
            save(comm, root, seed)
            checked += 1
    else:
        for saved_n in map(int, argv[3].split(",")):
            for seed in map(int, argv[4:]):
                load(comm, root, saved_n, seed)
                checked += 1
    print(f"OK rank {comm.Get_rank()} {mode} {checked}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
