"""Hypothesis strategies and plain helpers shared by the tests: random uneven N-d decompositions.

A decomposition of a global shape is made by cutting every axis at random
positions (a grid of blocks, each possibly empty on some axis), then adding
empty blocks.  ``grid_blocks`` is the same thing for a seeded numpy RNG, used by
the mpiexec scripts so that every rank computes the same decomposition.
"""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import strategies as st


@st.composite
def shapes(draw, min_ndim=0, max_ndim=3, max_side=6):
    ndim = draw(st.integers(min_ndim, max_ndim))
    return tuple(draw(st.integers(0, max_side)) for _ in range(ndim))


@st.composite
def cuts(draw, n):
    """Sorted cut positions on an axis of length n, always starting at 0 and ending at n (repeats allowed)."""
    inner = draw(st.lists(st.integers(0, n), max_size=3))
    return [0, *sorted(inner), n]


@st.composite
def decompositions(draw, shape=None, max_ndim=3, max_side=6):
    """(shape, list of (start, stop) boxes) that tile shape exactly; includes empty boxes."""
    if shape is None:
        shape = draw(shapes(min_ndim=1, max_ndim=max_ndim, max_side=max_side))
    per_axis = [draw(cuts(n)) for n in shape]
    boxes = []
    for idx in itertools.product(*[range(len(c) - 1) for c in per_axis]):
        start = tuple(per_axis[a][i] for a, i in enumerate(idx))
        stop = tuple(per_axis[a][i + 1] for a, i in enumerate(idx))
        boxes.append((start, stop))
    for _ in range(draw(st.integers(0, 2))):  # extra empty boxes anywhere inside the bounds
        start = tuple(draw(st.integers(0, n)) for n in shape)
        boxes.append((start, start))
    order = draw(st.permutations(range(len(boxes))))
    return tuple(shape), [boxes[i] for i in order]


def grid_blocks(rng: np.random.Generator, shape, nranks: int):
    """A random uneven decomposition of ``shape`` over ``nranks`` ranks: a list of (start, stop) per rank.

    The number of pieces per axis is drawn so that the grid has at most
    ``nranks`` blocks; each axis is cut at random positions (repeats give empty
    blocks); ranks left over get empty boxes; the blocks are dealt out in a
    random order.
    """
    ndim = len(shape)
    # choose the number of pieces per axis so that the product is <= nranks
    pieces = [1] * ndim
    for _ in range(rng.integers(0, 4)):
        axis = int(rng.integers(0, ndim))
        trial = list(pieces)
        trial[axis] += 1
        if int(np.prod(trial)) <= nranks:
            pieces = trial
    per_axis = []
    for n, p in zip(shape, pieces):
        inner = sorted(int(x) for x in rng.integers(0, n + 1, size=p - 1))
        per_axis.append([0, *inner, n])
    boxes = []
    for idx in itertools.product(*[range(len(c) - 1) for c in per_axis]):
        boxes.append((tuple(per_axis[a][i] for a, i in enumerate(idx)),
                      tuple(per_axis[a][i + 1] for a, i in enumerate(idx))))
    while len(boxes) < nranks:
        start = tuple(int(rng.integers(0, n + 1)) for n in shape)
        boxes.append((start, start))
    order = rng.permutation(len(boxes))
    return [boxes[i] for i in order]


def global_array(shape, dtype=np.float64, seed=0):
    """A deterministic array whose every element differs (so misplaced data is always seen)."""
    n = int(np.prod(shape)) if shape else 1
    base = np.arange(n, dtype=np.int64) * 7 + seed * 1000003
    return base.astype(dtype).reshape(shape)


def covered_count(shape, boxes):
    """How many boxes cover each element (reference implementation by painting)."""
    count = np.zeros(shape, dtype=np.int64)
    for start, stop in boxes:
        if all(0 <= a <= b <= n for a, b, n in zip(start, stop, shape)):
            count[tuple(slice(a, b) for a, b in zip(start, stop))] += 1
    return count
