"""Tracked output files, the pure part: what a version records of each file, its validation, and which blocks changed.

A Checkpointer can track the application's output files (time series, logs:
docs/files.md), so that a restart rolls them back to their content at the
restored version.  Each version records, under ``extra["files"]`` of its
metadata (docs/format.md section 9), one *record* per file:

* ``append``: the file only grows.  The record is its length and the checksum
  of its last ``tail_bytes`` bytes; the rollback is a truncation, and a tail
  that no longer matches means the file was rewritten (refused).
* ``inplace``: the file is rewritten anywhere.  It is cut into blocks of
  ``block_bytes``; the record lists each block's XXH3-128 and where its bytes
  are stored: in this version's ``tracked/`` files, or, for a block unchanged
  since the previous save, in the version that stored it (``@NAME/path``, as
  incremental saves reference data).
* ``absent``: a path registered literally (no glob) that did not exist.

This module holds no I/O and no MPI (hpcckpt.root.files does those).
"""

from __future__ import annotations

import fnmatch
import glob
import posixpath
from dataclasses import dataclass

from hpcckpt.errors import CheckpointError, CorruptCheckpointError
from hpcckpt.format.metadata import check_relative_path
from hpcckpt.core.names import reference, split_reference

MODES = ("append", "inplace")
#: Block of an in-place file, and the tail of an append-only file whose checksum is recorded.
DEFAULT_BLOCK_BYTES = 1 << 20
#: The directory of a version that holds the stored blocks of in-place files.
TRACKED_DIR = "tracked"
#: The placeholder of a per-rank path: each rank records its own file.
RANK_FIELD = "{rank}"
MANIFEST_VERSION = 1
_MAX_BLOCK_BYTES = 1 << 30


def tracked_file(rank: int) -> str:
    """The file of a version in which ``rank`` stores the changed blocks of its in-place files."""
    return f"{TRACKED_DIR}/r{rank:06d}.bin"


@dataclass(frozen=True)
class Pattern:
    """One registration: a path or glob (``{rank}`` in it: one file per rank), its mode and block size."""

    pattern: str
    mode: str = "append"
    block_bytes: int = DEFAULT_BLOCK_BYTES

    @property
    def per_rank(self) -> bool:
        return RANK_FIELD in self.pattern

    @property
    def literal(self) -> bool:
        """A plain path (no glob characters): recorded even when it does not exist."""
        return not glob.has_magic(self.pattern)

    def for_rank(self, rank: int) -> str:
        return self.pattern.replace(RANK_FIELD, str(rank))

    def names(self, rank: int) -> str:
        """The normalised path or glob this registration names for files recorded by ``rank``."""
        return posixpath.normpath(self.for_rank(rank) if self.per_rank else self.pattern)


def registration_of(record: "Record", registered: list[Pattern]) -> Pattern | None:
    """The registration of the running application that covers ``record``, or None: then the record is
    ignored by a restore.

    A record is covered when its path (normalised, as saves write it) is the
    path a literal registration names, or is matched component by component
    by a glob registration as ``glob.glob`` would match it, in the same mode.
    An ``absent`` record is covered by a literal registration only (a glob
    never records one).  Whatever a checkpoint's metadata says, a restore can
    therefore only act on files the application registers now.
    """
    if record.path != posixpath.normpath(record.path):
        return None
    for p in registered:
        name = p.names(record.rank)
        if p.literal:
            if name == record.path and record.mode in ("absent", p.mode):
                return p
        elif record.mode == p.mode and glob_matches(name, record.path):
            return p
    return None


def glob_matches(pattern: str, path: str) -> bool:
    """Whether ``glob.glob(pattern)`` can name ``path`` (both normalised): the same number of components, each
    matched by its pattern component, ``*`` never crossing a ``/`` and a hidden name only by a hidden pattern."""
    pattern_parts, path_parts = pattern.split("/"), path.split("/")
    return len(pattern_parts) == len(path_parts) and all(
        _component_matches(p, n) for p, n in zip(pattern_parts, path_parts))


def _component_matches(pattern: str, name: str) -> bool:
    if not glob.has_magic(pattern):
        return pattern == name
    if name.startswith(".") and not pattern.startswith("."):
        return False
    return fnmatch.fnmatchcase(name, pattern)


