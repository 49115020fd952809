"""``strategy="auto"``: pick the transport from the shape of the job and from measured bandwidth.

The rule (also in docs/io.md):

1. One rank: file-per-rank (nothing to aggregate).
2. If earlier saves under the same root measured at least two strategies at
   this scale (same rank count, bytes per rank within a factor 2), take the
   one with the best median bandwidth.
3. Otherwise, small writes (under ``SMALL_BYTES`` per rank on average) with
   several ranks per node go through aggregation: per-file costs (create,
   metadata, fsync) dominate such writes and one file per node amortises them.
4. Otherwise file-per-rank: it has no extra copy or message and is what a
   parallel file system handles best at moderate rank counts.

Pure: the measurements are passed in; io_history.py persists them.
"""

from __future__ import annotations

from statistics import median

STRATEGIES = ("file-per-rank", "aggregated", "shared-file")
SMALL_BYTES = 8 << 20


def choose_strategy(nranks: int, bytes_per_rank: float, ranks_per_node: int, history: list[dict]) -> str:
    """The strategy auto uses; ``history`` rows are {strategy, nranks, bytes_per_rank, gbps}."""
    if nranks <= 1:
        return "file-per-rank"
    similar: dict[str, list[float]] = {}
    for row in history:
        if row.get("nranks") == nranks and row.get("strategy") in STRATEGIES and _within(
                row.get("bytes_per_rank", 0), bytes_per_rank):
            similar.setdefault(row["strategy"], []).append(float(row["gbps"]))
    if len(similar) >= 2:
        return max(similar, key=lambda s: median(similar[s]))
    if bytes_per_rank < SMALL_BYTES and ranks_per_node >= 2:
        return "aggregated"
    return "file-per-rank"


def _within(a: float, b: float, factor: float = 2.0) -> bool:
    if a <= 0 or b <= 0:
        return a == b
    return 1 / factor <= a / b <= factor
