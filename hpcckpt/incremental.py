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

The pure parts (grid, keys, index, policy, duplicate assignment, row assembly)
know nothing of MPI or files and are tested with hypothesis; :func:`save_incremental`
is the collective save that wires them into the transports of saving.py.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import shutil
from dataclasses import dataclass, field

import numpy as np
import xxhash

from . import blockhash
from .arrays import byte_view
from .checksum import checksum, checksum_from_xxh3_128
from .collective import attempt, raise_if_failed, root_phase
from .commit import commit_version, now_iso
from .devices import array_module, as_local_array, is_device_array
from .encoding import dtype_from_json, dtype_to_json
from .errors import CheckpointError
from .log import logger
from .metadata import ChunkTable, Metadata, Variable
from .monitor import PhaseTimer
from .names import METADATA_FILE, is_reference_version, reference, split_reference
from .options import SaveResult
from .save_stages import create_version_directory, describe_state, plan_variables
from .stats import phase_record, slowest

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


def raw_hash(buffer) -> str:
    """xxh3_128 of a contiguous host buffer, 32 lower-case hex digits."""
    view = memoryview(buffer)
    if view.ndim != 1 or view.format != "B":
        view = view.cast("B")
    return xxhash.xxh3_128_hexdigest(view)


def content_hash(piece) -> str:
    """The content hash of a contiguous piece: xxh3_128 on the host, ``mix128:...`` (blockhash.py) on a GPU.

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
            for k, (fi, off, nb) in enumerate(zip(c.file.tolist(), c.offset.tolist(), c.nbytes.tolist())):
                file = files[fi]
                key = (c.hash[k], raw[k], ck)
                loc = (file, off, nb, c.checksum[k])
                if not is_ref[fi]:
                    own.setdefault(key, loc)
                elif key not in refs or loc[0] > refs[key][0]:
                    refs[key] = loc  # of several older copies, the newest version's (releases old ones sooner)
        refs.update(own)
        return cls(name=name, depth=depth, locations=refs)

    def __len__(self) -> int:
        return len(self.locations)


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


# --------------------------------------------------------------------------- the collective save

#: Indexes of the versions this process saved (or read) last, on every rank, newest last:
#: ``{(real path, metadata stamp): ChainIndex}``.  Two entries: the version saved last and its
#: predecessor (a save on an explicit base, as ``hpcckpt.save(..., base=...)`` repeated on one base).
_CACHE: dict = {}
_CACHE_ENTRIES = 2
#: Node layouts already asked of MPI: ``{(members as COMM_WORLD ranks, ranks per node setting): NodeLayout}``.
_LAYOUTS: dict = {}


def _remember(key, index) -> None:
    _CACHE.pop(key, None)
    _CACHE[key] = index
    while len(_CACHE) > _CACHE_ENTRIES:
        _CACHE.pop(next(iter(_CACHE)))


def _stamp(directory: str):
    st = os.stat(os.path.join(directory, METADATA_FILE))
    return st.st_ino, st.st_mtime_ns, st.st_size


def _resolve_base(directory: str, options, io_root: str | None) -> str | None:
    """Rank 0: the base version's path (an explicit ``base``, else the newest committed under ``io_root``)."""
    parent = os.path.dirname(os.path.realpath(directory))
    if options.base is not None:
        base = os.fspath(options.base)
        if not os.path.isfile(os.path.join(base, METADATA_FILE)):
            raise CheckpointError(f"base {base!r} is not a committed checkpoint")
        if os.path.dirname(os.path.realpath(base)) != parent:
            raise CheckpointError(f"base {base!r} must be a sibling of {directory!r} (the same parent directory)")
        if not is_reference_version(os.path.basename(os.path.realpath(base))):
            raise CheckpointError(f"base {base!r}: its name must be letters, digits and _.+- to be referenced")
        return base
    if io_root is None:
        return None
    from .catalog import current, list_versions

    name = os.path.basename(os.path.normpath(directory))
    live = [e for e in current(list_versions(io_root)) if e.name != name]
    return live[-1].path if live else None


