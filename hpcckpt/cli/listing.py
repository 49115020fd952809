"""``hpcckpt ls``: the versions under a Checkpointer root, and the MTBF learned from its failure history."""

from __future__ import annotations

import json


from hpcckpt.cli.common import (EXIT_OK, VersionRow, failure_estimate, human_bytes, print_table, require_root, time_text,
                     version_rows)


# --------------------------------------------------------------------------- ls

def cmd_ls(args) -> int:
    root = require_root(args.root)
    rows = version_rows(root)
    estimate = failure_estimate(root, args.prior_mtbf)
    from hpcckpt.levels.status import format_levels, levels_status

    levels = levels_status(root)  # None unless a multi-level Checkpointer used this root
    if args.json:
        doc = {"root": root, "versions": [_row_json(r) for r in rows],
               "failure_history": estimate[0] if estimate else None, "levels": levels}
        print(json.dumps(doc, indent=1))
        return EXIT_OK
    if not rows:
        print(f"{root}: no versions")
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
    return EXIT_OK


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
