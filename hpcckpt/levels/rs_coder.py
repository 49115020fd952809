"""The Reed-Solomon arithmetic of the RS level on plain blocks: ISA-L's Cauchy code, through PyECLib.

The level (levels/rs.py) has blocks, not payloads: a stripe leader holds the
k data segments of its stripe (received from other ranks' files) and wants
its m check blocks; a rebuilding member holds k surviving shards and wants
one data segment.  PyECLib (liberasurecode with Intel ISA-L, bundled in its
wheel) encodes one payload into k + m *fragments*, each a liberasurecode
header followed by the block, and decodes only such fragments.  So:

* encoding passes the k segments, contiguous (levels/rs.py receives them so),
  as the payload: the code is systematic and a payload of k * r bytes becomes
  k data fragments that are exactly the segments, and m check fragments whose
  blocks (the last r bytes) are the check blocks;
* decoding puts each shard behind the header the library itself wrote for a
  fragment at that position of a payload of the same size.  With no fragment
  checksum (the driver's default), a header depends only on the position and
  the sizes, never on the bytes (tests/levels/test_rs_layout.py checks it), so the
  headers of an all-zero payload of k * r bytes, computed once per size and
  kept, frame any shards of r bytes.

Only the blocks are stored (the parity files hold no header); the coder's
name, :data:`CODER`, is recorded in each version's ``extra.levels.rs`` so that
a reader knows which code made its check blocks.  ``isa_l_rs_cauchy`` and not
``isa_l_rs_vand``: ISA-L's Vandermonde-based matrix is not MDS for every
(k, m) (with m >= 5 some patterns of m losses cannot be decoded; liberasurecode
and Swift document it), its Cauchy matrix is, for any k + m <= 256.
"""

from __future__ import annotations

import functools

import numpy as np

#: The code that makes the check blocks, as PyECLib names it; recorded in ``extra.levels.rs.coder``.
CODER = "isa_l_rs_cauchy"


def missing() -> str | None:
    """Why the coder cannot run here (PyECLib or its ISA-L backend is missing), or None."""
    try:
        from pyeclib.ec_iface import ECDriverError
    except ImportError:
        return "rs_every needs the PyECLib library: pip install 'hpcckpt[rs]' (or pyeclib; its wheel bundles ISA-L)"
    try:
        driver(1, 1)
    except ECDriverError as exc:  # a PyECLib built against a liberasurecode without ISA-L
        return f"rs_every needs PyECLib's ISA-L backend ({CODER}), which does not load here: {exc}"
    return None


def driver(k: int, m: int):
    """A PyECLib driver of the (k, m) code (cheap to make: tens of microseconds)."""
    from pyeclib.ec_iface import ECDriver

    return ECDriver(k=k, m=m, ec_type=CODER)


def encode(k: int, m: int, stripe: np.ndarray) -> list[memoryview]:
    """The m check blocks of a stripe: ``stripe``, a contiguous uint8 array, is its k data segments in order.

    The array is handed to the library as it is (no copy: PyECLib's ``y#``
    argument takes numpy arrays, though not memoryviews or bytearrays, which
    carry a buffer-release hook); the last data fragment is compared with the
    last segment, so a library that framed its fragments otherwise is found.
    """
    r = stripe.nbytes // k
    fragments = driver(k, m).encode(stripe)
    blocks = [memoryview(f)[len(f) - r:] for f in fragments]
    if not np.array_equal(np.frombuffer(blocks[k - 1], np.uint8), stripe[(k - 1) * r:]):  # pads or moves it
        raise RuntimeError(f"PyECLib {CODER} fragments are not a header followed by the block here: the check "
                           "blocks cannot be taken from them")
    return blocks[k:]


@functools.lru_cache(maxsize=16)
def _headers(k: int, m: int, r: int) -> tuple[bytes, ...]:
    """The fragment headers of positions 0..k+m-1 for blocks of r bytes (made by the library, see above)."""
    return tuple(f[:len(f) - r] for f in driver(k, m).encode(bytes(k * r)))


def decode(k: int, m: int, shards: list, positions: list[int], wanted: int) -> memoryview:
    """Data segment ``wanted`` (not among ``positions``) of a stripe from k shards of r bytes at ``positions``."""
    r = memoryview(shards[0]).nbytes
    headers = _headers(k, m, r)
    frames = [b"".join((headers[q], s)) for q, s in zip(positions, shards)]
    fragment = driver(k, m).reconstruct(frames, [wanted])[0]
    return memoryview(fragment)[len(fragment) - r:]
