"""``hpcckpt.open``: a read-only view of one committed checkpoint, from one plain Python process (no MPI).

Any global region of any variable, the replicated values, and a full
verification of every chunk; built on reader.ChunkReader.
"""

from __future__ import annotations

import os

import numpy as np

from .encoding import decode_value
from .errors import CheckpointError
from .metadata import Variable
from .metadata_file import read_metadata
from .reader import ChunkReader, allocate
from .storage import POSIX, Storage


class CheckpointView:
    """A read-only view of one committed checkpoint, usable from a single plain Python process.

    ``variables`` maps names to their stored description (kind, global shape,
    dtype, chunks), ``values`` holds the replicated values, ``read(name, region)``
    returns any global region of a variable as a new numpy array.
    """

    def __init__(self, path: str, storage: Storage = POSIX):
        self.path = os.fspath(path)
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
        out = allocate(tuple(b - a for a, b in zip(start, stop)), var.dtype, name)
        self._reader.read_into(var, start, stop, out)
        return out.reshape(tuple(n for i, n in enumerate(out.shape) if i not in squeeze)) if squeeze else out

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
