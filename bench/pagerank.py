"""apps/pagerank.py's checkpoints: the incremental Checkpointer against saving the whole graph every time.

    mpiexec -n 4 python bench/pagerank.py [--scale 18] [--saves 8] [--dir DIR] [--json out.json]

The app's R-MAT graph (``--scale``, ``--edge-factor``) is built and partitioned
as the app does; then PageRank iterates and after each iteration the same
state (edges as a Ragged table, the rank vector as a Block) is saved twice,
in alternating order: by ``Checkpointer(incremental=True)`` with the app's
settings (the edges are written by the first version only), and by a plain
``Checkpointer`` (every version writes the edges and the ranks).  Per save:
bytes written (SaveResult.bytes_written, the data files) and time (the
slowest rank's, barrier to barrier, fsync on).  The first save of each is
reported apart (both write everything); the table gives the medians of the
later ones and the median of the per-iteration paired time ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

from mpi4py import MPI

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "apps"))
import hpcckpt  # noqa: E402
import pagerank  # noqa: E402  (the app: its generator, partition and solver)
from benchutil import print_table  # noqa: E402
from hpcckpt.core.regions import even_rows  # noqa: E402

COMM = MPI.COMM_WORLD
RANK = COMM.Get_rank()


def timed_save(ck, step: int):
    COMM.Barrier()
    t = time.perf_counter()
    result = ck.save(step=step)
    COMM.Barrier()
    return COMM.allreduce(time.perf_counter() - t, op=MPI.MAX), result.bytes_written


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=int, default=18, help="2**SCALE vertices (18)")
    ap.add_argument("--edge-factor", type=int, default=16)
    ap.add_argument("--saves", type=int, default=8, help="checkpoints of each kind, one per iteration (8)")
    ap.add_argument("--block-bytes", type=int, default=1 << 20)
    ap.add_argument("--dir", default=None, help="where the checkpoints go (default: a temp dir, removed)")
    ap.add_argument("--json", default=None, help="write every measurement here")
    args = ap.parse_args()
    if args.saves < 2:
        ap.error("--saves must be at least 2 (the first save of each kind is reported apart)")

    base = COMM.bcast(tempfile.mkdtemp(prefix="bench-pagerank-", dir=args.dir) if RANK == 0 else None)
    n = 1 << args.scale
    part = pagerank.Partition(COMM, n)
    lo, hi = even_rows(args.edge_factor * n, part.size, RANK)
    t0 = time.perf_counter()
    pr = pagerank.PageRank(part, pagerank.repartition(part, pagerank.rmat_edges(args.scale, lo, hi, 1)), 0.85,
                           {"graph": "rmat", "scale": args.scale})
    build = COMM.allreduce(time.perf_counter() - t0, op=MPI.MAX)
    nedges = COMM.allreduce(len(pr.edges))
    common = dict(comm=COMM, keep=3, policy=hpcckpt.policy.FixedSteps(1), track_failures=False,
                  handle_signals=False)
    inc = hpcckpt.Checkpointer(os.path.join(base, "incremental"), incremental=True, block_bytes=args.block_bytes,
                               max_chain=1 << 30, **common).register(pr)
    whole = hpcckpt.Checkpointer(os.path.join(base, "whole"), **common).register(pr)
    rows = {"incremental": [], "whole": []}
    for i in range(args.saves):
        pr.step()
        order = [("incremental", inc), ("whole", whole)] if i % 2 == 0 else [("whole", whole), ("incremental", inc)]
        for name, ck in order:
            rows[name].append(timed_save(ck, pr.iteration))
    inc.close()
    whole.close()
    if RANK == 0:
        shutil.rmtree(base, ignore_errors=True)
        later = {k: v[1:] for k, v in rows.items()}
        ratios = [w[0] / max(x[0], 1e-9) for x, w in zip(later["incremental"], later["whole"])]
        mib = 1 << 20
        print(f"{part.size} ranks, R-MAT scale {args.scale}: {n} vertices, {nedges} edges "
              f"({nedges * 16 / mib:.1f} MiB of edges, {n * 8 / mib:.1f} MiB of ranks); built in {build:.2f} s; "
              f"{args.saves} saves each, block {args.block_bytes // 1024} KiB")
        table = []
        for name in ("whole", "incremental"):
            first_t, first_b = rows[name][0]
            t = statistics.median(x[0] for x in later[name])
            b = statistics.median(x[1] for x in later[name])
            table.append([name, f"{first_b / mib:.2f}", f"{first_t * 1e3:.0f}", f"{b / mib:.2f}", f"{t * 1e3:.0f}"])
        print_table(["checkpointer", "first save MiB", "first save ms", "later saves MiB (median)",
                     "later saves ms (median)"], table)
        print(f"whole / incremental, later saves: bytes {statistics.median(x[1] for x in later['whole']) / statistics.median(x[1] for x in later['incremental']):.1f}x, "
              f"time {statistics.median(ratios):.1f}x (median of paired ratios)")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"ranks": part.size, "scale": args.scale, "vertices": n, "edges": nedges,
                           "block_bytes": args.block_bytes, "build_s": build,
                           "saves": {k: [{"seconds": t, "bytes": b} for t, b in v] for k, v in rows.items()},
                           "paired_time_ratio_median": statistics.median(ratios)}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
