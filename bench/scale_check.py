"""A real run of bench/scale.py's case, to check that the simulated figures and the real code agree.

    MPIR_CVAR_CH4_PROGRESS_THROTTLE=1 MPIR_CVAR_POLLS_BEFORE_YIELD=1 \\
      mpiexec -n 32 python bench/scale_check.py [--vars 20] [--dir DIR] [--json out.json] [--dedup]

P ranks save ``--vars`` variables, each rank a 4^3 float64 block of a 3-D grid
(scale.grid), and the first 3P/4 ranks (a sub-communicator) load them on their
own grid: the reshard of scale.py's ``P -> 3P/4`` case.  Measured on every
rank, through a communicator wrapper that pickles what each collective hands
back: the bytes received by the load's planning (the alltoalls of the chunk
directory) and by its metadata broadcast, and the plan phase's time
(loading.load_version's PhaseTimer).  Then rank 0 runs the simulation of the
same case (scale.save_case / load_case) and prints both side by side, with
the size of the real metadata.json against the simulated one.

``--ragged``: the same ranks save the variables plus a Ragged table (scale.table_rows rows of 4 float64 per
rank) and the 3P/4 load them with the table split evenly (``Ragged()``), the metadata broadcast (as beyond 16
ranks): the chunk directory after one Scan; the bytes its alltoalls hand each rank are set against
scale.ragged_load_case's.

``--dedup``: instead, P ranks save an incremental chain like scale.py's incremental case (a 4^3 float64
block per rank and variable, block_bytes 512; 2 of each rank's variables change, every new block with a twin
on another rank) with the deduplication forced through the keys' owners (hpcckpt.incremental.dedup_owners), and the
bytes each rank receives in the second save's alltoalls (the select stage's only ones) are set against
scale.dedup_exchanges of the keys and counts the ranks really sent (the grid cuts each rank's block of a
variable in two here: 40 keys a rank).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import sys
import tempfile

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import scale  # noqa: E402
from benchutil import print_table  # noqa: E402

import hpcckpt  # noqa: E402
from hpcckpt.loading.load import load_version  # noqa: E402
from hpcckpt.core.monitor import PhaseTimer  # noqa: E402
from hpcckpt.core.names import METADATA_FILE  # noqa: E402

COMM = MPI.COMM_WORLD


class Received:
    """A communicator wrapper that adds up the pickled size of what each collective returns to this rank."""

    def __init__(self, comm):
        self._comm, self.bytes = comm, {}

    def __getattr__(self, name):
        attr = getattr(self._comm, name)
        if name not in ("bcast", "alltoall", "allgather"):
            return attr

        def counted(*a, **k):
            out = attr(*a, **k)
            items = out if name != "bcast" else [out]
            self.bytes[name] = self.bytes.get(name, 0) + sum(len(pickle.dumps(x, protocol=5)) for x in items)
            return out
        return counted


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vars", type=int, default=20)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--dedup", action="store_true", help="the incremental save's deduplication exchange")
    ap.add_argument("--ragged", action="store_true", help="a Ragged table too, loaded through the directory")
    args = ap.parse_args()
    if args.dedup:
        return dedup_check(args)
    if args.ragged:
        return ragged_check(args)
    p, rank = COMM.size, COMM.rank
    q = 3 * p // 4
    root, path, shape = grid_save(args)
    sub = COMM.Split(0 if rank < q else MPI.UNDEFINED, rank)
    mine = None
    if sub != MPI.COMM_NULL:
        template = grid_template(args, q, shape, sub)
        load_version(template, path, sub)  # warm-up: imports and first-call costs
        counting, timer = Received(sub), PhaseTimer()
        load_version(template, path, counting, timer=timer)
        mine = (timer.seconds["plan"], counting.bytes.get("alltoall", 0), counting.bytes.get("bcast", 0))
        sub.Free()
    everyone = COMM.gather(mine, root=0)
    if rank == 0:
        real = [m for m in everyone if m is not None]
        meta_bytes = os.path.getsize(os.path.join(path, METADATA_FILE))
        save, meta, _ = scale.save_case(p, args.vars, [0])
        sim = scale.load_case(meta, q, args.vars, 6, 0)
        plan = [m[0] for m in real]
        recv = [m[1] for m in real]
        rows = [["plan ms per rank (median / max)", f"{np.median(plan) * 1e3:.1f} / {max(plan) * 1e3:.1f}",
                 f"{sim['new_plan_s_median'] * 1e3:.1f} / {sim['new_plan_s_max'] * 1e3:.1f} (+ index "
                 f"{sim['chunk_index_s'] * 1e3:.1f})"],
                ["planning bytes received per rank (median / max)", f"{np.median(recv):.0f} / {max(recv)}",
                 f"{sim['directory_received_bytes_median']:.0f} / {sim['directory_received_bytes_max']}"],
                ["metadata broadcast bytes", f"{real[0][2]}", f"{sim['metadata_bcast_bytes']}"],
                ["metadata.json bytes", f"{meta_bytes}", f"{save['meta_bytes']}"]]
        print(f"\n{p} ranks save, {q} load ({args.vars} variables)\n")
        print_table(["", "real", "simulated"], rows)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"ranks": p, "load_ranks": q, "real": real, "metadata_bytes": meta_bytes,
                           "simulated": sim}, f, indent=1)
        shutil.rmtree(root, ignore_errors=True)


def real_against_simulated(label: str, real: list, sim_median: float, sim_max: int, args, record: dict) -> None:
    """Rank 0: the table of bytes received per rank, real against simulated (median, max); ``record`` to --json."""
    print_table([label, "real", "simulated"], [["median", f"{np.median(real):.0f}", f"{sim_median:.0f}"],
                                               ["max", f"{max(real)}", f"{sim_max}"]])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)


def grid_save(args, extra: dict | None = None) -> tuple[str, str, tuple]:
    """Every rank saves its box of the 3-D grid of ``args.vars`` variables (and ``extra``) into a fresh root:
    ``(root, checkpoint path, global shape)``."""
    p, rank = COMM.size, COMM.rank
    root = COMM.bcast(tempfile.mkdtemp(prefix="scale-", dir=args.dir) if rank == 0 else None)
    path = os.path.join(root, "ck")
    shape = tuple(int(g) * scale.EDGE for g in scale.grid(p))
    starts, _ = scale.boxes_of(p, shape)
    local = np.full((scale.EDGE,) * 3, float(rank))
    state = {n: hpcckpt.Block(local, tuple(starts[rank].tolist()), shape) for n in scale.names(args.vars)}
    hpcckpt.save({**state, **(extra or {})}, path, comm=COMM)
    return root, path, shape


def grid_template(args, q: int, shape: tuple, sub) -> dict:
    """The Blocks of ``sub``'s rank on the grid of ``q`` ranks over ``shape``: a load template."""
    lo, hi = scale.boxes_of(q, shape)
    box = (tuple(lo[sub.rank].tolist()), tuple(hi[sub.rank].tolist()))
    return {n: hpcckpt.Block(np.zeros(np.subtract(box[1], box[0])), box[0], shape) for n in scale.names(args.vars)}


