"""The collective load of one version into a template, on any number of ranks.

metadata (on a few ranks each reads it: reads_metadata_itself; on more rank 0
reads and validates it once, then broadcasts) -> template check
(names, kinds, dtypes, shapes, tiling, Ragged row counts; every mismatch names
the variable on every rank) -> reads (each rank reads only the chunks that
overlap its own boxes, straight into its buffers where it can) -> the returned
dict.  A checkpoint is read before its plan (who reads a shared chunk is
decided by each rank alone: hpcckpt.loading.directory; a Ragged table's rows come
from one scan first: load_plan.scan_rows) and a failed check or read rides on
the plan's first exchange; only a checkpoint with a Ragged table whose
metadata each rank read itself is planned first, its reads under ``agree``
(hpcckpt.loading.plan: the two ways).  Either way one rank's failure
is every rank's CheckpointError, and a damaged checkpoint is a
CorruptCheckpointError on all ranks so that ``Checkpointer.restore`` can fall
back to an older version in step.
"""

from __future__ import annotations

import numpy as np

from hpcckpt.mpi.collective import agree, attempt, bcast_checked, unpack_checked
from hpcckpt.core.arrays import byte_view
from hpcckpt.core.devices import copy_into, is_device_array
from hpcckpt.core.encoding import PerRankEntries, decode_value, is_per_rank
from hpcckpt.core.log import logger
from hpcckpt.errors import TemplateMismatchError
from hpcckpt.format.metadata import Metadata, Variable
from hpcckpt.core.monitor import PhaseTimer
from hpcckpt.core.planning import common_names, plan_rows
from hpcckpt.loading.plan import directory_way, load_boxes, plan_directory, plan_gathered, ragged_names, scan_rows
from hpcckpt.loading.directory import HOLDS, NEEDS, chunk_roles
from hpcckpt.loading.read_plan import encode_requests, target_boxes
from hpcckpt.storage.metadata_file import check_step, read_metadata_reused
from hpcckpt.loading.reader import ChunkReader, allocate
from hpcckpt.core.regions import even_rows
from hpcckpt.core.box_index import covering_problem_indexed
from hpcckpt.state import Block, PerRank, Ragged, block_box, split_state
from hpcckpt.stateful import deliver, flatten, materialize, unflatten
from hpcckpt.storage import POSIX, Storage


