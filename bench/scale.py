"""Planning and metadata at many ranks, simulated: no rank is started.

    python bench/scale.py [--ranks 1024 4096 16384 65536] [--vars 20] [--sample 8] [--no-load] [--json out.json]

The planning and metadata code is pure, so it is driven here with what P ranks
would hand it: a 3-D grid decomposition (P = px*py*pz, 4^3 float64 elements
per rank on the save) of ``--vars`` variables, saved on P ranks and loaded on
3P/4 and on 2P ranks (reshard both ways, other grids, so most chunks are
shared), and an incremental version on top of it (10% of the blocks changed).
Measured per rank:

* save plan: rank 0's plan (plan_variables over P summaries) and every rank's
  own description (describe_state), time and tracemalloc peak; the bytes each
  rank receives to plan (pickled sizes of the messages of save_plan._plan, of
  the cache-hit allgather agree_plan made before the save-side change to local planning,
  and of the allreduce of save_plan.Ballot that replaced it: mpi4py reduces
  pickled objects over a binomial tree, then broadcasts the result, so the
  rank that receives most, rank 0, gets ceil(log2 P) ballots plus none);
* metadata: build (commit.metadata_from_rows), size, write (to_json_bytes) and
  parse (metadata.parse: seal, JSON, validation), per million chunks;
* load plan: the all-ranks plan (every rank plans every rank's reads: the tiling
  sweep regions.tiling_problem + planning.plan_shared_reads over all target
  boxes; run up to ``--old-full-max`` ranks only, its cost grows as Q^2)
  against the plan hpcckpt makes (read_plan.target_boxes +
  rank_reads: this rank's part only, timed on ``--sample`` ranks spread over
  the job, worst reported); the bytes each rank receives to plan (the
  metadata broadcast, and the requests allgather of both plans);
* incremental: the base index rank 0 builds and broadcasts
  (incremental.ChainIndex), the allgather of the new blocks' keys and the
  deduplication (incremental.duplicates) on the last rank, which scans them all;
  against it, the exchange that sends each key only to the rank that owns its
  hash range (xxh3 of the key modulo P): an alltoall of the keys to their
  owners and one of the verdicts back (bytes per rank, max and median, empty
  slots included; hpcckpt.incremental.dedup_owners, used from 4,096 ranks on:
  docs/performance.md, "Many ranks").

Every rank's load plan is independent given the metadata and the requests, so
sampled ranks give the per-rank figures without simulating all of them.

``--metadata-only`` measures the metadata rows alone, ``--repeat`` times (best
CPU): write and parse (seal, JSON, validation) of the save's version, the
pickled size of what rank 0 broadcasts (parsed, chunk indexes built),
and of the same version with a content-hash column (an incremental version's
tables).  Every chunk has a distinct checksum and hash, as real data has (a
repeated string would make any compressed form look better than it is).  It
calls only what every hpcckpt since format version 2 has (metadata_from_rows,
to_json_bytes, parse), so the same script measures an older tree too:
``PYTHONPATH=OLD_TREE python bench/scale.py --metadata-only`` (paired runs,
docs/performance.md).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import pickle
import sys
import time
import tracemalloc

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchutil import print_table  # noqa: E402

from hpcckpt.incremental import dedup_owners  # noqa: E402
from hpcckpt.storage.commit import metadata_from_rows  # noqa: E402
from hpcckpt.incremental.rules import ChainIndex, choose_kind, duplicates, incremental_metadata  # noqa: E402
from hpcckpt.loading.load import check_template  # noqa: E402
from hpcckpt.format.metadata import Variable, parse  # noqa: E402
from hpcckpt.core.names import rank_file, reference  # noqa: E402
from hpcckpt.options import SaveOptions  # noqa: E402
from hpcckpt.core.planning import plan_shared_reads  # noqa: E402
from hpcckpt.core.box_index import BoxIndex  # noqa: E402
from hpcckpt.loading.directory import (HOLDS, NEEDS, WHOLE, centre, chunk_roles, decide, directed,  # noqa: E402
                                    parts_for_directories, shared_from_assignments)
from hpcckpt.loading.read_plan import encode_requests, rank_reads, target_boxes  # noqa: E402
from hpcckpt.core.regions import tiling_problem  # noqa: E402
from hpcckpt.saving.plan import Ballot  # noqa: E402
from hpcckpt.saving.stages import describe_state, measure_codecs, plan_variables  # noqa: E402
from hpcckpt.state import Block  # noqa: E402

EDGE = 4  # elements per rank and axis on the save
ITEM = 8  # float64


def grid(p: int) -> tuple[int, int, int]:
    """A near-cubic factorisation px >= py >= pz of p."""
    best = (p, 1, 1)
    for a in range(1, round(p ** (1 / 3)) + 2):
        if p % a:
            continue
        for b in range(a, round((p // a) ** 0.5) + 2):
            if (p // a) % b == 0:
                c = p // a // b
                cand = tuple(sorted((a, b, c), reverse=True))
                if max(cand) - min(cand) < max(best) - min(best):
                    best = cand
    return best


def boxes_of(p: int, shape) -> tuple[np.ndarray, np.ndarray]:
    """Every rank's box of a grid decomposition of ``shape`` on p ranks, rank-major (C order over the grid)."""
    g = grid(p)
    idx = np.indices(g).reshape(3, -1).T
    n = np.asarray(shape, np.int64)
    gs = np.asarray(g, np.int64)
    return idx * n // gs, (idx + 1) * n // gs


