"""Staging buffers for asynchronous saves: a reused, bounded pool of host memory.

``save`` copies the caller's arrays into slots of this pool and returns; a
background writer consumes the filled slots and hands each one back once every
piece in it is written.  The pool is allocated lazily and kept for the life of
the Checkpointer, so after the first save a save costs one memcpy of the state
(no page faults, no allocator).

Trade-off of the bound (``staging_bytes``): when the state of a rank is larger
than the pool, ``save`` blocks until the writer has written enough to free a
slot, i.e. the caller waits for part of the I/O.  A pool at least as large as
the state makes ``save`` a pure copy; a smaller pool caps the memory at the
price of longer blocking.  Slots are ``min(chunk_bytes, staging_bytes)`` bytes
and several small pieces share a slot, so many small arrays do not waste it.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from .regions import contiguous_pieces

#: Byte alignment of pieces inside a slot (keeps typed views aligned for any dtype).
_ALIGN = 64
DEFAULT_STAGING_BYTES = 1 << 30


class StagingPool:
    """At most ``capacity`` bytes of reusable slots; :meth:`acquire` blocks while every slot is in use."""

    def __init__(self, capacity: int, slot_bytes: int):
        self.slot_bytes = max(_ALIGN, min(int(slot_bytes), int(capacity)))
        self.nslots = max(1, int(capacity) // self.slot_bytes)
        self._free: list[np.ndarray] = []
        self._allocated = 0
        self._cond = threading.Condition()
        self.wait_seconds = 0.0  # time acquire() blocked (the cost of a pool smaller than the state)

    @property
    def allocated_bytes(self) -> int:
        return self._allocated * self.slot_bytes

    def acquire(self, nbytes: int | None = None) -> np.ndarray:
        """A free slot (or, for one element larger than a slot, a one-off buffer of ``nbytes``)."""
        if nbytes is not None and nbytes > self.slot_bytes:
            return np.empty(nbytes, np.uint8)  # a single huge element: outside the pool, freed after use
        import time

        with self._cond:
            t = time.perf_counter()
            while not self._free and self._allocated >= self.nslots:
                self._cond.wait()
            self.wait_seconds += time.perf_counter() - t
            if self._free:
                return self._free.pop()
            self._allocated += 1
        return np.empty(self.slot_bytes, np.uint8)

    def release(self, buf: np.ndarray) -> None:
        if buf.nbytes != self.slot_bytes:
            return  # a one-off buffer
        with self._cond:
            self._free.append(buf)
            self._cond.notify_all()


@dataclass
class Slot:
    """A filled slot: the buffer and the pieces in it (variable, global start, count, dtype, offset, nbytes)."""

    buffer: np.ndarray
    pieces: list = field(default_factory=list)
    remaining: int = 0


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


def stage(arrays: dict, boxes: dict, pool: StagingPool, queue: SlotQueue) -> tuple[int, int]:
    """Copy every local array into pool slots, handing full slots to ``queue``; return (bytes, pieces).

    ``arrays[name]`` is this rank's array (any layout), ``boxes[name][0]`` the
    global start of its box.  Pieces never straddle slots; a piece is at most
    one slot (the chunking of the stored version follows the slot size).
    Ends with ``queue.put(None)``.
    """
    total = count = 0
    slot: Slot | None = None
    used = 0
    try:
        for name in sorted(arrays):
            local = arrays[name]
            if local is None:
                continue
            arr = np.asarray(local)
            if not arr.size:
                continue
            box_start = boxes[name][0]
            for start, stop in contiguous_pieces(arr.shape, arr.dtype.itemsize, pool.slot_bytes):
                extent = tuple(b - a for a, b in zip(start, stop))
                nbytes = int(np.prod(extent, dtype=np.int64)) * arr.dtype.itemsize
                if slot is not None and used + nbytes > slot.buffer.nbytes:
                    queue.put(slot)
                    slot = None
                if slot is None:
                    slot = Slot(pool.acquire(nbytes))
                    used = 0
                dest = slot.buffer[used:used + nbytes].view(arr.dtype).reshape(extent)
                np.copyto(dest, arr[tuple(slice(a, b) for a, b in zip(start, stop))])
                gstart = tuple(int(b) + int(s) for b, s in zip(box_start, start))
                slot.pieces.append((name, gstart, extent, arr.dtype, used, nbytes))
                slot.remaining += 1
                used += -(-nbytes // _ALIGN) * _ALIGN
                total += nbytes
                count += 1
        if slot is not None:
            queue.put(slot)
            slot = None
    except BaseException:
        if slot is not None:
            pool.release(slot.buffer)
        raise
    finally:
        queue.put(None)
    return total, count
