"""Zero-copy byte views of numpy arrays, and the pieces a local array is written in."""

from __future__ import annotations

from typing import Iterator

import numpy as np

from hpcckpt.core.devices import array_module
from hpcckpt.core.regions import contiguous_pieces


def byte_view(arr: np.ndarray) -> np.ndarray:
    """A flat uint8 view of a C-contiguous array, without copying (works for every dtype)."""
    return arr.reshape(-1).view(np.uint8)


def local_pieces(local: np.ndarray, max_bytes: int) -> Iterator[tuple[tuple[int, ...], tuple[int, ...], np.ndarray]]:
    """(local start, extent, C-contiguous array) for each piece of at most ``max_bytes``.

    For a C-contiguous ``local`` every piece is a view of the caller's memory;
    for Fortran-ordered or strided arrays each piece is copied, so the extra
    memory is one piece, never the whole array.  A CuPy array's pieces stay on
    its device.  Every piece keeps ``local``'s dtype, byte order included: the
    selection ends in ``...`` so that the one piece of a 0-d array is a 0-d view,
    not the native-order numpy scalar that ``local[()]`` would be.
    """
    xp = array_module(local)
    for start, stop in contiguous_pieces(local.shape, local.dtype.itemsize, max_bytes):
        sel = tuple(slice(a, b) for a, b in zip(start, stop)) + (Ellipsis,)
        extent = tuple(b - a for a, b in zip(start, stop))
        yield start, extent, xp.ascontiguousarray(local[sel])
