"""``hpcckpt verify``: read every chunk of a version (or of every version under a root) and check it."""

from __future__ import annotations

import os
import time


from hpcckpt.root.catalog import current, list_versions
from hpcckpt.errors import CheckpointError, CorruptCheckpointError
from hpcckpt.core.names import METADATA_FILE
from hpcckpt.loading.view import CheckpointView


from hpcckpt.cli.common import (EXIT_FAIL, EXIT_OK, duration_text, human_bytes, metadata_dir, progress_bar, require_dir,
                     show_progress, storage_of)

#: ``verify`` shows a progress bar on a terminal from this many bytes on.
PROGRESS_THRESHOLD = 64 << 20


# --------------------------------------------------------------------------- verify

def _targets(path: str) -> tuple[list[str], str]:
    """The version directories ``verify PATH`` checks, and a note on what it skipped."""
    path = metadata_dir(path)
    require_dir(path, "checkpoint")
    storage = storage_of(path)
    if storage.is_file(os.path.join(path, METADATA_FILE)):
        return [path], ""
    entries = list_versions(path, storage)
    live = current(entries)
    if not entries:
        return [path], ""  # not a root either: read_metadata gives the "no committed checkpoint" error
    if not live:
        raise CheckpointError(f"no committed version under {path} ({len(entries)} partial)")
    skipped = [e for e in entries if e not in live]
    note = f" (skipped {len(skipped)} partial or superseded)" if skipped else ""
    return [e.path for e in live], note


def cmd_verify(args) -> int:
    targets, note = _targets(args.path)
    t0 = time.perf_counter()
    views, problems = [], []
    try:
        for target in targets:
            try:
                views.append(CheckpointView(target, storage_of(target)))
            except CorruptCheckpointError as exc:
                problems.append(str(exc))
            except CheckpointError as exc:
                if len(targets) == 1:
                    raise
                problems.append(str(exc))
        total = sum(v.meta.variables[n].stored_bytes for v in views for n in v.meta.variables)
        nchunks = sum(len(var.chunks) for v in views for var in v.meta.variables.values())
        show = show_progress(args, total > PROGRESS_THRESHOLD)
        with progress_bar(show, total, "verify") as bar:
            for view in views:
                problems.extend(view.verify(progress=bar.update if show else None))
    finally:
        for view in views:
            view.close()
    seconds = time.perf_counter() - t0
    if problems:
        for line, n in _dedupe(problems):
            print(f"CORRUPT: {line}" + (f" ({n} chunks)" if n > 1 else ""))
        print(f"FAILED: {len(problems)} problem{'s' if len(problems) != 1 else ''} in {args.path}")
        return EXIT_FAIL
    what = f"{len(views)} version{'s' if len(views) != 1 else ''}, " if len(views) > 1 else ""
    print(f"OK: {args.path}: {what}{nchunks} chunk{'s' if nchunks != 1 else ''}, {human_bytes(total)} "
          f"verified in {duration_text(seconds)}{note}")
    return EXIT_OK


def _dedupe(lines: list[str]) -> list[tuple[str, int]]:
    counts: dict[str, int] = {}
    for line in lines:
        counts[line] = counts.get(line, 0) + 1
    return list(counts.items())
