"""Bringing the data files a node-local load reads onto the reader's node, from the nodes that hold them.

A node-local version keeps each rank's data file on that rank's node (L1),
plus the copies and parity the other levels made.  A load on the saved
decomposition reads only its own file; any other load (a Ragged table split
evenly when it was saved unevenly, a Block on another decomposition, another
rank count) reads chunks of files that other nodes hold.  Before such a load
(:func:`fetcher`, run by loading.load_version once every rank checked its
template):

1. one allgather gives every rank every rank's requests
   (read_plan.encode_requests) and what its node directory holds
   (:func:`inventory`);
2. every rank derives, from the same inputs, every rank's target boxes
   (read_plan.target_boxes) and the data files whose chunks they overlap
   (:func:`needed_files`), and who sends which file to whom
   (:func:`plan_fetches`, pure): one receiver per node and file, the sender a
   rank whose node holds a whole copy, the bytes spread over the holders;
3. partner.transfer moves the files over MPI, streamed in pieces
   (:func:`round_bytes`: one round holds about ROUND_BYTES on any rank,
   however many files it sends or receives, up to 32), into the receivers'
   node directories (they stay there, like the copies
   the rebuild moves).

A file that no node of the run holds whole is a CheckpointError on every
rank (the restore then goes on to the root or an older version).  What
arrives is checked like any file: the ordinary load verifies every chunk's
checksum.  Files of older versions that an incremental version points into
(``@VERSION/...``) are read where they are and never fetched.
"""

from __future__ import annotations

import os

from hpcckpt.mpi.collective import agree, allgather_checked
from hpcckpt.errors import CheckpointError, TemplateMismatchError
from hpcckpt.format.metadata import Metadata
from hpcckpt.core.names import DATA_DIR, METADATA_FILE, PARITY_DIR, rank_file, split_reference
from hpcckpt.loading.read_plan import encode_requests, target_boxes
from hpcckpt.storage.base import Storage
from hpcckpt.levels.partner import ROUND_BYTES, transfer


def inventory(storage: Storage, vdir: str, references=()) -> dict[str, int]:
    """Sizes of the data and parity files a node directory of ``storage`` holds for one version (links followed;
    what cannot be looked at is left out).

    ``references``: files of older versions the version points into
    (``@VERSION/data/...``, incremental saves), looked up beside it and listed
    under that name.
    """
    out = {}
    for sub in (DATA_DIR, PARITY_DIR):
        d = os.path.join(vdir, sub)
        try:
            names = storage.listdir(d)
        except (FileNotFoundError, NotADirectoryError):
            continue
        for n in names:
            if not n.endswith(".part"):
                _add_size(storage, out, f"{sub}/{n}", os.path.join(d, n))
    for name in references:
        version, path = split_reference(name)
        if storage.is_file(os.path.join(os.path.dirname(vdir), version, METADATA_FILE)):
            _add_size(storage, out, name, os.path.join(os.path.dirname(vdir), version, path))
    return out


def _add_size(storage: Storage, out: dict[str, int], name: str, path: str) -> None:
    """``out[name]``: the size of what ``path`` names, links followed (nothing when it cannot be looked at)."""
    try:
        st = storage.stat(path, follow=True)
    except OSError:
        return
    if st is not None:
        out[name] = st.size


def expected_sizes(meta: Metadata) -> dict[str, int]:
    """The least size of each data file: the end of its last chunk."""
    ends = {name: 0 for name in meta.files}
    for var in meta.variables.values():
        c = var.chunks
        for k in range(len(c)):
            name = meta.files[int(c.file[k])]
            ends[name] = max(ends[name], int(c.offset[k]) + int(c.nbytes[k]))
    return ends


def whole_sizes(meta: Metadata) -> dict[str, tuple[int, int | None]]:
    """``{data file: (least size, exact size or None)}`` of a version's own files.

    The least size is the end of the file's last chunk; the exact size is known
    for a file-per-rank file of the saved ranks when the version recorded its
    files' sizes (``extra.levels.sizes``).
    """
    ends = {name: end for name, end in expected_sizes(meta).items() if split_reference(name) is None}
    levels = meta.extra.get("levels") if isinstance(meta.extra, dict) else None
    sizes = levels.get("sizes") if isinstance(levels, dict) else None
    exact = {rank_file(o): s for o, s in enumerate(sizes if isinstance(sizes, list) else [])
             if isinstance(s, int) and not isinstance(s, bool)}  # the metadata is untrusted: others not used
    return {name: (end, max(end, exact[name]) if name in exact else None) for name, end in ends.items()}


