"""SZ3, ZFP and AutoLossy round-trip through save/load with resharding on 1 to 4 ranks, and hpcckpt.open reads them.

Run as a script under mpiexec by the tests below (as test_codecs_mpi.py): ``save N`` writes one 3-D
variable per spec from an uneven N-rank decomposition, ``load`` reads it back on another number of
ranks and checks every element against the spec's bound (bit for bit for NaN, Inf and reversible).
"""

from __future__ import annotations

import sys

import numpy as np

SHAPE = (19, 23, 17)
SPECS = {"sz3_abs": ("SZ3", "abs", 1e-3), "sz3_rel": ("SZ3", "rel", 1e-4), "sz3_pw": ("SZ3", "pw_rel", 1e-3),
         "zfp_acc": ("ZFP", "accuracy", 1e-3), "zfp_rev": ("ZFP", "reversible", True),
         "zfp_rate": ("ZFP", "rate", 16), "auto_abs": ("AutoLossy", "abs", 1e-3), "auto_rel": ("AutoLossy", "rel", 1e-4)}
#: What AutoLossy may store (rank 0's choice, recorded once in the metadata: every rank used it).
CHOSEN = {"hpcckpt.quantize", "hpcckpt.sz3", "hpcckpt.zfp"}


def field(seed):
    rng = np.random.default_rng(seed)
    z, y, x = np.mgrid[0:SHAPE[0], 0:SHAPE[1], 0:SHAPE[2]]
    f = np.sin(x / 5.0) * np.cos(y / 7.0) * 100 + z + rng.normal(scale=1e-3, size=SHAPE)
    f[3, 4, 5], f[7, 8, 9], f[1, 2, 3] = np.nan, -np.inf, -0.0
    return f


def spec_of(family, mode, value):
    from hpcckpt import codecs
    return getattr(codecs, family)(**{mode: value})


def check(name, want, got):
    _, mode, value = SPECS[name]
    fin = np.isfinite(want)
    assert want[~fin].tobytes() == got[~fin].tobytes(), name
    err = np.abs(want[fin] - got[fin])
    if mode == "reversible":
        assert want.tobytes() == got.tobytes(), name
    elif mode == "abs" or mode == "accuracy":
        assert err.max(initial=0) <= value, name
    elif mode == "pw_rel":
        assert np.all(err <= value * np.abs(want[fin])), name
    elif mode == "rel":  # per chunk range <= the whole range
        full = field(sorted(SPECS).index(name))
        assert err.max(initial=0) <= value * (np.nanmax(full[np.isfinite(full)]) - np.min(full[np.isfinite(full)]))
    else:
        assert np.all(np.isfinite(got[fin])), name


def main(mode, path, seed):
    from mpi4py import MPI

    import hpcckpt
    from decompositions import grid_blocks

    comm = MPI.COMM_WORLD
    rng = np.random.default_rng(seed)
    state, expect = {}, {}
    for i, (name, spec) in enumerate(sorted(SPECS.items())):
        full = field(i)
        start, stop = grid_blocks(rng, SHAPE, comm.size)[comm.rank]
        sel = tuple(slice(a, b) for a, b in zip(start, stop))
        local = full[sel].copy() if mode == "save" else np.zeros(full[sel].shape)
        state[name] = hpcckpt.Block(local, offset=start, global_shape=SHAPE, codec=spec_of(*spec))
        expect[name] = full[sel]
    if mode == "save":
        from hpcckpt.codecs import auto
        auto.observe_write(1 << 20, 10.0 * (1 + comm.rank))  # slow storage (ranks differ): AutoLossy weighs ratio
        hpcckpt.save(state, path, comm, chunk_bytes=4096)
        return
    hpcckpt.load(state, path, comm)
    for name, want in expect.items():
        check(name, want, state[name].local)
    if comm.rank == 0:
        view = hpcckpt.open(path)
        for name in ("auto_abs", "auto_rel"):
            assert view.variables[name].codec["id"] in CHOSEN, name
        for i, name in enumerate(sorted(SPECS)):
            check(name, field(i), view.read(name))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
else:
    import pytest

    from mpitools import run_mpi

    @pytest.mark.parametrize("save_n,load_n", [(3, 2), (1, 4), (4, 1), (2, 3)])
    def test_sz3_zfp_auto_lossy_reshard_round_trip(tmp_path, save_n, load_n):
        pytest.importorskip("pysz")
        pytest.importorskip("zfpy")
        path = str(tmp_path / "ckpt")
        run_mpi(save_n, __file__, "save", path, save_n)
        run_mpi(load_n, __file__, "load", path, 100 + load_n)