def registered_location(name: str) -> str:
    """The directory every path a normalised registration ``name`` names lies in: its leading components
    without glob characters (the file's own directory for a literal path)."""
    parts = name.split("/")[:-1]
    fixed = []
    for part in parts:
        if glob.has_magic(part):
            break
        fixed.append(part)
    if fixed == [""]:
        return "/"
    return "/".join(fixed) or "."


def patterns(files, mode: str = "append", block_bytes: int = DEFAULT_BLOCK_BYTES) -> list[Pattern]:
    """The Patterns of ``files``: a path or glob, a list of them (all in ``mode``), or a dict pattern -> mode."""
    if files is None:
        return []
    if isinstance(block_bytes, bool) or not isinstance(block_bytes, int) or not 1 <= block_bytes <= _MAX_BLOCK_BYTES:
        raise CheckpointError(f"block_bytes must be an integer in [1, 2^30], got {block_bytes!r}")
    pairs = files.items() if isinstance(files, dict) else [(f, mode) for f in ([files] if isinstance(files, str)
                                                                              else files)]
    out = []
    for pattern, m in pairs:
        if not isinstance(pattern, str) or not pattern:
            raise CheckpointError(f"a tracked file must be a non-empty path or glob, got {pattern!r}")
        if m not in MODES:
            raise CheckpointError(f"the mode of tracked file {pattern!r} must be one of {MODES}, got {m!r}")
        if "{" in pattern.replace(RANK_FIELD, ""):
            raise CheckpointError(f"tracked file {pattern!r}: the only placeholder allowed is {RANK_FIELD}")
        out.append(Pattern(pattern, m, block_bytes))
    return out