def whole_copies(inv: dict[str, int], sizes: dict[str, tuple[int, int | None]]) -> dict[str, int]:
    """The files of one node's inventory that are whole copies of the version's own files (right size)."""
    out = {}
    for name, (least, exact) in sizes.items():
        held = inv.get(name, -1)
        if held == exact if exact is not None else held >= least:
            out[name] = held
    return out


def needed_files(meta: Metadata, boxes: dict) -> set[str]:
    """The version's own data files holding a chunk that overlaps one of ``boxes`` (``{name: (start, stop)}``)."""
    out = set()
    for name, (start, stop) in boxes.items():
        chunks = meta.variables[name].chunks
        for k in chunks.index().query(start, stop).tolist():
            out.add(meta.files[int(chunks.file[k])])
    return {name for name in out if split_reference(name) is None}


def plan_fetches(needs: list[set[str]], held: list[dict[str, int]], node_of: list[int]):
    """``(moves, lost)``: the transfers that put every file a rank needs on its node, and what no node holds.

    ``needs[r]``: the files rank r's load reads; ``held[r]``: the whole copies
    r's node directory holds, ``{name: size}``; ``node_of[r]``: r's node (the
    ranks of a node share its directory).  ``moves`` are partner.transfer's
    ``(src, dst, name, size)``: for each node and file missing there, one
    move, to the lowest rank of that node that needs it, from a rank whose node
    holds it, the one that sent the fewest bytes so far (then the lowest).
    ``lost``: ``(rank, name)`` of the needs no rank holds, sorted.  The same
    inputs give the same answer on every rank.
    """
    moves, lost, sent, done = [], [], [0] * len(needs), set()
    holders: dict[str, list[int]] = {}
    for r, files in enumerate(held):
        for name in files:
            holders.setdefault(name, []).append(r)
    for r, files in enumerate(needs):
        for name in sorted(files):
            if name in held[r] or (node_of[r], name) in done:
                continue
            if name not in holders:
                lost.append((r, name))
                continue
            src = min(holders[name], key=lambda s: (sent[s], s))
            size = held[src][name]
            sent[src] += size
            moves.append((src, r, name, size))
            done.add((node_of[r], name))
    return moves, lost


def round_bytes(moves: list) -> int:
    """The piece size of a fetch's transfer: ROUND_BYTES shared among the files of the rank that sends or
    receives the most (partner.transfer holds one piece of each of its files per round), at least MIN_ROUND."""
    busiest = {}
    for src, dst, _, _ in moves:
        busiest[src] = busiest.get(src, 0) + 1
        busiest[dst] = busiest.get(dst, 0) + 1
    return max(ROUND_BYTES // max(busiest.values(), default=1), MIN_ROUND)


MIN_ROUND = 1 << 20


def fetcher(storage: Storage, comm, vdir: str, node_of: list[int], what: str):
    """The ``before_reads`` of a node-local load of ``vdir`` in ``storage`` (loading.load_version): collective,
    on every rank.

    Called with the metadata and this rank's requests (None when its template
    failed: the load then reports that, and nothing moves).  Raises the same
    CheckpointError on every rank when a needed file is on no node or a
    transfer fails.
    """
    def fetch(meta: Metadata, requests: dict | None) -> int:
        gathered = allgather_checked(comm, what + " (listing the node directories)", lambda: None if requests is None
                                     else (encode_requests(requests), inventory(storage, vdir)))
        if any(g is None for g in gathered):
            return 0
        try:
            targets = target_boxes([g[0] for g in gathered], meta)
        except TemplateMismatchError:  # the same on every rank: the load raises it
            return 0
        needs = [needed_files(meta, {name: (starts[r], stops[r]) for name, (starts, stops, _) in targets.items()})
                 for r in range(len(gathered))]
        sizes = whole_sizes(meta)
        moves, lost = plan_fetches(needs, [whole_copies(g[1], sizes) for g in gathered], node_of)
        if lost:
            shown = ", ".join(f"{name} (read by rank {r})" for r, name in lost[:4])
            raise CheckpointError(f"{what} failed: no node of this run holds a whole copy of {shown}"
                                  + (f" and {len(lost) - 4} more" if len(lost) > 4 else ""))
        return agree(comm, what + " (data files from other nodes)", lambda: transfer(
            storage, comm, moves, vdir, vdir, round_bytes=round_bytes(moves)))

    return fetch
