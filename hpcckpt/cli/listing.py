"""``hpcckpt ls``: the versions under a Checkpointer root, and the failure rate learned from its failure history.

Given a directory that holds no versions, ``ls`` names the Checkpointer roots
it finds below it (at most :data:`SEARCH_DEPTH` levels down), so that a user
who points it at a run directory learns where the checkpoints are.
"""

from __future__ import annotations

import json
import os

from hpcckpt.cli.common import (EXIT_FAIL, EXIT_OK, VersionRow, failure_estimate, human_bytes, print_table,
                                require_root, storage_of, time_text, version_rows)
from hpcckpt.core.names import parse_version_name
from hpcckpt.errors import CheckpointError
from hpcckpt.root.catalog import list_versions
from hpcckpt.storage.base import DIRECTORY

#: How many directory levels below a directory without versions ``hpcckpt ls`` looks for Checkpointer roots.
SEARCH_DEPTH = 3


# --------------------------------------------------------------------------- ls

def cmd_ls(args) -> int:
    root = require_root(args.root)
    rows = version_rows(root)
    estimate = failure_estimate(root, args.prior_mtbf, details=args.details)
    from hpcckpt.levels.status import format_levels, levels_status

    levels = levels_status(root, storage_of(root))  # None unless a multi-level Checkpointer used this root
    below = [] if rows else roots_below(root)
    found = bool(rows or below or levels)
    if args.json:
        doc = {"root": root, "versions": [_row_json(r) for r in rows],
               "failure_history": estimate[0] if estimate else None, "levels": levels,
               "roots_below": [{"root": path, "versions": n} for path, n in below]}
        print(json.dumps(doc, indent=1))
        return EXIT_OK if found else EXIT_FAIL
    if below:
        print(f"{root} is not a Checkpointer root (it holds no versions); the roots below it:")
        print_table([(path, f"{n} version{'s' if n != 1 else ''}") for path, n in below], indent="  ")
        print(f"point hpcckpt at one of them: hpcckpt ls {below[0][0]}")
    elif not rows:
        nothing = (f"{root}: no checkpoint versions, and no Checkpointer root up to {SEARCH_DEPTH} levels below it "
                   "(a root is the directory given to Checkpointer(...))")
        if levels is None and estimate is None:
            raise CheckpointError(nothing)
        print(nothing)
    else:
        chains = any(_chain(r) for r in rows)  # an incremental root: say what each version builds on
        table = [("STEP", "VERSION", "STATE", "SIZE", "CREATED", "VARS", "VALUES") + (("KIND",) if chains else ())]
        for r in rows:
            m = r.meta
            table.append((str(r.entry.step), r.entry.name, r.state, human_bytes(r.size),
                          time_text(m.created) if m else "-", str(len(m.variables)) if m else "-",
                          str(len(m.values)) if m else "-") + ((_kind_text(r),) if chains else ()))
        print_table(table, right={0, 3, 5, 6})
        for r in rows:
            if r.problem:
                print(f"  {r.entry.name}: {r.problem}")
        counts = {s: sum(1 for r in rows if r.state == s) for s in ("committed", "superseded", "partial", "damaged")}
        live = [r for r in rows if r.state == "committed"]
        parts = [f"{counts['committed']} committed" + (f" (newest step {live[-1].entry.step})" if live else "")]
        parts += [f"{n} {s}" for s, n in counts.items() if n and s != "committed"]
        total = sum(r.size for r in rows)
        print(f"{len(rows)} version{'s' if len(rows) != 1 else ''}: {', '.join(parts)}; {human_bytes(total)} on disk"
              + ("  (hpcckpt gc removes partial and superseded ones)" if counts["partial"] or counts["superseded"]
                 else ""))
    if levels:
        print("\n".join(format_levels(levels)))
    if estimate:
        print(estimate[1])
    return EXIT_OK if found else EXIT_FAIL


def roots_below(top: str, depth: int = SEARCH_DEPTH) -> list[tuple[str, int]]:
    """(path, number of version directories) of each Checkpointer root at most ``depth`` levels below ``top``.

    A root is a directory holding at least one version directory.  The search
    follows no symbolic link and enters neither a root, a version directory
    nor a hidden directory; the roots come sorted by path.
    """
    storage = storage_of(top)
    found, level = [], [top]
    for _ in range(depth):
        deeper = []
        for path in level:
            try:
                names = [n for n in storage.listdir(path) if not n.startswith(".") and parse_version_name(n) is None]
                dirs = [os.path.join(path, n) for n in names if _is_directory(storage, os.path.join(path, n))]
            except OSError:
                continue
            for d in dirs:
                n = len(list_versions(d, storage))
                if n:
                    found.append((d, n))
                else:
                    deeper.append(d)
        level = deeper
    return sorted(found)


def _is_directory(storage, path: str) -> bool:
    """Whether ``path`` is a directory itself (a link to one is not)."""
    st = storage.stat(path)
    return st is not None and st.kind == DIRECTORY


def _chain(r: VersionRow) -> dict | None:
    """The incremental record of a version's metadata (``extra.incremental``), or None."""
    info = r.meta.extra.get("incremental") if r.meta is not None and isinstance(r.meta.extra, dict) else None
    return info if isinstance(info, dict) else None


def _kind_text(r: VersionRow) -> str:
    """``full``, or ``incremental, depth 3 on step-...`` (what an incremental version builds on)."""
    info = _chain(r)
    if info is None:
        return "full" if r.meta is not None else "-"
    if info.get("kind") != "incremental":
        return "full"
    return f"incremental, depth {info.get('depth', '?')} on {info.get('base', '?')}"


def _row_json(r: VersionRow) -> dict:
    m = r.meta
    return {"name": r.entry.name, "step": r.entry.step, "revision": r.entry.revision, "state": r.state,
            "size": r.size, "created": m.created if m else None,
            "variables": len(m.variables) if m else None, "values": len(m.values) if m else None,
            "problem": r.problem,
            "incremental": {k: _chain(r).get(k) for k in ("kind", "base", "depth")} if _chain(r) else None}
