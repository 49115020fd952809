"""Byte order (docs/format.md 3.2): data is stored in exactly the order its descriptor says, never converted.

Every dtype x byte order x shape (0-d, empty, 1-d, 2-d, Fortran and strided
views) must come back with the same dtype and the same bytes, as a Block, a
Ragged and a replicated value, through every lossless codec, by
``hpcckpt.load`` and by ``hpcckpt.open(...).read``; uncompressed chunks must
hold those bytes on disk.  The serial tests run in one plain process; the MPI
test (``mpiexec -n 2/3 python tests/mpi_pytest.py --with-mpi -m mpi
tests/core/test_byteorder.py``) splits big-endian Blocks over the ranks.
"""

from __future__ import annotations

import json
import os
import tempfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hpcckpt
from hpcckpt import Block, CheckpointError, Ragged
from hpcckpt.codecs import Lossy
from hpcckpt.core.encoding import dtype_to_json

# a packed record whose fields have different byte orders (no padding: every byte is data)
MIXED = np.dtype([("a", ">i4"), ("b", "<f8"), ("c", ">c8", (2,)), ("d", "|S3"), ("e", "<u2")])
CODES = ["b1", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4", "f8", "c8", "c16", "S5", "U3",
         "M8[s]", "m8[us]"]
ORDERS = ["<", ">", "|", "="]
CODECS = [None, {"id": "blosc", "cname": "lz4", "clevel": 5, "shuffle": 1}, {"id": "zstd", "level": 1},
          {"id": "lz4"}, "shuffle+zstd"]
LAYOUTS = ["0-d", "empty", "1-d", "2-d", "fortran", "strided", "transposed"]


def random_bytes(n: int, dtype: np.dtype, seed: int) -> np.ndarray:
    """``n`` elements of random bytes viewed as ``dtype`` (bools 0/1: other bytes are not bools)."""
    raw = np.random.default_rng(seed).integers(0, 256, size=n * dtype.itemsize, dtype=np.uint8)
    if dtype.kind == "b":
        raw &= 1
    return raw.view(dtype)


def make_array(dtype: np.dtype, layout: str, seed: int) -> np.ndarray:
    """An array of ``dtype`` in one of LAYOUTS (the non-contiguous ones are views of a bigger array)."""
    if layout == "0-d":
        return random_bytes(1, dtype, seed).reshape(())
    if layout == "empty":
        return random_bytes(0, dtype, seed).reshape(0, 3)
    if layout == "1-d":
        return random_bytes(7, dtype, seed)
    base = random_bytes(24, dtype, seed).reshape(4, 6)
    return {"2-d": base, "fortran": np.asfortranarray(base), "strided": base[::2, 1::2], "transposed": base.T}[layout]


@st.composite
def arrays(draw):
    """An array of any plain dtype in any byte order, or of the mixed-order record, in any layout."""
    if draw(st.booleans()) and draw(st.booleans()):
        dtype = MIXED
    else:
        dtype = np.dtype(draw(st.sampled_from(ORDERS)) + draw(st.sampled_from(CODES)))
    return make_array(dtype, draw(st.sampled_from(LAYOUTS)), draw(st.integers(0, 2**32 - 1)))


def assert_same(got, want: np.ndarray) -> None:
    """Same dtype (byte order included), same shape, same bytes in C order."""
    assert isinstance(got, np.ndarray)
    assert got.dtype == want.dtype and got.dtype.str == want.dtype.str, (got.dtype, want.dtype)
    assert got.shape == want.shape
    assert got.tobytes() == np.ascontiguousarray(want).tobytes()


def stored_chunk_bytes(path: str, name: str) -> list[bytes]:
    """The raw bytes of every chunk of ``name`` as they lie in the data files (for codec none)."""
    meta = json.load(open(os.path.join(path, "metadata.json")))
    chunks = meta["variables"][name]["chunks"]
    out = []
    for f, offset, nbytes in zip(chunks["file"], chunks["offset"], chunks["nbytes"]):
        with open(os.path.join(path, meta["files"][f]), "rb") as fh:
            fh.seek(offset)
            out.append(fh.read(nbytes))
    return out


def round_trip(arr: np.ndarray, codec, path: str) -> None:
    """Save ``arr`` as a Block, a Ragged and replicated values; check what load, open and the files give back."""
    state = {"x": Block(arr, codec=codec), "v": arr}
    if arr.ndim:
        state["r"] = Ragged(arr, codec=codec)
    if arr.size:
        state["s"] = arr.reshape(-1)[0]  # a numpy scalar (np.void keeps the record's byte orders)
    hpcckpt.save(state, path)

    meta = json.load(open(os.path.join(path, "metadata.json")))
    assert meta["variables"]["x"]["dtype"] == dtype_to_json(arr.dtype)
    if codec is None:
        assert b"".join(stored_chunk_bytes(path, "x")) == np.ascontiguousarray(arr).tobytes()

    view = hpcckpt.open(path)
    assert_same(view.read("x"), arr)
    assert_same(view.values["v"], arr)
    if arr.ndim:
        assert_same(view.read("r"), arr)

    template = {"x": Block(np.zeros(arr.shape, arr.dtype)), "v": None}
    if arr.ndim:
        template["r"] = Ragged()
    if arr.size:
        template["s"] = None
    out = hpcckpt.load(template, path)
    assert_same(out["x"].local, arr)
    assert_same(out["v"], arr)
    if arr.ndim:
        assert_same(out["r"].local, arr)
    if arr.size:
        want = state["s"]
        assert type(out["s"]) is type(want)
        assert np.asarray(out["s"]).dtype == np.asarray(want).dtype
        assert np.asarray(out["s"]).tobytes() == np.asarray(want).tobytes()


