"""Adapters: the Block of a distributed-array library's object (mpi4py-fft, petsc4py, heat, your own).

A distributed-array library already knows, on every rank, which part of the
global array this rank holds.  An adapter says it in hpcckpt's words: it
turns the library's object into a ``Block(local, offset, global_shape)`` whose
``local`` is a numpy view of the object's own memory, so that a save reads it
and a load fills the object in place::

    import hpcckpt
    from hpcckpt.adapters import block
    state = {"u": block(u), "step": step}       # u: an mpi4py-fft DistArray, a petsc4py Vec ...
    hpcckpt.save(state, path, step=step)
    hpcckpt.load(state, path)                   # on any rank count: u holds the saved values

The protocol is one function ``fn(obj) -> Block``.  It comes from, in this order:

1. an adapter registered for the object's class or one of its base classes,
   with :func:`register_adapter` (a class, or its ``"module.QualName"`` so the
   library need not be imported to register it);
2. the object's own ``__hpcckpt_block__()`` method (for a library that wants
   to support hpcckpt itself).

Built in: ``mpi4py_fft.distarray.DistArray`` (hpcckpt/adapters/mpi4py_fft.py),
``petsc4py.PETSc.Vec`` (hpcckpt/adapters/petsc.py, plain and DMDA vectors),
heat's ``DNDarray`` (hpcckpt/adapters/heat.py) and Devito's ``Function`` and
``TimeFunction`` (hpcckpt/adapters/devito.py).  They are registered by name and use only the object's attributes:
importing hpcckpt imports none of these libraries.
"""

from __future__ import annotations

from typing import Any, Callable

from hpcckpt.errors import TemplateMismatchError
from hpcckpt.state import Block
from hpcckpt.adapters import devito, heat, mpi4py_fft, petsc

__all__ = ["block", "register_adapter"]

#: class (or "module.QualName") -> fn(obj) -> Block
_ADAPTERS: dict[Any, Callable[[Any], Block]] = {}


def _class_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def register_adapter(cls, fn: Callable[[Any], Block]) -> None:
    """Make ``block(obj)`` call ``fn(obj)`` for every instance of ``cls`` (a class or ``"module.QualName"``).

    A later registration for the same class replaces the earlier one (the way
    to override a built-in adapter).
    """
    if not (isinstance(cls, type) or (isinstance(cls, str) and cls)):
        raise TypeError(f"register_adapter: cls must be a class or a 'module.QualName' string, got {cls!r}")
    if not callable(fn):
        raise TypeError(f"register_adapter: fn must be callable, got {type(fn).__name__}")
    _ADAPTERS[cls] = fn


def _adapter_for(obj) -> Callable[[Any], Block] | None:
    for cls in type(obj).__mro__:
        fn = _ADAPTERS.get(cls) or _ADAPTERS.get(_class_name(cls))
        if fn is not None:
            return fn
    method = getattr(obj, "__hpcckpt_block__", None)
    return method and (lambda _obj: method())


def block(obj, codec=None) -> Block:
    """The ``Block`` that saves ``obj`` (a distributed-array object) and that a load fills in place.

    ``codec``: as for ``Block`` (None: the save's codec).  An object no adapter
    knows is a ``TemplateMismatchError`` naming its class; so is an adapter
    that returns something other than a Block.
    """
    fn = _adapter_for(obj)
    if fn is None:
        raise TemplateMismatchError(
            f"no hpcckpt adapter for {_class_name(type(obj))}: register one with "
            "hpcckpt.adapters.register_adapter(cls, fn) or give the class a __hpcckpt_block__() method")
    out = fn(obj)
    if not isinstance(out, Block):
        raise TemplateMismatchError(
            f"the hpcckpt adapter for {_class_name(type(obj))} returned {type(out).__name__}, not a hpcckpt.Block")
    if codec is not None:
        out.codec = codec
    return out


register_adapter("mpi4py_fft.distarray.DistArray", mpi4py_fft.distarray_block)
register_adapter("petsc4py.PETSc.Vec", petsc.vec_block)
register_adapter("heat.core.dndarray.DNDarray", heat.dndarray_block)
register_adapter("devito.types.dense.Function", devito.function_block)