def load_version(state, directory: str, comm, strict: bool = True, expect_step: int | None = None,
                 storage: Storage = POSIX, cast: bool = False, metadata: tuple | None = None,
                 shared_directory: bool = False, before_reads=None) -> dict:
    """Fill the Blocks of ``state`` in place from ``directory``; return the restored state dict.

    ``state``: a dict, a Stateful object or a callable (hpcckpt.stateful),
    resolved now; nested dicts come back nested, and Stateful objects get
    ``load_state_dict`` with their part once the load has succeeded.  None:
    every variable of the version, by its stored name (:func:`default_template`).
    Template blocks may overlap (each rank gets its region) but must cover
    each array.

    ``expect_step``: the step the directory's name claims (a Checkpointer
    version); metadata holding another step is a damaged version.
    ``storage``: where the version lives (hpcckpt.storage; POSIX by default).
    ``strict``: True, the template names every variable; False, those it
    omits are skipped; ``"rest"``, they are returned too, as ``state=None``
    gives them (under their stored names, at the top level of the result).
    ``cast``: a Block or Ragged whose template dtype differs from the stored
    one is filled by casting (:func:`cast_allowed`); otherwise that is a
    TemplateMismatchError.  ``metadata``: the ``(failure, Metadata)`` pair of
    :func:`version_metadata` that rank 0 already broadcast with something else
    (Checkpointer.restore: with the listing), so the load makes no broadcast of
    its own.  ``shared_directory``: ``directory`` shows every rank the same
    version (hpcckpt.load's path), so on a few ranks each reads the metadata
    itself (:func:`reads_metadata_itself`); False (a node-local level's
    restore, where each rank passes its node's directory and only rank 0's
    holds the metadata): rank 0 reads it and broadcasts.  ``before_reads``: a
    collective ``before_reads(meta, requests)`` every rank calls once its
    template is checked and before any read (``requests``: this rank's, None
    when its template failed, which the load then reports); it may raise, the
    same CheckpointError on every rank (a node-local restore brings the files
    the reads need onto each node: hpcckpt.levels.fetch).
    """
    timer = PhaseTimer()
    what = f"load of {directory!r}"
    own = metadata is None and shared_directory and storage.shared_files and reads_metadata_itself(comm.Get_size())
    with timer.phase("metadata"):
        if own:  # no broadcast: a rank that cannot read it tells the others in the first exchange
            meta, failure = attempt(lambda: version_metadata(directory, storage, expect_step))
        else:
            meta, failure = (bcast_checked(comm, what, lambda: version_metadata(directory, storage, expect_step))
                             if metadata is None else unpack_checked(comm, what, metadata)), None
    if failure is not None:  # the way the others take starts with the same alltoall (plan_gathered's too)
        plan_directory(comm, what, meta, None, None, None, failure)
    rank, size = comm.Get_rank(), comm.Get_size()
    with timer.phase("plan"):
        local, failure = attempt(lambda: read_template(state, meta, strict, cast, rank, size))
    if before_reads is not None:
        before_reads(meta, None if failure is not None else local["requests"])
    plan = None
    by_directory = directory_way(meta, own)
    if by_directory:  # read first: a failed read rides on the directory's first exchange
        with timer.phase("plan"):  # a Ragged table's rows: one scan of a few numbers per table
            rows, problem = scan_rows(comm, meta, local and local["requests"]) if ragged_names(meta) else ({}, None)
        with timer.phase("read"):
            boxes = None if failure is not None else load_boxes(meta, local["requests"], rows)
            roles = None if boxes is None else _roles(meta, local, boxes)
            early, failure = (None, failure) if roles is None else attempt(
                lambda: _read_early(directory, meta, local, boxes, roles, storage))
        with timer.phase("plan"):
            plan = plan_directory(comm, what, meta, local, boxes, roles, failure, problem)
    if plan is not None:
        shared, reread = plan
        targets, held, values = early
        with timer.phase("read"):
            if reread:
                agree(comm, what, lambda: _reread(directory, meta, targets, roles, shared, rank, storage))
            outgoing = _owed(meta, targets, held, shared, rank)
            _exchange(comm, meta, targets, shared, outgoing)
    else:  # the allgather of every rank's requests, then the reads, then their agreement
        with timer.phase("plan"):
            boxes, shared = plan_gathered(comm, what, meta, local, failure, alltoall=own and not by_directory)
        with timer.phase("read"):
            targets, outgoing, values = agree(comm, what, lambda: _read(directory, meta, local, boxes, shared, rank,
                                                                        storage))
            _exchange(comm, meta, targets, shared, outgoing)
    if comm.Get_rank() == 0:
        logger.info("loaded %s on %d ranks: %s", directory, comm.Get_size(),
                    ", ".join(f"{k} {v:.3f} s" for k, v in timer.seconds.items()))
    restored = restored_state(local, targets, values, comm.Get_rank(), comm.Get_size())
    deliver(state, restored)  # load_state_dict of Stateful objects, after every collective of the load
    return restored


def restored_state(local: dict, targets: dict, values: dict, rank: int, nranks: int) -> dict:
    """The state a load returns, nested as the template: its filled Blocks, new Ragged rows, values, PerRanks.

    ``local``: :func:`read_template`'s answer; ``targets[name][2]``: the rows
    filled for each Ragged; ``values``: the decoded replicated values (a
    PerRankEntries for a PerRank).  Shared by a load and hpcckpt.redistribute.
    """
    out = {}
    for name, value in local["flat"].items():
        if isinstance(value, Block):
            out[name] = value
        elif isinstance(value, Ragged):
            out[name] = Ragged(targets[name][2])
        elif isinstance(value, PerRank) or isinstance(values[name], PerRankEntries):
            out[name] = per_rank_value(name, value, values[name], rank, nranks)
        else:
            out[name] = values[name]
    return unflatten(out, local["tree"])


