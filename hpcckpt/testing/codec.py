"""The conformance suite of a Codec: round trips, enforced sizes, and damaged streams refused cleanly.

Subclass it in a pytest module with ``config`` (the codec config the metadata
would store) and ``dtype``; a lossy codec overrides :meth:`assert_decoded`::

    class TestMine(CodecTests):
        config = {"id": "zstd", "level": 3}
        dtype = np.dtype("<f8")
"""

from __future__ import annotations

import json

import numpy as np

from hpcckpt.codecs import from_config
from hpcckpt.errors import CorruptCheckpointError


class CodecTests:
    """Conformance tests every codec config must pass (pytest collects them from subclasses)."""

    config: dict
    dtype: np.dtype

    def codec(self):
        return from_config(json.loads(json.dumps(self.config)), self.dtype)  # through JSON, as the metadata goes

    def arrays(self):
        """Chunks to round-trip: smooth, random, constant, one element."""
        rng = np.random.default_rng(11)
        kind = np.dtype(self.dtype).kind
        n = 5000
        if kind == "f":
            smooth = np.cumsum(rng.standard_normal(n)).astype(self.dtype)
            noisy = rng.standard_normal(n).astype(self.dtype)
        else:
            info = np.iinfo(self.dtype)
            smooth = (np.arange(n) % 200).astype(self.dtype)
            noisy = rng.integers(info.min, info.max, n, dtype=self.dtype, endpoint=True)
        return [smooth, noisy, np.full(n, smooth[0], self.dtype), smooth[:1].copy()]

    def assert_decoded(self, original: np.ndarray, decoded: np.ndarray) -> None:
        """Exact for a lossless codec; a lossy codec's subclass checks its bound instead."""
        assert decoded.tobytes() == original.tobytes()

    def test_round_trip(self):
        codec = self.codec()
        for arr in self.arrays():
            stored = np.ascontiguousarray(codec.encode(arr)).view(np.uint8)
            out = np.empty(arr.nbytes, np.uint8)
            self.codec().decode(stored, out)
            self.assert_decoded(arr, out.view(self.dtype))

    def test_what_is_stored_reads_back_as_the_same_codec(self):
        stored = self.codec().config  # validated and normalised: what the metadata holds
        again = from_config(json.loads(json.dumps(stored)), self.dtype)
        assert again.config == stored and type(again) is type(self.codec())

    def test_a_wrong_decoded_size_is_refused(self):
        arr = self.arrays()[0]
        stored = np.ascontiguousarray(self.codec().encode(arr)).view(np.uint8)
        for size in (arr.nbytes - self.dtype.itemsize, arr.nbytes + self.dtype.itemsize):
            try:
                self.codec().decode(stored, np.empty(size, np.uint8))
            except CorruptCheckpointError:
                continue
            raise AssertionError(f"decoding into {size} bytes (the chunk holds {arr.nbytes}) was accepted")

    def test_a_cut_stream_is_a_corrupt_checkpoint_error(self):
        arr = self.arrays()[1]
        stored = np.ascontiguousarray(self.codec().encode(arr)).view(np.uint8)
        for n in sorted({0, 1, len(stored) // 2, len(stored) - 1}):
            try:
                self.codec().decode(stored[:n].copy(), np.empty(arr.nbytes, np.uint8))
            except CorruptCheckpointError:
                continue
            raise AssertionError(f"a stream cut to {n} of {len(stored)} bytes decoded")