def block_count(size: int, block_bytes: int) -> int:
    return -(-size // block_bytes)


def block_span(index: int, size: int, block_bytes: int) -> tuple[int, int]:
    """``(offset, nbytes)`` of block ``index`` of a file of ``size`` bytes."""
    start = index * block_bytes
    return start, min(block_bytes, size - start)


def tail_span(size: int, tail_bytes: int) -> tuple[int, int]:
    """``(offset, nbytes)`` of the tail of an append-only file whose checksum is recorded."""
    n = min(size, tail_bytes)
    return size - n, n


def reuse(hashes: list[str], previous: list[tuple[str, str, int]] | None) -> list[tuple[str, int] | None]:
    """For each block hash, the ``(blob, offset)`` of an earlier stored copy of the same block, or None (store it).

    ``previous``: the blocks of the file at the previous save, ``(hash, blob,
    offset)`` by index with blobs in root form (``@NAME/path``).  A block is
    reused only at the same index with the same hash (a rewrite in place
    leaves the other blocks where they were).
    """
    previous = previous or []
    return [(previous[i][1], previous[i][2]) if i < len(previous) and previous[i][0] == h else None
            for i, h in enumerate(hashes)]


def root_form(blob: str, version: str) -> str:
    """A blob of the manifest of ``version`` as another version of the root names it."""
    return blob if split_reference(blob) is not None else reference(version, blob)


@dataclass
class Record:
    """A validated record of one file (see the module docstring)."""

    path: str
    rank: int
    mode: str  # "append", "inplace" or "absent"
    size: int = 0
    tail_bytes: int = 0
    tail: str = ""
    block_bytes: int = 0
    blocks: list | None = None  # [(hash, blob, offset)] for in-place files, blobs as the version names them

    def to_json(self, blobs: dict) -> dict:
        """The record as docs/format.md section 9 writes it; ``blobs`` maps blob names to indices (grown here)."""
        doc = {"path": self.path, "rank": self.rank, "mode": self.mode}
        if self.mode == "append":
            doc.update(size=self.size, tail_bytes=self.tail_bytes, tail=self.tail)
        elif self.mode == "inplace":
            doc.update(size=self.size, block_bytes=self.block_bytes,
                       blocks={"file": [blobs.setdefault(b, len(blobs)) for _, b, _ in self.blocks],
                               "offset": [o for _, _, o in self.blocks], "hash": [h for h, _, _ in self.blocks]})
        return doc


def manifest(records: list[Record]) -> dict:
    """The ``extra["files"]`` object of a version from every rank's records; duplicate paths are refused."""
    seen = {}
    for r in records:
        if r.path in seen:
            raise CheckpointError(f"tracked file {r.path!r} is recorded by rank {seen[r.path]} and rank {r.rank}: "
                                  "a file is tracked by one rank (a shared path by rank 0, a {rank} path by its rank)")
        seen[r.path] = r.rank
    blobs: dict = {}
    entries = [r.to_json(blobs) for r in records]
    return {"version": MANIFEST_VERSION, "blobs": list(blobs), "entries": entries}


def parse_manifest(doc) -> list[Record]:
    """The records of a version's ``extra["files"]``, validated as untrusted input (CorruptCheckpointError)."""
    _expect(isinstance(doc, dict) and set(doc) == {"version", "blobs", "entries"}, "files: malformed manifest")
    _expect(_count(doc["version"], 2**31) and doc["version"] == MANIFEST_VERSION, f"files: unknown manifest version {doc['version']!r}")
    blobs, entries = doc["blobs"], doc["entries"]
    _expect(isinstance(blobs, list) and isinstance(entries, list), "files: blobs and entries must be arrays")
    for b in blobs:
        check_relative_path(b)
    out, paths = [], set()
    for e in entries:
        _expect(isinstance(e, dict), "files: an entry must be an object")
        record = _parse_entry(e, blobs)
        _expect(record.path not in paths, f"files: {record.path!r} is recorded twice")
        paths.add(record.path)
        out.append(record)
    return out


_KEYS = {"absent": {"path", "rank", "mode"}, "append": {"path", "rank", "mode", "size", "tail_bytes", "tail"},
         "inplace": {"path", "rank", "mode", "size", "block_bytes", "blocks"}}


def _parse_entry(e: dict, blobs: list) -> Record:
    mode = e.get("mode")
    _expect(isinstance(mode, str) and mode in _KEYS and set(e) == _KEYS[mode], f"files: malformed entry {str(e)[:120]}")
    path = e["path"]
    _expect(isinstance(path, str) and 0 < len(path) <= 4096 and "\x00" not in path, "files: bad path")
    _expect(_count(e["rank"], 2**31), f"files: bad rank of {path!r}")
    record = Record(path=path, rank=e["rank"], mode=mode)
    if mode == "append":
        _expect(_count(e["size"], 2**62) and _count(e["tail_bytes"], _MAX_BLOCK_BYTES + 1)
                and e["tail_bytes"] >= 1, f"files: bad size of {path!r}")
        _expect(_hex(e["tail"], 16), f"files: bad tail checksum of {path!r}")
        record.size, record.tail_bytes, record.tail = e["size"], e["tail_bytes"], e["tail"]
    elif mode == "inplace":
        size, bb, blocks = e["size"], e["block_bytes"], e["blocks"]
        _expect(_count(size, 2**62) and _count(bb, _MAX_BLOCK_BYTES + 1) and bb >= 1, f"files: bad size of {path!r}")
        _expect(isinstance(blocks, dict) and set(blocks) == {"file", "offset", "hash"}, f"files: bad blocks of {path!r}")
        n = block_count(size, bb)
        cols = blocks["file"], blocks["offset"], blocks["hash"]
        _expect(all(isinstance(c, list) and len(c) == n for c in cols), f"files: {path!r} needs {n} blocks")
        _expect(all(_count(f, len(blobs)) for f in cols[0]) and all(_count(o, 2**62) for o in cols[1])
                and all(_hex(h, 32) for h in cols[2]), f"files: bad block of {path!r}")
        record.size, record.block_bytes = size, bb
        record.blocks = [(h, blobs[f], o) for f, o, h in zip(*cols)]
    return record


def _count(value, bound: int) -> bool:
    """A JSON integer in [0, bound)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < bound


def _hex(value, digits: int) -> bool:
    return isinstance(value, str) and len(value) == digits and all(c in "0123456789abcdef" for c in value)


def _expect(condition: bool, message: str) -> None:
    if not condition:
        raise CorruptCheckpointError(message)


def recorder(record_rank: int, nranks: int) -> int:
    """The rank that checks and rolls back a file recorded by ``record_rank`` on a run of ``nranks`` ranks
    (the same rank on the same rank count, so per-rank files on node-local disks work there)."""
    return record_rank % nranks
