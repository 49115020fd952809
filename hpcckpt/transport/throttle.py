"""``max_writers``: at most k ranks write at the same time, in staggered waves.

Rank r (among the writers, numbered 0..n-1) waits for a token from writer
r - k before it writes and passes the token to writer r + k when it is done,
success or failure, so a failed write never blocks the next wave.  The cost
is one tiny message per writer.
"""

from __future__ import annotations

from contextlib import contextmanager

_TAG = 7301


@contextmanager
def write_turn(comm, writers: list[int], max_writers: int | None):
    """Hold this rank's turn to write (no-op when unlimited or when this rank is not a writer)."""
    rank = comm.Get_rank()
    if not max_writers or rank not in writers or len(writers) <= max_writers:
        yield
        return
    i = writers.index(rank)
    if i >= max_writers:
        comm.recv(source=writers[i - max_writers], tag=_TAG)
    try:
        yield
    finally:
        if i + max_writers < len(writers):
            comm.send(None, dest=writers[i + max_writers], tag=_TAG)
