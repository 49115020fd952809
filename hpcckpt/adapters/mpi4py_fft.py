"""The Block of an mpi4py-fft ``DistArray`` (physical or spectral, any pencil, any tensor rank).

A ``DistArray`` is a numpy array subclass holding this rank's pencil of the
global array: ``substart`` is its global start and ``global_shape`` the whole
array's shape (the leading ``rank`` axes of a vector or tensor field are not
distributed and start at 0).  The Block's ``local`` is a plain numpy view of
the DistArray's memory, so a load fills the DistArray in place.  Nothing
from mpi4py_fft is imported here.
"""

from __future__ import annotations

import numpy as np

from hpcckpt.errors import TemplateMismatchError
from hpcckpt.state import Block


def distarray_block(a) -> Block:
    """``Block(view of a, a.substart, a.global_shape)``; a 1-D DistArray (not distributed) is refused."""
    if a.pencil is None:
        raise TemplateMismatchError(
            "a 1-D mpi4py-fft DistArray is not distributed (every rank holds all of it): save np.asarray(a) "
            "as a replicated value, or Block(np.asarray(a)) on one rank")
    return Block(np.asarray(a), tuple(int(s) for s in a.substart), tuple(int(g) for g in a.global_shape))
