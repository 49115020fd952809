"""Incremental (differential) saves over dynamic datasets (docs/incremental.md).

Every variable is cut along a *global* block grid (:func:`block_grid`): blocks
are runs of whole trailing sub-arrays of about ``block_bytes``, in global
coordinates, intersected with each rank's box.  Each piece is hashed (xxh3_128
of its raw bytes) and looked up, by content, in the index of the base version
(:class:`ChainIndex`): a piece whose bytes are already stored somewhere in the
chain is not written; its row points at that file and offset, through a
reference ``@VERSION/data/...`` to the sibling version that holds it.  So:

* a variable whose global shape changed finds no equal blocks (unless some of
  its content really is the same) and is written again, alone;
* a Ragged table that grew at its end keeps its prefix blocks (the grid does not
  depend on the row count), rows that moved between ranks but kept their global
  position are found, variables may appear and disappear;
* a restart on another rank count continues the chain (nothing is per rank).

Identical blocks within one version are stored once (``dedup``): the first
occurrence (lowest rank, then save order) is written, the others point at it.
A hybrid policy (:func:`choose_kind`) makes a full version when the chain is
``max_chain`` deep or when more than ``full_threshold`` of the bytes changed.

Everything here is pure (grid, keys, index, policy, duplicate assignment, row
assembly, the version's metadata) and tested with hypothesis; the save
pipeline's select stage (saving/selection.py) runs it across ranks, incremental/chain_cache.py
finds the base.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass, field

import numpy as np

from hpcckpt.core import blockhash
from hpcckpt.core.arrays import byte_view
from hpcckpt.core.checksum import raw_hash
from hpcckpt.storage.commit import now_iso
from hpcckpt.core.devices import array_module, as_local_array, is_device_array
from hpcckpt.core.encoding import dtype_to_json
from hpcckpt.format.metadata import ChunkTable, Metadata, Variable
from hpcckpt.core.names import reference, split_reference

#: Name of the content hash stored in the optional ``hash`` column of the chunk table.
HASH_ALGORITHM = "xxh3_128"

Key = tuple[str, int, str]  # (content hash of the raw bytes, raw byte count, codec key)
Location = tuple[str, int, int, str]  # (file as "@VERSION/path", offset, stored nbytes, checksum)


# --------------------------------------------------------------------------- the global block grid

def block_grid(shape, itemsize: int, block_bytes: int) -> tuple[int, int]:
    """``(axis, rows)``: blocks are 1 element wide on the axes before ``axis``, ``rows`` on ``axis``, whole after.

    ``axis`` is the first axis whose trailing sub-arrays fit in ``block_bytes``
    (the last axis if not even one element does), so a block is one contiguous
    run of C-ordered memory of at most ``block_bytes`` (or one element).  The
    grid never depends on ``shape[0]``: a table that grows keeps its blocks.
    """
    nd = len(shape)
    if nd == 0:
        return 0, 1
    tail = itemsize
    tails = [0] * nd
    for k in range(nd - 1, -1, -1):
        tails[k] = tail
        tail *= int(shape[k])
    axis = next((k for k in range(nd) if tails[k] <= block_bytes), nd - 1)
    return axis, max(1, block_bytes // max(tails[axis], 1))


def grid_boxes(shape, itemsize: int, block_bytes: int, lo, hi):
    """The pieces of the box ``[lo, hi)``: ``(global start, count)`` of each block of the grid met by the box.

    Each piece is a run of whole trailing *local* sub-arrays of the box, so it is
    contiguous in the C-ordered local array.  An empty box has no pieces; a 0-d
    variable has one, ``((), ())``.
    """
    nd = len(shape)
    if nd == 0:
        yield (), ()
        return
    lo, hi = tuple(int(x) for x in lo), tuple(int(x) for x in hi)
    if any(b <= a for a, b in zip(lo, hi)):
        return
    axis, rows = block_grid(shape, itemsize, block_bytes)
    tail_start, tail_count = lo[axis + 1:], tuple(b - a for a, b in zip(lo[axis + 1:], hi[axis + 1:]))
    for prefix in itertools.product(*(range(lo[i], hi[i]) for i in range(axis))):
        for j in range(lo[axis] // rows, (hi[axis] - 1) // rows + 1):
            a, b = max(lo[axis], j * rows), min(hi[axis], (j + 1) * rows)
            yield prefix + (a,) + tail_start, (1,) * axis + (b - a,) + tail_count


def local_piece(arr, lo, start, count):
    """The C-contiguous piece ``[start, start + count)`` (global) of the local array whose box starts at ``lo``.

    A CuPy array's piece stays on its device.
    """
    xp = array_module(arr)
    if not count:
        return xp.ascontiguousarray(arr).reshape(())
    sel = tuple(slice(s - l, s - l + n) for s, l, n in zip(start, lo, count))
    return xp.ascontiguousarray(arr[sel])


def content_hash(piece) -> str:
    """The content hash of a contiguous piece: xxh3_128 on the host, ``mix128:...`` (core/blockhash.py) on a GPU.

    The device hash carries its name, so it never matches a host hash: a
    variable that moves between GPU and CPU ranks starts a fresh baseline.
    """
    if is_device_array(piece):
        with piece.device:
            return f"{blockhash.NAME}:{blockhash.mix128(array_module(piece), piece)}"
    return raw_hash(byte_view(piece))


def codec_key(codec: dict, dtype) -> str:
    """What stored bytes must share besides the raw content to stand in for each other.

    Uncompressed chunks are the raw bytes themselves (any dtype); compressed ones
    decode only with the same codec configuration and item layout.
    """
    if not codec or codec.get("id", "none") == "none":
        return "none"
    return json.dumps([codec, dtype_to_json(np.dtype(dtype))], sort_keys=True, separators=(",", ":"))


def root_form(file: str, version: str) -> str:
    """A data file name of ``version`` as seen from a sibling: ``@version/file`` (references stay as they are)."""
    return file if split_reference(file) is not None else reference(version, file)


# --------------------------------------------------------------------------- the index a version offers

@dataclass
class ChainIndex:
    """What a committed version offers to the next save: where each distinct block content is stored."""

    name: str  # the version's directory name
    depth: int  # incremental versions since the last full one (0: full)
    locations: dict = field(default_factory=dict)  # Key -> Location

    @classmethod
    def from_metadata(cls, meta: Metadata, name: str) -> "ChainIndex":
        """Index every chunk that has a content hash; own files are preferred over references (newest data)."""
        info = meta.extra.get("incremental") if isinstance(meta.extra, dict) else None
        depth = info.get("depth", 0) if isinstance(info, dict) else 0
        depth = depth if type(depth) is int and depth >= 0 else 0
        own: dict = {}
        refs: dict = {}
        files = [root_form(f, name) for f in meta.files]
        is_ref = [split_reference(f) is not None for f in meta.files]
        for var in meta.variables.values():
            c = var.chunks
            if c.hash is None or not len(c):
                continue
            ck = codec_key(var.codec, var.dtype)
            raw = ((np.prod(c.count, axis=1) if c.count.shape[1] else np.ones(len(c), np.int64))
                   * var.dtype.itemsize).tolist()
            hashes, sums = list(c.hash), list(c.checksum)  # the strings at once (columnar tables hold words)
            for k, (fi, off, nb) in enumerate(zip(c.file.tolist(), c.offset.tolist(), c.nbytes.tolist())):
                file = files[fi]
                key = (hashes[k], raw[k], ck)
                loc = (file, off, nb, sums[k])
                if not is_ref[fi]:
                    own.setdefault(key, loc)
                elif key not in refs or loc[0] > refs[key][0]:
                    refs[key] = loc  # of several older copies, the newest version's (releases old ones sooner)
        refs.update(own)
        return cls(name=name, depth=depth, locations=refs)

    def __len__(self) -> int:
        return len(self.locations)

    def restricted(self, file_name: str) -> "ChainIndex":
        """The locations in data files named ``file_name`` only (multi-level saves: a rank reuses its own file's
        blocks, which sit on its node)."""
        suffix = "/" + file_name
        return ChainIndex(self.name, self.depth, {k: loc for k, loc in self.locations.items()
                                                  if loc[0].endswith(suffix)})


# --------------------------------------------------------------------------- policy

def choose_kind(base_depth: int | None, changed_bytes: int, total_bytes: int, max_chain: int,
                full_threshold: float) -> tuple[str, str]:
    """``(kind, reason)``: "full" or "incremental" for the next version.

    Full when there is no usable base, when one more incremental version would
    make the chain deeper than ``max_chain``, or when the changed fraction of the
    bytes exceeds ``full_threshold`` (an incremental version then saves little
    and a full one shortens the chain restores read from).
    """
    if base_depth is None:
        return "full", "no base"
    if base_depth + 1 > max_chain:
        return "full", f"chain depth {base_depth + 1} > max_chain {max_chain}"
    fraction = changed_bytes / total_bytes if total_bytes else 0.0
    if fraction > full_threshold:
        return "full", f"{fraction:.1%} changed > full_threshold {full_threshold:.1%}"
    return "incremental", f"{fraction:.1%} changed"


def duplicates(keys_per_rank: list[list], rank: int) -> list[bool]:
    """For each of ``rank``'s keys: whether an earlier occurrence (lower rank, or earlier on this rank) exists."""
    seen = set()
    for r in range(rank):
        seen.update(keys_per_rank[r])
    out = []
    for key in keys_per_rank[rank]:
        out.append(key in seen)
        seen.add(key)
    return out


