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


def new_hasher():
    """A streaming xxh3_64: ``update`` it piece by piece; same digest as :func:`checksum` of the whole."""
    return xxhash.xxh3_64()


def hexdigest(hasher) -> str:
    return format(hasher.intdigest(), "016x")