def ragged_check(args) -> None:
    """Real bytes received by a Ragged load's directory against the simulation (docstring)."""
    from hpcckpt.loading import load as loading

    loading.PER_RANK_METADATA_MAX_RANKS = 0  # rank 0 broadcasts the metadata: the directory way for Ragged tables
    p, rank = COMM.size, COMM.rank
    q = 3 * p // 4
    rows = scale.table_rows(p)
    table = np.arange(sum(rows[:rank]) * 4, sum(rows[:rank + 1]) * 4, dtype=np.float64).reshape(-1, scale.TABLE_COLS)
    root, path, shape = grid_save(args, {scale.TABLE: hpcckpt.Ragged(table)})
    sub = COMM.Split(0 if rank < q else MPI.UNDEFINED, rank)
    mine = None
    if sub != MPI.COMM_NULL:
        template = dict(grid_template(args, q, shape, sub), **{scale.TABLE: hpcckpt.Ragged()})
        load_version(template, path, sub)  # warm-up: imports and first-call costs
        counting = Received(sub)
        out = load_version(template, path, counting)
        total = sum(rows)
        want = np.arange(total * 4, dtype=np.float64).reshape(-1, 4)[total * sub.rank // q:total * (sub.rank + 1) // q]
        assert np.array_equal(out[scale.TABLE].local, want)
        mine = counting.bytes.get("alltoall", 0)
        sub.Free()
    everyone = COMM.gather(mine, root=0)
    if rank == 0:
        real = [m for m in everyone if m is not None]
        sim = scale.ragged_load_case(scale.ragged_metadata(p, args.vars), p, q, args.vars, 6, False)
        print(f"\n{p} ranks save, {q} load ({args.vars} variables + a Ragged table of {sum(rows)} rows, split "
              "evenly; the directory after one Scan)\n")
        real_against_simulated("directory bytes received per rank", real, sim["directory_received_bytes_median"],
                               sim["directory_received_bytes_max"], args,
                               {"ranks": p, "load_ranks": q, "real": real, "simulated": sim})
        shutil.rmtree(root, ignore_errors=True)


def dedup_check(args) -> None:
    """Real bytes received in the owners' exchange of an incremental save against the simulation (docstring)."""
    from hpcckpt.incremental import dedup_owners

    dedup_owners.OWNERS_FROM_RANKS = 1
    p, rank = COMM.size, COMM.rank
    root = COMM.bcast(tempfile.mkdtemp(prefix="scale-", dir=args.dir) if rank == 0 else None)
    shape = tuple(int(g) * scale.EDGE for g in scale.grid(p))
    starts, _ = scale.boxes_of(p, shape)
    block = scale.EDGE ** 3 * scale.ITEM

    def state(changed: bool) -> dict:
        out = {}
        for vi, n in enumerate(scale.names(args.vars)):
            twin = changed and (rank + vi) % 10 == 0  # as scale.incremental_case: twins within 20 ranks
            value = 1e6 + vi * 1e3 + rank // 20 if twin else rank * args.vars + vi  # base: every block distinct
            out[n] = hpcckpt.Block(np.full((scale.EDGE,) * 3, float(value)), tuple(starts[rank].tolist()), shape)
        return out

    options = {"incremental": True, "block_bytes": block, "strategy": "file-per-rank", "full_threshold": 0.5}
    hpcckpt.save(state(False), os.path.join(root, "v1"), comm=COMM, **options)
    counting, mine = Received(COMM), []
    key_parts = dedup_owners.key_parts

    def captured(keys, reusable, positions):  # the keys this rank hands the exchange, for the simulation
        mine.append((keys, reusable))
        return key_parts(keys, reusable, positions)

    dedup_owners.key_parts = captured
    result = hpcckpt.save(state(True), os.path.join(root, "v2"), comm=counting, base=os.path.join(root, "v1"),
                          **options)
    everyone = COMM.gather(counting.bytes.get("alltoall", 0), root=0)
    sent = COMM.gather(mine[0], root=0)
    if rank == 0:
        items = [list(zip(keys, again)) for keys, again in sent]
        counts = [(sum(k[1] for k, _ in mine), sum(k[1] for k, again in mine if not again), 0, 0) for mine in items]
        sim = scale.dedup_exchanges(items, counts, p, [0])
        info = result.incremental
        print(f"\n{p} ranks, an incremental save of {args.vars} variables ({info['kind']}, written "
              f"{info['written_bytes']} bytes, deduplicated {info['deduplicated_bytes']})\n")
        real_against_simulated("owners' exchange, bytes received per rank", everyone,
                               sim["owners_bytes_rank_median"], sim["owners_bytes_rank_max"], args,
                               {"ranks": p, "real": everyone, "simulated": sim, "incremental": info})
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