def _base_index(directory: str, options, io_root, cached_everywhere):
    """Rank 0: ``(key, ChainIndex or None)`` of the base (None: every rank has it cached), or None without a base.

    ``cached_everywhere(key)``: whether every rank holds ``key`` in its cache.
    """
    from .metadata_file import read_metadata

    base = _resolve_base(directory, options, io_root)
    if base is None:
        return None
    key = (os.path.realpath(base), _stamp(base))
    if cached_everywhere(key):
        return key, None
    index = _CACHE.get(key)
    if index is None:
        index = ChainIndex.from_metadata(read_metadata(base), os.path.basename(key[0]))
    return key, index


def _members(comm) -> tuple:
    """The COMM_WORLD ranks of ``comm``'s processes (local, no communication): what a node layout depends on."""
    if comm.Get_size() == 1 or not hasattr(comm, "Get_group"):
        return ()  # a single process (SerialComm included: never import mpi4py for it) needs no layout query
    try:
        from mpi4py import MPI

        world = MPI.COMM_WORLD.Get_group()
        group = comm.Get_group()
        try:
            return tuple(group.Translate_ranks(list(range(comm.Get_size())), world))
        finally:
            group.Free()
            world.Free()
    except Exception:  # noqa: BLE001 - a SerialComm or an exotic communicator: never cached
        return ()


