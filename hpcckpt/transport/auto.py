"""``strategy="auto"``: pick the transport from the shape of the job and from measured bandwidth.

The rule (also in docs/io.md):

1. One rank: file-per-rank (nothing to aggregate).
   On a storage where several ranks cannot write into one file
   (``shared_files=False``: an object store, one writer per object), where
   each object costs requests (create, parts, completion) and a listing
   entry, aggregated when it writes fewer objects than there are ranks
   (several ranks per node, or ``aggregators`` below the rank count), else
   file-per-rank; no measurement is needed (:func:`writes_fewer_objects`).
2. If earlier saves under the same root measured at least two strategies at
   this scale (same rank count, bytes per rank within a factor 2), take the
   one with the best median bandwidth, unless the strategy used last at this
   scale is within ``HYSTERESIS`` of it: then keep that one, so that noise in
   the measurements does not make saves switch back and forth.
3. If only file-per-rank was measured at this scale, the writes are small
   (under ``SMALL_BYTES`` per rank on average) and nodes hold several ranks,
   try aggregation once: whether one file per node beats one file per rank
   depends on the file system's per-file cost (large on Lustre/GPFS, small
   on a local file system), which only a measurement tells; rule 2 then keeps
   the faster.
4. Otherwise file-per-rank: no extra copy or message, and without a
   measurement it is the safe choice (bench/compare.py: aggregation lost on a
   local file system even at 64 KiB per rank).

Pure: the measurements are passed in; io_history.py persists them.
"""

from __future__ import annotations

from statistics import median

from hpcckpt.transport import TRANSPORTS

SMALL_BYTES = 8 << 20
#: Another strategy replaces the one in use only when its median bandwidth is this much better.
HYSTERESIS = 0.10


def choose_strategy(nranks: int, bytes_per_rank: float, ranks_per_node: int, history: list[dict] | None, *,
                    shared_files: bool = True, aggregators: int | None = None) -> str:
    """The strategy auto uses; ``history`` rows are {strategy, nranks, bytes_per_rank, gbps} (not read, and may
    be None, where ``shared_files`` is False); ``shared_files``: the storage's flag; ``aggregators``: the
    option (None: one aggregator per node)."""
    if nranks <= 1:
        return "file-per-rank"
    if not shared_files:
        return "aggregated" if writes_fewer_objects(nranks, ranks_per_node, aggregators) else "file-per-rank"
    similar: dict[str, list[float]] = {}
    last = None  # the strategy of the newest measurement at this scale
    for row in history:
        if row.get("nranks") == nranks and row.get("strategy") in TRANSPORTS and _within(
                row.get("bytes_per_rank", 0), bytes_per_rank):
            similar.setdefault(row["strategy"], []).append(float(row["gbps"]))
            last = row["strategy"]
    if len(similar) >= 2:
        best = max(similar, key=lambda s: median(similar[s]))
        if median(similar[best]) <= (1 + HYSTERESIS) * median(similar[last]):
            return last  # not clearly better than what runs now
        return best
    if set(similar) == {"file-per-rank"} and bytes_per_rank < SMALL_BYTES and ranks_per_node >= 2:
        return "aggregated"  # explore once; rule 2 decides from then on
    return "file-per-rank"


def writes_fewer_objects(nranks: int, ranks_per_node: int, aggregators: int | None) -> bool:
    """Whether aggregated writes fewer files than file-per-rank's ``nranks``: with ``aggregators`` given, one
    per group (at most one per rank); else one per node, fewer when some node holds several ranks."""
    if aggregators is not None:
        return aggregators < nranks
    return ranks_per_node >= 2


def _within(a: float, b: float, factor: float = 2.0) -> bool:
    if a <= 0 or b <= 0:
        return a == b
    return 1 / factor <= a / b <= factor
