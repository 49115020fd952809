"""The device block hash (hpcckpt/core/blockhash.py), run with numpy as CI's stand-in for CuPy.

tests/gpu/test_gpu_state.py checks that CuPy gives these same digests.
"""

from __future__ import annotations

import numpy as np
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcckpt.core import blockhash
from hpcckpt.codecs import nvcomp


def _reference(data: bytes) -> str:
    """The hash from its definition (docstring of core/blockhash.py), in plain Python integers."""
    mask = (1 << 64) - 1
    padded = data + bytes(-len(data) % 8)
    words = [int.from_bytes(padded[i:i + 8], "little") for i in range(0, len(padded), 8)]

    def fmix(h):
        h ^= h >> 33
        h = (h * 0xFF51AFD7ED558CCD) & mask
        h ^= h >> 33
        h = (h * 0xC4CEB9FE1A85EC53) & mask
        return h ^ (h >> 33)

    lanes = [sum(fmix(w ^ ((i * 0x9E3779B97F4A7C15 + seed) & mask)) for i, w in enumerate(words)) & mask
             for seed in (0x243F6A8885A308D3, 0x13198A2E03707344)]
    return f"{lanes[0]:016x}{lanes[1]:016x}"


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=300))
def test_mix128_matches_its_definition(data):
    assert blockhash.mix128(np, np.frombuffer(data, np.uint8)) == _reference(data)


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=1, max_size=2000), st.data())
def test_changing_one_word_always_changes_the_hash(data, draw):
    """fmix64 is a bijection: a block that differs in a single 8-byte word never keeps its hash."""
    a = np.frombuffer(data, np.uint8).copy()
    b = a.copy()
    i = draw.draw(st.integers(0, len(a) - 1))
    b[i] ^= draw.draw(st.integers(1, 255))
    assert blockhash.mix128(np, a) != blockhash.mix128(np, b)


def test_swapped_words_and_unaligned_views_hash_consistently():
    words = np.arange(1000, dtype=np.uint64)
    swapped = words.copy()
    swapped[[3, 700]] = swapped[[700, 3]]
    assert blockhash.mix128(np, words.view(np.uint8)) != blockhash.mix128(np, swapped.view(np.uint8))
    raw = np.random.default_rng(0).integers(0, 256, 4099, dtype=np.uint8)
    assert blockhash.mix128(np, raw[3:]) == blockhash.mix128(np, raw[3:].copy())


def test_device_hashes_never_look_like_host_hashes():
    digest = blockhash.mix128(np, np.zeros(16, np.uint8))
    assert len(digest) == 32 and digest != xxhash.xxh3_128_hexdigest(bytes(16))


def test_nvcomp_is_opt_in_and_says_why_it_is_not_used(monkeypatch):
    monkeypatch.delenv(nvcomp.ENABLE, raising=False)
    assert nvcomp.status()["zstd"].startswith("off")
    monkeypatch.setenv(nvcomp.ENABLE, "1")
    monkeypatch.setattr(nvcomp, "_disabled", {})
    try:
        import nvidia.nvcomp  # noqa: F401
    except ImportError:  # CI: not installed, so unusable, with the reason
        assert nvcomp.status()["zstd"].startswith("unusable: ")