def timed(fn):
    gc.collect()
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def timed_cpu(fn):
    """``(wall s, CPU s of this process, result)``: the CPU time is what the loaded shared machine inflates least."""
    gc.collect()
    t, c = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - t, time.process_time() - c, out


def traced(fn) -> int:
    """Peak bytes tracemalloc sees while ``fn`` runs (a separate, untimed call)."""
    gc.collect()
    tracemalloc.start()
    fn()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


def psize(obj) -> int:
    return len(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def names(nvars: int) -> list[str]:
    return [f"v{i:02d}" for i in range(nvars)]


def chunk_rows(p: int, nvars: int, starts, stops) -> list:
    """Each rank's written rows, as commit.metadata_from_rows takes them: one chunk per rank and variable."""
    rows = []
    for r in range(p):
        s0, cnt = tuple(starts[r].tolist()), tuple((stops[r] - starts[r]).tolist())
        nb = int(np.prod(cnt)) * ITEM
        rows.append([(n, rank_file(r), i * nb, nb, "0123456789abcdef", s0, cnt) for i, n in enumerate(names(nvars))])
    return rows


def save_case(p: int, nvars: int, sample: list[int]) -> tuple[dict, object, list]:
    shape = tuple(int(g) * EDGE for g in grid(p))
    starts, stops = boxes_of(p, shape)
    local = np.zeros((EDGE,) * 3)
    options = SaveOptions()

    def state(r):
        return {n: Block(local, offset=tuple(starts[r].tolist()), global_shape=shape) for n in names(nvars)}

    describe = [timed(lambda: measure_codecs(describe_state(state(r), r, p, options, step=1), options))[0]
                for r in sample]
    one = describe_state(state(0), 0, p, options, step=1)
    template = measure_codecs(one, options)
    summaries = []
    for r in range(p):
        s0, s1 = starts[r].tolist(), stops[r].tolist()
        summaries.append({n: {**v, "start": s0, "stop": s1} for n, v in template.items()})
    t_plan, (variables, boxes, codecs, _replicas) = timed(lambda: plan_variables(summaries, options))
    m_plan = traced(lambda: plan_variables(summaries, options))
    payload = (True, None, one.digest)
    gather_bytes = p * psize((None, summaries[-1], payload))  # what rank 0 receives
    payloads = [(True, None, "".join(list(one.digest))) for _ in range(p)]  # distinct objects, as received
    bcast_bytes = psize((None, None, payloads, variables, codecs, 0)) + psize(boxes[-1])
    hit_bytes = p * psize((None, True, None, None, one.digest))  # a cache-hit allgather (the allreduce's alternative), every rank
    root_part = (f"/scratch/run/step-{1:012d}", "file-per-rank", None, None)  # what rank 0 hands out on a hit
    ballot = Ballot(False, True, one.digest, one.digest, root_part, None)
    hit_reduce_bytes = max(1, (p - 1).bit_length()) * psize(ballot)  # rank 0: one ballot per level of the tree
    rows = chunk_rows(p, nvars, starts, stops)
    t_build, (meta, _, nchunks) = timed(lambda: metadata_from_rows(variables, rows, codecs, {}, p, 1, {}))
    t_write, raw = timed(meta.to_json_bytes)
    cpu = time.process_time()
    t_parse, parsed = timed(lambda: parse(raw))
    cpu = time.process_time() - cpu
    out = {"ranks": p, "chunks": nchunks, "shape": shape,
           "save_describe_s_max": max(describe), "save_plan_root_s": t_plan, "save_plan_root_peak_bytes": m_plan,
           "save_gather_bytes_root": gather_bytes, "save_bcast_scatter_bytes_rank": bcast_bytes,
           "save_hit_allgather_bytes_rank": hit_bytes, "save_hit_allreduce_bytes_rank_max": hit_reduce_bytes,
           "meta_build_s": t_build, "meta_bytes": len(raw), "meta_write_s": t_write, "meta_parse_s": t_parse,
           "meta_parse_s_per_million": t_parse / nchunks * 1e6,
           "meta_parse_cpu_s_per_million": cpu / nchunks * 1e6, "meta_pickle_bytes": psize(parsed)}
    return out, parsed, rows


def distinct_digests(meta) -> None:
    """Give every chunk of ``meta`` its own random checksum and content hash (seeded), as real data has."""
    rng = np.random.default_rng(20)
    for var in meta.variables.values():
        n = len(var.chunks)
        words = rng.integers(0, 1 << 63, (n, 3), dtype=np.int64).astype(">u8").tobytes().hex()
        var.chunks.checksum = [words[48 * k:48 * k + 16] for k in range(n)]
        var.chunks.hash = [words[48 * k + 16:48 * k + 48] for k in range(n)]


def metadata_case(p: int, nvars: int, repeat: int) -> dict:
    """Build, write and parse the metadata of P ranks (best CPU of ``repeat``), without and with a hash column."""
    shape = tuple(int(g) * EDGE for g in grid(p))
    starts, stops = boxes_of(p, shape)
    variables = {n: _plan(Variable(n, "block", np.dtype("<f8"), shape, None)) for n in names(nvars)}
    meta = metadata_from_rows(variables, chunk_rows(p, nvars, starts, stops), {}, {}, p, 1, {})[0]
    distinct_digests(meta)
    hashes = {n: v.chunks.hash for n, v in meta.variables.items()}
    out = {"ranks": p, "chunks": sum(len(v.chunks) for v in meta.variables.values())}
    for label, with_hash in (("", False), ("hash_", True)):
        for n, v in meta.variables.items():
            v.chunks.hash = hashes[n] if with_hash else None
        best = {"write": (float("inf"),) * 2, "parse": (float("inf"),) * 2}  # (CPU s, wall s) of the best
        for _ in range(repeat):
            wall, cpu, raw = timed_cpu(meta.to_json_bytes)
            best["write"] = min(best["write"], (cpu, wall))
            wall, cpu, _ = timed_cpu(lambda raw=raw: parse(raw))
            best["parse"] = min(best["parse"], (cpu, wall))
        out[label + "meta_bytes"] = len(raw)
        out[label + "meta_bcast_bytes"] = psize(parse(raw).indexed())  # what rank 0 broadcasts (untimed)
        for key in ("write", "parse"):
            out[f"{label}meta_{key}_cpu_s"], out[f"{label}meta_{key}_s"] = best[key]
            out[f"{label}meta_{key}_cpu_s_per_million"] = best[key][0] / out["chunks"] * 1e6
    return out


def directory_replies(meta, loaded: list, routed: dict, r: int, q: int, inbox_of) -> list:
    """What rank ``r`` gets in the directory's second alltoall: each directory it sent parts to decides on its
    own inbox (``inbox_of(d)``, read_directory.decide), as the real load does."""
    replies = [None] * q
    for d in sorted(routed):
        replies[d] = decide(meta, loaded, [m.get("parts") for m in inbox_of(d)], d, q)[1].get(r)
    return replies


def directory_received(inbox: list, replies: list, signature: tuple, r: int, q: int) -> int:
    """Pickled bytes rank ``r`` receives in the directory's two alltoalls (rank 0 also every signature)."""
    empty = psize(None)
    return (sum(psize({"parts": m["parts"]}) if m.get("parts") else empty for m in inbox)
            + (q - 1) * (psize({"signature": signature}) if r == 0 else 0)
            + sum(empty if x is None else psize({"assigned": x}) for x in replies))


def load_case(meta, q: int, nvars: int, nsample: int, old_full_max: int) -> dict:
    shape = meta.variables[names(nvars)[0]].shape
    starts, stops = boxes_of(q, shape)
    requests = [{n: ("block", tuple(starts[r].tolist()), tuple(stops[r].tolist())) for n in names(nvars)}
                for r in range(q)]
    sample = sorted({int(x) for x in np.linspace(0, q - 1, nsample)})
    local = np.zeros(tuple((stops[0] - starts[0]).tolist()))
    flat = {n: Block(local, offset=tuple(starts[0].tolist()), global_shape=shape) for n in names(nvars)}
    t_check = timed(lambda: check_template(flat, meta, True))[0]
    encoded = [encode_requests(r) for r in requests]
    old_bytes = q * psize((None, requests[-1]))
    gathered_bytes = q * psize((None, encoded[-1]))
    # the allgather way (Ragged tables): one rank's part of the plan from every rank's compact requests
    gathered = []
    for r in sample[:3]:
        clear_indexes(meta)
        gathered.append(timed(lambda: rank_reads(meta, target_boxes(encoded, meta), r))[0])
    # the directory way (Blocks only): the chunk indexes (built once per process), then this rank's own work
    clear_indexes(meta)
    t_index = timed(lambda: [v.chunks.index() for v in meta.variables.values()])[0]
    targets = {n: (BoxIndex(starts, stops), starts, stops) for n in names(nvars)}
    times, cpus, peaks, touched, received = [], [], [], [], []
    signature = tuple((n, "block") for n in names(nvars))
    for r in sample:
        box = {n: (tuple(starts[r].tolist()), tuple(stops[r].tolist())) for n in names(nvars)}
        inbox = directory_inbox(meta, targets, r, q)
        if r == 0:
            inbox = [dict(m or {}, signature=signature) for m in inbox]
        t1, c1, routed = timed_cpu(lambda: parts_for_directories(meta, chunk_roles(meta, box, set(box)), q))
        t2, c2, (problem, _, _) = timed_cpu(lambda: decide(meta, names(nvars), [m.get("parts") for m in inbox], r, q))
        assert problem is None
        replies = directory_replies(meta, names(nvars), routed, r, q, lambda d: directory_inbox(meta, targets, d, q))
        t3, c3, shared = timed_cpu(lambda: shared_from_assignments(replies, names(nvars)))
        times.append(t1 + t2 + t3)
        cpus.append(c1 + c2 + c3)
        touched.append(sum(len(p) for p in routed.values()))
        received.append(directory_received(inbox, replies, signature, r, q))
    r = sample[len(sample) // 2]  # (the chunk indexes came with the metadata)
    box = {n: (tuple(starts[r].tolist()), tuple(stops[r].tolist())) for n in names(nvars)}
    inbox = directory_inbox(meta, targets, r, q)
    peaks.append(traced(lambda: (parts_for_directories(meta, chunk_roles(meta, box, set(box)), q),
                                 decide(meta, names(nvars), [m.get("parts") for m in inbox], r, q))))
    # the all-ranks plan ("old" in the figures): every rank plans every rank's reads
    full, k = q <= old_full_max, q

    def old_tiling():  # the all-ranks plan's tiling check: the sweep of regions.tiling_problem
        for n in names(nvars):
            problem = tiling_problem(starts, stops, shape, label="the block of rank")
            assert problem is None

    def old():
        old_tiling()
        for n in names(nvars):
            c = meta.variables[n].chunks
            plan_shared_reads(c.start, c.stop, [(tuple(starts[r].tolist()), tuple(stops[r].tolist()))
                                                for r in range(k)] + [None] * (q - k))
    meta.indexed()  # rank 0 builds the chunk indexes and broadcasts them with the metadata
    meta_bcast = psize((None, meta))
    t_unpickle = timed(lambda: pickle.loads(pickle.dumps((None, meta), protocol=pickle.HIGHEST_PROTOCOL)))[0]
    if full:
        t_old, _ = timed(old)
        m_old = traced(old) if q <= 4096 else None
    else:  # the sweep alone is O(q^2 / px): too slow to run here
        t_old, m_old = None, None
    return {"ranks": q, "check_template_s": t_check, "chunk_index_s": t_index, "new_plan_s_max": max(times),
            "new_plan_cpu_s_max": max(cpus),
            "new_plan_s_median": float(np.median(times)), "new_plan_peak_bytes": max(peaks),
            "parts_touched_max": max(touched), "directory_received_bytes_max": max(received),
            "directory_received_bytes_median": float(np.median(received)), "gathered_plan_s_max": max(gathered),
            "requests_allgather_gathered_bytes": gathered_bytes, "agree_allgather_bytes": q * psize((None, None)),
            "old_plan_s": t_old, "old_plan_peak_bytes": m_old,
            "requests_allgather_old_bytes": old_bytes,
            "metadata_bcast_bytes": meta_bcast, "metadata_unpickle_s": t_unpickle, "sampled_ranks": sample}


TABLE = "particles"  # the Ragged table of the --ragged case: 4 float64 columns per row
TABLE_COLS = 4


def table_rows(p: int) -> list[int]:
    """Rows each of p ranks saved of the Ragged table: 64-127, uneven (particles drift between ranks)."""
    return [64 + (r * 37) % 64 for r in range(p)]


def ragged_metadata(p: int, nvars: int):
    """The version of the --ragged case, parsed as a load reads it: ``nvars`` Blocks of the 3-D grid plus a
    Ragged table saved in one chunk per rank (rows in rank order)."""
    shape = tuple(int(g) * EDGE for g in grid(p))
    starts, stops = boxes_of(p, shape)
    counts = table_rows(p)
    variables = {n: _plan(Variable(n, "block", np.dtype("<f8"), shape, None)) for n in names(nvars)}
    variables[TABLE] = _plan(Variable(TABLE, "ragged", np.dtype("<f8"), (sum(counts), TABLE_COLS), None))
    rows = chunk_rows(p, nvars, starts, stops)
    row0 = 0
    for r in range(p):
        at = sum(x[3] for x in rows[r])
        rows[r].append((TABLE, rank_file(r), at, counts[r] * TABLE_COLS * ITEM, "0123456789abcdef", (row0, 0),
                        (counts[r], TABLE_COLS)))
        row0 += counts[r]
    meta = metadata_from_rows(variables, rows, {}, {}, p, 1, {})[0]
    return parse(meta.to_json_bytes()).indexed()


class ScanOf:
    """A stand-in communicator for one rank of a q-rank job: its Scan hands back that rank's inclusive sum of
    the tallies every rank gives (load_plan.scan_rows runs as in a load; the other ranks are simulated)."""

    def __init__(self, rank: int, size: int, inclusive: np.ndarray):
        self.rank, self.size, self.inclusive = rank, size, inclusive

    def Get_rank(self) -> int:
        return self.rank

    def Get_size(self) -> int:
        return self.size

    def Scan(self, sendbuf, recvbuf, op=None) -> None:
        recvbuf[...] = self.inclusive


def ragged_load_case(meta, p: int, q: int, nvars: int, nsample: int, counts: bool) -> dict:
    """A load of ``meta`` (:func:`ragged_metadata`) on q ranks of their own 3-D grid, the Ragged table by an even
    split (``Ragged()``) or by counts (``Ragged(rows=n)``, uneven): the directory way (one Scan, then the
    directory's alltoalls, this rank's part: load_plan.scan_rows, load_boxes, chunk_roles,
    parts_for_directories, fast_summary, decide, shared_from_assignments) against the gathered way
    (every rank's encoded requests: target_boxes, rank_reads), per sampled rank."""
    from hpcckpt.loading.plan import load_boxes, ragged_names, scan_rows
    from hpcckpt.loading.ragged_rows import tally
    from hpcckpt.loading.directory import fast_summary

    shape = meta.variables[names(nvars)[0]].shape
    total = meta.variables[TABLE].shape[0]
    starts, stops = boxes_of(q, shape)
    asks = [None] * q
    if counts:  # uneven counts that add up: every even rank one row fewer, the next one more
        asks = [total * (r + 1) // q - total * r // q for r in range(q)]
        for r in range(0, q - 1, 2):
            if asks[r]:
                asks[r], asks[r + 1] = asks[r] - 1, asks[r + 1] + 1
    requests = [{**{n: ("block", tuple(starts[r].tolist()), tuple(stops[r].tolist())) for n in names(nvars)},
                 TABLE: ("ragged", asks[r])} for r in range(q)]
    tables = ragged_names(meta)
    inclusive = np.cumsum(np.stack([tally(req, tables) for req in requests]), axis=0)
    lo = np.cumsum([0] + [a for a in asks[:-1]]) if counts else np.asarray([total * r // q for r in range(q)])
    hi = lo + np.asarray(asks if counts else [total * (r + 1) // q - total * r // q for r in range(q)])
    t_starts, t_stops = np.stack([lo, np.zeros(q, np.int64)], 1), np.stack([hi, np.full(q, TABLE_COLS)], 1)
    per_name = {n: (BoxIndex(starts, stops), starts, stops) for n in names(nvars)}
    per_name[TABLE] = (BoxIndex(t_starts, t_stops), t_starts, t_stops)
    everything = names(nvars) + [TABLE]
    signature = tuple((n, requests[0][n][0]) for n in sorted(everything))
    sample = sorted({int(x) for x in np.linspace(0, q - 1, nsample)})
    out = {"saved_on": p, "ranks": q, "table_rows": total, "counts": counts, "sampled_ranks": sample}
    cpus, walls, received, scan_cpus, touched = [], [], [], [], []
    for r in sample:
        comm = ScanOf(r, q, inclusive[r])

        def plan_here(r=r, comm=comm):
            rows, problem = scan_rows(comm, meta, requests[r])
            assert problem is None
            boxes = load_boxes(meta, requests[r], rows)
            roles = chunk_roles(meta, boxes, set(boxes))
            return boxes, roles, parts_for_directories(meta, roles, q), fast_summary(meta, boxes, roles, signature, r)
        c0 = time.process_time()
        rows, _ = scan_rows(comm, meta, requests[r])
        scan_cpus.append(time.process_time() - c0)
        assert rows[TABLE] == (int(lo[r]), int(hi[r])), (rows, lo[r], hi[r])
        inbox = directory_inbox(meta, per_name, r, q)
        if r == 0:
            inbox = [dict(m or {}, signature=signature) for m in inbox]
        t1, c1, (boxes, roles, routed, summary) = timed_cpu(plan_here)
        t2, c2, (problem, _, _) = timed_cpu(lambda: decide(meta, everything, [m.get("parts") for m in inbox], r, q))
        assert problem is None, problem
        replies = directory_replies(meta, everything, routed, r, q, lambda d: directory_inbox(meta, per_name, d, q))
        t3, c3, _ = timed_cpu(lambda: shared_from_assignments(replies, everything))
        walls.append(t1 + t2 + t3)
        cpus.append(c1 + c2 + c3)
        touched.append(sum(len(x) for x in routed.values()))
        received.append(directory_received(inbox, replies, signature, r, q))
    steps = max(1, (q - 1).bit_length())  # MPI_Scan by recursive doubling: ceil(log2 q) vectors received
    out.update({"scan_bytes_rank": steps * 8 * 4 * len(tables), "scan_cpu_s_max": max(scan_cpus),
                "directory_plan_s_max": max(walls), "directory_plan_cpu_s_max": max(cpus),
                "directory_received_bytes_max": max(received),
                "directory_received_bytes_median": float(np.median(received)), "parts_touched_max": max(touched)})
    encoded = [encode_requests(req) for req in requests]
    gathered, gathered_cpu = [], []
    for r in sample[:3]:
        t, c, _ = timed_cpu(lambda r=r: rank_reads(meta, target_boxes(encoded, meta), r))
        gathered.append(t)
        gathered_cpu.append(c)
    out.update({"gathered_bytes_rank": q * psize({"requests": encoded[-1]}), "gathered_plan_s_max": max(gathered),
                "gathered_plan_cpu_s_max": max(gathered_cpu), "agree_bytes_rank": q * psize(None)})
    return out


def ragged_main(args) -> None:
    results = []
    for p in args.ranks:
        meta = ragged_metadata(p, args.vars)
        for q in (3 * p // 4, 2 * p):
            for counts in (False, True):
                results.append(ragged_load_case(meta, p, q, args.vars, args.sample, counts))
            print(f"P={p} -> {q} done", file=sys.stderr, flush=True)
    print(f"\nRagged load plan per rank ({args.vars} Blocks on a 3-D grid + a Ragged table of 4 columns, one chunk "
          "per saved rank; directory: one Scan + the directory's alltoalls; gathered: every rank's requests)\n")
    print_table(["P -> Q", "table rows", "rows by", "parts", "scan B/rank", "directory CPU ms (max)",
                 "directory wall ms", "recv directory KiB (max / median)", "gathered CPU ms (max)", "gathered wall ms",
                 "recv gathered KiB", "agree KiB"],
                [[f"{r['saved_on']} -> {r['ranks']}", r["table_rows"], "counts" if r["counts"] else "split",
                  r["parts_touched_max"], r["scan_bytes_rank"], f"{r['directory_plan_cpu_s_max'] * 1e3:.1f}",
                  f"{r['directory_plan_s_max'] * 1e3:.1f}",
                  f"{r['directory_received_bytes_max'] / 1024:.1f} / {r['directory_received_bytes_median'] / 1024:.1f}",
                  f"{r['gathered_plan_cpu_s_max'] * 1e3:.1f}", f"{r['gathered_plan_s_max'] * 1e3:.1f}",
                  f"{r['gathered_bytes_rank'] / 1024:.1f}", f"{r['agree_bytes_rank'] / 1024:.1f}"] for r in results])
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"ragged_load": results}, f, indent=1)


def clear_indexes(meta) -> None:
    """Forget the chunk indexes (a fresh process builds them on first use)."""
    for v in meta.variables.values():
        v.chunks._index = None


def directory_inbox(meta, per_name: dict, d: int, q: int) -> list:
    """What directory rank ``d`` receives in the first exchange, by sender (the parts of the chunks it directs);
    ``per_name``: ``{name: (BoxIndex of the ranks' boxes, starts, stops)}``."""
    inbox = [None] * q
    for name in sorted(meta.variables):
        c = meta.variables[name].chunks
        targets, starts, stops = per_name[name]
        for k in directed(d, len(c), q):
            for u in targets.query(c.start[k], c.stop[k]).tolist():
                lo = tuple(np.maximum(starts[u], c.start[k]).tolist())
                hi = tuple(np.minimum(stops[u], c.stop[k]).tolist())
                mid = centre(c.start[k], c.stop[k])
                role = (WHOLE if lo == tuple(c.start[k].tolist()) and hi == tuple(c.stop[k].tolist()) else
                        HOLDS if all(a <= m < b for a, m, b in zip(lo, mid.tolist(), hi)) else NEEDS)
                inbox[u] = inbox[u] or {"parts": []}
                inbox[u]["parts"].append((name, k, lo, hi, role))
    return [m or {} for m in inbox]


def incremental_case(meta, rows: list, p: int, nvars: int, sample: list[int]) -> dict:
    """A version on top of ``meta`` (as an incremental base) where every tenth block changed (half of the new
    blocks have a twin on another rank, which deduplication finds); the deduplication
    exchange measured both ways on the keys every rank would hand the select stage (:func:`dedup_exchanges`)."""
    variables = {n: _plan(v) for n, v in meta.variables.items()}
    dtypes = {n: v.dtype for n, v in meta.variables.items()}
    codecs = {n: v.codec for n, v in meta.variables.items()}
    for vi, v in enumerate(meta.variables.values()):  # every block of the base has its own content
        v.chunks.hash = [f"{vi:08x}{k:024x}" for k in range(len(v.chunks))]
    t_index, index = timed(lambda: ChainIndex.from_metadata(meta, "step-1"))
    parts, items = [], []
    at = {n: 0 for n in names(nvars)}
    for r in range(p):
        written, refs, hashes, mine = [], [], {}, []
        for vi, (n, file, off, nb, dg, st, cnt) in enumerate(rows[r]):
            k = at[n]
            at[n] += 1
            if (r + vi) % 10 == 0:  # 2 of the 20 variables of each rank changed; every new block has one twin
                h = f"{vi:08x}{(1 << 95) + r // 20:024x}"  # (the same variable's on another rank of its 20)
                written.append((n, rank_file(r), len(written) * nb, nb, dg, st, cnt))
                hashes[(n, st)] = h
                mine.append(((h, nb, "none"), False))
            else:
                h = f"{vi:08x}{k:024x}"
                refs.append((n, reference("step-1", file), off, nb, dg, st, cnt, h))
                mine.append(((h, nb, "none"), True))
        parts.append({"written": written, "hashes": hashes, "refs": refs, "dups": []})
        items.append(mine)
    extra = {"incremental": {"kind": "incremental", "base": "step-1", "depth": 1}}
    t_meta, (imeta, _, nchunks, _) = timed(lambda: incremental_metadata(variables, dtypes, codecs, parts, {}, p, 2,
                                                                       extra))
    raw = imeta.to_json_bytes()
    t_parse, _ = timed(lambda: parse(raw))
    block = rows[0][0][3]
    counts = [(block * len(mine), block * sum(not again for _, again in mine), 0, 0) for mine in items]
    return {"ranks": p, "chunks": nchunks, "base_index_s": t_index, "base_index_bcast_bytes": psize(index),
            "meta_root_s": t_meta, "meta_bytes": len(raw), "meta_parse_s": t_parse,
            "new_keys": sum(not again for mine in items for _, again in mine),
            "keys": sum(len(mine) for mine in items), **dedup_exchanges(items, counts, p, sample)}


def dedup_exchanges(items: list, counts: list, p: int, sample: list[int]) -> dict:
    """The select stage's deduplication exchange of P ranks through the code the save runs (hpcckpt.saving.selection,
    hpcckpt.incremental.dedup_owners), both ways, for an incremental version and for a full one (its reusable blocks are
    written after all).  ``items[r]``: rank r's ``(key, reusable)`` in its order; ``counts[r]``: its counts.

    Bytes received per rank are the pickled sizes of the messages the code hands mpi4py (which pickles each
    alltoall slot and each allgather contribution on its own); for the owners' exchange every slot a rank
    receives is counted, empty ones included, computed per (sender, owner) pair that has keys plus one empty slot
    per sender, so no P x P list is built.  CPU per rank: everything a rank does in the exchange but the
    transfer, on the ``sample`` ranks (worst reported): for the owners, building its P slots, pickling them,
    unpickling the P it receives, the owner's verdicts, and the same for the verdicts' round and the
    reassembly; for the allgather, pickling its message, unpickling P and incremental.duplicates.
    """
    keys = [[k for k, _ in mine] for mine in items]
    reusable = [[again for _, again in mine] for mine in items]
    new = [[k for k, again in mine if not again] for mine in items]
    out = {}
    # the allgather (selection.by_allgather): (failure, (counts, new keys, any reusable)), and every key again
    # for a full version with reusable blocks
    messages = [(None, (counts[r], new[r], any(reusable[r]))) for r in range(p)]
    pickled = [pickle.dumps(m, protocol=pickle.HIGHEST_PROTOCOL) for m in messages]
    out["allgather_bytes_rank"] = sum(map(len, pickled))
    out["allgather_full_bytes_rank"] = out["allgather_bytes_rank"] + sum(psize(k) for k in keys)
    last = p - 1  # the rank that scans every rank's keys
    _, cpu, _ = timed_cpu(lambda: (pickle.dumps(messages[last], protocol=pickle.HIGHEST_PROTOCOL),
                                   [pickle.loads(m) for m in pickled], duplicates(new, last)))
    out["allgather_cpu_s_rank"] = cpu
    # the owners (selection.by_owners)
    positions = [dedup_owners.route(k, p) for k in keys]
    parts = [dedup_owners.key_parts(keys[r], reusable[r], positions[r]) for r in range(p)]
    empty = [psize(dedup_owners.key_slot(c)) for c in counts]
    received1 = np.full(p, sum(empty), dtype=np.int64)
    inboxes: dict[int, dict] = {}
    for s in range(p):
        for o, part in parts[s].items():
            received1[o] += psize(dedup_owners.key_slot(counts[s], part)) - empty[s]
            inboxes.setdefault(o, {})[s] = part
    none = psize(None)
    for label, full in (("", False), ("full_", True)):
        received2 = np.full(p, p * none, dtype=np.int64)
        for o, inbox in inboxes.items():
            for s, flags in dedup_owners.verdicts(inbox, full).items():
                received2[s] += psize(flags) - none
        total = received1 + received2
        out[f"owners_{label}bytes_rank_max"] = int(total.max())
        out[f"owners_{label}bytes_rank_median"] = float(np.median(total))
        out[f"owners_{label}keys_round_bytes_rank_max"] = int(received1.max())
    cpus, verdict_cpus = [], []
    for r in sample:  # what rank r does in by_owners, but the transfers
        got = [pickle.dumps(dedup_owners.key_slot(counts[s], parts[s].get(r)), protocol=pickle.HIGHEST_PROTOCOL)
               for s in range(p)]
        replies = {}
        for o in {o for o in positions[r]}:
            replies[o] = dedup_owners.verdicts(inboxes[o], False).get(r)
        back = [pickle.dumps(replies.get(o), protocol=pickle.HIGHEST_PROTOCOL) for o in range(p)]

        def owner_work():
            failures, everyone, inbox = dedup_owners.read_key_slots([pickle.loads(m) for m in got])
            sums = tuple(map(sum, zip(*everyone)))
            t = time.process_time()
            decided = dedup_owners.verdicts(inbox, choose_kind(1, sums[1], sums[0], 10, 0.5)[0] == "full")
            verdict_cpus.append(time.process_time() - t)
            return [pickle.dumps(x, protocol=pickle.HIGHEST_PROTOCOL)
                    for x in dedup_owners.verdict_slots(decided, p)]

        def sender_work():
            pos = dedup_owners.route(keys[r], p)
            mine = dedup_owners.key_parts(keys[r], reusable[r], pos)
            sent = [pickle.dumps(dedup_owners.key_slot(counts[r], mine.get(o)), protocol=pickle.HIGHEST_PROTOCOL)
                    for o in range(p)]
            _, answers = dedup_owners.read_verdict_slots([pickle.loads(m) for m in back])
            return sent, dedup_owners.reassemble(pos, answers, reusable[r], False)

        _, cpu, _ = timed_cpu(lambda: (sender_work(), owner_work()))
        cpus.append(cpu)
    out["owners_cpu_s_rank_max"] = max(cpus)
    out["owners_verdicts_cpu_s_max"] = max(verdict_cpus)
    out["owners_received_keys_max"] = max(sum(len(part[0]) for part in inbox.values())
                                          for inbox in inboxes.values())
    return out


def _plan(var):
    from hpcckpt.core.encoding import dtype_to_json
    from hpcckpt.core.planning import VariablePlan

    return VariablePlan(var.kind, dtype_to_json(var.dtype), var.shape)


def metadata_main(args) -> None:
    import hpcckpt.format.metadata as md

    results = [metadata_case(p, args.vars, args.repeat) for p in args.ranks]
    print(f"\nMetadata (format version {md.FORMAT_VERSION}, hpcckpt from {os.path.dirname(md.__file__)}); "
          f"CPU s per million chunks, best of {args.repeat}\n")
    print_table(["P", "chunks", "meta MiB", "write CPU s/M", "parse CPU s/M", "bcast MiB", "with hash: MiB",
                 "write CPU s/M", "parse CPU s/M", "bcast MiB"],
                [[r["ranks"], r["chunks"], mib(r["meta_bytes"]), f"{r['meta_write_cpu_s_per_million']:.3f}",
                  f"{r['meta_parse_cpu_s_per_million']:.3f}", mib(r["meta_bcast_bytes"]), mib(r["hash_meta_bytes"]),
                  f"{r['hash_meta_write_cpu_s_per_million']:.3f}", f"{r['hash_meta_parse_cpu_s_per_million']:.3f}",
                  mib(r["hash_meta_bcast_bytes"])] for r in results])
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"format_version": md.FORMAT_VERSION, "metadata": results}, f, indent=1)


def mib(n) -> str:
    return "-" if n is None else f"{n / 2**20:.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[1024, 4096, 16384, 65536])
    ap.add_argument("--vars", type=int, default=20)
    ap.add_argument("--sample", type=int, default=8, help="ranks whose new load plan is timed, per case")
    ap.add_argument("--old-full-max", type=int, default=4096, help="above this, the old load plan is sampled")
    ap.add_argument("--no-load", action="store_true", help="the save and incremental cases only")
    ap.add_argument("--json", default=None)
    ap.add_argument("--metadata-only", action="store_true", help="only the metadata rows (docstring)")
    ap.add_argument("--repeat", type=int, default=3, help="with --metadata-only: repeats, best CPU reported")
    ap.add_argument("--ragged", action="store_true", help="only the load plan of Blocks plus a Ragged table, both ways")
    args = ap.parse_args()
    if args.metadata_only:
        return metadata_main(args)
    if args.ragged:
        return ragged_main(args)
    results = {"save": [], "load": [], "incremental": []}
    for p in args.ranks:
        save, meta, rows = save_case(p, args.vars, sorted({0, p // 2, p - 1}))
        results["save"].append(save)
        for q in () if args.no_load else (3 * p // 4, 2 * p):
            results["load"].append({"saved_on": p, **load_case(meta, q, args.vars, args.sample, args.old_full_max)})
        results["incremental"].append(incremental_case(meta, rows, p, args.vars,
                                                       sorted({int(x) for x in np.linspace(0, p - 1, args.sample)})))
        del meta, rows
        print(f"P={p} done", file=sys.stderr, flush=True)
    print("\nSave plan and metadata (per rank; rank 0 plans)\n")
    print_table(["P", "chunks", "describe ms", "plan rank0 s", "plan rank0 MiB", "gather rank0 MiB",
                 "bcast+scatter MiB/rank", "hit allgather (old) MiB/rank", "hit allreduce KiB/rank (max)",
                 "meta MiB", "write s", "parse s",
                 "parse s/M chunks", "parse CPU s/M"],
                [[s["ranks"], s["chunks"], f"{s['save_describe_s_max'] * 1e3:.2f}", f"{s['save_plan_root_s']:.3f}",
                  mib(s["save_plan_root_peak_bytes"]), mib(s["save_gather_bytes_root"]),
                  mib(s["save_bcast_scatter_bytes_rank"]), mib(s["save_hit_allgather_bytes_rank"]),
                  f"{s['save_hit_allreduce_bytes_rank_max'] / 1024:.2f}",
                  mib(s["meta_bytes"]), f"{s['meta_write_s']:.3f}", f"{s['meta_parse_s']:.3f}",
                  f"{s['meta_parse_s_per_million']:.3f}", f"{s['meta_parse_cpu_s_per_million']:.3f}"]
                 for s in results["save"]])
    print("\nLoad plan per rank (old: every rank plans all ranks; directory: Blocks, this rank's part; "
          "gathered: the Ragged way)\n")
    print_table(["P -> Q", "parts", "old s", "old MiB", "index ms (rank 0)", "directory ms (max)", "CPU ms (max)", "directory MiB",
                 "gathered ms", "meta bcast MiB", "recv old MiB", "recv directory KiB (max / median)", "recv gathered MiB",
                 "agree KiB"],
                [[f"{r['saved_on']} -> {r['ranks']}", r["parts_touched_max"],
                  "-" if r["old_plan_s"] is None else f"{r['old_plan_s']:.2f}", mib(r["old_plan_peak_bytes"]),
                  f"{r['chunk_index_s'] * 1e3:.1f}", f"{r['new_plan_s_max'] * 1e3:.1f}",
                  f"{r['new_plan_cpu_s_max'] * 1e3:.1f}", mib(r["new_plan_peak_bytes"]), f"{r['gathered_plan_s_max'] * 1e3:.0f}",
                  mib(r["metadata_bcast_bytes"]), mib(r["requests_allgather_old_bytes"]),
                  f"{r['directory_received_bytes_max'] / 1024:.1f} / {r['directory_received_bytes_median'] / 1024:.1f}", mib(r["requests_allgather_gathered_bytes"]),
                  f"{r['agree_allgather_bytes'] / 1024:.1f}"] for r in results["load"]])
    print("\nIncremental version on the P-rank base (10% of the blocks changed)\n")
    print_table(["P", "chunks", "keys", "new", "base index s", "index bcast MiB", "meta rank0 s", "meta MiB",
                 "parse s"],
                [[i["ranks"], i["chunks"], i["keys"], i["new_keys"], f"{i['base_index_s']:.3f}",
                  mib(i["base_index_bcast_bytes"]), f"{i['meta_root_s']:.3f}", mib(i["meta_bytes"]),
                  f"{i['meta_parse_s']:.3f}"] for i in results["incremental"]])
    print("\nDeduplication exchange per rank (received: pickled bytes; CPU: the rank's own work, worst of the "
          "sampled ranks)\n")
    print_table(["P", "allgather MiB (incr.)", "allgather MiB (full)", "allgather CPU ms",
                 "owners KiB max / median (incr.)", "owners KiB max (full)", "keys round KiB max",
                 "owner keys max", "owners CPU ms", "verdicts CPU ms"],
                [[i["ranks"], mib(i["allgather_bytes_rank"]), mib(i["allgather_full_bytes_rank"]),
                  f"{i['allgather_cpu_s_rank'] * 1e3:.1f}",
                  f"{i['owners_bytes_rank_max'] / 1024:.1f} / {i['owners_bytes_rank_median'] / 1024:.1f}",
                  f"{i['owners_full_bytes_rank_max'] / 1024:.1f}",
                  f"{i['owners_keys_round_bytes_rank_max'] / 1024:.1f}", i["owners_received_keys_max"],
                  f"{i['owners_cpu_s_rank_max'] * 1e3:.1f}", f"{i['owners_verdicts_cpu_s_max'] * 1e3:.2f}"]
                 for i in results["incremental"]])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
