"""The content hash of incremental blocks that live on a GPU: ``mix128``, computed where the data is.

An incremental save hashes every block to find the ones that changed.  For a
CuPy array that must happen on the device, so that only the changed blocks
cross to the host.  xxh3 (the host's hash, core.checksum.raw_hash) has no CuPy
implementation, so device blocks use this hash, written once against an array
module ``xp`` like the codec kernels (tests run it with numpy, tests/gpu
compares CuPy with numpy bit for bit):

    words w_i: the block's bytes as little-endian uint64, zero-padded to 8 bytes;
    lane_j = sum over i of fmix64(w_i XOR (i * K + S_j))  (mod 2^64), j = 0, 1;
    hash = lane_0 and lane_1 as 32 hex digits.

fmix64 (MurmurHash3's finaliser) is a bijection, so a block that differs in
one word always gets another hash; the position term makes moved words count.
It is a non-cryptographic 128-bit hash like xxh3_128: accidental collisions
are as unlikely as with xxh3, a deliberate one is easy (docs/incremental.md,
"Hash width and collisions").  Hashes of the two kinds are never compared
with each other: the key of a device block carries the hash's name (see
incremental.codec_key), so a variable that moves between GPU and CPU ranks
starts a fresh baseline for itself.
"""

from __future__ import annotations

import numpy as np

NAME = "mix128"
_K = np.uint64(0x9E3779B97F4A7C15)
_SEEDS = (np.uint64(0x243F6A8885A308D3), np.uint64(0x13198A2E03707344))
_M1, _M2 = np.uint64(0xFF51AFD7ED558CCD), np.uint64(0xC4CEB9FE1A85EC53)
_S33 = np.uint64(33)


def _fmix64(h):
    h = h ^ (h >> _S33)
    h = h * _M1
    h = h ^ (h >> _S33)
    h = h * _M2
    return h ^ (h >> _S33)


def _words(xp, data):
    """The flat uint8 array ``data`` as uint64 words, zero-padded to a multiple of 8 bytes."""
    tail = data.nbytes % 8
    if tail:
        data = xp.concatenate([data, xp.zeros(8 - tail, np.uint8)])
    elif (data.ctypes.data if xp is np else data.data.ptr) % 8:
        data = data.copy()  # a GPU reads 8-byte words only from 8-byte aligned addresses
    return data.view(np.uint64)


def mix128(xp, data) -> str:
    """The mix128 hash (32 hex digits) of the flat C-contiguous uint8 array ``data`` of module ``xp``."""
    words = _words(xp, data.reshape(-1).view(np.uint8))
    index = xp.arange(words.size, dtype=np.uint64)
    lanes = xp.stack([words ^ (index * _K + seed) for seed in _SEEDS])
    low, high = _fmix64(lanes).sum(axis=1, dtype=np.uint64).tolist()
    return f"{int(low):016x}{int(high):016x}"