def save_incremental(state, directory: str, comm, options, step: int | None = None, extra: dict | None = None,
                     io_root: str | None = None):
    """Collectively write ``state`` into the new ``directory`` as an incremental (or full) version; commit it.

    Collectives (the fixed cost of a save): gather + bcast to plan, one allgather
    after hashing (totals for the policy, new blocks' keys for dedup), the
    transport's own, gather + bcast to commit; plus a node-layout query on the
    first save of a communicator and an allgather of all keys when the policy
    turns a version with reusable blocks into a full one.
    """
    from .codecs.pipeline import EncodedPieces
    from .transport import TRANSPORTS, Piece, TransportContext
    from .transport import io_history
    from .transport.auto import choose_strategy
    from .transport.topology import node_layout, ranks_per_node_setting

    rank, size = comm.Get_rank(), comm.Get_size()
    timer = PhaseTimer()
    what = f"save of {directory!r}"
    name = os.path.basename(os.path.normpath(directory))
    members = _members(comm)
    created = [False]

    with timer.phase("plan"):
        def describe():
            d = describe_state(state, rank, options)
            k = ranks_per_node_setting(options.ranks_per_node)
            return d, k

        described, failure = attempt(describe)
        local, rpn = described if failure is None else (None, None)
        layout_key = (members, rpn)
        layout = _LAYOUTS.get(layout_key) if members else None
        needs_layout = options.strategy == "auto" or TRANSPORTS[options.strategy].needs_node_layout
        local_bytes = sum(as_local_array(a).nbytes for a in local["arrays"].values() if a is not None) if local else 0
        mine = (local["summaries"] if local else None, local_bytes, list(_CACHE), layout is not None)

        def plan_on_root(msgs):
            planned = plan_variables([m[0] for m in msgs], options)
            create_version_directory(directory)
            created[0] = True
            base = _base_index(directory, options, io_root, lambda key: all(key in m[2] for m in msgs))
            strategy = options.strategy
            if strategy == "auto":
                history = io_history.read(io_root)
                have_layout = layout is not None and all(m[3] for m in msgs)
                strategy = (choose_strategy(size, sum(m[1] for m in msgs) / size, layout.max_ranks_per_node, history)
                            if have_layout else ("auto", sum(m[1] for m in msgs), history))
            return planned, base, strategy, all(m[3] for m in msgs)

        try:
            planned, base, strategy, all_have_layout = root_phase(comm, what, failure, mine, plan_on_root)
        except CheckpointError:
            if rank == 0 and created[0]:
                shutil.rmtree(directory, ignore_errors=True)
            raise
    try:
        with timer.phase("plan"):
            variables, all_boxes, codecs = planned
            boxes = all_boxes[rank]
            if base is None:
                index = None
            else:
                key, shipped = base
                index = shipped if shipped is not None else _CACHE[key]
                _remember(key, index)
            if needs_layout and not all_have_layout:
                layout = node_layout(comm, rpn)  # collective, once per communicator
                if members:
                    _LAYOUTS[layout_key] = layout
            if isinstance(strategy, tuple):  # auto, decided now that the layout is known (same answer everywhere)
                _, total, history = strategy
                strategy = choose_strategy(size, total / size, layout.max_ranks_per_node, history)
            ctx = TransportContext(comm=comm, directory=directory, layout=layout, max_writers=options.max_writers,
                                   aggregators=options.aggregators, aggregator_buffer=options.aggregator_buffer,
                                   mpiio_hints=options.mpiio_hints, fsync=options.fsync)
        dtypes = {n: dtype_from_json(v.dtype) for n, v in variables.items()}
        with timer.phase("hash"):
            entries, failure = attempt(lambda: hash_pieces(local["arrays"], boxes, variables, dtypes, codecs,
                                                             options.block_bytes, index))
            entries = entries or []
            new_keys = [e[4] for e in entries if e[6] is None] if options.dedup else None
            mine = (sum(e[5] for e in entries), sum(e[5] for e in entries if e[6] is None), new_keys,
                    sum(1 for e in entries if e[6] is not None))
            everyone = comm.allgather((failure, None if failure else mine))
            raise_if_failed(comm, what, [f for f, _ in everyone])
            everyone = [m for _, m in everyone]
        total_bytes = sum(m[0] for m in everyone)
        changed_bytes = sum(m[1] for m in everyone)
        kind, reason = choose_kind(index.depth if index is not None and len(index) else None, changed_bytes,
                                   total_bytes, options.max_chain, options.full_threshold)
        if options.dedup:
            keys_per_rank = [m[2] for m in everyone]
        if kind == "full":
            if options.dedup and any(m[3] for m in everyone):  # reusable blocks are written after all
                keys_per_rank = comm.allgather([e[4] for e in entries])
            entries = [e[:6] + (None,) for e in entries]
        new = [e for e in entries if e[6] is None]
        dup = duplicates(keys_per_rank, rank) if options.dedup else [False] * len(new)
        to_write = [e for e, d in zip(new, dup) if not d]
        refs = [(e[0], *e[6], e[1], e[2], e[4][0]) for e in entries if e[6] is not None]
        dups = [(e[0], e[4], e[1], e[2], e[4][0]) for e, d in zip(new, dup) if d]
        fused = TRANSPORTS[strategy].hashes_while_writing  # it checksums the others while it writes them

        def pieces():
            """The blocks to write as Pieces; an uncompressed block's checksum comes from its content hash."""
            encoder = EncodedPieces.for_save(codecs, local["summaries"], options.codec_threads)
            encoded = encoder.wrap(((e[0], e[1], e[2], e[3]) for e in to_write), timer)
            for (variable, start, count, arr), e in zip(encoded, to_write):  # wrap first: zip then runs it to its end
                payload = byte_view(arr)
                (content, _, ck) = e[4]
                host_hashed = not content.startswith(f"{blockhash.NAME}:")  # xxh3_128, not the device hash
                digest = checksum_from_xxh3_128(content, payload.nbytes) if ck == "none" and host_hashed else None
                if digest is None and not fused:
                    with timer.phase("hash"):
                        digest = checksum(payload)
                yield Piece(variable, start, count, payload, digest)

        with timer.phase("write"):
            written, failure = attempt(lambda: TRANSPORTS[strategy].write(ctx, pieces()))
        with timer.phase("commit"):
            info = {"kind": kind, "base": index.name if kind == "incremental" else None,
                    "depth": index.depth + 1 if kind == "incremental" else 0, "reason": reason,
                    "hash": HASH_ALGORITHM, "block_bytes": options.block_bytes, "total_bytes": total_bytes,
                    "changed_bytes": changed_bytes}
            mine = None
            if failure is None:
                mine = ({"seconds": dict(timer.seconds), "timeline": list(timer.timeline), "bytes": written.nbytes},
                        {"written": written.rows, "hashes": {(e[0], tuple(e[1])): e[4][0] for e in to_write},
                         "refs": refs, "dups": dups})

            def commit_on_root(msgs):
                stats = [m[0] for m in msgs]
                return _commit(directory, name, variables, dtypes, codecs, [m[1] for m in msgs], local["values"],
                               size, step, {**(extra or {}), "strategy": strategy, "stats": phase_record(stats),
                                            "incremental": info}, options.fsync) + (stats,)

            done = root_phase(comm, what, failure, mine, commit_on_root)
    except CheckpointError:
        if rank == 0:
            shutil.rmtree(directory, ignore_errors=True)
        raise
    (written_bytes, nchunks, summary), new_stamp, new_index, stats = done
    _remember((os.path.realpath(directory), new_stamp), new_index)
    if rank == 0:
        logger.info("saved %s (%s, depth %d, base %s: %s): wrote %d of %d bytes in %d chunks, write %.3f s",
                    directory, kind, info["depth"], info["base"], reason, written_bytes, total_bytes, nchunks,
                    max(s["seconds"].get("write", 0.0) for s in stats))
    return SaveResult(path=directory, step=step, bytes_written=written_bytes, nchunks=nchunks,
                      timings={**slowest(phase_record(stats)), "commit": timer.seconds["commit"]}, strategy=strategy,
                      kind=kind, incremental={**info, **summary})