def assemble(variables: dict, dtypes: dict, codecs: dict, per_rank: list[dict]):
    """Rank 0: the files list and, per variable, the chunk rows and hashes of the new version.

    ``per_rank[r]`` holds ``written`` (transport rows ``(variable, file, offset,
    nbytes, checksum, start, count)``, of any rank's pieces), ``hashes``
    (``{(variable, start): hash}`` of the pieces rank r had written),
    ``refs`` (rows ``(variable, "@V/file", offset, nbytes, checksum, start, count, hash)``
    into older versions) and ``dups`` (``(variable, key, start, count, hash)``,
    blocks identical to a block written in this version).
    Returns ``(files, {variable: (rows, hashes)})`` with rows as ChunkTable.from_rows takes them.
    """
    hashes = {}
    for part in per_rank:
        hashes.update(part["hashes"])
    itemsize = {name: dt.itemsize for name, dt in dtypes.items()}
    ckeys = {name: codec_key(codecs.get(name), dt) for name, dt in dtypes.items()}
    rows = []
    by_key: dict = {}
    for part in per_rank:
        for variable, file, offset, nbytes, digest, start, count in part["written"]:
            h = hashes[(variable, tuple(start))]
            rows.append((variable, file, offset, nbytes, digest, tuple(start), tuple(count), h))
            raw = math.prod(count) * itemsize[variable]
            by_key.setdefault((h, raw, ckeys[variable]), (file, offset, nbytes, digest))
    for part in per_rank:
        for row in part["refs"]:
            rows.append(tuple(row[:5]) + (tuple(row[5]), tuple(row[6]), row[7]))
    for part in per_rank:
        for variable, key, start, count, h in part["dups"]:
            file, offset, nbytes, digest = by_key[tuple(key)]
            rows.append((variable, file, offset, nbytes, digest, tuple(start), tuple(count), h))
    files: list[str] = []
    index: dict[str, int] = {}
    out = {name: ([], []) for name in variables}
    for variable, file, offset, nbytes, digest, start, count, h in rows:
        if file not in index:
            index[file] = len(files)
            files.append(file)
        out[variable][0].append((index[file], offset, nbytes, digest, start, count))
        out[variable][1].append(h)
    return files, out


