"""``hpcckpt stats``: where the time of a save went (per-rank phases, bandwidth, straggler)."""

from __future__ import annotations

import os


from ..metadata_file import read_metadata


from .common import EXIT_OK, human_bytes, print_table, resolve_version


def cmd_stats(args) -> int:
    """``hpcckpt stats``: the timing record of one save as a table (and optionally a timeline PNG)."""
    from .. import stats

    path, note = resolve_version(args.path)
    if note:
        print(note)
    meta = read_metadata(path)
    record = stats.save_stats(meta.extra)
    print(f"{path}: saved by {meta.nranks} ranks with strategy {meta.extra.get('strategy', '?')}")
    print_table([("phase", "min s", "median s", "max s", "slowest rank"), *map(tuple, stats.table(record))],
                 right={1, 2, 3, 4})
    rate = stats.bandwidth(record)
    if rate is not None:
        print(f"bandwidth: {human_bytes(sum(record['bytes']))} at {rate / 1e9:.2f} GB/s (slowest rank's write phase)")
    slow = stats.straggler(record)
    if slow is not None:
        print(slow)
    if args.plot:
        stats.plot_timeline(record, args.plot, title=os.path.basename(os.path.normpath(path)))
        print(f"timeline written to {args.plot}")
    return EXIT_OK
