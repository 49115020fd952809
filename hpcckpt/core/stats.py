"""Where the time of a save went: per-rank phase timings, bandwidth, and the straggler.

Every save stores, with its metadata (``extra.stats``), each rank's seconds per
phase (plan, hash, write, commit, ...), its bytes and a short timeline.  This
module turns that record into the table ``hpcckpt stats`` prints and the
per-rank timeline it can plot; it reads only the record, never the data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hpcckpt.errors import CheckpointError
from hpcckpt.core.humanize import format_duration

#: Phases that contain others; the straggler is sought among these top-level ones.
TOP_LEVEL = ("plan", "write", "commit")


@dataclass
class Straggler:
    """The slowest rank in the slowest phase, and how far behind the median rank it is."""

    phase: str
    rank: int
    seconds: float
    median: float

    def __str__(self) -> str:
        ratio = self.seconds / self.median if self.median > 0 else float("inf")
        return f"slowest: rank {self.rank} in '{self.phase}' ({format_duration(self.seconds)}, {ratio:.1f}x the median rank)"


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def phase_record(per_rank: list[dict]) -> dict:
    """The per-rank phase timings and bytes stored with the version (small: a few numbers per rank)."""
    phases = sorted({p for s in per_rank for p in s["seconds"]})
    return {"phases": {p: [round(s["seconds"].get(p, 0.0), 6) for s in per_rank] for p in phases},
            "bytes": [s["bytes"] for s in per_rank],
            "timeline": [[[name, round(a, 6), round(b, 6)] for name, a, b in s["timeline"]] for s in per_rank]}


def slowest(record: dict) -> dict[str, float]:
    """The slowest rank's seconds per phase of a :func:`phase_record` (the maximum over the ranks)."""
    return {phase: max(values, default=0.0) for phase, values in record["phases"].items()}


def save_stats(extra: dict) -> dict:
    """The stats record of a version's metadata ``extra``, checked enough to print safely."""
    stats = extra.get("stats") if isinstance(extra, dict) else None
    if not isinstance(stats, dict) or not isinstance(stats.get("phases"), dict):
        raise CheckpointError("this checkpoint has no timing record (written by an older hpcckpt?)")
    for name, values in stats["phases"].items():
        if not isinstance(values, list) or not values or not all(map(_seconds, values)):
            raise CheckpointError(f"the timing record of phase {name!r} is malformed")
    nbytes = stats.get("bytes")
    if nbytes is not None and not (isinstance(nbytes, list)
                                   and all(type(n) is int and n >= 0 for n in nbytes)):
        raise CheckpointError("the byte counts of the timing record are malformed")
    timeline = stats.get("timeline")
    if timeline is not None and not (isinstance(timeline, list) and all(
            isinstance(events, list) and all(isinstance(e, list) and len(e) == 3 and isinstance(e[0], str)
                                             and _seconds(e[1]) and _seconds(e[2]) for e in events)
            for events in timeline)):
        raise CheckpointError("the timeline of the timing record is malformed")
    return stats


def _seconds(value) -> bool:
    """Whether a record entry is a time the table can print: a finite int or float (JSON allows 10**400)."""
    if type(value) not in (int, float):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def table(stats: dict) -> list[tuple[str, float, float, float, int]]:
    """Rows of (phase, min, median, max seconds over the ranks, slowest rank), top-level phases first."""
    phases = stats["phases"]
    order = [p for p in TOP_LEVEL if p in phases] + sorted(p for p in phases if p not in TOP_LEVEL)
    rows = []
    for name in order:
        values = phases[name]
        slowest = max(range(len(values)), key=values.__getitem__)
        rows.append((name, float(min(values)), float(_median(values)), float(max(values)), slowest))
    return rows


def straggler(stats: dict) -> Straggler | None:
    """The slowest rank of the phase whose slowest rank takes longest."""
    best = None
    for name in TOP_LEVEL:
        values = stats["phases"].get(name)
        if not values:
            continue
        rank = max(range(len(values)), key=values.__getitem__)
        if best is None or values[rank] > best.seconds:
            best = Straggler(name, rank, float(values[rank]), _median(values))
    return best


def bandwidth(stats: dict) -> float | None:
    """Aggregate write bandwidth in bytes/s: all bytes over the slowest rank's write phase."""
    write = stats["phases"].get("write")
    nbytes = stats.get("bytes")
    if not write or not isinstance(nbytes, list) or max(write) <= 0:
        return None
    return sum(nbytes) / max(write)


def plot_timeline(stats: dict, path: str, title: str = "") -> None:
    """Draw one bar per rank and phase (matplotlib, the ``plot`` extra) into a PNG."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise CheckpointError("plotting needs matplotlib: pip install 'hpcckpt[plot]'") from None
    timeline = stats.get("timeline") or []
    colors: dict[str, str] = {}
    palette = plt.get_cmap("tab10")
    fig, ax = plt.subplots(figsize=(8, 1 + 0.4 * max(1, len(timeline))))
    for rank, events in enumerate(timeline):
        for name, start, end in events:
            if name not in TOP_LEVEL:
                continue
            color = colors.setdefault(name, palette(len(colors) % 10))
            ax.barh(rank, end - start, left=start, color=color, edgecolor="black", linewidth=0.3)
    for name, color in colors.items():
        ax.barh([], [], color=color, label=name)
    ax.set_xlabel("seconds since the save began (per rank)")
    ax.set_ylabel("rank")
    ax.invert_yaxis()
    ax.legend(loc="lower right", fontsize="small")
    ax.set_title(title or "save timeline")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
