"""Loading into a template of another dtype: ``load(..., cast=True)`` and ``Checkpointer.restore(..., cast=True)``.

The rule (hpcckpt.loading.load.cast_allowed): numeric dtypes only and numpy's
``np.can_cast(stored, target, "same_kind")``; the values must equal
``np.asarray(saved).astype(target)``.  Without cast=True a dtype difference is
refused as before, the message naming cast=True.  The MPI test
(``mpiexec -n 2/3 python tests/mpi_pytest.py --with-mpi -m mpi tests/core/test_cast.py``)
saves on one rank count and loads with a cast on another.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import hpcckpt
from hpcckpt import Block, Ragged, TemplateMismatchError
from hpcckpt.loading.load import cast_allowed

SHAPE = (13, 11)
CODECS = [None, {"id": "zstd", "level": 1}]


def values(dtype, seed=0, shape=SHAPE):
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(max(info.min, -2**40), min(info.max, 2**40), size=shape).astype(dtype)
    return (rng.standard_normal(shape) * 1e3).astype(dtype)


def save_rows(tmp_path, arr, chunk_bytes, codec=None):
    """Save ``arr`` as one Block and as Ragged rows, in chunks of at most ``chunk_bytes``."""
    path = str(tmp_path / "ck")
    hpcckpt.save({"u": Block(arr, (0,) * arr.ndim, arr.shape), "r": Ragged(arr)}, path, chunk_bytes=chunk_bytes,
                 codec=codec)
    return path


@pytest.mark.parametrize("codec", CODECS, ids=["raw", "zstd"])
@pytest.mark.parametrize("stored,target", [("f8", "f4"), ("f4", "f8"), ("i8", "i4"), (">f8", "f4"),
                                           (">f4", "<f4"), ("i4", "f8")])
def test_cast_fills_block_and_ragged(tmp_path, stored, target, codec):
    saved = values(stored)
    path = save_rows(tmp_path, saved, 40, codec)
    want = np.asarray(saved).astype(target)
    # a C-ordered target, then a non-contiguous one (chunks split between ranks: test_reshard_with_cast)
    out = np.full(SHAPE, -1, target)
    got = hpcckpt.load({"u": Block(out, (0, 0), SHAPE), "r": Ragged(np.empty((0, SHAPE[1]), target))}, path,
                       cast=True)
    assert out.dtype == np.dtype(target) and np.array_equal(out, want)
    assert got["r"].local.dtype == np.dtype(target) and np.array_equal(got["r"].local, want)
    base = np.full((SHAPE[1], SHAPE[0]), -1, target)
    got = hpcckpt.load({"u": Block(base.T, (0, 0), SHAPE), "r": Ragged()}, path, cast=True)  # a Fortran view
    assert got["r"].local.dtype == np.dtype(stored)  # Ragged() without rows: the stored dtype
    assert np.array_equal(base.T, want)


def test_cast_rounds_as_numpy_does(tmp_path):
    saved = np.array([[1 + 2**-30, 1e39, -1e-50, np.nan, np.inf, 0.1]])  # rounding, overflow, underflow
    path = save_rows(tmp_path, saved, 16)
    out = np.empty(saved.shape, np.float32)
    with np.errstate(over="ignore"):
        want = saved.astype(np.float32)
        hpcckpt.load({"u": Block(out, (0, 0), saved.shape), "r": Ragged()}, path, cast=True)
    assert np.array_equal(out, want, equal_nan=True)


def test_same_dtype_with_cast_is_the_plain_load(tmp_path):
    saved = values("f8")
    path = save_rows(tmp_path, saved, 40)
    out = np.empty(SHAPE)
    hpcckpt.load({"u": Block(out, (0, 0), SHAPE), "r": Ragged()}, path, cast=True)
    assert np.array_equal(out, saved)


def test_without_cast_a_dtype_difference_is_refused_naming_cast(tmp_path):
    path = save_rows(tmp_path, values("f8"), 40)
    out = np.zeros(SHAPE, np.float32)
    with pytest.raises(TemplateMismatchError, match=r"'u'.*float32 differs from the stored float64.*cast=True"):
        hpcckpt.load({"u": Block(out, (0, 0), SHAPE), "r": Ragged()}, path)
    assert not out.any()
    with pytest.raises(TemplateMismatchError, match=r"'r'.*float32 differs from the stored float64.*cast=True"):
        hpcckpt.load({"u": Block(np.zeros(SHAPE), (0, 0), SHAPE), "r": Ragged(np.zeros((0, 11), "f4"))}, path)
    (tmp_path / "le").mkdir()
    little = save_rows(tmp_path / "le", values("<f8"), 40)
    with pytest.raises(TemplateMismatchError, match="differs from the stored float64.*cast=True"):  # byte order
        hpcckpt.load({"u": Block(np.zeros(SHAPE, ">f8"), (0, 0), SHAPE), "r": Ragged()}, little)


@pytest.mark.parametrize("stored,target", [("f8", "i8"), ("f4", "i4"), ("c16", "f8"), ("c8", "f4"), ("i8", "u8"),
                                           ("i4", "?"), ("f8", "U8"), ("i8", "M8[s]")])
def test_lossy_kind_changes_are_refused_even_with_cast(tmp_path, stored, target):
    assert not cast_allowed(np.dtype(stored), np.dtype(target))
    path = save_rows(tmp_path, values(stored if stored[0] in "iuf" else "f8").astype(stored), 40)
    out = np.zeros(SHAPE, target)
    with pytest.raises(TemplateMismatchError, match=r"cannot cast the stored .* same_kind"):
        hpcckpt.load({"u": Block(out, (0, 0), SHAPE), "r": Ragged()}, path, cast=True)


def test_cast_allowed_rule():
    for stored, target in [("f8", "f4"), ("f2", "f8"), ("i8", "i1"), ("u8", "i2"), ("i8", "f4"), ("?", "i4"),
                           ("f8", "c8"), (">f8", "<f4"), (">i4", "<i4")]:
        assert cast_allowed(np.dtype(stored), np.dtype(target)), (stored, target)


def test_restore_with_cast(tmp_path):
    saved = values("f8", seed=3)
    ck = hpcckpt.Checkpointer(tmp_path / "root", chunk_bytes=56)
    try:
        ck.save({"u": Block(saved, (0, 0), SHAPE), "t": 0.5}, step=1)
        out = np.empty(SHAPE, np.float32)
        with pytest.raises(TemplateMismatchError, match="cast=True"):
            ck.restore({"u": Block(out, (0, 0), SHAPE), "t": None})
        got = ck.restore({"u": Block(out, (0, 0), SHAPE), "t": None}, cast=True)
        assert got["t"] == 0.5 and np.array_equal(out, saved.astype(np.float32))
    finally:
        ck.close()


# ---- MPI: save on one rank count, load with a cast on another ----

def _rows(n, parts, i):
    return i * n // parts, (i + 1) * n // parts


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("codec", CODECS, ids=["raw", "zstd"])
def test_reshard_with_cast(mpi_tmp, codec):
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    n, r = comm.size, comm.rank
    shape = (17, 3)  # chunks of 6 elements span rows: the row split of the load shares chunks
    g = values(">f8", seed=5, shape=shape)
    gi = values("i8", seed=6, shape=shape)
    path = os.path.join(mpi_tmp, "ck")
    # saved on n - 1 ranks (columns split), loaded on n ranks (rows split: chunks shared between ranks)
    sub = comm.Split(0 if r < n - 1 else 1, r)
    if r < n - 1:
        a, b = _rows(shape[1], n - 1, r)
        hpcckpt.save({"u": Block(np.ascontiguousarray(g[:, a:b]), (0, a), shape),
                      "k": Block(np.ascontiguousarray(gi[:, a:b]), (0, a), shape),
                      "p": Ragged(g[r::n - 1])}, path, comm=sub, chunk_bytes=48, codec=codec)
    sub.Free()
    comm.Barrier()
    lo, hi = _rows(shape[0], n, r)
    out = np.full((hi - lo, shape[1]), -1, np.float32)
    outk = np.full((hi - lo, shape[1]), -1, np.int32)
    got = hpcckpt.load({"u": Block(out, (lo, 0), shape), "k": Block(outk, (lo, 0), shape),
                        "p": Ragged(np.empty((0, shape[1]), np.float32))}, path, comm=comm, cast=True)
    assert np.array_equal(out, g[lo:hi].astype(np.float32))
    assert np.array_equal(outk, gi[lo:hi].astype(np.int32))
    rows = np.concatenate([p for p in comm.allgather(got["p"].local)])
    assert rows.dtype == np.float32
    assert np.array_equal(rows, np.concatenate([g[q::n - 1] for q in range(n - 1)]).astype(np.float32))
    with pytest.raises(TemplateMismatchError, match="cast=True"):  # every rank, without cast
        hpcckpt.load({"u": Block(out, (lo, 0), shape), "k": Block(outk, (lo, 0), shape), "p": Ragged()}, path,
                     comm=comm)


def test_hdf5_file_with_cast(tmp_path):
    h5py = pytest.importorskip("h5py")
    saved = values("f8", seed=7)
    path = str(tmp_path / "f.h5")
    with h5py.File(path, "w") as f:
        f["u"] = saved
        f["r"] = saved
    out = np.empty(SHAPE, np.float32)
    with pytest.raises(TemplateMismatchError, match="cast=True"):
        hpcckpt.load({"u": Block(out, (0, 0), SHAPE), "r": Ragged()}, path)
    got = hpcckpt.load({"u": Block(out, (0, 0), SHAPE), "r": Ragged(np.empty((0, SHAPE[1]), np.float32))}, path,
                       cast=True)
    assert np.array_equal(out, saved.astype(np.float32))
    assert got["r"].local.dtype == np.float32 and np.array_equal(got["r"].local, saved.astype(np.float32))
    with pytest.raises(TemplateMismatchError, match="cannot cast"):
        hpcckpt.load({"u": Block(np.empty(SHAPE, np.int64), (0, 0), SHAPE), "r": Ragged()}, path, cast=True)
