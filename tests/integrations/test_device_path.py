"""The CuPy code paths of save, load, asynchronous and incremental saves, run in CI with tests/support/fakecupy.py.

The fake is numpy posing as device memory and refusing implicit conversion,
so these tests catch a device array that wanders into a host-only path.  The
real thing runs in tests/gpu/ on a GPU (bench/gpu_check.sh).
"""

from __future__ import annotations

import numpy as np
import pytest

import fakecupy
import hpcckpt
from hpcckpt.core import blockhash
from hpcckpt.codecs import Lossy
from hpcckpt.core.devices import is_device_array, to_host

CODECS = ["none", "lz4", "shuffle+lz4", "shuffle+zstd", "auto", Lossy(abs=1e-3)]


@pytest.fixture
def cupy(monkeypatch):
    return fakecupy.install(monkeypatch)


def field(shape=(96, 50), seed=0):
    rng = np.random.default_rng(seed)
    x = np.sin(np.linspace(0, 20, shape[0] * shape[1])).reshape(shape) + rng.normal(scale=1e-3, size=shape)
    x[3, 4] = np.nan
    return x


def same(got, want, codec):
    if isinstance(codec, Lossy):
        assert np.array_equal(np.isnan(got), np.isnan(want)) and np.nanmax(np.abs(got - want)) <= 1e-3
    else:
        assert got.tobytes() == want.tobytes()


def test_the_fake_behaves_like_a_device_array(cupy):
    a = cupy.asarray(np.arange(4.0))
    assert is_device_array(a) and not is_device_array(np.arange(4.0))
    with pytest.raises(TypeError):
        np.asarray(a)  # as in CuPy: no silent trip to the host
    assert to_host(a).tolist() == [0.0, 1.0, 2.0, 3.0]


@pytest.mark.parametrize("dtype", ["<f2", "<f4", "<f8"])
def test_the_device_quantizer_keeps_negative_zero_as_the_cpu_one_does(cupy, dtype):
    """The quantizer's device twin (codecs/gpu.py, kernels with xp = cupy) sets -0.0 aside like the CPU codec."""
    from hpcckpt.codecs import resolve
    from hpcckpt.codecs.gpu import device_decode, device_encode

    x = field().reshape(-1).astype(dtype)
    x[3 * 50 + 4] = 0.5  # no NaN: the fast path, whose -0.0 check runs on the device
    x[[0, 7, x.size - 1]] = -0.0
    for spec in (Lossy(abs=1e-3), Lossy(rel=1e-4)):
        codec = resolve(spec, x.dtype)
        stored = device_encode(codec, cupy.asarray(x))
        assert stored.tobytes() == codec.encode(x).tobytes()
        back = cupy.zeros(x.size, dtype)
        device_decode(codec, stored, back)
        assert np.signbit(back.get()[[0, 7, x.size - 1]]).all()


@pytest.mark.parametrize("codec", CODECS, ids=str)
def test_device_block_saves_and_loads_through_the_device_paths(tmp_path, cupy, codec):
    x = field()
    hpcckpt.save({"u": hpcckpt.Block(cupy.asarray(x)[:, :40], codec=codec), "n": 2}, tmp_path / "c",
                 chunk_bytes=2048)
    want = np.ascontiguousarray(x[:, :40])
    with hpcckpt.open(tmp_path / "c") as view:
        same(view.read("u"), want, codec)
        part = cupy.zeros((30, 17))  # a box that cuts chunks: the decode-then-copy branch of the reader
        view._reader.read_into(view.variables["u"], (5, 11), (35, 28), part)
        same(part.get(), want[5:35, 11:28], codec)
    back = cupy.full((96, 40), -1.0)
    out = hpcckpt.load({"u": hpcckpt.Block(back), "n": None}, tmp_path / "c")
    assert out["n"] == 2
    same(back.get(), want, codec)


def test_host_checkpoint_loads_into_a_device_block(tmp_path, cupy):
    x = field(seed=1).astype(np.float32)
    hpcckpt.save({"u": hpcckpt.Block(x, codec="shuffle+zstd")}, tmp_path / "c", chunk_bytes=1000)
    back = cupy.zeros(x.shape, np.float32)
    hpcckpt.load({"u": hpcckpt.Block(back)}, tmp_path / "c")
    assert back.get().tobytes() == x.tobytes()


def test_device_ragged_rows_are_saved(tmp_path, cupy):
    rows = np.arange(30, dtype=np.int64).reshape(10, 3)
    hpcckpt.save({"p": hpcckpt.Ragged(cupy.asarray(rows))}, tmp_path / "c")
    out = hpcckpt.load({"p": hpcckpt.Ragged()}, tmp_path / "c")
    assert np.array_equal(out["p"].local, rows)


def test_asynchronous_save_stages_device_arrays_in_pinned_buffers(tmp_path, cupy):
    x = field()
    dev = cupy.asarray(x)
    with hpcckpt.Checkpointer(tmp_path, asynchronous=True) as ckpt:
        ckpt.save({"u": hpcckpt.Block(dev)}, step=1)
        dev += 1.0
        ckpt.wait()
        assert ckpt.engine.pool.pinned
    back = cupy.zeros(x.shape)
    with hpcckpt.Checkpointer(tmp_path) as ckpt:
        ckpt.restore({"u": hpcckpt.Block(back)})
    assert back.get().tobytes() == x.tobytes()


def test_incremental_device_blocks_are_hashed_with_mix128_and_only_changes_written(tmp_path, cupy, table_form):
    x = np.random.default_rng(3).random((64, 2048))  # 16 KiB rows
    dev = cupy.asarray(x)
    with hpcckpt.Checkpointer(tmp_path, incremental=True, block_bytes=64 << 10) as ckpt:
        ckpt.save({"u": hpcckpt.Block(dev)}, step=1)
        dev[10, 5] += 1.0
        result = ckpt.save({"u": hpcckpt.Block(dev)}, step=2)
    assert result.incremental["kind"] == "incremental" and result.incremental["written_bytes"] == 64 << 10
    with hpcckpt.open(result.path) as view:  # a columnar table keeps the tag in its hash_kind column
        hashes = view.variables["u"].chunks.hash
        assert all(h.startswith(f"{blockhash.NAME}:") for h in hashes)
        assert all(hashes[k].startswith(f"{blockhash.NAME}:") for k in range(len(hashes)))
        want = x.copy()
        want[10, 5] += 1.0
        assert view.read("u").tobytes() == want.tobytes()
