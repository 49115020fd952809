"""``hpcckpt stats``: where the time of a save went (per-rank phases, bandwidth, straggler)."""

from __future__ import annotations

import os


from hpcckpt.storage.metadata_file import read_metadata


from hpcckpt.cli.common import EXIT_OK, duration_text, human_bytes, print_table, resolve_version


def cmd_stats(args) -> int:
    """``hpcckpt stats``: the timing record of one save as a table (and optionally a timeline PNG)."""
    from hpcckpt.core import stats

    path, note = resolve_version(args.path)
    if note:
        print(note)
    meta = read_metadata(path)
    record = stats.save_stats(meta.extra)
    ranks = f"{meta.nranks} rank{'s' if meta.nranks != 1 else ''}"
    print(f"{path}: saved by {ranks} with strategy {meta.extra.get('strategy', '?')}")
    rows = [(name, *map(duration_text, (low, median, high)), str(rank))
            for name, low, median, high, rank in stats.table(record)]
    print_table([("PHASE", "MIN", "MEDIAN", "MAX", "SLOWEST RANK"), *rows], right={1, 2, 3, 4})
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
