"""The commit of a version: the one place where a version's metadata is built from chunk rows and made visible.

Every kind of save (blocking, incremental, asynchronous, the levels' copies,
compaction, a restore that copies a version to node-local storage) ends here,
so the commit rule of docs/format.md section 2 is written once: the data files
are durable before ``metadata.json`` exists, the metadata is written atomically
(and sealed by its own checksum, see metadata.seal), and the directory entry is
durable afterwards.  ``fsync=False`` (an option for throw-away runs) skips the
fsyncs but never the atomic rename.
"""

from __future__ import annotations

import datetime as _dt
import os

from hpcckpt.format.metadata import ChunkTable, Metadata, Variable
from hpcckpt.core.names import DATA_DIR, METADATA_FILE
from hpcckpt.storage import POSIX, Storage


def now_iso() -> str:
    """The commit time as docs/format.md writes it: ISO 8601 in UTC, to the second."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def metadata_from_rows(variables: dict, tables: list, codecs: dict | None, values, nranks: int, step,
                       extra: dict) -> tuple[Metadata, int, int]:
    """The Metadata of a version written by ``nranks`` ranks, and its ``(stored bytes, chunk count)``.

    ``variables``: the save plan (planning.VariablePlan by name); ``tables``:
    each rank's written rows ``(variable, file, offset, nbytes, checksum,
    start, count)``, in rank order (so the files are listed in rank order);
    ``codecs``: the codec config of each compressed variable.
    """
    from hpcckpt.core.encoding import dtype_from_json

    files: list[str] = []
    index: dict[str, int] = {}
    rows: dict[str, list] = {name: [] for name in variables}
    total = nchunks = 0
    for rank_rows in tables:
        for variable, file, offset, nbytes, digest, start, count in rank_rows:
            if file not in index:
                index[file] = len(files)
                files.append(file)
            rows[variable].append((index[file], offset, nbytes, digest, start, count))
            total += nbytes
            nchunks += 1
    meta = Metadata(
        step=step, files=files, nranks=nranks, created=now_iso(),
        variables={name: Variable(name=name, kind=plan.kind, dtype=dtype_from_json(plan.dtype), shape=plan.shape,
                                  chunks=ChunkTable.from_rows(rows[name], len(plan.shape)),
                                  codec=(codecs or {}).get(name, {"id": "none"}))
                   for name, plan in variables.items()},
        values=values, extra=extra)
    return meta, total, nchunks


def commit_version(directory: str, meta: Metadata | bytes, fsync: bool = True, storage: Storage = POSIX,
                   synced: bool = False) -> bytes:
    """Make the version at ``directory`` visible with ``meta`` (a Metadata, or its committed bytes); those bytes.

    Order: ``data/`` fsynced (its new entries are durable), ``metadata.json``
    written to a temporary name, fsynced and renamed over (readers see no
    version or the whole one), then the version directory (storage.atomic_write)
    and its parent fsynced.  ``synced``: the writers already fsynced ``data/``
    (each after creating its files) and the parent (after the version
    directory was made; its entry there does not change afterwards), in
    parallel with the other ranks' writes: what is left is the metadata's part.
    """
    raw = meta if isinstance(meta, (bytes, bytearray)) else meta.to_json_bytes()
    data = os.path.join(directory, DATA_DIR)
    if fsync and not synced and storage.exists(data):
        storage.sync_directory(data)
    storage.atomic_write(os.path.join(directory, METADATA_FILE), bytes(raw), fsync=fsync)
    if fsync and not synced:
        storage.sync_directory(parent_directory(directory))
    return bytes(raw)


def parent_directory(directory: str) -> str:
    """The directory whose entry names the version ``directory`` (what the commit fsyncs last)."""
    return os.path.dirname(os.path.abspath(directory))
