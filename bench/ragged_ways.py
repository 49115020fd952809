#!/usr/bin/env python
"""A real Ragged load both ways on a few ranks: the chunk directory (the metadata's broadcast, one Scan, then its
alltoalls) against the gathered way (each rank reads the metadata, then every rank's requests and an agreement
after the reads: hpcckpt.load on at most 16 ranks).

    flock /tmp/hpcckpt-bench.lock mpiexec -n 4 .venv/bin/python bench/ragged_ways.py --loads 40 --json out.json

Every rank saves ``--vars`` Blocks of ``--block-kib`` KiB (its rows of 2-D arrays) and a Ragged table of
uneven rows (4 float64 columns); then ``--loads`` rounds, each loading the version once each way in an order
that alternates (the way chosen through loading.PER_RANK_METADATA_MAX_RANKS: 0 for the directory, as on
more ranks or in Checkpointer.restore, 16 for the gathered way), for two templates: the saved rows (``same``: no rank needs a part from another) and an even split of the table
with the Blocks' rows shifted by one (``reshard``).  Timing: ``Barrier; t0; load; Barrier``, rank 0's clock.
Reported: median ms per way, the median of the paired per-round ratios directory / gathered, and the
collectives each way makes (tests/support/mpitools.CountingComm).  The data is checked after every load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "support"))
from benchutil import print_table  # noqa: E402

import hpcckpt  # noqa: E402
from hpcckpt import Block, Ragged  # noqa: E402
from hpcckpt.loading import load as loading
from mpitools import CountingComm  # noqa: E402

COLLECTIVES = {"allgather", "gather", "bcast", "scatter", "allreduce", "exscan", "Scan", "Barrier", "barrier",
               "alltoall", "Allgather", "Gather", "Bcast", "Scatter", "Allreduce", "Alltoallv"}
WAYS = {"directory": 0, "gathered": 16}  # loading.PER_RANK_METADATA_MAX_RANKS of each way


def main() -> None:
    from mpi4py import MPI

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--loads", type=int, default=40)
    ap.add_argument("--vars", type=int, default=20)
    ap.add_argument("--block-kib", type=int, default=16)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    n, r = comm.size, comm.rank
    rows, cols = 16, args.block_kib * 1024 // (16 * 8)
    shape = (rows * n, cols)
    counts = [40 + 17 * q % 23 for q in range(n)]
    first = sum(counts[:r])
    table = np.arange(first * 4, (first + counts[r]) * 4, dtype=np.float64).reshape(-1, 4)
    names = [f"v{i:02d}" for i in range(args.vars)]
    state = {name: Block(np.full((rows, cols), float(r + i)), (rows * r, 0), shape) for i, name in enumerate(names)}
    state["particles"] = Ragged(table)
    root = tempfile.mkdtemp(prefix="ragged-ways-") if r == 0 else None
    path = os.path.join(comm.bcast(root), "ck")
    hpcckpt.save(state, path, comm=comm)
    total = sum(counts)
    everything = np.arange(total * 4, dtype=np.float64).reshape(-1, 4)
    times = {(layout, way): [] for layout in ("same", "reshard") for way in WAYS}
    calls = {}
    for k in range(args.loads):
        for layout in ("same", "reshard"):
            lo, hi = (rows * r, rows * r + rows) if layout == "same" else (
                rows * r + (r > 0), rows * r + rows + (r < n - 1))
            asks = counts[r] if layout == "same" else None
            want = (first, first + counts[r]) if layout == "same" else (total * r // n, total * (r + 1) // n)
            for way in (list(WAYS) if k % 2 == 0 else list(WAYS)[::-1]):
                loading.PER_RANK_METADATA_MAX_RANKS = WAYS[way]
                template = {name: Block(np.empty((hi - lo, cols)), (lo, 0), shape) for name in names}
                template["particles"] = Ragged(rows=asks)
                counting = CountingComm(comm)
                comm.Barrier()
                t0 = time.perf_counter()
                out = hpcckpt.load(template, path, comm=counting)
                comm.Barrier()
                times[(layout, way)].append(time.perf_counter() - t0)
                calls[(layout, way)] = [c for c in counting.calls if c in COLLECTIVES]
                assert np.array_equal(out["particles"].local, everything[want[0]:want[1]])
                assert np.array_equal(out["v03"].local, np.repeat(np.arange(n) + 3.0, rows)[lo:hi, None]
                                      + np.zeros(cols))
    if r:
        return
    result = []
    for layout in ("same", "reshard"):
        d, g = times[(layout, "directory")], times[(layout, "gathered")]
        result.append({"layout": layout, "ranks": n, "loads": args.loads,
                       "directory_ms": statistics.median(d) * 1e3, "gathered_ms": statistics.median(g) * 1e3,
                       "paired_ratio": statistics.median(a / b for a, b in zip(d, g)),
                       "directory_calls": calls[(layout, "directory")], "gathered_calls": calls[(layout, "gathered")]})
    print(f"\nRagged load on {n} ranks ({args.vars} Blocks of {args.block_kib} KiB + a table of {total} rows; "
          f"metadata broadcast; {args.loads} rounds)\n")
    print_table(["layout", "directory ms", "gathered ms", "directory / gathered (paired)", "directory calls",
                 "gathered calls"],
                [[x["layout"], f"{x['directory_ms']:.2f}", f"{x['gathered_ms']:.2f}", f"{x['paired_ratio']:.3f}",
                  " ".join(x["directory_calls"]), " ".join(x["gathered_calls"])] for x in result])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
