"""The transform stage of every save: this rank's selected arrays -> chunks -> stored bytes -> Pieces.

The same generator runs inline in a blocking save (over the caller's own
arrays: zero copy) and in the background writer of an asynchronous save (over
the staged copies).  Order per chunk: cut (whole arrays into pieces of at
most ``chunk_bytes``; incremental blocks stay whole) -> codec (in a thread
pool, codecs/pipeline.py) -> checksum (unless the transport hashes while it
writes, or the checksum is already known from the block's content hash).
"""

from __future__ import annotations

from hpcckpt.core.arrays import byte_view, local_pieces
from hpcckpt.core.checksum import checksum
from hpcckpt.transport.base import Piece


def raw_pieces(items, chunk_bytes: int):
    """``(variable, global start, count, array)`` of each chunk of ``items``, in order.

    ``items``: ``(variable, global start, array, cut)``; ``cut`` arrays are
    split into C-contiguous pieces of at most ``chunk_bytes`` (views of a
    C-ordered array), the others are one chunk each.
    """
    for variable, start, arr, cut in items:
        if not cut:
            yield variable, tuple(start), tuple(arr.shape), arr
            continue
        for local_start, extent, piece in local_pieces(arr, chunk_bytes):
            yield variable, tuple(b + s for b, s in zip(start, local_start)), extent, piece


def encoded_pieces(raw, encoder, timer, checksum_here: bool = True, digests: dict | None = None):
    """The Pieces of a stream of raw chunks: encoded by ``encoder`` (an EncodedPieces), then checksummed.

    ``digests``: checksums already known by ``(variable, start)`` (an
    uncompressed incremental block's, derived from its content hash);
    ``checksum_here=False`` leaves the others to a transport that hashes while
    it writes.
    """
    for variable, start, count, arr in encoder.wrap(raw, timer):
        payload = byte_view(arr)
        digest = digests.get((variable, tuple(start))) if digests else None
        if digest is None and checksum_here:
            with timer.phase("hash"):
                digest = checksum(payload)
        yield Piece(variable, start, count, payload, digest)
