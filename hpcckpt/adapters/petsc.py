"""The Block of a petsc4py ``Vec``: a plain parallel vector, or a global vector of a ``DMDA``.

A plain ``Vec`` is 1-D: this rank owns ``getOwnershipRange()`` of
``getSize()`` entries.  A vector whose DM is a DMDA (``da.createGlobalVec()``)
is the DMDA's grid: the global array has the axes PETSc indexes it by,
``(x, y, z)`` as far as the DMDA has dimensions, plus a last axis of ``dof``
components when ``dof > 1`` (the layout of ``da.getVecArray(vec)``, so
``hpcckpt.open`` reads ``u[i, j]`` where PETSc writes ``a[i, j]``); this rank
holds ``da.getRanges()``.  A DMDA's local (ghosted) vector is refused: save
the global one.

The vector's DM is asked for as PETSc's own ``VecGetDM`` finds it, with
``vec.query(DM_KEY)``, not ``vec.getDM()``: petsc4py 3.18 (Debian 12's) gives
``getDM()`` a base ``DM`` without the DMDA's methods, and takes no reference
for it while dropping one when it is freed, so each call leaves the DM's
count one short and the program crashes at exit; ``query`` returns the DM as
its own class (a ``DMDA``) with a reference of its own on 3.18 and on current
petsc4py alike.

The Block holds a getter: ``vec.getArray()`` is asked for at every save and
restore, so PETSc's get/restore of the array (and its object state, which
caches norms) follow each one.  Nothing from petsc4py is imported here.
"""

from __future__ import annotations

import math

from hpcckpt.errors import TemplateMismatchError
from hpcckpt.state import Block

#: the name under which PETSc's VecSetDM composes a vector's DM: VecGetDM is PetscObjectQuery of it
#: (src/dm/interface/dm.c, the same in PETSc 3.18 and 3.26)
DM_KEY = "__PETSc_dm"


def vec_block(vec) -> Block:
    """The Block of ``vec`` (1-D, or the DMDA's grid for a DMDA global vector)."""
    dm = vec.query(DM_KEY)  # None for a vector without a DM
    if dm is not None and dm.getType() == "da":
        return _dmda_block(vec, dm)
    lo, hi = vec.getOwnershipRange()
    return Block(vec.getArray, (int(lo),), (int(vec.getSize()),))


def _dmda_block(vec, da) -> Block:
    ranges = [(int(s), int(e)) for s, e in da.getRanges()]
    counts = [e - s for s, e in ranges]
    dof = int(da.getDof())
    if vec.getLocalSize() != math.prod(counts) * dof:
        raise TemplateMismatchError(
            f"a DMDA vector of local size {vec.getLocalSize()} is not the DMDA's global vector (owned box "
            f"{counts} x {dof} dof): save the global vector, not a local (ghosted) one")
    components = (dof,) if dof > 1 else ()
    offset = tuple(s for s, _ in ranges) + (0,) * len(components)
    global_shape = tuple(int(n) for n in da.getSizes()) + components
    # PETSc stores x fastest, then y, z, with the dof components innermost: C order (z, y, x, dof).
    stored = tuple(reversed(counts)) + (dof,)
    to_xyz = tuple(reversed(range(len(counts)))) + (len(counts),)

    def local():
        arr = vec.getArray().reshape(stored).transpose(to_xyz)
        return arr if components else arr[..., 0]

    return Block(local, offset, global_shape)