def read_template(state, meta: Metadata, strict: bool, cast: bool = False, rank: int = 0, nranks: int = 1) -> dict:
    """The template read now (hpcckpt.stateful: Stateful objects, callables, getters, nesting), then checked.

    ``state=None``: :func:`default_template`, every variable of the version;
    ``strict="rest"``: the variables the template omits are added from it.
    """
    if not isinstance(strict, bool) and strict != "rest":
        raise TemplateMismatchError(f"strict must be True, False or 'rest', got {strict!r}")
    tree = default_template(meta, rank, nranks) if state is None else materialize(state)
    flat = flatten(tree)
    if strict == "rest":
        rest = default_template(meta, rank, nranks, omit=set(flat))
        tree, flat = {**tree, **rest}, {**flat, **rest}
    local = check_template(flat, meta, strict, cast)
    local["tree"], local["flat"] = tree, flat
    return local


def default_template(meta: Metadata, rank: int, nranks: int, omit=frozenset()) -> dict:
    """The template of a load without one: every variable of the version (but ``omit``), by its stored (path) name.

    A Block variable: ``Block(new array, offset, global_shape)`` holding this
    rank's even share of the first axis (``regions.even_rows``, as
    ``Ragged()`` splits rows; a 0-d array whole on every rank); a Ragged
    variable: ``Ragged()``; a per-rank value: ``PerRank(None, resize=True)``
    (this rank's saved entry, or None beyond the saved ranks); any other
    value: replicated, whole.
    """
    tree: dict = {}
    for name, var in meta.variables.items():
        if name in omit:
            continue
        if var.kind == "ragged":
            tree[name] = Ragged()
            continue
        lo, hi = even_rows(var.shape[0], nranks, rank) if var.shape else (0, 0)
        local = allocate(((hi - lo),) + var.shape[1:] if var.shape else (), var.dtype, name)
        tree[name] = Block(local, (lo,) + (0,) * (len(var.shape) - 1) if var.shape else (), var.shape)
    for name, raw in meta.values.items():
        if name not in omit:
            tree[name] = PerRank(None, resize=True) if is_per_rank(raw) else None
    return tree


def per_rank_value(name: str, template, stored, rank: int, nranks: int) -> PerRank:
    """This rank's ``PerRank`` of a load (the rule of hpcckpt.PerRank; the same decision on every rank).

    Saved on as many ranks: each rank gets its own entry.  On another count a
    TemplateMismatchError, unless the template is ``PerRank(default,
    resize=True)``: rank r gets entry r if it was saved, else ``default``.  A
    value saved replicated is given to every rank; a PerRank in the checkpoint
    needs a PerRank in the template.
    """
    if not isinstance(stored, PerRankEntries):
        return PerRank(stored)
    if not isinstance(template, PerRank):
        raise TemplateMismatchError(f"{name!r} holds one value per rank in the checkpoint: ask for it with "
                                    "hpcckpt.PerRank() in the template")
    if len(stored) != nranks and not template.resize:
        raise TemplateMismatchError(f"{name!r} holds one value per rank for {len(stored)} ranks, and this run has "
                                    f"{nranks}: pass hpcckpt.PerRank(default, resize=True) to give rank r the saved "
                                    "value of rank r, or the default beyond the saved ranks")
    return PerRank(stored[rank] if rank < len(stored) else template.value, template.resize)


def reads_metadata_itself(nranks: int) -> bool:
    """Whether every rank of a load on ``nranks`` ranks reads the version's metadata itself instead of receiving
    rank 0's broadcast: on at most PER_RANK_METADATA_MAX_RANKS ranks.

    One collective fewer (a restart on the saved decomposition is then one alltoall; docs/performance.md,
    "Small, frequent saves and loads", has the timings).  Every rank sees the
    same bytes (``load_version(..., shared_directory=True)``, hpcckpt.load: one directory on a storage whose
    files every process sees; a committed version is immutable, docs/format.md section 2) and reuses what it
    parsed before
    (metadata_file.read_metadata_reused); a rank that cannot read or validate it sends its failure in the
    load's first exchange, which is an alltoall whichever way the load is planned, so every rank raises the
    same CheckpointError.  Beyond the threshold rank 0 reads and broadcasts: one reader of a shared file
    system instead of P, and a broadcast whose cost grows as log P.
    """
    return nranks <= PER_RANK_METADATA_MAX_RANKS


