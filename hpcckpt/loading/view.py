"""``hpcckpt.open``: a read-only view of one committed checkpoint, from one plain Python process (no MPI).

Any global region of any variable, the replicated values, and a full
verification of every chunk; built on reader.ChunkReader.  Like h5py,
``view["u"]`` is a lazy :class:`VariableView`: numpy basic indexing on it
reads only the chunks the selected region overlaps.
"""

from __future__ import annotations

import os

import numpy as np

from hpcckpt.core.encoding import decode_value
from hpcckpt.errors import CheckpointError
from hpcckpt.format.metadata import Variable
from hpcckpt.storage.metadata_file import read_metadata
from hpcckpt.loading.reader import ChunkReader, allocate
from hpcckpt.storage import POSIX, Storage


class CheckpointView:
    """A read-only view of one committed checkpoint, usable from a single plain Python process.

    ``variables`` maps names to their stored description (kind, global shape,
    dtype, chunks), ``values`` holds the replicated values, ``read(name, region)``
    returns any global region of a variable as a new numpy array.
    """

    def __init__(self, path: str, storage: Storage = POSIX):
        self.path = os.fspath(path)
        self.storage = storage
        self.meta = read_metadata(self.path, storage)
        self.values = {name: decode_value(v, repr(name)) for name, v in self.meta.values.items()}
        self._reader = ChunkReader(self.path, self.meta, storage)

    @property
    def step(self) -> int | None:
        return self.meta.step

    @property
    def variables(self) -> dict[str, Variable]:
        return self.meta.variables

    def read(self, name: str, region=None) -> np.ndarray:
        """The global ``region`` of variable ``name``: None for all, or a tuple of slices/ints, or (start, stop) pairs."""
        if name not in self.meta.variables:
            raise CheckpointError(f"no variable {name!r} in {self.path} (it has {sorted(self.meta.variables)})")
        var = self.meta.variables[name]
        start, stop, squeeze = _region_box(region, var.shape, name)
        out = self._read_box(var, start, stop)
        return out.reshape(tuple(n for i, n in enumerate(out.shape) if i not in squeeze)) if squeeze else out

    def _read_box(self, var: Variable, start, stop) -> np.ndarray:
        """The global box ``[start, stop)`` of ``var`` as a new array; reads only the chunks it overlaps."""
        out = allocate(tuple(b - a for a, b in zip(start, stop)), var.dtype, var.name)
        self._reader.read_into(var, start, stop, out)
        return out

    def __getitem__(self, name: str) -> "VariableView":
        """A lazy view of variable ``name`` (nothing is read until it is indexed or converted)."""
        if not isinstance(name, str) or name not in self.meta.variables:
            hint = f"; {name!r} is a replicated value: use view.values[{name!r}]" \
                if isinstance(name, str) and name in self.values else ""
            raise KeyError(f"no variable {name!r} in {self.path} (its variables: {sorted(self.meta.variables)}"
                           f"{hint})")
        return VariableView(self, self.meta.variables[name])

    def __contains__(self, name) -> bool:
        return name in self.meta.variables

    def __iter__(self):
        return iter(self.meta.variables)

    def __len__(self) -> int:
        return len(self.meta.variables)

    def __bool__(self) -> bool:
        return True  # a view of a checkpoint with no distributed variables is still a view

    def keys(self):
        """The names of the distributed variables (the replicated values are in ``values``)."""
        return self.meta.variables.keys()

    def __repr__(self) -> str:
        lines = [f"<hpcckpt checkpoint {self.path!r}, step {self.step}, {len(self)} variable"
                 f"{'' if len(self) == 1 else 's'}, {len(self.values)} value{'' if len(self.values) == 1 else 's'}"]
        names = list(self.meta.variables)
        for name in names[:_REPR_ROWS]:
            var = self.meta.variables[name]
            lines.append(f"  {name!r}: {var.kind} {tuple(var.shape)} {var.dtype}")
        if len(names) > _REPR_ROWS:
            lines.append(f"  ... {len(names) - _REPR_ROWS} more")
        if self.values:
            shown = ", ".join(repr(n) for n in list(self.values)[:_REPR_ROWS])
            lines.append(f"  values: {shown}{', ...' if len(self.values) > _REPR_ROWS else ''}")
        return "\n".join(lines) + ">"

    def verify(self, progress=None) -> list[str]:
        """Check every chunk's presence, length and checksum; the list of problems found (empty when sound)."""
        problems = []
        for var in self.meta.variables.values():
            problems.extend(self._reader.verify_variable(var, progress))
        return problems

    def close(self) -> None:
        self._reader.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


_REPR_ROWS = 20


