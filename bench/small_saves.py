#!/usr/bin/env python
"""Fixed cost of a small, frequent checkpoint: repeated Checkpointer.save of a small state.

Run under mpiexec; it saves the same layout ``--saves`` times (after
``--warmup`` saves) and prints one JSON line from rank 0: the median and 90th
percentile seconds per save (``Barrier; t0; save; Barrier; t1``, rank 0's
clock, so the slowest rank's time) and the hpcckpt it imported.  To compare two
versions of hpcckpt in the same run, run it alternately with each on
PYTHONPATH (``--compare OLD_TREE NEW_TREE`` does that and prints paired ratios):

    .venv/bin/python bench/small_saves.py --compare /path/to/old /path/to/new --ranks 4 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def measure(args) -> None:
    import numpy as np
    from mpi4py import MPI

    import hpcckpt

    comm = MPI.COMM_WORLD
    n = args.kib * 128  # float64 elements per rank
    local = np.arange(n, dtype=np.float64) + comm.rank
    root = comm.bcast(tempfile.mkdtemp(prefix="hpcckpt-small-", dir=args.dir) if comm.rank == 0 else None)
    state = {"u": hpcckpt.Block(local, offset=(comm.rank * n,), global_shape=(comm.size * n,)), "step": 0}
    times = []
    with hpcckpt.Checkpointer(root, comm=comm, keep=2, strategy=args.strategy, track_failures=False) as ck:
        for step in range(args.warmup + args.saves):
            state["step"] = step
            local[0] = step
            comm.Barrier()
            t0 = time.perf_counter()
            ck.save(state, step)
            comm.Barrier()
            if step >= args.warmup:
                times.append(time.perf_counter() - t0)
    if comm.rank == 0:
        times.sort()
        print(json.dumps({"hpcckpt": os.path.dirname(os.path.dirname(hpcckpt.__file__)), "ranks": comm.size,
                          "kib_per_rank": args.kib, "median_s": statistics.median(times),
                          "p90_s": times[int(0.9 * (len(times) - 1))]}), flush=True)


def compare(args) -> None:
    """Alternate the two trees ``--rounds`` times; the medians and the paired ratios new/old."""
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    env_base = dict(os.environ, MPIR_CVAR_CH4_PROGRESS_THROTTLE="1", MPIR_CVAR_POLLS_BEFORE_YIELD="1")
    runs: dict[str, list[float]] = {"old": [], "new": []}
    for r in range(args.rounds):
        for label in (("old", "new") if r % 2 == 0 else ("new", "old")):
            tree = args.compare[0] if label == "old" else args.compare[1]
            cmd = [mpiexec, "-n", str(args.ranks), sys.executable, os.path.abspath(__file__), "--kib", str(args.kib),
                   "--saves", str(args.saves), "--warmup", str(args.warmup), "--strategy", args.strategy]
            out = subprocess.run(cmd, env=dict(env_base, PYTHONPATH=tree), capture_output=True, text=True,
                                 check=True, cwd=tree).stdout
            row = json.loads(out.strip().splitlines()[-1])
            runs[label].append(row["median_s"])
    ratios = [n / o for n, o in zip(runs["new"], runs["old"])]
    print(json.dumps({"old_median_ms": [round(x * 1e3, 3) for x in runs["old"]],
                      "new_median_ms": [round(x * 1e3, 3) for x in runs["new"]],
                      "paired_ratio_new_over_old": [round(x, 3) for x in ratios],
                      "median_ratio": round(statistics.median(ratios), 3)}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kib", type=int, default=16, help="KiB per rank (default 16)")
    ap.add_argument("--saves", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--strategy", default="file-per-rank")
    ap.add_argument("--dir", default=None, help="where the roots go (default: the temp dir)")
    ap.add_argument("--compare", nargs=2, metavar=("OLD_TREE", "NEW_TREE"), default=None)
    ap.add_argument("--ranks", type=int, default=4, help="with --compare: ranks per run")
    ap.add_argument("--rounds", type=int, default=5, help="with --compare: runs of each tree")
    args = ap.parse_args()
    compare(args) if args.compare else measure(args)


if __name__ == "__main__":
    main()
