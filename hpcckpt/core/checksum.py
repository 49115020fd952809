"""Chunk checksums: xxHash's xxh3 (64 bit), written as 16 lower-case hex digits.

xxh3 runs at memory bandwidth, so checksumming every chunk on save and on every
read costs little next to the I/O.  Its 64 bits make an undetected random
corruption of a chunk a 2^-64 event; it is not a defence against an attacker
who can write the files (nothing short of a signature is).
"""

from __future__ import annotations

import xxhash


def checksum(buffer) -> str:
    """The checksum of a contiguous buffer (bytes, memoryview, C-contiguous numpy array)."""
    view = memoryview(buffer)
    if view.ndim != 1 or view.format != "B":
        view = view.cast("B")
    return format(xxhash.xxh3_64_intdigest(view), "016x")


#: Step of the fused read/write + checksum loops: small enough to stay in cache, so
#: the checksum reads the bytes that the copy just touched instead of going to DRAM again.
PIECE = 256 << 10


#: Above this many bytes, XXH3 hashes every input the same way for its 64- and 128-bit digests.
_XXH3_MIDSIZE_MAX = 240


def checksum_from_xxh3_128(digest128: str, nbytes: int) -> str | None:
    """The checksum of a buffer of ``nbytes`` bytes whose xxh3_128 hex digest is ``digest128``; None when too short.

    Past 240 bytes XXH3's 64-bit digest is the low half of its 128-bit one (the
    same accumulator loop and the same final merge; XXH3's output is frozen
    since xxHash 0.8.0), so an incremental save, which hashes every block with
    xxh3_128 anyway, gets the checksum of each block it writes without another
    pass over the bytes.  Shorter inputs take different paths: checksum them.
    """
    return digest128[16:] if nbytes > _XXH3_MIDSIZE_MAX else None


def new_hasher():
    """A streaming xxh3_64: ``update`` it piece by piece; same digest as :func:`checksum` of the whole."""
    return xxhash.xxh3_64()


def hexdigest(hasher) -> str:
    return format(hasher.intdigest(), "016x")


def raw_hash(buffer) -> str:
    """xxh3_128 of a contiguous host buffer, 32 lower-case hex digits."""
    view = memoryview(buffer)
    if view.ndim != 1 or view.format != "B":
        view = view.cast("B")
    return xxhash.xxh3_128_hexdigest(view)