def hash_pieces(arrays: dict, boxes: dict, variables: dict, dtypes: dict, codecs: dict, block_bytes: int,
                 index: ChainIndex | None) -> list[tuple]:
    """This rank's pieces on the global grid: (variable, start, count, array, key, raw nbytes, base Location or None)."""
    out = []
    locations = index.locations if index is not None else {}
    for name in sorted(arrays):
        local = arrays[name]
        if local is None:
            continue
        arr = as_local_array(local)
        if not arr.size:
            continue
        lo, hi = boxes[name]
        dtype = dtypes[name]
        ck = codec_key(codecs.get(name), dtype)
        for start, count in grid_boxes(variables[name].shape, dtype.itemsize, block_bytes, lo, hi):
            piece = local_piece(arr, lo, start, count)
            key = (content_hash(piece), piece.nbytes, ck)
            out.append((name, start, count, piece, key, piece.nbytes, locations.get(key)))
    return out


def _commit(directory, name, variables, dtypes, codecs, parts, values, nranks, step, extra, fsync):
    """Rank 0: assemble the chunk tables, check the referenced versions are still there, commit the metadata."""
    files, tables = assemble(variables, dtypes, codecs, parts)
    parent = os.path.dirname(os.path.realpath(directory))
    for ref in {split_reference(f)[0] for f in files if split_reference(f) is not None}:
        if not os.path.isfile(os.path.join(parent, ref, METADATA_FILE)):
            raise CheckpointError(f"the base version {ref} was removed during the save")
    written = sum(nbytes for p in parts for _, _, _, nbytes, _, _, _ in p["written"])
    referenced = sum(r[3] for p in parts for r in p["refs"])
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
    commit_version(directory, meta, fsync)
    nchunks = sum(len(rows) for rows, _ in tables.values())
    return (written, nchunks, summary), _stamp(directory), ChainIndex.from_metadata(meta, name)


def checkpointer_base(ckpt, opts):
    """The options of a Checkpointer's incremental save with ``base`` set to the version it saved or restored last.

    Without one (a fresh Checkpointer), or when that version is gone, the save
    builds on the newest committed version under the root.
    """
    import dataclasses

    base = ckpt.chain_base
    ok = ckpt.comm.bcast(base is not None and os.path.isfile(os.path.join(base, METADATA_FILE))
                         if ckpt.comm.Get_rank() == 0 else None, root=0)
    return dataclasses.replace(opts, base=base) if ok else opts