PER_RANK_METADATA_MAX_RANKS = 16


def version_metadata(directory: str, storage: Storage = POSIX, expect_step: int | None = None) -> Metadata:
    """Rank 0's part of a load: the version's metadata, read, validated and indexed, for the broadcast.

    ``expect_step``: the step the directory's name claims; metadata holding
    another step is a damaged version (CorruptCheckpointError).
    """
    meta = read_metadata_reused(directory, storage)
    if expect_step is not None:
        check_step(directory, meta, expect_step)
    return meta.indexed()


def cast_allowed(stored: np.dtype, target: np.dtype) -> bool:
    """Whether ``load(..., cast=True)`` fills a ``target`` dtype from a ``stored`` one.

    Both must be numeric (numpy kinds b, i, u, f, c; any byte order) and
    ``np.can_cast(stored, target, "same_kind")``: floats to floats and complex
    of any size, ints to ints of any size (signed to unsigned refused), ints
    and bools to floats; never float to int, complex to real, or to bool.
    """
    stored, target = np.dtype(stored), np.dtype(target)
    return (stored.kind in _NUMERIC and target.kind in _NUMERIC
            and bool(np.can_cast(stored, target, "same_kind")))


_NUMERIC = "biufc"


def _dtype_problem(name: str, what: str, target: np.dtype, stored: np.dtype, cast: bool) -> str | None:
    """Why a template dtype cannot be loaded from the stored one (None: it can, as is or by casting)."""
    if target == stored:
        return None
    if not cast:
        return (f"variable {name!r}: the template's {what} {target} differs from the stored {stored} "
                "(pass cast=True to cast it on load)")
    if not cast_allowed(stored, target):
        return (f"variable {name!r}: cannot cast the stored {stored} to the template's {what} {target}: "
                "cast=True allows only numpy same_kind casts between numeric dtypes (no float to int, "
                "complex to real, or signed to unsigned)")
    return None


def check_template(state, meta: Metadata, strict: bool, cast: bool = False) -> dict:
    """Rank-local checks of the template against the metadata; the requests rank 0 plans with.

    ``local["dtypes"]``: the target dtype of each variable that is cast (cast=True only).
    """
    distributed, replicated = split_state(state)
    stored = set(meta.variables) | set(meta.values)
    missing = sorted((set(distributed) | set(replicated)) - stored)
    if missing:
        raise TemplateMismatchError(f"variable {missing[0]!r} is not in the checkpoint (it holds {sorted(stored)})")
    unknown = sorted(stored - set(distributed) - set(replicated))
    if strict and unknown:
        raise TemplateMismatchError(
            f"the checkpoint holds {unknown[0]!r}, which the template does not name (pass strict=False to skip it)")
    requests = {}
    dtypes = {}
    for name, value in distributed.items():
        if name not in meta.variables:
            raise TemplateMismatchError(f"variable {name!r} is a replicated value in the checkpoint, "
                                        f"not a {type(value).__name__}")
        var = meta.variables[name]
        if isinstance(value, Block):
            requests[name] = _check_block(name, value, var, cast)
            target = value.local.dtype
        else:
            requests[name] = _check_ragged(name, value, var, cast)
            target = var.dtype if value.local is None else np.asarray(value.local).dtype
        if target != var.dtype:
            dtypes[name] = np.dtype(target)
    for name in replicated:
        if name in meta.variables:
            raise TemplateMismatchError(f"variable {name!r} is a distributed array in the checkpoint; "
                                        "the template must give a Block or Ragged for it")
    return {"distributed": distributed, "replicated": sorted(replicated), "requests": requests, "dtypes": dtypes}


