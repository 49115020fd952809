"""Incremental saves against full saves: bytes written, save time, chain restore time.

    mpiexec -n 4 python bench/incremental.py [--mib 256] [--dir DIR] [--json out.json]

A Block field of ``--mib`` MiB (float64, rows split evenly over the ranks) is
saved once in full (the plain, non-incremental save) and once as an
incremental base; then 1%, 5%, 25% and 100% of its 1 MiB blocks change
(``random``: blocks anywhere; ``clustered``: one contiguous run) and each
variant is saved incrementally on the base.  Also: the block size (256 KiB,
1 MiB, 4 MiB at 5% random), the cost of deduplication (at 100% changed, where
it finds nothing), a growing particle table (Ragged, +2% rows per step, rows
migrating between ranks), and the restore time of a chain of depth 10 (5%
random changes per step) against a full restore of the same data.  Times are
the slowest rank's, min of ``--repeat`` runs; fsync on.  Each incremental case
is paired with ``--repeat`` full saves run alternately with it, and its ratio
is against their minimum (the machine's load changes between cases).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import hpcckpt  # noqa: E402
from hpcckpt.core.regions import even_rows  # noqa: E402

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
COLS = 1024  # 8 KiB rows: a 1 MiB block is 128 rows


def timed(fn):
    COMM.Barrier()
    t = time.perf_counter()
    out = fn()
    COMM.Barrier()
    return COMM.allreduce(time.perf_counter() - t, op=MPI.MAX), out


def fresh(base_dir, name):
    path = os.path.join(base_dir, name)
    if RANK == 0:
        shutil.rmtree(path, ignore_errors=True)
    COMM.Barrier()
    return path


def field(rows):
    lo, hi = even_rows(rows, SIZE, RANK)
    local = np.random.default_rng(RANK).random((hi - lo, COLS))
    return local, lo


def change(local, lo, rows, fraction, pattern, seed, block_rows=128):
    nblocks = rows // block_rows
    k = max(1, round(fraction * nblocks))
    rng = np.random.default_rng(seed)
    if pattern == "random":
        chosen = rng.choice(nblocks, size=k, replace=False)
    else:
        first = int(rng.integers(0, nblocks - k + 1))
        chosen = np.arange(first, first + k)
    for b in chosen:
        r = b * block_rows - lo
        if 0 <= r < local.shape[0]:
            local[r, 0] += 1.0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    base_dir = COMM.bcast(tempfile.mkdtemp(prefix="hpcckpt-bench-", dir=args.dir) if RANK == 0 else None)
    rows = args.mib * (1 << 20) // (COLS * 8)
    local, lo = field(rows)
    block = lambda a: {"u": hpcckpt.Block(a, (lo, 0), (rows, COLS))}  # noqa: E731
    results = {"mib": args.mib, "ranks": SIZE, "rows": []}

    def best(fn):
        runs = [fn() for _ in range(args.repeat)]
        return min(runs, key=lambda r: r[0])

    def full_save():
        path = fresh(base_dir, "full")
        t, r = timed(lambda: hpcckpt.save(block(local), path, comm=COMM))
        return t, r.bytes_written

    t_full, b_full = best(full_save)
    results["full"] = {"seconds": t_full, "bytes": b_full}
    if RANK == 0:
        print(f"full save: {b_full / 2**20:.0f} MiB in {t_full:.3f} s", flush=True)

    def incremental_variant(fraction, pattern, block_bytes=1 << 20, dedup=True, tag=""):
        basep = fresh(base_dir, f"base{tag}")
        hpcckpt.save(block(local), basep, comm=COMM, incremental=True, block_bytes=block_bytes)
        changed = local.copy()
        change(changed, lo, rows, fraction, pattern, seed=int(fraction * 1000))

        def one():
            path = fresh(base_dir, f"inc{tag}")
            t, r = timed(lambda: hpcckpt.save(block(changed), path, comm=COMM, base=basep, block_bytes=block_bytes,
                                              dedup=dedup, full_threshold=1.0))
            return t, r.bytes_written
        runs, fulls = [], []
        for _ in range(args.repeat):  # paired: a full save next to each incremental one (load bursts hit both)
            runs.append(one())
            fulls.append(full_save()[0])
        t, b = min(runs, key=lambda r: r[0])
        return t, b, min(fulls)

    for pattern in ("random", "clustered"):
        for fraction in (0.01, 0.05, 0.25, 1.0):
            t, b, t_pair = incremental_variant(fraction, pattern)
            row = {"case": f"{fraction:.0%} {pattern}", "seconds": t, "bytes": b, "full_seconds": t_pair,
                   "bytes_vs_full": b / b_full, "time_vs_full": t / t_pair}
            results["rows"].append(row)
            if RANK == 0:
                print(f"{row['case']:>14}: {b / 2**20:8.2f} MiB ({b / b_full:6.1%}) in {t:.3f} s "
                      f"({t / t_pair:.2f}x the paired full save, {t_pair:.3f} s)", flush=True)
    for bb in (256 << 10, 1 << 20, 4 << 20):
        t, b, _ = incremental_variant(0.05, "random", block_bytes=bb, tag="bs")
        results.setdefault("block_size", []).append({"block_bytes": bb, "seconds": t, "bytes": b})
        if RANK == 0:
            print(f"block {bb >> 10:5d} KiB, 5% random: {b / 2**20:7.2f} MiB in {t:.3f} s", flush=True)
    for dedup in (False, True):
        t, b, _ = incremental_variant(1.0, "random", dedup=dedup, tag="dd")
        results.setdefault("dedup", []).append({"dedup": dedup, "seconds": t, "bytes": b})
        if RANK == 0:
            print(f"100% changed, dedup={dedup}: {t:.3f} s", flush=True)

    # depth-10 chain restore against a full restore of the same final state
    root = fresh(base_dir, "chain")
    ck = hpcckpt.Checkpointer(root, comm=COMM, incremental=True, max_chain=10, full_threshold=1.0,
                              track_failures=False)
    cur = local.copy()
    for step in range(11):
        if step:
            change(cur, lo, rows, 0.05, "random", seed=step)
        r = ck.save(block(cur), step=step)
    depth = r.incremental["depth"]
    fullp = fresh(base_dir, "full-final")
    hpcckpt.save(block(cur), fullp, comm=COMM)
    target = np.empty_like(cur)

    def restore(path):  # both warm in the page cache (the first of the runs warms it); min of the runs
        return timed(lambda: hpcckpt.load(block(target), path, comm=COMM))[0]

    chain_runs, full_runs = [], []
    for _ in range(max(5, args.repeat + 1)):  # interleaved, so that a burst of load on the machine hits both
        chain_runs.append(restore(os.path.join(root, "step-000000000010")))
        assert np.array_equal(target, cur)
        full_runs.append(restore(fullp))
    t_chain, t_fullr = min(chain_runs), min(full_runs)
    results["restore"] = {"depth": depth, "chain_seconds": t_chain, "full_seconds": t_fullr}
    if RANK == 0:
        print(f"restore: chain depth {depth} {t_chain:.3f} s, full {t_fullr:.3f} s ({t_chain / t_fullr:.2f}x)",
              flush=True)

    # a growing particle table: +2% rows per step, rows migrating between ranks
    rec = np.dtype([("x", "<f8"), ("y", "<f8"), ("vx", "<f8"), ("vy", "<f8"), ("id", "<i8")])
    n0 = (args.mib << 20) // 4 // rec.itemsize  # a quarter of the field's size
    root = fresh(base_dir, "particles")
    ck = hpcckpt.Checkpointer(root, comm=COMM, incremental=True, track_failures=False)
    table = np.zeros(n0, rec)
    table["id"] = np.arange(n0)
    grow = []
    for step in range(4):
        if step:
            extra = np.zeros(n0 // 50, rec)
            extra["id"] = np.arange(len(table), len(table) + len(extra))
            table = np.concatenate([table, extra])
        cuts = np.sort(np.random.default_rng(step).integers(0, len(table), SIZE - 1)) if SIZE > 1 else []
        bounds = [0, *map(int, cuts), len(table)]
        mine = table[bounds[RANK]:bounds[RANK + 1]]
        t, r = timed(lambda: ck.save({"p": hpcckpt.Ragged(mine)}, step=step))
        grow.append({"step": step, "seconds": t, "bytes": r.bytes_written, "table_bytes": table.nbytes})
        if RANK == 0:
            print(f"particles step {step}: table {table.nbytes / 2**20:.1f} MiB, wrote "
                  f"{r.bytes_written / 2**20:.2f} MiB in {t:.3f} s", flush=True)
    results["particles"] = grow
    if RANK == 0:
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)
        shutil.rmtree(base_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
