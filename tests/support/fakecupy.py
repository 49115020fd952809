"""A numpy-backed stand-in for CuPy, so that CI (no GPU) runs hpcckpt's device code paths.

``install(monkeypatch)`` puts fake ``cupy`` and ``cupyx`` modules into
``sys.modules``.  ``FakeDeviceArray`` wraps a numpy array the way a CuPy array
wraps device memory: it has ``__cuda_array_interface__``, ``.device``,
``.get()`` / ``.set()``, and, like CuPy, refuses implicit conversion to numpy
(``np.asarray(fake)`` raises TypeError), so a host-only code path that a
device array reaches by mistake fails here as it would on a GPU.  Every other
attribute, operator and module function is numpy's, with arrays wrapped and
unwrapped on the way.  tests/gpu/ runs the same paths on a real GPU; this is
what keeps them honest on machines without a GPU.
"""

from __future__ import annotations

import contextlib
import sys
import types

import numpy as np


def _unwrap(obj):
    if isinstance(obj, FakeDeviceArray):
        return obj._a
    if isinstance(obj, (list, tuple)):
        return type(obj)(_unwrap(o) for o in obj)
    return obj


def _wrap(obj):
    if isinstance(obj, np.ndarray):
        return FakeDeviceArray(obj)
    if isinstance(obj, tuple):
        return tuple(_wrap(o) for o in obj)
    return obj


def _wrapped(fn):
    def call(*args, **kwargs):
        return _wrap(fn(*_unwrap(args), **{k: _unwrap(v) for k, v in kwargs.items()}))
    return call


class _Pointer:
    def __init__(self, a):
        self.ptr = a.ctypes.data


class FakeDeviceArray:
    """A numpy array posing as device memory (see the module docstring)."""

    def __init__(self, a: np.ndarray):
        self._a = a

    @property
    def __cuda_array_interface__(self):
        return {"shape": self._a.shape, "typestr": self._a.dtype.str, "data": (self._a.ctypes.data, False),
                "version": 3}

    @property
    def device(self):
        return contextlib.nullcontext()

    @property
    def data(self):
        return _Pointer(self._a)

    def __array__(self, *args, **kwargs):
        raise TypeError("Implicit conversion to a NumPy array is not allowed (as in CuPy)")

    def get(self, stream=None, order="C", out=None):
        if out is None:
            return self._a.copy()
        assert out.flags.c_contiguous and out.shape == self._a.shape and out.dtype == self._a.dtype
        out[...] = self._a
        return out

    def set(self, arr):
        assert isinstance(arr, np.ndarray) and self._a.flags.c_contiguous and arr.shape == self._a.shape
        self._a[...] = arr

    def __getitem__(self, key):
        return _wrap(self._a[_unwrap(key)])

    def __setitem__(self, key, value):
        if isinstance(value, np.ndarray):
            raise TypeError("a host array must be moved with cupy.asarray first (as the real path does)")
        self._a[_unwrap(key)] = _unwrap(value)

    def __len__(self):
        return len(self._a)

    def __iter__(self):
        return (_wrap(x) for x in self._a)

    def __int__(self):
        return int(self._a)

    def __float__(self):
        return float(self._a)

    def __bool__(self):
        return bool(self._a)

    def __getattr__(self, name):
        if name.startswith("__"):  # no __array_interface__ & co: numpy must not see through the fake
            raise AttributeError(name)
        value = getattr(self._a, name)
        return _wrapped(value) if callable(value) else _wrap(value)

    def __repr__(self):
        return f"FakeDeviceArray({self._a!r})"


def _binary(name):
    def op(self, other):
        return _wrap(getattr(self._a, name)(_unwrap(other)))
    return op


for _name in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "and", "or", "xor", "lshift", "rshift",
              "eq", "ne", "lt", "le", "gt", "ge", "radd", "rsub", "rmul", "rtruediv", "rand", "ror", "rxor",
              "iadd", "isub", "imul", "itruediv", "iand", "ior", "ixor"):
    setattr(FakeDeviceArray, f"__{_name}__", _binary(f"__{_name}__"))
FakeDeviceArray.__neg__ = lambda self: _wrap(-self._a)
FakeDeviceArray.__invert__ = lambda self: _wrap(~self._a)


def _module() -> types.ModuleType:
    cupy = types.ModuleType("cupy")
    cupy.ndarray = FakeDeviceArray

    def asarray(obj, dtype=None):
        return FakeDeviceArray(np.array(_unwrap(obj), dtype=dtype, copy=True))

    def asnumpy(obj):
        return obj.get() if isinstance(obj, FakeDeviceArray) else np.asarray(obj)

    cupy.asarray = cupy.array = asarray
    cupy.asnumpy = asnumpy
    cupy.ascontiguousarray = lambda a: _wrap(np.ascontiguousarray(_unwrap(a)))
    cupy.get_array_module = lambda *args: cupy
    cupy.__getattr__ = lambda name: _wrapped(getattr(np, name)) if callable(getattr(np, name)) else getattr(np, name)
    cuda = types.SimpleNamespace(Device=lambda *a: types.SimpleNamespace(synchronize=lambda: None))
    cupy.cuda = cuda
    return cupy


def install(monkeypatch):
    """Make ``import cupy`` / ``import cupyx`` give the fakes for the rest of the test; return the fake cupy."""
    cupy = _module()
    cupyx = types.ModuleType("cupyx")
    cupyx.empty_pinned = lambda shape, dtype=np.float64, order="C": np.empty(shape, dtype, order)
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setitem(sys.modules, "cupyx", cupyx)
    return cupy