def _check_block(name: str, block: Block, var: Variable, cast: bool = False):
    start, stop = block_box(name, block)
    if tuple(block.global_shape) != var.shape:
        raise TemplateMismatchError(f"variable {name!r}: the template's global shape {tuple(block.global_shape)} "
                                    f"differs from the stored {var.shape}")
    problem = _dtype_problem(name, "dtype", block.local.dtype, var.dtype, cast)
    if problem is not None:
        raise TemplateMismatchError(problem)
    if not getattr(block.local.flags, "writeable", True):  # CuPy arrays have no read-only flag
        raise TemplateMismatchError(
            f"variable {name!r}: the template's local array is read-only (writeable=False, or a broadcast view): "
            "a restore fills the template's arrays in place, so they must be writeable; pass a writeable array "
            "(e.g. np.empty_like(a)) and, if the application rebinds its arrays, take the filled one from the "
            f"returned dict (out[{name!r}].local)")
    return ("block", start, stop)


def _check_ragged(name: str, ragged: Ragged, var: Variable, cast: bool = False):
    if ragged.local is not None:
        arr = np.asarray(ragged.local)
        problem = _dtype_problem(name, "rows' dtype", arr.dtype, var.dtype, cast)
        if problem is not None and tuple(arr.shape[1:]) == var.shape[1:]:
            raise TemplateMismatchError(problem)
        if problem is not None or tuple(arr.shape[1:]) != var.shape[1:]:
            raise TemplateMismatchError(
                f"variable {name!r}: the template's rows ({arr.dtype}, trailing shape {arr.shape[1:]}) differ from "
                f"the stored ({var.dtype}, trailing shape {var.shape[1:]})")
    if ragged.rows is not None and (not isinstance(ragged.rows, (int, np.integer)) or isinstance(ragged.rows, bool)):
        raise TemplateMismatchError(f"variable {name!r}: Ragged(rows=...) must be an integer, got {ragged.rows!r}")
    if not var.shape:
        raise TemplateMismatchError(f"variable {name!r} is a 0-d array; a Ragged template needs rows")
    if ragged.rows is not None and ragged.rows > var.shape[0]:  # (the row sums of any rank count then fit int64)
        raise TemplateMismatchError(f"variable {name!r}: Ragged(rows={ragged.rows}) asks for more rows than the "
                                    f"checkpoint holds ({var.shape[0]})")
    return ("ragged", None if ragged.rows is None else int(ragged.rows))


def plan_reads(requests: list[dict], meta: Metadata) -> list[dict]:
    """Check the template's blocks tile each array and split Ragged rows; row ranges per rank."""
    ranges: list[dict] = [{} for _ in requests]
    for name in sorted(common_names(requests, "template's distributed")):
        var = meta.variables[name]
        kinds = {r[name][0] for r in requests}
        if len(kinds) != 1:
            raise TemplateMismatchError(f"variable {name!r} is a Block on some ranks and Ragged on others")
        if kinds == {"block"}:
            starts = np.asarray([r[name][1] for r in requests], np.int64).reshape(len(requests), len(var.shape))
            stops = np.asarray([r[name][2] for r in requests], np.int64).reshape(len(requests), len(var.shape))
            problem = covering_problem_indexed(starts, stops, var.shape, label="the block of rank")  # overlaps are fine
            if problem is not None:
                raise TemplateMismatchError(f"variable {name!r}: the template's blocks do not cover the array: "
                                            f"{problem}")
        else:
            for rank, rng in enumerate(plan_rows([r[name][1] for r in requests], var.shape[0], name)):
                ranges[rank][name] = rng
    return ranges


def plan_targets(requests: list[dict], meta: Metadata) -> list[dict]:
    """Every rank's global target box per distributed variable, ``[{name: (start, stop)}]`` by rank.

    ``requests[r]``: rank r's requests (:func:`check_template`); checked as a
    load's are (hpcckpt.loading.read_plan.target_boxes): the same answer, or the same
    TemplateMismatchError, on every rank.
    """
    per_variable = target_boxes([encode_requests(r) for r in requests], meta)
    return [{name: (tuple(starts[r].tolist()), tuple(stops[r].tolist())) for name, (starts, stops, _) in
             per_variable.items()} for r in range(len(requests))]


