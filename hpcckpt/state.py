"""How an application describes its distributed state: Block, Ragged and plain values.

A state is a flat dict (hpcckpt.stateful resolves Stateful objects, callables,
getters and nested dicts into one before any stage sees it).  ``Block`` and ``Ragged`` values are distributed (each
rank holds a part of one global array); every other value is replicated and
stored once, from rank 0.  This module turns those objects into small,
JSON-able summaries that rank 0 plans with (see core/planning.py); it does no I/O
and no MPI.  Construction never raises for bad data: problems are found inside
the collective save/load, where every rank learns of them together.
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

from hpcckpt.core.devices import as_local_array, is_device_array
from hpcckpt.core.encoding import dtype_to_json
from hpcckpt.errors import TemplateMismatchError
from hpcckpt.core.names import state_name_problem


class Block:
    """This rank's rectangular part of a global N-d array.

    ``local`` is a numpy or CuPy array (any layout: C, Fortran or strided views;
    a CuPy array is compressed on its device and crosses to the host once, see
    docs/compression.md, "GPU ranks"),
    ``offset`` the global index of its first element, ``global_shape`` the
    shape of the whole array.  Blocks of all ranks must tile the global array
    without overlap (unless declared ``replicated``); a rank may hold an empty block.  ``Block(a)`` alone means
    the rank holds the whole array (for single-process use).  On load the
    block is filled in place.  ``codec`` compresses this variable (a name such
    as "lz4", "zstd", "auto", or ``hpcckpt.codecs.Lossy(...)``; see
    docs/compression.md); None uses the save's ``codec`` option.

    ``local`` may be a getter instead (``Block(lambda: u, offset, shape)``):
    it is called at every save and restore, so the Block follows an array the
    application rebinds (``u, un = un, u``); a plain Block keeps the array it
    was built with (see hpcckpt.stateful).

    ``replicated=True`` declares copies: the blocks of this variable may
    overlap (an array decomposed over part of the process grid and identical
    on the other ranks, or an array every rank holds whole); every rank must
    declare it alike.  Each element is saved once, by the lowest rank that
    holds it, and every save compares the copies (a digest per shared region,
    at the commit): copies that differ are a CheckpointError on every rank
    naming the variable, two ranks and the region.  Load templates may overlap
    without it.
    """

    def __init__(self, local, offset=None, global_shape=None, codec=None, replicated: bool = False):
        self.local = plain_ndarray(local)
        self.codec = codec  # None: the save's default (see hpcckpt.codecs)
        self.replicated = bool(replicated)
        if callable(local):  # a getter (hpcckpt.stateful): the defaults come from the array it returns
            self.offset = tuple(offset) if offset is not None else None
            self.global_shape = tuple(global_shape) if global_shape is not None else None
            return
        shape = getattr(local, "shape", ())
        self.offset = tuple(offset) if offset is not None else (0,) * len(shape)
        self.global_shape = tuple(global_shape) if global_shape is not None else tuple(shape)

    def __repr__(self) -> str:
        shape = getattr(self.local, "shape", None)
        rep = ", replicated=True" if self.replicated else ""
        return f"Block(local shape {shape}, offset={self.offset}, global_shape={self.global_shape}{rep})"


class Ragged:
    """This rank's rows (first axis) of a global table, concatenated in rank order.

    At save, ``local`` holds the rows (None for none), or is a getter called
    at every save (``Ragged(lambda: parts)``, see hpcckpt.stateful).  At load, ``Ragged()``
    asks for an even split of the rows and ``Ragged(rows=k)`` for k rows; the
    counts of all ranks must add up to the stored total.  Load returns a new
    ``Ragged`` whose ``local`` holds the loaded rows.
    """

    def __init__(self, local=None, rows=None, codec=None):
        self.local = local
        self.rows = rows
        self.codec = codec  # None: the save's default (see hpcckpt.codecs)

    def __repr__(self) -> str:
        shape = getattr(self.local, "shape", None)
        return f"Ragged(local shape {shape}, rows={self.rows})"


class PerRank:
    """A value that legitimately differs between ranks (a per-rank RNG state, a rank's own counter).

    ``PerRank(value)`` in a state saves one entry per rank (each rank's
    ``value``, in the JSON forms of replicated values); every other
    non-distributed value must be equal on every rank, which each save checks.
    On load, a ``PerRank`` in the template (its ``value`` is not used) gives
    back ``PerRank(saved value of this rank)``.  On another rank count the load
    is a TemplateMismatchError on every rank, unless the template says
    ``PerRank(default, resize=True)``: then rank r gets the value saved by rank
    r if there was one, else ``default`` (entries of ranks beyond this run's
    count are not used).
    """

    def __init__(self, value=None, resize: bool = False):
        self.value = value
        self.resize = bool(resize)

    def __repr__(self) -> str:
        return f"PerRank({self.value!r})"

    def __eq__(self, other) -> bool:
        return isinstance(other, PerRank) and other.value == self.value

    __hash__ = None


def plain_ndarray(local):
    """A numpy array subclass as a plain ndarray view of the same memory; anything else as it is.

    Subclasses may give indexing another meaning (Devito's ``Data`` indexes a
    distributed array by global indices under MPI): hpcckpt reads and fills
    the rank's own elements through a plain view, in place.
    """
    if isinstance(local, np.ndarray) and type(local) is not np.ndarray:
        return local.view(np.ndarray)
    return local


def is_distributed(value: Any) -> bool:
    return isinstance(value, (Block, Ragged))


def _check_array(name: str, arr, what: str) -> np.ndarray:
    if not isinstance(arr, np.ndarray) and not is_device_array(arr):
        raise TemplateMismatchError(
            f"variable {name!r}: {what} must be a numpy or CuPy array, got {type(arr).__name__}")
    if arr.dtype.hasobject:
        raise TemplateMismatchError(f"variable {name!r}: dtype {arr.dtype} holds Python objects (not storable)")
    return arr


def _int_tuple(name: str, what: str, values) -> tuple[int, ...]:
    try:
        return tuple(operator.index(v) for v in values)
    except TypeError:
        raise TemplateMismatchError(f"variable {name!r}: {what} must be a sequence of integers") from None


def block_box(name: str, block: Block) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The global box ``[start, stop)`` this rank's block covers, after local validation."""
    arr = _check_array(name, block.local, "the local part of a Block")
    offset = _int_tuple(name, "offset", block.offset)
    gshape = _int_tuple(name, "global_shape", block.global_shape)
    if not (len(offset) == len(gshape) == arr.ndim):
        raise TemplateMismatchError(
            f"variable {name!r}: local array has {arr.ndim} dimensions, offset {len(offset)}, "
            f"global_shape {len(gshape)}")
    stop = tuple(o + s for o, s in zip(offset, arr.shape))
    if any(o < 0 for o in offset) or any(g < 0 for g in gshape) or (arr.size and any(
            e > g for e, g in zip(stop, gshape))):
        raise TemplateMismatchError(
            f"variable {name!r}: block at offset {offset} with shape {arr.shape} does not fit in "
            f"global shape {gshape}")
    if arr.size == 0:  # an empty block places nothing; normalise it so tiling checks ignore it
        offset = tuple(min(o, g) for o, g in zip(offset, gshape))
        stop = offset
    return offset, stop


def summarize_for_save(name: str, value) -> dict:
    """The small description of one distributed variable that rank 0 plans the save with."""
    if isinstance(value, Block):
        start, stop = block_box(name, value)
        summary = {"kind": "block", "dtype": dtype_to_json(value.local.dtype), "shape": list(value.global_shape),
                   "start": list(start), "stop": list(stop)}
        if value.replicated:
            summary["replicated"] = True
        return summary
    local = value.local
    if local is None:
        return {"kind": "ragged", "dtype": None, "trailing": None, "rows": 0}
    arr = _check_array(name, as_local_array(local), "the local rows of a Ragged")
    if arr.ndim == 0:
        raise TemplateMismatchError(f"variable {name!r}: Ragged rows need at least one axis")
    return {"kind": "ragged", "dtype": dtype_to_json(arr.dtype), "trailing": list(arr.shape[1:]),
            "rows": int(arr.shape[0])}


def split_state(state) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split a state dict into (distributed variables, replicated values)."""
    if not isinstance(state, dict):
        raise TemplateMismatchError(f"the state must be a dict, got {type(state).__name__}")
    distributed, replicated = {}, {}
    for name, value in state.items():
        problem = state_name_problem(name)
        if problem:
            raise TemplateMismatchError(problem)
        (distributed if is_distributed(value) else replicated)[name] = value
    return distributed, replicated
