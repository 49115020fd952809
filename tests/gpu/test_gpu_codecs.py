"""The real CuPy path of the codecs (hpcckpt.codecs.gpu): skipped, with a message, without a GPU.

Checks, for every codec with a device path, that device encoding gives the
CPU codec's bytes exactly (what a GPU writes, a CPU reads) and that device
decoding of CPU-written bytes gives the CPU decoder's array (and the other way
round); with nvCOMP (a different compressor writing the same numcodecs
format) the bytes differ, so there both directions are checked by decoding.
bench/gpu_check.sh runs tests/gpu plus a throughput benchmark.
"""

from __future__ import annotations

import numpy as np
import pytest

from gpu_available import require_gpu

cupy = require_gpu()

from hpcckpt.codecs import Lossy, nvcomp, resolve  # noqa: E402
from hpcckpt.codecs import kernels  # noqa: E402
from hpcckpt.codecs.core import ChainCodec, NumcodecsCodec, zstd_frames  # noqa: E402
from hpcckpt.codecs.gpu import device_decode, device_encode  # noqa: E402

CODECS = ["none", "lz4", "zstd", "shuffle+lz4", "shuffle+zstd", Lossy(abs=1e-3), Lossy(rel=1e-4),
          Lossy(rel=1e-2, compressor="lz4")]


def field(dtype):
    rng = np.random.default_rng(0)
    x = np.sin(np.linspace(0, 30, 1 << 16)) * 10 + rng.normal(scale=1e-3, size=1 << 16)
    x[::331] = np.nan
    x[7::997] = np.inf
    return x.astype(dtype)


@pytest.fixture
def without_nvcomp(monkeypatch):
    """The device filters with the host's lossless stage (the default): byte-identical to the CPU codecs."""
    monkeypatch.delenv(nvcomp.ENABLE, raising=False)


@pytest.fixture
def with_nvcomp(monkeypatch):
    """nvCOMP turned on (opt-in), as a user does with HPCCKPT_NVCOMP=1."""
    pytest.importorskip("nvidia.nvcomp", reason="nvidia-nvcomp is not installed")
    monkeypatch.setenv(nvcomp.ENABLE, "1")
    monkeypatch.setattr(nvcomp, "_disabled", {})


@pytest.mark.parametrize("spec", CODECS, ids=str)
@pytest.mark.parametrize("dtype", ["<f2", "<f4", "<f8"])
def test_device_bytes_equal_cpu_bytes_both_ways(spec, dtype, without_nvcomp):
    x = field(dtype)
    codec = resolve(spec, x.dtype)
    cpu = codec.encode(x)
    gpu = device_encode(codec, cupy.asarray(x))
    host_out = np.empty(x.nbytes, np.uint8)
    codec.decode(gpu, host_out)
    if isinstance(codec, NumcodecsCodec):
        # blosc has no device filters: the device path is one copy, then the very same host codec, whose
        # multi-threaded zstd output was seen to differ between two calls on the same bytes; what matters is
        # that either side decodes the other's bytes exactly
        assert host_out.tobytes() == x.tobytes()
    else:
        assert gpu.tobytes() == cpu.tobytes()
    dev_out = cupy.empty_like(cupy.asarray(x))
    device_decode(codec, cpu, dev_out)
    assert cupy.asnumpy(dev_out).tobytes() == host_out.tobytes()


@pytest.mark.parametrize("spec", [Lossy(abs=1e-3), Lossy(rel=1e-4)], ids=str)
@pytest.mark.parametrize("dtype", ["<f2", "<f4", "<f8"])
@pytest.mark.parametrize("nan", [False, True], ids=["fast-path", "general-path"])
def test_device_quantizer_keeps_negative_zero_like_the_cpu(spec, dtype, nan, without_nvcomp):
    """-0.0 is an outlier on the device too (the fast path's check runs there): the CPU codec's bytes."""
    x = field(dtype)
    if not nan:
        x = np.nan_to_num(x, nan=0.5, posinf=0.5)
    x[[0, 13, x.size - 1]] = -0.0
    codec = resolve(spec, x.dtype)
    gpu = device_encode(codec, cupy.asarray(x))
    assert gpu.tobytes() == codec.encode(x).tobytes()
    back = cupy.zeros(x.size, x.dtype)
    device_decode(codec, gpu, back)
    assert np.signbit(cupy.asnumpy(back)[[0, 13, x.size - 1]]).all()


@pytest.mark.parametrize("keepbits", [0, 5, 10])
def test_bitround_and_shuffle_kernels_on_device(keepbits):
    x = field("<f4")
    assert cupy.asnumpy(kernels.bitround(cupy, cupy.asarray(x), keepbits)).tobytes() == \
        kernels.bitround(np, x, keepbits).tobytes()
    b = x.view(np.uint8)
    assert cupy.asnumpy(kernels.shuffle(cupy, cupy.asarray(b), 4)).tobytes() == kernels.shuffle(np, b, 4).tobytes()


@pytest.mark.parametrize("dtype", ["<f4", "<f8"])
@pytest.mark.parametrize("n", [1000, 1 << 20, (4 << 20) + 12])
def test_nvcomp_chunks_decode_on_the_cpu_and_cpu_chunks_on_the_device(dtype, n, with_nvcomp):
    x = np.resize(field(dtype), n)
    codec = resolve("shuffle+zstd", x.dtype)
    assert isinstance(codec, ChainCodec)
    gpu = device_encode(codec, cupy.asarray(x))
    host_out = np.empty(x.nbytes, np.uint8)
    codec.decode(gpu, host_out)  # the CPU decoder reads what the device wrote
    assert host_out.tobytes() == x.tobytes()
    dev_out = cupy.empty_like(cupy.asarray(x))
    device_decode(codec, gpu, dev_out)  # nvCOMP reads it back on the device (many frames)
    assert cupy.asnumpy(dev_out).tobytes() == x.tobytes()
    dev_out[...] = 0
    device_decode(codec, codec.encode(x), dev_out)  # and the device reads what the CPU wrote
    assert cupy.asnumpy(dev_out).tobytes() == x.tobytes()
    print("nvCOMP:", nvcomp.status())


def test_nvcomp_is_used_for_zstd_when_turned_on(with_nvcomp):
    x = cupy.asarray(field("<f8"))
    stored = device_encode(resolve("shuffle+zstd", np.float64), x)
    assert nvcomp.status()["zstd"].startswith("nvCOMP"), nvcomp.status()
    frames = zstd_frames(stored)
    assert len(frames) == -(-x.nbytes // nvcomp.SUB_BYTES)  # one frame per sub-chunk: written by nvCOMP


def test_nvcomp_is_off_by_default(without_nvcomp):
    x = cupy.asarray(field("<f8"))
    stored = device_encode(resolve("shuffle+zstd", np.float64), x)
    assert len(zstd_frames(stored)) == 1 and nvcomp.status()["zstd"].startswith("off")