def _roles(meta: Metadata, local: dict, boxes: dict) -> dict:
    """This rank's role in each chunk its boxes touch (read_directory.chunk_roles): a Block's target can send in
    place when it is a host array of the stored dtype, a Ragged table's new rows unless they are cast."""
    sendable = set()
    for name, value in local["distributed"].items():
        out = value.local
        if (name not in local["dtypes"] if isinstance(value, Ragged) else
                isinstance(out, np.ndarray) and out.dtype == meta.variables[name].dtype):
            sendable.add(name)
    return chunk_roles(meta, boxes, sendable)


def _targets(meta: Metadata, local: dict, boxes: dict) -> dict:
    """``{name: (start, stop, array to fill)}``: a Block's own array, new rows for a Ragged (the template's dtype)."""
    targets = {}
    for name, value in sorted(local["distributed"].items()):
        start, stop = boxes[name]
        out = value.local if isinstance(value, Block) else allocate(
            tuple(b - a for a, b in zip(start, stop)), local["dtypes"].get(name, meta.variables[name].dtype), name)
        targets[name] = (start, stop, out)
    return targets


def _values(meta: Metadata, local: dict) -> dict:
    return {name: decode_value(meta.values[name], repr(name)) for name in local["replicated"]}


def _read_early(directory: str, meta: Metadata, local: dict, boxes: dict, roles: dict, storage: Storage):
    """The directory way's reads of this rank's ``boxes``, before its plan: ``(targets, held, values)``.

    Every chunk this rank reads (its roles but NEEDS) is read and verified now;
    a shared chunk whose centre it holds is kept whole in ``held[(name,
    chunk)]`` (its own part copied out) for the users it may have to send to.
    """
    targets = _targets(meta, local, boxes)
    held = {}
    with ChunkReader(directory, meta, storage) as reader:
        for name, (start, stop, out) in targets.items():
            var = meta.variables[name]
            later = {k: (lo, hi) for k, lo, hi, role in roles[name] if role in (NEEDS, HOLDS)}
            reader.read_into(var, start, stop, out, skip=later)
            for k, lo, hi, role in roles[name]:
                if role == HOLDS:
                    held[(name, k)] = chunk = reader.chunk_array(var, k, own=True)
                    copy_into(out[_local_slices(lo, hi, start)], chunk[_local_slices(lo, hi, var.chunks.start[k])])
    return targets, held, _values(meta, local)


def _reread(directory: str, meta: Metadata, targets: dict, roles: dict, shared: dict, rank: int,
            storage: Storage) -> None:
    """The parts this rank was told to read itself after the plan (no rank can send them: read_directory)."""
    with ChunkReader(directory, meta, storage) as reader:
        for name, (start, _, out) in targets.items():
            var = meta.variables[name]
            for k, lo, hi, role in roles[name]:
                if role == NEEDS and shared[name][k][0] == rank:
                    chunk = reader.chunk_array(var, k)
                    copy_into(out[_local_slices(lo, hi, start)], chunk[_local_slices(lo, hi, var.chunks.start[k])])


def _owed(meta: Metadata, targets: dict, held: dict, shared: dict, rank: int) -> list:
    """The parts this rank sends, in plan order: ``(rank, source, start, stop)`` with the part
    ``source[start:stop]`` of a C-contiguous host array, the chunk it holds or its target where the chunk lies
    wholly in it (no copy: :func:`_exchange` sends a strided part as an MPI subarray)."""
    outgoing = []
    for name, (start, _, out) in targets.items():
        for k, (sender, parts) in sorted(shared[name].items()):
            if sender != rank:
                continue
            source, origin = ((held[(name, k)], meta.variables[name].chunks.start[k]) if (name, k) in held
                              else (out, start))
            for dest, lo, hi in parts:
                if dest == rank:
                    continue
                a, b = [x - o for x, o in zip(lo, origin)], [y - o for y, o in zip(hi, origin)]
                if not source.flags.c_contiguous:  # a strided target: the part, copied
                    source, a, b = np.ascontiguousarray(source[_local_slices(lo, hi, origin)]), [0] * len(a), \
                        [y - x for x, y in zip(a, b)]
                outgoing.append((dest, source, a, b))
    return outgoing


