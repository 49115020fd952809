"""The Block of a Devito ``Function`` or ``TimeFunction`` (any grid, any MPI decomposition, every time buffer).

Under MPI (``DEVITO_MPI=1``) a Devito function's ``shape`` is this rank's
part and ``shape_global`` the whole array's; ``local_indices`` holds, per
dimension, the slice of global indices this rank owns (for the time
dimension of a TimeFunction: all its buffers, every rank alike).  ``data``
is the rank's domain region, without halo; the Block's ``local`` is a plain
numpy view of it, so that a load fills the function in place.  Taking
``data`` marks the halo out of date, so the next operator run exchanges it.
Nothing from devito is imported here.
"""

from __future__ import annotations

import numpy as np

from hpcckpt.state import Block


def function_block(f) -> Block:
    """``Block(view of f.data, start of each f.local_indices, f.shape_global)``."""
    return Block(f.data.view(np.ndarray), tuple(int(s.start) for s in f.local_indices),
                 tuple(int(n) for n in f.shape_global))