@settings(max_examples=150, deadline=None)
@given(arrays(), st.sampled_from(CODECS))
def test_every_dtype_order_and_shape_round_trips(arr, codec):
    with tempfile.TemporaryDirectory() as tmp:
        round_trip(arr, codec, os.path.join(tmp, "ck"))


@pytest.mark.parametrize("dtype", [">i8", ">f8", ">c16", ">i2", MIXED], ids=str)
@pytest.mark.parametrize("codec", [None, "lz4", "zstd", "shuffle+lz4"])
def test_zero_d_big_endian_block(tmp_path, dtype, codec):
    """The reported bug: a 0-d '>i8' Block was written little-endian but labelled '>i8' (-3 came back as
    -144115188075855873): indexing a 0-d array with () gives a native-order scalar, not a view."""
    arr = np.zeros((), dtype)
    if arr.dtype.names:
        arr["a"], arr["b"], arr["c"], arr["d"], arr["e"] = -3, -3.5, [1 - 2j, 3j], b"abc", 513
    else:
        arr[()] = -3
    path = str(tmp_path / "ck")
    hpcckpt.save({"x": Block(arr, offset=(), global_shape=(), codec=codec)}, path)
    if codec is None:
        assert stored_chunk_bytes(path, "x") == [arr.tobytes()]
    assert_same(hpcckpt.open(path).read("x"), arr)
    target = np.ones((), dtype)
    hpcckpt.load({"x": Block(target, offset=(), global_shape=())}, path)
    assert_same(target, arr)


@pytest.mark.parametrize("dtype", [">f2", ">f4", ">f8", "<f8"])
@pytest.mark.parametrize("layout", ["0-d", "empty", "1-d", "strided"])
@pytest.mark.parametrize("mode", ["abs", "rel"])
def test_lossy_keeps_byte_order(tmp_path, dtype, layout, mode):
    """hpcckpt.quantize accepts either byte order: the dtype comes back unchanged, every finite element
    within the bound, NaN and +-Inf bit for bit."""
    full = np.linspace(-50, 50, 64).astype(dtype)
    full[:3] = [np.nan, np.inf, -np.inf]
    arr = {"0-d": full[5:6].reshape(()), "empty": full[:0].reshape(0, 4), "1-d": full[:61],
           "strided": full.reshape(8, 8)[::2, ::3]}[layout]
    codec = Lossy(abs=0.01) if mode == "abs" else Lossy(rel=0.001)
    path = str(tmp_path / "ck")
    hpcckpt.save({"x": Block(arr, codec=codec)}, path)
    got = hpcckpt.open(path).read("x")
    assert got.dtype.str == arr.dtype.str and got.shape == arr.shape
    finite = np.isfinite(arr)
    values = arr[finite].astype(np.float64)
    bound = 0.01 if mode == "abs" else 0.001 * (float(values.max() - values.min()) if values.size else 0.0)
    assert np.all(np.abs(got[finite].astype(np.float64) - values) <= bound)
    assert got[~finite].tobytes() == np.ascontiguousarray(arr[~finite]).tobytes()


def test_lossy_refuses_non_float_of_either_order(tmp_path):
    for dtype in [">i8", "<i8", ">c16"]:
        with pytest.raises(CheckpointError, match="float16/32/64"):
            hpcckpt.save({"x": Block(np.zeros(4, dtype), codec=Lossy(abs=0.1))}, str(tmp_path / dtype[1:]))


# ---------------------------------------------------------------- MPI: big-endian Blocks split across ranks
@pytest.fixture
def comm():
    from mpi4py import MPI

    return MPI.COMM_WORLD


def _rows(n: int, size: int, rank: int) -> tuple[int, int]:
    return rank * n // size, (rank + 1) * n // size


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("strategy", ["file-per-rank", "aggregated", "shared-file"])
@pytest.mark.parametrize("codec", [None, "zstd"])
def test_big_endian_blocks_split_across_ranks(comm, mpi_tmp, strategy, codec):
    """Saved in row slabs, loaded in column slabs: every rank's part comes back byte for byte."""
    size, rank = comm.Get_size(), comm.Get_rank()
    path = os.path.join(mpi_tmp, f"ck-{strategy}-{codec}")
    shape = (7, 5)
    want = {str(dt): random_bytes(35, np.dtype(dt), seed=i).reshape(shape)
            for i, dt in enumerate([">f8", ">i4", MIXED])}
    lo, hi = _rows(shape[0], size, rank)
    state = {name: Block(a[lo:hi], offset=(lo, 0), global_shape=shape, codec=codec) for name, a in want.items()}
    state["r"] = Ragged(want[">f8"][lo:hi], codec=codec)
    hpcckpt.save(state, path, comm, strategy=strategy)

    c0, c1 = _rows(shape[1], size, rank)
    template = {name: Block(np.zeros((shape[0], c1 - c0), a.dtype), offset=(0, c0), global_shape=shape)
                for name, a in want.items()}
    template["r"] = Ragged()
    out = hpcckpt.load(template, path, comm)
    for name, a in want.items():
        assert_same(out[name].local, a[:, c0:c1])
    r0, r1 = _rows(shape[0], size, rank)  # Ragged() splits the rows evenly
    assert_same(out["r"].local, want[">f8"][r0:r1])
    if rank == 0:
        view = hpcckpt.open(path)
        for name, a in want.items():
            assert_same(view.read(name), a)
    comm.Barrier()
