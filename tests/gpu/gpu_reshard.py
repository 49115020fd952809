"""Save CuPy Blocks on N ranks, load them into CuPy Blocks on M ranks (driven by tests/gpu/test_gpu_state.py).

    mpiexec -n N python gpu_reshard.py save DIR CODEC    rows split over the ranks, small chunks
    mpiexec -n M python gpu_reshard.py load DIR CODEC    columns split: every chunk is cut by the new blocks

Every rank of both runs shares the one GPU.  The global array is a seeded
function of the index, so each rank knows what it must get back; exact for
lossless codecs, within the bound for Lossy.  Prints "OK rank R".
"""

from __future__ import annotations

import sys

import cupy
import numpy as np
from mpi4py import MPI

import hpcckpt
from hpcckpt.codecs import Lossy
from hpcckpt.core.regions import even_rows

SHAPE = (301, 77)
COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()


def global_array() -> np.ndarray:
    i, j = np.indices(SHAPE)
    x = np.sin(i * 0.05) * np.cos(j * 0.1) * 100 + np.random.default_rng(0).normal(scale=1e-3, size=SHAPE)
    x[5, 7] = np.nan
    x[9, 9] = -np.inf
    return x


def codec(name: str):
    return Lossy(rel=1e-4) if name == "lossy" else name


def main() -> int:
    mode, directory, name = sys.argv[1:4]
    g = global_array()
    if mode == "save":
        lo, hi = even_rows(SHAPE[0], SIZE, RANK)
        local = cupy.asarray(g[lo:hi])
        state = {"u": hpcckpt.Block(local, offset=(lo, 0), global_shape=SHAPE, codec=codec(name)), "step": 3}
        hpcckpt.save(state, directory, chunk_bytes=2048)
    else:
        lo, hi = even_rows(SHAPE[1], SIZE, RANK)
        local = cupy.full((SHAPE[0], hi - lo), 7.0)
        out = hpcckpt.load({"u": hpcckpt.Block(local, offset=(0, lo), global_shape=SHAPE), "step": None}, directory)
        assert out["step"] == 3
        got, want = cupy.asnumpy(local), g[:, lo:hi]
        if name == "lossy":
            finite = np.isfinite(want)
            assert np.array_equal(np.isnan(got), np.isnan(want)) and np.array_equal(got[~finite & ~np.isnan(want)],
                                                                                      want[~finite & ~np.isnan(want)])
            assert np.max(np.abs(got[finite] - want[finite])) <= 1e-4 * (np.nanmax(g[np.isfinite(g)]) -
                                                                          np.nanmin(g[np.isfinite(g)]))
        else:
            assert got.tobytes() == want.tobytes(), f"rank {RANK}: data differ"
    print(f"OK rank {RANK}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
