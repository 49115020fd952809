"""The Block of a heat ``DNDarray`` split along one axis (any split axis, any number of dimensions).

A DNDarray with ``split=k`` holds, on each rank of ``a.comm``, a slab of the
global array ``a.gshape`` along axis ``k``; its local part is the torch tensor
``a.larray``.  The slab's start on axis ``k`` is heat's own: where heat knows
the array is balanced, ``a.comm.chunk(gshape, split)`` (no communication);
otherwise the displacements of ``a.counts_displs()``, which is collective over
``a.comm`` like heat's own operations.  The Block's ``local`` is a getter
returning a numpy view of ``a.larray`` (a CPU tensor's ``.numpy()`` shares its
memory), asked for at every save and restore, so a load fills the DNDarray in
place even after heat rebinds ``larray``.  A DNDarray that is not split (every
rank holds all of it), one on a GPU, or one of a dtype numpy lacks
(``bfloat16``) is refused.  Nothing from heat or torch is imported here.
"""

from __future__ import annotations

from hpcckpt.errors import TemplateMismatchError
from hpcckpt.state import Block


def dndarray_block(a) -> Block:
    """``Block(view of a.larray, a's slab start, a.gshape)``; see the module docstring for what is refused."""
    if a.split is None:
        raise TemplateMismatchError(
            "a heat DNDarray with split=None is not distributed (every rank holds all of it): save "
            "a.larray.numpy() as a replicated value, or resplit_ it along an axis")
    tensor = a.larray
    if tensor.device.type != "cpu":
        raise TemplateMismatchError(
            f"the heat DNDarray is on {tensor.device}: hpcckpt saves a DNDarray's memory as a numpy view, so "
            "save a CPU one (a.cpu())")
    try:
        tensor.new_empty(0).numpy()
    except TypeError as exc:
        raise TemplateMismatchError(f"a heat DNDarray of torch dtype {tensor.dtype} has no numpy view: {exc}") from exc
    split = int(a.split)
    offset = [0] * a.ndim
    offset[split] = _slab_start(a, split)
    return Block(lambda: a.larray.numpy(), tuple(offset), tuple(int(g) for g in a.gshape))


def _slab_start(a, split: int) -> int:
    if a.balanced is True:
        return int(a.comm.chunk(a.gshape, split)[0])
    return int(a.counts_displs()[1][a.comm.rank])
