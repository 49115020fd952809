"""Chains of incremental versions on disk: who references whom, retention that respects it, compaction.

A version saved incrementally (hpcckpt/incremental/rules.py) lists data files of
sibling versions as ``@NAME/data/...``.  References are always to the version
that holds the bytes (never through an intermediate one), so the versions a
version depends on are exactly the ``@NAME`` prefixes of its ``files`` list.

* retention (catalog.referenced, catalog.protected and catalog.removable, used by
  ``Checkpointer(keep=N)``, the asynchronous engine and ``hpcckpt gc``) never
  removes a version that a kept version references.
* :func:`compact`: rewrites the kept versions of a root so that none of them
  references a version outside the kept set (the oldest kept becomes a full,
  self-contained version; later ones point at the kept copies), after which
  the others are unreferenced and ``gc`` removes them.  Each rewrite is crash
  safe: the copied chunks are written and fsynced into a new file first, then
  the metadata is replaced atomically.  Every file is reached through the
  root's Storage (POSIX by default).
"""

from __future__ import annotations

import os

import numpy as np

from hpcckpt.core.checksum import checksum
from hpcckpt.errors import CorruptCheckpointError
from hpcckpt.format.metadata import ChunkTable
from hpcckpt.core.names import compacted_file, split_reference
from hpcckpt.storage import POSIX, Storage


def compact(root: str, keep: int | None = None, dry_run: bool = False, fsync: bool = True,
            storage: Storage = POSIX) -> list[str]:
    """Make the newest ``keep`` committed versions (all when None) of ``root`` in ``storage`` independent of
    every other version.

    Returns one line per version rewritten.  Single process (the ``hpcckpt gc
    --compact`` command); do not run it while a job saves into ``root``.
    """
    from hpcckpt.root.catalog import current, list_versions
    from hpcckpt.incremental.rules import ChainIndex, codec_key
    from hpcckpt.storage.metadata_file import read_metadata
    from hpcckpt.loading.reader import allocate
    from hpcckpt.storage.commit import commit_version

    live = current(list_versions(root, storage))
    kept = live[-keep:] if keep else live
    names = {e.name for e in kept}
    available: dict = {}  # content key -> location in a kept version processed already
    report = []
    for e in kept:
        meta = read_metadata(e.path, storage)
        outside = sorted(r for r in {split_reference(f)[0] for f in meta.files if split_reference(f)} - names)
        if not outside:
            available.update(ChainIndex.from_metadata(meta, e.name).locations)
            continue
        new_files = list(meta.files)
        index = {f: i for i, f in enumerate(new_files)}
        target_name = _free_name(storage, e.path)
        target = None
        written = 0  # bytes appended to ``target`` so far: the offset of the next chunk copied
        copied = retargeted = 0
        done = False
        try:
            for var in meta.variables.values():
                c = var.chunks
                ck = codec_key(var.codec, var.dtype)
                file_col = c.file.copy()
                offset_col = c.offset.copy()
                for k in range(len(c)):
                    ref = split_reference(meta.files[int(c.file[k])])
                    if ref is None or ref[0] in names:
                        continue
                    raw = int(np.prod(c.count[k])) * var.dtype.itemsize
                    loc = available.get((c.hash[k], raw, ck)) if c.hash is not None else None
                    if loc is not None and loc[2] == int(c.nbytes[k]) and loc[3] == c.checksum[k]:
                        fname, off = loc[0], loc[1]
                        retargeted += 1
                    else:
                        data = allocate((int(c.nbytes[k]),), np.uint8, var.name)
                        src = storage.resolve(e.path, meta.files[int(c.file[k])])
                        _read_chunk(storage, src, int(c.offset[k]), data)
                        if checksum(data) != c.checksum[k]:
                            raise CorruptCheckpointError(f"{src}: a chunk of {var.name!r} at offset "
                                                         f"{int(c.offset[k])} fails its checksum")
                        if target is None and not dry_run:
                            target = storage.create(os.path.join(e.path, target_name))
                        fname, off = target_name, written
                        if target is not None:
                            written += storage.append(target, data)
                        copied += int(c.nbytes[k])
                    if fname not in index:
                        index[fname] = len(new_files)
                        new_files.append(fname)
                    file_col[k], offset_col[k] = index[fname], off
                var.chunks = ChunkTable(file_col, offset_col, c.nbytes, c.checksum, c.start, c.count, c.hash)
            done = True
        finally:
            if target is not None:
                storage.close(target, fsync=fsync and done)  # durable before the metadata names it
        used = sorted({int(i) for v in meta.variables.values() for i in v.chunks.file.tolist()})
        remap = {old: new for new, old in enumerate(used)}
        meta.files = [new_files[i] for i in used]
        for var in meta.variables.values():
            var.chunks.file = np.asarray([remap[int(i)] for i in var.chunks.file.tolist()], np.int64)
        info = meta.extra.get("incremental")
        if isinstance(info, dict):
            refs_left = {split_reference(f)[0] for f in meta.files if split_reference(f)}
            info["compacted"] = True
            if not refs_left:
                info.update(kind="full", base=None, depth=0)
            elif info.get("base") not in refs_left:
                info["base"] = max(refs_left)
        report.append(f"{e.name}: copied {copied} bytes, repointed {retargeted} chunks "
                      f"(no longer references {', '.join(outside)})")
        if not dry_run:
            commit_version(e.path, meta, fsync, storage)
        available.update(ChainIndex.from_metadata(meta, e.name).locations)
    return report


def _read_chunk(storage: Storage, path: str, offset: int, data) -> None:
    """Fill ``data`` from the data file ``path`` at ``offset``; CorruptCheckpointError when the file is missing
    or ends first."""
    try:
        handle, _ = storage.open_read(path)
    except FileNotFoundError:
        raise CorruptCheckpointError(f"data file {path} is missing") from None
    try:
        storage.read_segments(handle, offset, data, path, [(data.nbytes, None)])
    finally:
        storage.close_read(handle)


def _free_name(storage: Storage, version_path: str) -> str:
    """The first compaction file name not yet taken (by anything, a dangling link included) in the version at
    ``version_path``."""
    n = 0
    while storage.exists(os.path.join(version_path, compacted_file(n))):
        n += 1
    return compacted_file(n)