# --------------------------------------------------------------------------- pieces and metadata

def hash_pieces(parts: list, variables: dict, dtypes: dict, codecs: dict, block_bytes: int,
                index: ChainIndex | None) -> list[tuple]:
    """This rank's pieces on the global grid: (variable, start, count, array, key, raw nbytes, base Location or None).

    ``parts``: ``(variable, global start, array)`` this rank writes (selection.written_parts).
    """
    out = []
    locations = index.locations if index is not None else {}
    for name, lo, local in parts:
        arr = as_local_array(local)
        if not arr.size:
            continue
        hi = tuple(a + n for a, n in zip(lo, arr.shape))
        dtype = dtypes[name]
        ck = codec_key(codecs.get(name), dtype)
        for start, count in grid_boxes(variables[name].shape, dtype.itemsize, block_bytes, lo, hi):
            piece = local_piece(arr, lo, start, count)
            key = (content_hash(piece), piece.nbytes, ck)
            out.append((name, start, count, piece, key, piece.nbytes, locations.get(key)))
    return out


def incremental_metadata(variables: dict, dtypes: dict, codecs: dict, parts: list, values, nranks: int, step,
                         extra: dict) -> tuple[Metadata, int, int, dict]:
    """Rank 0, pure: the Metadata of an incremental-capable version from every rank's part (see :func:`assemble`).

    Returns ``(meta, written bytes, chunk count, summary)``; ``summary`` (the
    written, referenced and deduplicated bytes) is also added to
    ``extra["incremental"]``.
    """
    files, tables = assemble(variables, dtypes, codecs, parts)
    written = sum(nbytes for p in parts for _, _, _, nbytes, _, _, _ in p["written"])
    # rows into older versions; a ref row into a file of this version (a pre-copy file, hpcckpt.saving.precopy) is not
    referenced = sum(r[3] for p in parts for r in p["refs"] if split_reference(r[1]) is not None)
    deduplicated = sum(math.prod(d[3]) * dtypes[d[0]].itemsize for p in parts for d in p["dups"])
    summary = {"written_bytes": written, "referenced_bytes": referenced, "deduplicated_bytes": deduplicated}
    extra["incremental"].update(summary)
    meta_vars = {}
    for vname, plan in variables.items():
        rows, hashes = tables[vname]
        table = ChunkTable.from_rows(rows, len(plan.shape))
        table.hash = hashes
        meta_vars[vname] = Variable(name=vname, kind=plan.kind, dtype=dtypes[vname], shape=plan.shape, chunks=table,
                                    codec=(codecs or {}).get(vname, {"id": "none"}))
    meta = Metadata(step=step, files=files, nranks=nranks, created=now_iso(), variables=meta_vars, values=values,
                    extra=extra)
    return meta, written, sum(len(rows) for rows, _ in tables.values()), summary


def referenced_versions(files: list[str]) -> set[str]:
    """The sibling versions a version's file list points into."""
    return {split_reference(f)[0] for f in files if split_reference(f) is not None}
