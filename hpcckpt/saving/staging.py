"""Staging buffers for asynchronous saves: a reused, bounded pool of host memory.

``save`` copies the caller's arrays into buffers of this pool and returns; a
background writer consumes the staged arrays and hands each buffer back once
everything in it is written.  Buffers are kept for the life of the
Checkpointer and reused by size, so after the first save of a layout a save
costs one memcpy of the state (no page faults, no allocator).

Two ways to stage, chosen per rank and per save:

* whole arrays (the state fits in the pool): each local array is copied with a
  single ``np.copyto`` into a C-ordered buffer of exactly its size.  The
  foreground does one copy per array and nothing per piece; the writer cuts the
  staged copy into ``chunk_bytes`` pieces (views, no copy) in the background.
* pieces (the state is larger than the pool): the writer is started first and
  each array is copied piece by piece (at most ``piece_bytes``) into pool
  buffers; ``acquire`` blocks while the pool is full, until the writer releases
  a buffer.

CuPy arrays are staged into page-locked host buffers (a pool made with
``pinned=True``), with one device-to-host copy each: the copy runs at the
link's full speed and the buffers are reused like any others.

Trade-off of the bound (``staging_bytes``): a pool at least as large as the
state makes ``save`` a pure copy; a smaller pool caps the memory at the price
of longer blocking (the caller waits for about ``(state - pool) / write
bandwidth``).  When buffers of the wanted size are not free but the pool has
room only through buffers of other sizes that are free, those are dropped
(their memory is returned) so that the total never exceeds the bound.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass

import numpy as np

from hpcckpt.core.devices import copy_into, pinned_empty
from hpcckpt.core.regions import contiguous_pieces

DEFAULT_STAGING_BYTES = 1 << 30


class StagingPool:
    """At most ``capacity`` bytes of reusable buffers; :meth:`acquire` blocks while it cannot allocate.

    ``pinned``: the buffers are page-locked host memory (for staging CuPy arrays).
    """

    def __init__(self, capacity: int, pinned: bool = False):
        self.capacity = int(capacity)
        self.pinned = pinned
        self._free: dict[int, list[np.ndarray]] = {}
        self._allocated = 0  # bytes of every buffer the pool owns (free or in use)
        self._cond = threading.Condition()
        self.wait_seconds = 0.0  # time acquire() blocked (the cost of a pool smaller than the state)

    @property
    def allocated_bytes(self) -> int:
        return self._allocated

    def acquire(self, nbytes: int) -> np.ndarray:
        """A uint8 buffer of exactly ``nbytes`` (a one-off buffer outside the pool when larger than the pool)."""
        nbytes = int(nbytes)
        if nbytes > self.capacity:
            return self._allocate(nbytes)  # a single huge element: outside the pool, freed after use
        with self._cond:
            t = time.perf_counter()
            while True:
                same = self._free.get(nbytes)
                if same:
                    buf = same.pop()
                    break
                if self._allocated + nbytes <= self.capacity:
                    self._allocated += nbytes
                    buf = None
                    break
                if not self._drop_one_free():
                    self._cond.wait()
            self.wait_seconds += time.perf_counter() - t
        if buf is None:
            try:
                buf = self._allocate(nbytes)
            except BaseException:
                with self._cond:
                    self._allocated -= nbytes
                raise
        return buf

    def _allocate(self, nbytes: int) -> np.ndarray:
        return pinned_empty(nbytes, np.uint8) if self.pinned else np.empty(nbytes, np.uint8)

    def _drop_one_free(self) -> bool:
        """Forget the largest free buffer (caller holds the lock); False when none is free."""
        sizes = [n for n, bufs in self._free.items() if bufs]
        if not sizes:
            return False
        n = max(sizes)
        self._free[n].pop()
        self._allocated -= n
        return True

    def release(self, buf: np.ndarray) -> None:
        if buf.nbytes > self.capacity:
            return  # a one-off buffer
        with self._cond:
            self._free.setdefault(buf.nbytes, []).append(buf)
            self._cond.notify_all()


@dataclass
class Staged:
    """One staged item (or piece of one): ``array`` is a C-ordered copy held in ``buffer``.

    ``start`` is the global start of ``array``; ``cut``: whether the writer
    may cut it into chunks (an incremental block is written whole);
    ``remaining`` counts the chunks the writer still has to write before
    ``buffer`` goes back to the pool.
    """

    variable: str
    start: tuple
    array: np.ndarray
    buffer: np.ndarray
    cut: bool = True
    remaining: int = 0

    @property
    def item(self) -> tuple:
        """As a selection item ``(variable, global start, array, cut)`` (transform.raw_pieces takes these)."""
        return self.variable, self.start, self.array, self.cut


class SlotQueue:
    """The hand-over from the staging caller to the writer thread (unbounded: the pool bounds it)."""

    def __init__(self):
        self._items: deque = deque()
        self._cond = threading.Condition()

    def put(self, item) -> None:
        with self._cond:
            self._items.append(item)
            self._cond.notify()

    def get(self):
        with self._cond:
            while not self._items:
                self._cond.wait()
            return self._items.popleft()


def staged_bytes(items) -> int:
    """Bytes the whole-item staging of ``items`` (selection items) takes in the pool."""
    return sum(int(arr.nbytes) for _, _, arr, _ in items)


def stage(items, pool: StagingPool, queue: SlotQueue, piece_bytes: int | None = None,
          staged=None) -> tuple[int, int]:
    """Copy every selected item into pool buffers, handing each to ``queue``; return (bytes, staged items).

    ``items``: ``(variable, global start, array, cut)`` (selection.Selection);
    an array may have any layout, numpy or CuPy (then the copy is a
    device-to-host copy).  With ``piece_bytes=None`` each item is one copy into
    a buffer of its size; otherwise each ``cut`` item is copied in pieces of at
    most ``piece_bytes`` (one buffer each, so the pool can recycle them while
    the copy goes on).  ``staged``: called with each whole item's Staged copy
    before the writer gets it (pre-copy hashes the copy there; an exception
    stops the staging).  Ends with ``queue.put(None)``, also after a failure.
    """
    total = count = 0
    try:
        for name, box, arr, cut in items:
            if not arr.size:
                continue
            if piece_bytes is None or not cut:
                buf = pool.acquire(arr.nbytes)
                dst = buf.view(arr.dtype).reshape(arr.shape)
                copy_into(dst, arr)
                copy = Staged(name, tuple(box), dst, buf, cut)
                if staged is not None:
                    try:
                        staged(copy)
                    except BaseException:
                        pool.release(buf)
                        raise
                queue.put(copy)
                total += arr.nbytes
                count += 1
                continue
            for start, stop in contiguous_pieces(arr.shape, arr.dtype.itemsize, piece_bytes):
                extent = tuple(b - a for a, b in zip(start, stop))
                nbytes = int(np.prod(extent, dtype=np.int64)) * arr.dtype.itemsize
                buf = pool.acquire(nbytes)
                dst = buf.view(arr.dtype).reshape(extent)
                copy_into(dst, arr[tuple(slice(a, b) for a, b in zip(start, stop))] if arr.ndim else arr)
                queue.put(Staged(name, tuple(int(b) + int(s) for b, s in zip(box, start)), dst, buf))
                total += nbytes
                count += 1
    finally:
        queue.put(None)
    return total, count
