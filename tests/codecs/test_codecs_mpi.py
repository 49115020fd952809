"""Every codec round-trips through save/load with resharding on 1 to 4 ranks (mpiexec runs).

Run as a script under mpiexec by the tests below: ``save N`` writes a state
with one variable per codec from an uneven N-rank decomposition; ``load``
reads it back on another number of ranks and another decomposition, and
checks every element (exact for lossless codecs, within the bound for lossy).
"""

from __future__ import annotations

import importlib.util
import sys

import numpy as np

SHAPE = (37, 23)
SPECS = {"none": "none", "lz4": "lz4", "zstd": "zstd", "shz": "shuffle+zstd", "auto": "auto",
         "abs": ("abs", 1e-3), "rel": ("rel", 1e-4)}
if importlib.util.find_spec("blosc2") is not None:  # the blosc2 family (hpcckpt/codecs/blosc2_codec.py)
    SPECS.update({"b2": "blosc2", "b2lz4": "blosc2-lz4"})


def field(seed):
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:SHAPE[0], 0:SHAPE[1]]
    return np.sin(x / 5.0) * np.cos(y / 7.0) * 100 + rng.normal(scale=1e-3, size=SHAPE)


def main(mode, path, seed):
    from mpi4py import MPI

    import hpcckpt
    from hpcckpt.codecs import Lossy
    from decompositions import grid_blocks

    comm = MPI.COMM_WORLD
    rng = np.random.default_rng(seed)
    state, expect = {}, {}
    for i, (name, spec) in enumerate(sorted(SPECS.items())):
        full = field(i)
        start, stop = grid_blocks(rng, SHAPE, comm.size)[comm.rank]
        sel = tuple(slice(a, b) for a, b in zip(start, stop))
        codec = Lossy(**{spec[0]: spec[1]}) if isinstance(spec, tuple) else spec
        local = full[sel].copy() if mode == "save" else np.zeros(full[sel].shape)
        state[name] = hpcckpt.Block(local, offset=start, global_shape=SHAPE, codec=codec)
        expect[name] = (full[sel], spec)
    rows = np.arange(3 * 101, dtype=np.int64).reshape(101, 3)
    lo, hi = (comm.rank * 101) // comm.size, ((comm.rank + 1) * 101) // comm.size
    state["rows"] = hpcckpt.Ragged(rows[lo:hi] if mode == "save" else None, codec="lz4")
    if mode == "save":
        hpcckpt.save(state, path, comm, chunk_bytes=512)
        return
    out = hpcckpt.load(state, path, comm)
    for name, (want, spec) in expect.items():
        got = state[name].local
        if isinstance(spec, tuple):
            full = field(sorted(SPECS).index(name))
            bound = spec[1] if spec[0] == "abs" else spec[1] * (full.max() - full.min())
            assert np.abs(got - want).max(initial=0) <= bound, name
        else:
            assert np.array_equal(got, want), name
    got_rows = comm.allgather(out["rows"].local)
    assert np.array_equal(np.concatenate(got_rows), rows)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
else:
    import pytest

    from mpitools import run_mpi

    @pytest.mark.parametrize("save_n,load_n", [(3, 2), (1, 4), (4, 1)])
    def test_codecs_reshard_round_trip(tmp_path, save_n, load_n):
        pytest.importorskip("numcodecs")
        path = str(tmp_path / "ckpt")
        run_mpi(save_n, __file__, "save", path, save_n)
        run_mpi(load_n, __file__, "load", path, 100 + load_n)