def _read(directory: str, meta: Metadata, local: dict, boxes: dict, shared: dict, rank: int, storage: Storage):
    """The allgather way's reads, after its plan: the targets filled (but for parts others send), what this rank
    owes, the values."""
    targets = _targets(meta, local, boxes)
    return targets, _read_local(directory, meta, targets, shared, rank, storage), _values(meta, local)


def _read_local(directory: str, meta: Metadata, targets: dict, shared: dict, rank: int, storage: Storage) -> list:
    """Read every chunk this rank needs alone, and the shared chunks it was chosen to read.

    Returns the parts owed to other ranks as ``(rank, contiguous array)`` in plan order.
    """
    outgoing = []
    with ChunkReader(directory, meta, storage) as reader:
        for name, (start, stop, out) in targets.items():
            var = meta.variables[name]
            reader.read_into(var, start, stop, out, skip=shared[name])
            for k, (reader_rank, parts) in sorted(shared[name].items()):
                if reader_rank != rank:
                    continue
                chunk = reader.chunk_array(var, k)
                c0 = var.chunks.start[k]
                for dest, lo, hi in parts:
                    part = chunk[_local_slices(lo, hi, c0)]
                    if dest == rank:
                        copy_into(out[_local_slices(lo, hi, start)], part)
                    else:  # a copy: chunk is the reader's reused scratch
                        outgoing.append((dest, part.copy(), [0] * part.ndim, list(part.shape)))
    return outgoing


def _exchange(comm, meta: Metadata, targets: dict, shared: dict, outgoing: list) -> None:
    """Move the shared parts from their readers to the ranks that need them (non-blocking, in plan order).

    ``outgoing``: ``(rank, source, start, stop)``, the part ``source[start:stop]`` of a C-contiguous array.
    """
    if comm.Get_size() == 1 or not (outgoing or any(shared.values())):  # nothing moves (a same-decomposition load)
        return
    rank = comm.Get_rank()
    incoming = []
    requests = []
    for name, (start, _, out) in targets.items():
        for k, (reader_rank, parts) in sorted(shared[name].items()):
            for dest, lo, hi in parts:
                if dest == rank and reader_rank != rank:
                    sel = _local_slices(lo, hi, start)
                    dest_view = out[sel]
                    if (dest_view.flags.c_contiguous and not is_device_array(dest_view)  # straight in (row splits)
                            and dest_view.dtype == meta.variables[name].dtype):  # a cast goes through buf
                        buf = dest_view
                    else:
                        buf = np.empty(dest_view.shape, dtype=meta.variables[name].dtype)
                        incoming.append((out, sel, buf))
                    requests.append(comm.Irecv(byte_view(buf), source=reader_rank, tag=_PART_TAG))
    from mpi4py import MPI

    types = []
    for dest, source, a, b in outgoing:
        part = source[tuple(slice(x, y) for x, y in zip(a, b))]
        if part.flags.c_contiguous:
            requests.append(comm.Isend(byte_view(part), dest=dest, tag=_PART_TAG))
            continue
        item = source.itemsize  # a strided part of C-ordered memory: an MPI subarray of its bytes, sent in place
        sizes, subsizes, starts = list(source.shape), [y - x for x, y in zip(a, b)], list(a)
        sizes[-1], subsizes[-1], starts[-1] = sizes[-1] * item, subsizes[-1] * item, starts[-1] * item
        types.append(MPI.BYTE.Create_subarray(sizes, subsizes, starts).Commit())
        requests.append(comm.Isend([byte_view(source), 1, types[-1]], dest=dest, tag=_PART_TAG))
    MPI.Request.Waitall(requests)  # all parts were read and verified before: nothing here can fail half-way
    for t in types:
        t.Free()
    for out, sel, buf in incoming:
        copy_into(out[sel], buf)


_PART_TAG = 7311


def _local_slices(lo, hi, start) -> tuple:
    """The index of the global part ``[lo, hi)`` in a target whose box starts at ``start`` (a view, also 0-d)."""
    return tuple(slice(a - s, b - s) for a, b, s in zip(lo, hi, start)) + (Ellipsis,)
