"""``hpcckpt ls``: the versions under a Checkpointer root, and the MTBF learned from its failure history."""

from __future__ import annotations

import json


from .common import EXIT_OK, VersionRow, failure_estimate, human_bytes, print_table, require_root, version_rows


# --------------------------------------------------------------------------- ls

def cmd_ls(args) -> int:
    root = require_root(args.root)
    rows = version_rows(root)
    estimate = failure_estimate(root, args.prior_mtbf)
    from ..levels.status import format_levels, levels_status

    levels = levels_status(root)  # None unless a multi-level Checkpointer used this root
    if args.json:
        doc = {"root": root, "versions": [_row_json(r) for r in rows],
               "failure_history": estimate[0] if estimate else None, "levels": levels}
        print(json.dumps(doc, indent=1))
        return EXIT_OK
    if not rows:
        print(f"{root}: no versions")
    else:
        table = [("STEP", "VERSION", "STATE", "SIZE", "CREATED", "VARS", "VALUES")]
        for r in rows:
            m = r.meta
            table.append((str(r.entry.step), r.entry.name, r.state, human_bytes(r.size),
                          m.created if m else "-", str(len(m.variables)) if m else "-",
                          str(len(m.values)) if m else "-"))
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


def _row_json(r: VersionRow) -> dict:
    m = r.meta
    return {"name": r.entry.name, "step": r.entry.step, "revision": r.entry.revision, "state": r.state,
            "size": r.size, "created": m.created if m else None,
            "variables": len(m.variables) if m else None, "values": len(m.values) if m else None,
            "problem": r.problem}
