"""A spatial index over many boxes: which of them overlap a query box, in time proportional to the answer.

A load plans with two sets of boxes that grow with the rank count: the chunks
of each stored variable and the target boxes of the ranks that load it.  A
rank must find the few chunks its box touches, and for each of those the few
ranks that share it, without scanning every chunk or every rank (a
rank's load planning costs O(the chunks it touches), not O(all chunks)).

Two layouts, chosen from the boxes themselves:

* a rectilinear grid (what a grid decomposition saves and loads, including its
  chunks split along the same planes on every rank): the non-empty boxes are
  exactly the cells of a grid whose planes are the distinct box edges per
  axis.  A query bisects the planes of each axis and reads the cells between:
  O(ndim log n + answer).  Such boxes tile their bounding box, so
  :meth:`BoxIndex.tiles` answers the tiling question of a template in O(n),
  vectorised;
* anything else: the boxes sorted by their start along axis 0; a query takes
  the window of boxes that can reach it along axis 0 (bisection) and filters
  it with :func:`hpcckpt.core.regions.overlapping`: O(log n + window).

Pure numpy, no MPI and no I/O; tested with hypothesis against the brute-force
:func:`hpcckpt.core.regions.overlapping`.
"""

from __future__ import annotations

import numpy as np

from hpcckpt.core.regions import covering_problem, overlapping, tiling_problem


class BoxIndex:
    """The boxes ``[starts[i], stops[i])`` (two ``(n, ndim)`` int64 arrays), indexed for overlap queries."""

    def __init__(self, starts: np.ndarray, stops: np.ndarray):
        starts = np.asarray(starts, np.int64)
        stops = np.asarray(stops, np.int64)
        self.ndim = starts.shape[1]
        extents = stops - starts
        self.bounds = ((starts.min(axis=0), stops.max(axis=0)) if len(starts) and self.ndim else None)
        self.ordered = bool(np.all(extents >= 0))
        nonempty = np.all(extents > 0, axis=1) if self.ndim else np.ones(len(starts), bool)
        self.ids = np.nonzero(nonempty)[0]  # empty boxes overlap nothing: never indexed
        self.starts, self.stops = starts[self.ids], stops[self.ids]
        self.planes = self.cells = None
        self.order = self.axis0 = None
        self.reach0 = 0
        if self.ndim and len(self.ids):
            self._grid()
        if self.cells is None and self.ndim:
            self.order = np.argsort(self.starts[:, 0], kind="stable")
            self.axis0 = self.starts[self.order, 0]
            self.reach0 = int((self.stops[:, 0] - self.starts[:, 0]).max()) if len(self.ids) else 0

    def _grid(self) -> None:
        """Index the boxes as the cells of a rectilinear grid, when that is what they are."""
        planes, coords = [], []
        for d in range(self.ndim):
            p = _distinct(np.concatenate([self.starts[:, d], self.stops[:, d]]))
            lo = np.searchsorted(p, self.starts[:, d])
            if not np.array_equal(np.searchsorted(p, self.stops[:, d]), lo + 1):
                return  # a box spans several planes of this axis: not the cells of one grid
            planes.append(p)
            coords.append(lo)
        shape = tuple(len(p) - 1 for p in planes)
        if int(np.prod(shape, dtype=np.float64)) != len(self.ids):
            return
        flat = np.ravel_multi_index(coords, shape)
        cells = np.full(len(self.ids), -1, np.int64)
        cells[flat] = np.arange(len(self.ids))
        if np.any(cells < 0):
            return  # two boxes in one cell, so another cell is empty
        self.planes, self.cells = planes, cells.reshape(shape)
        self.starts = self.stops = None  # a grid query needs only the planes and the cells

    @property
    def is_grid(self) -> bool:
        """Whether the non-empty boxes are exactly the cells of a rectilinear grid."""
        return self.cells is not None

    def query(self, q_start, q_stop) -> np.ndarray:
        """Indices (into the boxes given, ascending) of the boxes that share an element with ``[q_start, q_stop)``."""
        if not len(self.ids):
            return np.zeros(0, np.int64)
        q_start = np.asarray(q_start, np.int64)
        q_stop = np.asarray(q_stop, np.int64)
        if self.ndim == 0:
            return self.ids.copy()
        if not bool(np.all(q_stop > q_start)):
            return np.zeros(0, np.int64)
        if self.cells is not None:
            axes = []
            for d, p in enumerate(self.planes):
                lo = max(int(np.searchsorted(p, q_start[d], side="right")) - 1, 0)
                hi = min(int(np.searchsorted(p, q_stop[d], side="left")), len(p) - 1)
                if lo >= hi:
                    return np.zeros(0, np.int64)
                axes.append(slice(lo, hi))
            return np.sort(self.ids[self.cells[tuple(axes)].ravel()])
        a = int(np.searchsorted(self.axis0, q_start[0] - self.reach0, side="right"))
        b = int(np.searchsorted(self.axis0, q_stop[0], side="left"))
        window = self.order[a:b]
        hit = overlapping(self.starts[window], self.stops[window], q_start, q_stop)
        return np.sort(self.ids[window[hit]])

    def tiles(self, shape) -> bool:
        """True when the boxes certainly tile ``shape`` (a grid filling it exactly); False means "not shown".

        Inside the bounds, the cells of a grid tile their bounding box; the
        bounding box must then be the whole array.  Other layouts return False:
        the caller checks them with :func:`hpcckpt.core.regions.tiling_problem`.
        """
        if self.ndim == 0 or self.cells is None or not self.ordered:
            return False
        lo, hi = self.bounds  # empty boxes too must lie inside the array
        shape = np.asarray(shape, np.int64)
        if np.any(lo < 0) or np.any(hi > shape):
            return False
        return all(int(p[0]) == 0 and int(p[-1]) == int(s) for p, s in zip(self.planes, shape))


def tiling_problem_indexed(starts: np.ndarray, stops: np.ndarray, shape, label: str = "box") -> str | None:
    """:func:`hpcckpt.core.regions.tiling_problem`, answered in O(n) vectorised when the boxes form a grid.

    The sweep of tiling_problem keeps every box of an axis-0 slab active, so a
    3-D grid of P boxes costs it O(P^2/px) Python steps; a grid that fills the
    array is accepted through its index,
    and anything else (including every layout that does not tile) still gets
    the sweep and its message.
    """
    shape = tuple(int(s) for s in shape)
    if len(shape) and BoxIndex(np.asarray(starts, np.int64).reshape(-1, len(shape)),
                               np.asarray(stops, np.int64).reshape(-1, len(shape))).tiles(shape):
        return None
    return tiling_problem(starts, stops, shape, label=label)


def covering_problem_indexed(starts: np.ndarray, stops: np.ndarray, shape, label: str = "box") -> str | None:
    """:func:`hpcckpt.core.regions.covering_problem` (boxes may overlap: load templates), with the grid fast path of
    :func:`tiling_problem_indexed`: a grid that tiles the array covers it."""
    if tiling_problem_indexed(starts, stops, shape, label) is None:
        return None
    return covering_problem(starts, stops, shape, label=label)


def _distinct(values: np.ndarray) -> np.ndarray:
    """The sorted distinct values (np.unique without its first-call import of numpy.ma)."""
    values = np.sort(values)
    keep = np.ones(len(values), bool)
    keep[1:] = values[1:] != values[:-1]
    return values[keep]
