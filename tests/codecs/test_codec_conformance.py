"""Every codec the writer can emit passes the shipped conformance suite (hpcckpt.testing.CodecTests)."""

from __future__ import annotations

import numpy as np

from hpcckpt.codecs import resolve
from hpcckpt.testing import CodecTests

F8, F4, I4 = np.dtype("<f8"), np.dtype("<f4"), np.dtype("<i4")


class TestNone(CodecTests):
    config, dtype = {"id": "none"}, F8


class TestBloscLz4(CodecTests):
    config, dtype = resolve("lz4", F8).config, F8


class TestBloscZstd(CodecTests):
    config, dtype = resolve("zstd", I4).config, I4


class TestBloscLz4hc(CodecTests):
    config, dtype = resolve("lz4hc", F4).config, F4


class TestShuffleLz4(CodecTests):
    config, dtype = resolve("shuffle+lz4", F8).config, F8


class TestShuffleZstd(CodecTests):
    config, dtype = resolve("shuffle+zstd", I4).config, I4


class TestPlainZstd(CodecTests):
    config, dtype = {"id": "zstd", "level": 3}, F8


class TestPlainLz4(CodecTests):
    config, dtype = {"id": "lz4", "acceleration": 1}, F4


class TestQuantizeAbs(CodecTests):
    config, dtype = {"id": "hpcckpt.quantize", "abs": 1e-3, "compressor": {"id": "zstd", "level": 1}}, F8

    def assert_decoded(self, original, decoded):
        assert np.max(np.abs(decoded.astype(np.float64) - original)) <= 1e-3


class TestQuantizeRel(CodecTests):
    config, dtype = {"id": "hpcckpt.quantize", "rel": 1e-4, "compressor": {"id": "lz4"}}, F4

    def assert_decoded(self, original, decoded):
        span = float(original.max() - original.min())
        assert np.max(np.abs(decoded.astype(np.float64) - original)) <= 1e-4 * span + 1e-12
