"""Save with one strategy on N ranks, or load on M ranks and check every element.

argv: ROOT MODE(save|load) STRATEGY SEED [FAIL_RANK].  The data are a function
of the global index, so any decomposition can check what it loaded.  With
FAIL_RANK, that rank's data file writes fail mid-save (an injected OSError).
"""

import sys

import numpy as np
from mpi4py import MPI

import hpcckpt

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size
root, mode, strategy, seed = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
fail_rank = int(sys.argv[5]) if len(sys.argv) > 5 else None
rng = np.random.default_rng(seed)
NY, NX = int(rng.integers(5, 60)), int(rng.integers(1, 9))
g = (np.arange(NY * NX, dtype=np.float64) * 1.5).reshape(NY, NX)
table = np.arange(3 * 40, dtype=np.int32).reshape(40, 3)


def cuts(n, parts, rng):
    inner = np.sort(rng.integers(0, n + 1, parts - 1))
    return np.concatenate([[0], inner, [n]])


if mode == "save":
    rows = cuts(NY, size, np.random.default_rng(seed + 1))
    lo, hi = int(rows[rank]), int(rows[rank + 1])
    trows = cuts(40, size, np.random.default_rng(seed + 2))
    state = {"u": hpcckpt.Block(g[lo:hi].copy(), (lo, 0), (NY, NX)),
             "t": hpcckpt.Ragged(table[trows[rank]:trows[rank + 1]]), "step": 7}
    if fail_rank == rank:
        import hpcckpt.storage.posix as posix

        def broken(*args):
            raise OSError(28, "No space left on device (injected)")
        posix.write_all = broken
        import hpcckpt.transport.file_per_rank as fpr
        fpr.write_all = broken
    try:
        res = hpcckpt.save(state, root, comm=comm, strategy=strategy, chunk_bytes=64, aggregator_buffer=40,
                           max_writers=2, overwrite=True)
    except hpcckpt.CheckpointError as exc:
        print(f"rank {rank} CheckpointError: {exc}", flush=True)
        sys.exit(3)
    if rank == 0:
        print(f"saved {res.strategy} {res.bytes_written}", flush=True)
else:
    cols = cuts(NX, size, np.random.default_rng(seed + 3))
    lo, hi = int(cols[rank]), int(cols[rank + 1])
    u = np.full((NY, hi - lo), -1.0)
    out = hpcckpt.load({"u": hpcckpt.Block(u, (0, lo), (NY, NX)), "t": hpcckpt.Ragged(), "step": None},
                       root, comm=comm)
    assert np.array_equal(u, g[:, lo:hi]), f"rank {rank}: wrong u"
    t_lo, t_hi = rank * 40 // size, (rank + 1) * 40 // size
    assert np.array_equal(out["t"].local, table[t_lo:t_hi]), f"rank {rank}: wrong t"
    assert out["step"] == 7
    strategy_used = hpcckpt.open(root).meta.extra["strategy"]
    if rank == 0:
        print(f"loaded ok from {strategy_used}", flush=True)
