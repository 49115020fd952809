"""CuPy arrays through the whole pipeline: save, load, reshard, asynchronous and incremental saves.

Skipped, with a message, without a usable GPU (bench/gpu_check.sh runs it on
one).  What a GPU writes is read back on the CPU (hpcckpt.open) and the other
way round, for every codec.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from gpu_available import require_gpu

cupy = require_gpu()

import hpcckpt  # noqa: E402
from hpcckpt.core import blockhash  # noqa: E402
from hpcckpt.codecs import Lossy  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
CODECS = ["none", "lz4", "zstd", "shuffle+lz4", "shuffle+zstd", "auto"]


def field(shape=(512, 300), seed=0):
    rng = np.random.default_rng(seed)
    x = np.sin(np.linspace(0, 20, shape[0] * shape[1])).reshape(shape) + rng.normal(scale=1e-3, size=shape)
    x[3, 4] = np.nan
    return x


@pytest.mark.parametrize("codec", CODECS)
def test_cupy_block_round_trips_and_the_cpu_reads_it(tmp_path, codec):
    x = field()
    dev = cupy.asarray(x)
    hpcckpt.save({"u": hpcckpt.Block(dev[:, :250], codec=codec), "n": 5}, tmp_path / "c", chunk_bytes=64 << 10)
    with hpcckpt.open(tmp_path / "c") as view:  # the CPU path reads what the device wrote
        assert view.read("u").tobytes() == np.ascontiguousarray(x[:, :250]).tobytes()
    back = cupy.full((512, 250), -1.0)
    out = hpcckpt.load({"u": hpcckpt.Block(back), "n": None}, tmp_path / "c")
    assert out["n"] == 5 and cupy.asnumpy(back).tobytes() == np.ascontiguousarray(x[:, :250]).tobytes()


@pytest.mark.parametrize("codec", ["none", "shuffle+zstd", "lz4"])
def test_cpu_written_checkpoint_loads_into_cupy(tmp_path, codec):
    x = field(seed=1).astype(np.float32)
    hpcckpt.save({"u": hpcckpt.Block(x, codec=codec)}, tmp_path / "c", chunk_bytes=32 << 10)
    back = cupy.zeros(x.shape, np.float32)
    hpcckpt.load({"u": hpcckpt.Block(back)}, tmp_path / "c")
    assert cupy.asnumpy(back).tobytes() == x.tobytes()


def test_lossy_bound_holds_through_the_device(tmp_path):
    x = field(seed=2)
    hpcckpt.save({"u": hpcckpt.Block(cupy.asarray(x), codec=Lossy(abs=1e-3))}, tmp_path / "c")
    back = cupy.empty_like(cupy.asarray(x))
    hpcckpt.load({"u": hpcckpt.Block(back)}, tmp_path / "c")
    got = cupy.asnumpy(back)
    assert np.array_equal(np.isnan(got), np.isnan(x))
    assert np.nanmax(np.abs(got - x)) <= 1e-3


def test_corrupt_chunk_is_named_on_a_device_load(tmp_path):
    x = field()
    hpcckpt.save({"u": hpcckpt.Block(cupy.asarray(x))}, tmp_path / "c", chunk_bytes=64 << 10)
    data = next((tmp_path / "c" / "data").iterdir())
    raw = bytearray(data.read_bytes())
    raw[100] ^= 0xFF
    data.write_bytes(bytes(raw))
    with pytest.raises(hpcckpt.CorruptCheckpointError, match="fails its checksum"):
        hpcckpt.load({"u": hpcckpt.Block(cupy.empty_like(cupy.asarray(x)))}, tmp_path / "c")


@pytest.mark.parametrize("codec", ["none", "shuffle+lz4", "lossy"])
def test_reshard_cupy_blocks_2_to_3_ranks(tmp_path, codec):
    from mpitools import run_mpi

    script = os.path.join(HERE, "gpu_reshard.py")
    run_mpi(2, script, "save", tmp_path / "c", codec, timeout=300)
    proc = run_mpi(3, script, "load", tmp_path / "c", codec, timeout=300)
    assert proc.stdout.count("OK rank") == 3


def test_asynchronous_save_holds_the_values_at_the_call(tmp_path):
    x = field()
    dev = cupy.asarray(x)
    with hpcckpt.Checkpointer(tmp_path, asynchronous=True) as ckpt:
        ckpt.save({"u": hpcckpt.Block(dev)}, step=1)
        dev += 1.0  # the application goes on at once
        ckpt.wait()
        assert ckpt.engine.pool.pinned  # staged through page-locked memory
    back = cupy.zeros_like(dev)
    with hpcckpt.Checkpointer(tmp_path) as ckpt:
        ckpt.restore({"u": hpcckpt.Block(back)})
    assert cupy.asnumpy(back).tobytes() == x.tobytes()


def test_incremental_hashes_on_the_device_and_writes_only_changed_blocks(tmp_path):
    x = np.random.default_rng(3).random((64, 16384))  # 8 MiB, 128 KiB rows: 8 rows per 1 MiB block
    dev = cupy.asarray(x)
    with hpcckpt.Checkpointer(tmp_path, incremental=True) as ckpt:
        ckpt.save({"u": hpcckpt.Block(dev)}, step=1)
        dev[10, 5] += 1.0  # one block changes
        result = ckpt.save({"u": hpcckpt.Block(dev)}, step=2)
    assert result.incremental["kind"] == "incremental"
    assert result.incremental["written_bytes"] == 1 << 20
    with hpcckpt.open(result.path) as view:
        hashes = view.variables["u"].chunks.hash
        assert all(h.startswith(f"{blockhash.NAME}:") for h in hashes)
        want = x.copy()
        want[10, 5] += 1.0
        assert view.read("u").tobytes() == want.tobytes()


@pytest.mark.parametrize("nbytes", [0, 1, 7, 8, 4096, (1 << 20) + 3])
def test_device_block_hash_equals_the_numpy_run(nbytes):
    data = np.random.default_rng(nbytes).integers(0, 256, size=nbytes, dtype=np.uint8)
    assert blockhash.mix128(cupy, cupy.asarray(data)) == blockhash.mix128(np, data)
    if nbytes > 9:  # an unaligned view is hashed alike too
        assert blockhash.mix128(cupy, cupy.asarray(data)[1:]) == blockhash.mix128(np, data[1:])
