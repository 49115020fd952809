#!/usr/bin/env python
"""Runtime malleability benchmark: resize in memory against checkpoint-and-restart.

    .venv/bin/mpiexec -n 4 .venv/bin/python bench/malleability.py --total-mib 512 --repeats 5

A ``--total-mib`` float64 array, in row slabs over the 4 ranks, is shrunk to 3
ranks and grown back to 4, two ways, in the same run:

* in memory: ``hpcckpt.redistribute`` over the 4 ranks (shrink: rank 3 holds,
  has no template; grow: rank 3 has no held state);
* through the file system: ``hpcckpt.save`` on the old ranks, then
  ``hpcckpt.load`` (a reshard load) on the new ones, once with the data
  files' pages dropped before the load (cold, as on a relaunch on other
  nodes) and once straight after the save (warm page cache).  The relaunch of
  the job itself is not counted.

Each time is the slowest rank's (allreduce MAX between barriers), the median
over ``--repeats`` (the ratios: medians of the per-repetition ratios) after
``--warmup`` uncounted repetitions; every result is checked exactly. The
policy (``hpcckpt.policy.choose_resize``) is then given the measured
bandwidths and says what it would choose. Rank 0 prints a Markdown table;
``--json`` writes the numbers.
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

import hpcckpt  # noqa: E402
from benchutil import drop_cache, fill_rows, print_table  # noqa: E402 - bench/ is the script's folder
from hpcckpt.policy import choose_resize  # noqa: E402

NCOLS = 1024
world = MPI.COMM_WORLD
rank, size = world.rank, world.size


def timed(fn) -> float:
    world.Barrier()
    t = time.perf_counter()
    fn()
    return world.allreduce(time.perf_counter() - t, op=MPI.MAX)


def slab(nrows: int, n: int, i: int) -> tuple[int, int]:
    return i * nrows // n, (i + 1) * nrows // n


def held(nrows: int, n: int) -> dict | None:
    """This rank's slab of the state on ``n`` ranks (None beyond them), filled with the global pattern."""
    if rank >= n:
        return None
    lo, hi = slab(nrows, n, rank)
    u = np.empty((hi - lo, NCOLS))
    fill_rows(u, lo, NCOLS)
    return {"u": hpcckpt.Block(u, (lo, 0), (nrows, NCOLS)), "step": 7}


def template(nrows: int, n: int) -> dict | None:
    if rank >= n:
        return None
    lo, hi = slab(nrows, n, rank)
    return {"u": hpcckpt.Block(np.zeros((hi - lo, NCOLS)), (lo, 0), (nrows, NCOLS)), "step": None}


def check(tmpl: dict | None, what: str) -> None:
    """Exact data: element (i, j) must be i*NCOLS + j."""
    ok = True
    if tmpl is not None:
        block = tmpl["u"]
        expect = np.empty_like(block.local)
        fill_rows(expect, block.offset[0], NCOLS)
        ok = bool(np.array_equal(block.local, expect))
    if not world.allreduce(ok, op=MPI.LAND):
        raise SystemExit(f"{what}: wrong data")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--total-mib", type=float, default=512)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1, help="repetitions run first and not counted (first touch of "
                   "MPI's shared buffers and of fresh pages costs seconds once)")
    p.add_argument("--root", default=None, help="directory for the checkpoints (default: a temporary one)")
    p.add_argument("--json", default=None, help="also write the results here (rank 0)")
    args = p.parse_args()
    if size < 2:
        raise SystemExit("run on 2 or more ranks (the benchmark shrinks by one rank)")
    nrows = int(args.total_mib * (1 << 20)) // (8 * NCOLS)
    nbytes = nrows * NCOLS * 8
    small = size - 1
    sub = world.Split(0 if rank < small else MPI.UNDEFINED, rank)  # the shrunk job's communicator
    root = world.bcast(tempfile.mkdtemp(prefix="hpcckpt-mall-", dir=args.root) if rank == 0 else None)
    times = {k: [] for k in ("redistribute shrink", "redistribute grow", "save shrink", "load shrink cold",
                             "load shrink warm", "save grow", "load grow cold", "load grow warm")}
    for rep in range(-args.warmup, args.repeats):
        for way, n_old, n_new in (("shrink", size, small), ("grow", small, size)):
            state, tmpl = held(nrows, n_old), template(nrows, n_new)
            t_mem = timed(lambda: hpcckpt.redistribute(world, state, tmpl))
            check(tmpl, f"redistribute {way}")
            measured = {f"redistribute {way}": t_mem}
            old_comm, new_comm = (world, sub) if way == "shrink" else (sub, world)
            for cache in ("cold", "warm"):
                path = os.path.join(root, f"{way}-{rep}-{cache}")
                t_save = timed(lambda: state is not None and hpcckpt.save(state, path, comm=old_comm))
                if cache == "cold":
                    measured[f"save {way}"] = t_save
                    if rank == 0:
                        drop_cache(path)
                tmpl = template(nrows, n_new)
                measured[f"load {way} {cache}"] = timed(lambda: tmpl is not None and hpcckpt.load(
                    tmpl, path, comm=new_comm))
                check(tmpl, f"load {way} {cache}")
                world.Barrier()
                if rank == 0:
                    shutil.rmtree(path)
            state = tmpl = None  # freed before the next repetition allocates its own
            if rep >= 0:
                for k, v in measured.items():
                    times[k].append(v)
    med = {k: statistics.median(v) for k, v in times.items()}
    if rank == 0:
        rows, out = [], {"total_bytes": nbytes, "ranks": size, "repeats": args.repeats, "warmup": args.warmup,
                         "median_seconds": med,
                         "seconds": times}
        for way in ("shrink", "grow"):
            r = med[f"redistribute {way}"]
            ratio = {cache: statistics.median((s + lo) / m for m, s, lo in zip(  # paired: per repetition
                times[f"redistribute {way}"], times[f"save {way}"], times[f"load {way} {cache}"]))
                for cache in ("cold", "warm")}
            n_old, n_new = (size, small) if way == "shrink" else (small, size)
            choice = choose_resize(nbytes, nbytes / r, nbytes / med[f"save {way}"], nbytes / med[f"load {way} cold"])
            out[way] = {"ratio_cold": ratio["cold"], "ratio_warm": ratio["warm"], "policy": choice.method,
                        "reason": choice.reason}
            rows.append([f"{way} {n_old} -> {n_new}", f"{r:.3f}", f"{med[f'save {way}']:.3f}",
                         f"{med[f'load {way} cold']:.3f}", f"{med[f'load {way} warm']:.3f}",
                         f"{ratio['cold']:.1f}x", f"{ratio['warm']:.1f}x", choice.method])
        print(f"{nbytes / (1 << 20):.0f} MiB float64, {size} ranks, median of {args.repeats} "
              "(slowest rank's seconds)")
        print_table(["resize", "redistribute s", "save s", "load s (cold)", "load s (warm)",
                     "save+load / redistribute (cold)", "(warm)", "policy"], rows)
        for way in ("shrink", "grow"):
            print(f"policy, {way}: {out[way]['reason']}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
