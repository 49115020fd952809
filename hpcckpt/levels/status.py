"""What ``hpcckpt ls ROOT`` shows about the levels: which levels hold each version, and a flush in progress.

The engine's rank 0 writes ``ROOT/levels.json`` (the node-local directories
and the intervals) when a Checkpointer with ``local_dir`` starts, and
``ROOT/flush-in-progress.json`` while an L4 flush runs (removed when the flush
is committed or fails; a run killed mid-flush leaves it, and the next run's
first save removes it).  From those and the version directories:

* L1: the node directories holding the version committed (``metadata.json``
  present), e.g. ``2/2`` nodes.  Only the node directories this machine can
  see are looked at (all of them with simulated nodes; with real nodes, run
  ``ls`` on a compute node).
* one column per level registered in ``levels.registry.LEVELS``, in the
  registry's order and named by its ``label`` (L2 partner copies, L3 XOR
  parity, RS Reed-Solomon parity, PM the persistent-memory tier, then any
  level registered from outside the package): the version's metadata records
  that level's description (``extra.levels[key]``) and the version is on L1.
* L4: the version is committed on the root.
"""

from __future__ import annotations

import json
import os

from hpcckpt.root.catalog import list_versions
from hpcckpt.errors import CheckpointError
from hpcckpt.core.humanize import format_duration, table_lines
from hpcckpt.core.names import METADATA_FILE
from hpcckpt.storage import POSIX, Storage
from hpcckpt.levels import FLUSH_MARKER, LEVELS_FILE
from hpcckpt.levels.registry import LEVELS


#: The longest levels.json or flush marker read: far beyond any real one.
_MAX_JSON = 1 << 20


def _load_json(path: str, storage: Storage = POSIX):
    try:
        return json.loads(storage.read_file(path, _MAX_JSON))
    except (OSError, ValueError, RecursionError, CheckpointError):
        return None


def level_columns() -> list[tuple[str, str]]:
    """``(key, label)`` of every registered level, in the registry's order: the columns between L1 and L4."""
    return [(cls.key, cls.label) for cls in LEVELS.values()]


def levels_status(root: str, storage: Storage = POSIX) -> dict | None:
    """The levels of every version under ``root``, in ``storage`` (None when the root has no ``levels.json``).
    The node directories are node-local: looked at through POSIX.

    Each version's entry has ``L1_nodes`` and ``nodes``, one boolean per
    registered level under its label (:func:`level_columns`) and ``L4``.
    """
    conf = _load_json(os.path.join(root, LEVELS_FILE), storage)
    marker = _load_json(os.path.join(root, FLUSH_MARKER), storage)
    if not isinstance(conf, dict):
        return None if marker is None else {"config": None, "versions": [], "flush": _flush(root, marker, storage)}
    node_dirs = [d for d in conf.get("node_dirs") or [] if isinstance(d, str)]
    visible = [d for d in node_dirs if os.path.isdir(d)]
    root_entries = list_versions(root, storage)
    on_root = {e.name for e in root_entries if e.committed}
    by_name: dict[str, dict] = {}
    for d in visible:
        for e in list_versions(d):
            if e.committed:
                by_name.setdefault(e.name, {"step": e.step, "nodes": 0, "meta": os.path.join(e.path, METADATA_FILE),
                                            "storage": POSIX})
                by_name[e.name]["nodes"] += 1
    for name in on_root:
        if name not in by_name:
            e = next(x for x in root_entries if x.name == name)
            by_name[name] = {"step": e.step, "nodes": 0, "meta": os.path.join(e.path, METADATA_FILE),
                             "storage": storage}
    versions = []
    for name in sorted(by_name):
        info = by_name[name]
        meta = _load_json(info["meta"], info["storage"]) or {}
        lv = (meta.get("extra") or {}).get("levels") if isinstance(meta.get("extra"), dict) else None
        lv = lv if isinstance(lv, dict) else {}
        versions.append({"name": name, "step": info["step"], "L1_nodes": info["nodes"], "nodes": len(node_dirs),
                         **{label: bool(lv.get(key)) for key, label in level_columns()}, "L4": name in on_root})
    return {"config": conf, "visible_node_dirs": len(visible), "versions": versions,
            "flush": _flush(root, marker, storage)}


def _flush(root: str, marker, storage: Storage) -> dict | None:
    if not isinstance(marker, dict):
        return None
    name = marker.get("version")
    done = isinstance(name, str) and storage.is_file(os.path.join(root, name, METADATA_FILE))
    return {**marker, "state": "stale (already committed)" if done else "in progress (or interrupted)"}


def format_levels(status: dict) -> list[str]:
    """The lines ``hpcckpt ls`` prints."""
    out = []
    conf = status.get("config")
    if conf:
        columns = level_columns()
        intervals = "".join(f"{label} every {conf.get(f'{key}_every') or 0}, " for key, label in columns)
        out.append(f"levels: L1 in {conf.get('local_dir')} ({len(conf.get('node_dirs') or [])} node dir(s), "
                   f"{status.get('visible_node_dirs', 0)} visible here); {intervals}flush every {conf.get('flush_every')}"
                   + (" (derived from costs %s)" % ", ".join(map(format_duration, conf["derived_from_costs"]))
                      if conf.get("derived_from_costs") else ""))
        rows = [("VERSION", "L1", *(label for _, label in columns), "L4")]
        for v in status["versions"]:
            rows.append((v["name"], f"{v['L1_nodes']}/{v['nodes']}" if v["L1_nodes"] else "-",
                         *("yes" if v.get(label) and v["L1_nodes"] else "-" for _, label in columns),
                         "yes" if v["L4"] else "-"))
        out += table_lines(rows, indent="  ")
    f = status.get("flush")
    if f:
        out.append(f"flush to L4 of {f.get('version')} {f['state']} (marker {FLUSH_MARKER})")
    return out
