"""``hpcckpt gc``, ``hpcckpt unlock`` and ``hpcckpt halt``: removing leftovers, old versions and stale writer
locks; asking the job that writes a root to checkpoint and exit."""

from __future__ import annotations

import sys
import time
import warnings


from hpcckpt.root.catalog import current, list_versions, remove_versions, removable


from hpcckpt.cli.common import (EXIT_FAIL, EXIT_OK, dir_size, duration_text, human_bytes, newest_mtime, print_table,
                                require_root, storage_of)


# --------------------------------------------------------------------------- unlock

def cmd_unlock(args) -> int:
    from hpcckpt.root.lock import remove_lock

    root = require_root(args.root)
    lock = remove_lock(root, force=args.force, storage=storage_of(root))
    print(f"removed the writer lock of {root} (held by {lock.describe()})" if lock is not None
          else f"{root} has no writer lock")
    return EXIT_OK


# --------------------------------------------------------------------------- halt

def cmd_halt(args) -> int:
    from hpcckpt.root.halt import halt_path, request, withdraw

    root = require_root(args.root)
    storage = storage_of(root)
    if args.remove:
        print(f"removed {halt_path(root)}" if withdraw(root, storage) else f"{root} has no halt file")
        return EXIT_OK
    path = request(root, args.reason or "", storage)
    print(f"wrote {path}: the job writing {root} checkpoints and exits at its next maybe_save/should_save "
          f"decision, and removes the file when it closes")
    return EXIT_OK


# --------------------------------------------------------------------------- gc

def cmd_gc(args) -> int:
    """One table (ACTION, VERSION, SIZE, REASON) of what was compacted, kept and removed, then a summary line."""
    root = require_root(args.root)
    storage = storage_of(root)
    entries = list_versions(root, storage)
    table = []
    if args.compact:
        from hpcckpt.incremental.chain import compact

        for line in compact(root, args.keep, dry_run=args.dry_run, storage=storage):
            name, _, what = line.partition(": ")
            table.append(("would compact" if args.dry_run else "compacted", name, "", what))
        entries = list_versions(root, storage)
    live = current(entries)
    kept_by_keep = {e.name for e in (live[-args.keep:] if args.keep else live)}
    newest_rev = {e.step: e.name for e in live}
    now = time.time()
    plan = []
    if args.compact and args.dry_run:  # after the compaction no kept version would reference another: say so
        doomed = [e for e in entries if e.name not in kept_by_keep]
    else:
        doomed = removable(entries, args.keep)
    # removable() keeps what a kept incremental version references: say why such a version stays
    doomed_names = {d.name for d in doomed}
    for e in entries:
        if e.name not in kept_by_keep and e.name not in doomed_names:
            table.append(("kept", e.name, human_bytes(dir_size(e.path)),
                          "a kept version references its data (incremental save)"))
    for e in doomed:
        if not e.committed:
            age = now - newest_mtime(e.path)
            if age < args.grace:
                table.append(("kept", e.name, human_bytes(dir_size(e.path)),
                              f"partial, but modified {duration_text(age)} ago (a save may be running; "
                              "--grace 0 removes it)"))
                continue
            why = "partial (never committed)"
        elif e.name in {x.name for x in live} and e.name not in kept_by_keep:
            why = f"beyond --keep {args.keep}"
        else:
            why = f"superseded by {newest_rev.get(e.step, '?')}"
        plan.append((e, why, dir_size(e.path)))
    if args.dry_run:
        table += [("would remove", e.name, human_bytes(size), why) for e, why, size in plan]
        _print_gc_table(table)
        print(f"dry run: would remove {len(plan)} version{'s' if len(plan) != 1 else ''}, "
              f"{human_bytes(sum(s for _, _, s in plan))}")
        return EXIT_OK
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        removed = set(remove_versions([e for e, _, _ in plan]))
    table += [("removed", e.name, human_bytes(size), why) for e, why, size in plan if e.name in removed]
    _print_gc_table(table)
    for w in caught:
        print(f"hpcckpt: warning: {str(w.message).removeprefix('hpcckpt: ')}", file=sys.stderr)
    freed = sum(s for e, _, s in plan if e.name in removed)
    print(f"removed {len(removed)} version{'s' if len(removed) != 1 else ''}, freed {human_bytes(freed)}")
    return EXIT_OK if len(removed) == len(plan) else EXIT_FAIL


def _print_gc_table(rows: list[tuple]) -> None:
    if rows:
        print_table([("ACTION", "VERSION", "SIZE", "REASON"), *rows], right={2})