class VariableView:
    """A lazy, read-only, array-like view of one variable of a :class:`CheckpointView` (``view["u"]``).

    ``shape``, ``dtype``, ``ndim``, ``size``, ``nbytes``, ``len()``; numpy basic
    indexing (ints, slices with any step, ``...``, ``None``) reads the bounding
    box of the selection -- only the chunks it overlaps -- then applies the
    steps; ``np.asarray(v)`` reads it all.  Out-of-range integers raise
    IndexError as numpy does.
    """

    def __init__(self, view: CheckpointView, var: Variable):
        self._view = view
        self.variable = var

    name = property(lambda self: self.variable.name)
    kind = property(lambda self: self.variable.kind)
    dtype = property(lambda self: self.variable.dtype)
    shape = property(lambda self: tuple(int(n) for n in self.variable.shape))
    ndim = property(lambda self: len(self.variable.shape))
    size = property(lambda self: int(np.prod(self.shape, dtype=np.int64)))
    nbytes = property(lambda self: self.variable.nbytes)

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d variable")
        return self.shape[0]

    def __iter__(self):
        if not self.shape:
            raise TypeError("iteration over a 0-d variable")
        return (self[i] for i in range(self.shape[0]))

    def __repr__(self) -> str:
        return (f"<hpcckpt {self.kind} variable {self.name!r}: shape {self.shape}, dtype {self.dtype}, "
                f"{len(self.variable.chunks)} chunks, in {self._view.path!r}>")

    def __array__(self, dtype=None, copy=None):
        out = self._view._read_box(self.variable, (0,) * self.ndim, self.shape)
        return out if dtype is None else out.astype(dtype, copy=False)

    def __getitem__(self, key):
        start, stop, local = _basic_index(key, self.shape)
        out = self._view._read_box(self.variable, start, stop)[local]
        if isinstance(out, np.ndarray) and not out.flags.c_contiguous:
            out = np.ascontiguousarray(out)  # a step: keep only the selected elements, not the bounding box
        return out


def _basic_index(key, shape):
    """``(start, stop, local)`` of a numpy basic index: the bounding box to read and the index into it."""
    key = key if isinstance(key, tuple) else (key,)
    if sum(k is Ellipsis for k in key) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    used = sum(k is not None and k is not Ellipsis for k in key)
    if used > len(shape):
        raise IndexError(f"too many indices: the variable is {len(shape)}-dimensional, but {used} were indexed")
    explicit = any(k is Ellipsis for k in key)  # numpy: a[..., 3] is a 0-d array where a[3] is a scalar
    if not explicit:
        key = key + (Ellipsis,)
    start, stop, local, axis = [], [], [], 0
    for k in key:
        if k is None:
            local.append(None)
            continue
        if k is Ellipsis:
            for _ in range(len(shape) - used):
                start.append(0)
                stop.append(shape[axis])
                axis += 1
                if not explicit:
                    local.append(slice(None))
            if explicit:
                local.append(Ellipsis)
            continue
        n = shape[axis]
        if isinstance(k, slice):
            a, b, step = k.indices(n)
            count = len(range(a, b, step))
            lo, hi = (a, a + (count - 1) * step + 1) if step > 0 else (a + (count - 1) * step, a + 1)
            start.append(lo if count else 0)
            stop.append(hi if count else 0)
            local.append(slice(None, None, step))
        elif isinstance(k, (int, np.integer)) and not isinstance(k, (bool, np.bool_)):
            i = int(k) + n if k < 0 else int(k)
            if not 0 <= i < n:
                raise IndexError(f"index {int(k)} is out of bounds for axis {axis} with size {n}")
            start.append(i)
            stop.append(i + 1)
            local.append(0)
        else:
            raise IndexError(f"only integers, slices (`:`), ellipsis (`...`) and None are valid indices of a "
                             f"checkpoint variable, got {k!r} (read it with np.asarray first for other indexing)")
        axis += 1
    return tuple(start), tuple(stop), tuple(local)


def _region_box(region, shape, name):
    """Turn a user's region into (start, stop, axes to squeeze), clipping like numpy slicing."""
    if region is None:
        return (0,) * len(shape), tuple(shape), ()
    if not isinstance(region, tuple):
        region = (region,) if isinstance(region, (slice, int, np.integer)) else tuple(region)
    if len(region) > len(shape):
        raise CheckpointError(f"region has {len(region)} axes but {name!r} has {len(shape)}")
    start, stop, squeeze = [], [], []
    for axis, n in enumerate(shape):
        r = region[axis] if axis < len(region) else slice(None)
        if isinstance(r, slice):
            a, b, step = r.indices(n)
            if step != 1:
                raise CheckpointError("regions are contiguous boxes: slice steps other than 1 are not supported")
            b = max(a, b)
        elif isinstance(r, (int, np.integer)):
            a = int(r) + n if r < 0 else int(r)
            if not 0 <= a < n:
                raise CheckpointError(f"index {r} is out of bounds for axis {axis} of {name!r} (size {n})")
            b = a + 1
            squeeze.append(axis)
        elif isinstance(r, (tuple, list)) and len(r) == 2:
            a, b = int(r[0]), int(r[1])
            if not 0 <= a <= b <= n:
                raise CheckpointError(f"range {tuple(r)} is outside axis {axis} of {name!r} (size {n})")
        else:
            raise CheckpointError(f"cannot use {r!r} as a region of axis {axis}")
        start.append(a)
        stop.append(b)
    return tuple(start), tuple(stop), tuple(squeeze)
