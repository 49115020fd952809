"""The GPU path of the codecs, run with numpy as its array module: byte for byte the CPU codecs.

hpcckpt.codecs.gpu runs the filters (byte shuffle, quantization, bit rounding)
through kernels.py with ``xp`` = cupy on GPU ranks; here the very same code
runs with ``xp`` = numpy and must produce the stored bytes of the CPU codecs
(numcodecs' Shuffle and BitRound are independent implementations), and each
side must decode what the other wrote.
"""

from __future__ import annotations

import numpy as np
import pytest

from hpcckpt.codecs import Lossy, resolve
from hpcckpt.codecs import kernels
from hpcckpt.codecs.gpu import device_decode, device_encode

numcodecs = pytest.importorskip("numcodecs")

CODECS = ["none", "lz4", "zstd", "shuffle+lz4", "shuffle+zstd", Lossy(abs=1e-3), Lossy(rel=1e-4),
          Lossy(rel=1e-2, compressor="lz4")]


def fields():
    rng = np.random.default_rng(3)
    n = 20000
    smooth = np.sin(np.linspace(0, 20, n)) * 50 + rng.normal(scale=1e-2, size=n)
    const = np.repeat(rng.normal(size=n // 1000), 1000)
    special = smooth.copy()
    special[::97] = np.nan
    special[5::101] = np.inf
    special[7::103] = -np.inf
    special[9] = np.float64(np.finfo(np.float64).max)
    weird_nan = np.array([0x7FF0000000000001, 0xFFF8000000000123], np.uint64).view(np.float64)
    special[11:13] = weird_nan
    negzero = smooth.copy()  # finite, range across 0: the fast path's -0.0 check sends it to the general path
    negzero[[0, 4, 19999]] = -0.0
    return {"smooth": smooth, "const": const, "special": special, "random": rng.normal(size=n),
            "f4": smooth.astype(np.float32), "f2": (smooth / 10).astype(np.float16), "negzero": negzero,
            "negzero-f4": negzero.astype(np.float32)}


@pytest.mark.parametrize("spec", CODECS, ids=str)
@pytest.mark.parametrize("field", sorted(fields()))
def test_gpu_path_with_numpy_matches_cpu_codec_bytes(spec, field):
    x = fields()[field]
    codec = resolve(spec, x.dtype)
    cpu = codec.encode(x)
    dev = device_encode(codec, x, xp=np)
    assert dev.tobytes() == cpu.tobytes()
    # and each side decodes the other's bytes to the same array
    a = np.empty(x.nbytes, np.uint8)
    codec.decode(dev, a)
    b = np.empty_like(x)
    device_decode(codec, cpu, b, xp=np)
    assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("elementsize", [1, 2, 4, 8, 16])
def test_shuffle_kernel_is_numcodecs_shuffle(elementsize):
    data = np.random.default_rng(0).integers(0, 256, size=elementsize * 777, dtype=np.uint8)
    ref = numcodecs.Shuffle(elementsize=elementsize).encode(data)
    got = kernels.shuffle(np, data, elementsize)
    assert got.tobytes() == np.asarray(ref).tobytes()
    assert np.array_equal(kernels.unshuffle(np, got, elementsize), data)


@pytest.mark.parametrize("dtype", ["<f2", "<f4", "<f8"])
@pytest.mark.parametrize("keepbits", [0, 1, 3, 7, 10])
def test_bitround_kernel_is_numcodecs_bitround(dtype, keepbits):
    rng = np.random.default_rng(keepbits)
    x = (rng.normal(size=5000) * 10.0 ** rng.integers(-3, 4, size=5000)).astype(dtype)
    x[:4] = [np.nan, np.inf, -np.inf, 0.0]
    ref = np.asarray(numcodecs.BitRound(keepbits=keepbits).encode(x))
    got = kernels.bitround(np, x, keepbits)
    assert got.tobytes() == ref.tobytes()
