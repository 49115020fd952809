#!/usr/bin/env python
"""Self-adaptive pre-copy against the plain asynchronous incremental save.

    .venv/bin/mpiexec -n 4 .venv/bin/python bench/precopy.py --total-mib 512 --repeats 3 --json out.json

One run, ``--total-mib`` of float64 state split evenly over the ranks, saved
by ``Checkpointer(asynchronous=True, incremental=True, policy=FixedSteps(N))``
from a time loop that calls ``ck.maybe_save(step)`` every step, with and
without ``precopy=True`` (each repeat runs both, on fresh roots, the order
alternating).  Each interval of ``N`` steps:

* steps 1 .. N/2 - 1: the whole state is rewritten (it evolves everywhere);
* steps N/2 .. N - 1: nothing changes (pre-copy rounds run here);
* step N, just before the call: ``--changed`` of the blocks change (5%: the
  changes between the last pre-copy round and the checkpoint; 100%: a state
  that changes everywhere every step, where pre-copy must stop by itself).

Each step "computes" for ``--step-seconds`` (a sleep, so the background
writers get the cores).  Measured at each checkpoint after the first two
(steady state): ``blocking``, the time the saving ``maybe_save`` call blocks;
``commit``, the time from that call to the committed version (``ck.wait()``
right after it); ``rounds``, the foreground time of every ``maybe_save`` call
that did not save in the interval before it (the decision's allreduce, and
the start of the pre-copy rounds), and ``round calls``, that of the calls that
started a round.  Times are the slowest rank's (allreduce MAX), medians over
repeats and checkpoints; ratios are precopy / plain of the same repeat.

A second table splits the checkpoint by stage, from the SaveResult timings
(slowest rank per stage): in the call, ``plan`` (the plan's allgather and the
base), ``hash`` (every block hashed at the call, and the select stage's
allgather), ``stage`` (the copy of the selected blocks); after it, ``write``
(the background writer) and ``commit`` (``ck.wait()``: waiting for the
writers, the commit's gather and broadcast, rank 0's metadata and retention).
A last line per case counts the measured intervals in which pre-copy ran
copying rounds, only hash-only probes (the interval after a back-off), or
nothing (skipped or stopped).
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

from hpcckpt import Block, Checkpointer  # noqa: E402
from hpcckpt.policy import FixedSteps  # noqa: E402
from benchutil import print_table  # noqa: E402 - bench/ is the script's folder

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size


def slowest(seconds: float) -> float:
    return comm.allreduce(seconds, op=MPI.MAX)


def one_run(root: str, precopy: bool, changed: float, args, rng) -> list:
    """One Checkpointer over ``args.intervals`` intervals; per measured checkpoint (blocking, commit, rounds)."""
    rows = args.total_mib * (1 << 20) // 8 // args.cols // size
    a = rng.random((rows, args.cols))  # distinct blocks (equal ones would be deduplicated)
    block_rows = max(1, args.block_bytes // (8 * args.cols))
    nblocks = rows // block_rows
    every = args.every
    extra = {"precopy": True} if precopy else {}
    out = []
    stages = ("plan", "hash", "stage")
    with Checkpointer(root, comm=comm, keep=2, asynchronous=True, incremental=True, policy=FixedSteps(every),
                      block_bytes=args.block_bytes, track_failures=False, handle_signals=False, **extra) as ck:
        ck.register({"u": Block(a, (rank * rows, 0), (size * rows, args.cols))})
        rounds = starting = 0.0
        copies = probes = 0  # rounds started in the interval: copying ones, hash-only probes
        for step in range(1, every * args.intervals + 1):
            phase = step % every
            if 0 < phase < every // 2:
                a += 1.0  # the whole state evolves
            elif phase == 0:
                picked = rng.choice(nblocks, max(1, round(changed * nblocks)), replace=False)
                for b in picked:
                    a[b * block_rows:(b + 1) * block_rows] += rng.random()
            time.sleep(args.step_seconds)
            comm.Barrier()
            started = ck.engine.precopy.started if precopy else 0
            t0 = time.perf_counter()
            result = ck.maybe_save(step)
            t1 = time.perf_counter()
            if result is None:
                rounds += t1 - t0
                if precopy and ck.engine.precopy.started > started:
                    starting += t1 - t0
                    copies, probes = (copies + 1, probes) if ck.engine.precopy.plan.copies else (copies, probes + 1)
                continue
            ck.wait()
            t2 = time.perf_counter()
            if step > 2 * every:
                done = ck.last_result
                split = [slowest(result.timings.get(k, 0.0)) for k in stages] + \
                    [done.timings.get("write", 0.0), done.timings["commit"]]
                out.append((slowest(t1 - t0), slowest(t2 - t0), slowest(rounds),
                            done.incremental.get("precopied_bytes", 0), done.bytes_written, slowest(starting),
                            *split, comm.allreduce(copies), comm.allreduce(probes)))
            rounds = starting = 0.0
            copies = probes = 0
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--total-mib", type=int, default=512)
    p.add_argument("--cols", type=int, default=1024)
    p.add_argument("--block-bytes", type=int, default=1 << 20)
    p.add_argument("--every", type=int, default=16, help="steps per checkpoint (FixedSteps)")
    p.add_argument("--intervals", type=int, default=5, help="checkpoints per run (the first two are not measured)")
    p.add_argument("--step-seconds", type=float, default=0.05)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--changed", type=float, nargs="+", default=[0.05, 1.0])
    p.add_argument("--root", default=None, help="a disk directory (default: a temporary one)")
    p.add_argument("--json", default=None, help="also write the results here (rank 0)")
    args = p.parse_args()
    top = comm.bcast(tempfile.mkdtemp(prefix="precopy-bench-", dir=args.root) if rank == 0 else None)
    rng = np.random.default_rng(1234 + rank)
    results = {}
    for changed in args.changed:
        runs = {"plain": [], "precopy": []}
        for r in range(args.repeats):
            for mode in (("plain", "precopy") if r % 2 == 0 else ("precopy", "plain")):
                root = os.path.join(top, f"{mode}-{changed}-{r}")
                runs[mode].append(one_run(root, mode == "precopy", changed, args, rng))
                comm.Barrier()
                if rank == 0:
                    shutil.rmtree(root, ignore_errors=True)
        results[changed] = runs
    if rank == 0:
        shutil.rmtree(top, ignore_errors=True)
        table, split, record = [], [], {"ranks": size, "total_mib": args.total_mib, "args": vars(args),
                                         "load_average": os.getloadavg(), "cases": []}
        for changed, runs in results.items():
            med = {m: [statistics.median(c[k] for run in runs[m] for c in run) for k in range(11)] for m in runs}
            ratio = {k: statistics.median(statistics.median(c[k] for c in pc) / statistics.median(c[k] for c in pl)
                                          for pc, pl in zip(runs["precopy"], runs["plain"])) for k in (0, 1)}
            for m in ("plain", "precopy"):
                b, c, rd, pre, wrote, starting = med[m][:6]
                table.append([f"{changed:.0%}", m, f"{b * 1e3:.1f}", f"{c * 1e3:.1f}", f"{rd * 1e3:.1f}",
                              f"{starting * 1e3:.1f}" if m == "precopy" else "",
                              f"{pre / 2**20:.1f}", f"{wrote / 2**20:.1f}",
                              f"{ratio[0]:.2f}" if m == "precopy" else "", f"{ratio[1]:.2f}" if m == "precopy" else ""])
                split.append([f"{changed:.0%}", m] + [f"{v * 1e3:.1f}" for v in med[m][6:]] + [f"{c * 1e3:.1f}"])
            record["cases"].append({"changed": changed, "median": med, "ratio_blocking": ratio[0],
                                    "ratio_commit": ratio[1], "raw": runs})
        print_table(["changed at ckpt", "mode", "blocking ms", "call->commit ms", "rounds ms/interval",
                     "round calls ms/interval", "precopied MiB", "written at ckpt MiB", "blocking x", "commit x"],
                    table)
        print()
        print_table(["changed at ckpt", "mode", "plan ms", "hash ms", "stage ms", "write ms", "wait+commit ms",
                     "call->commit ms"], split)
        print()
        for changed, runs in results.items():  # what pre-copy did in the measured intervals (all ranks' rounds)
            cks = [c for run in runs["precopy"] for c in run]
            print(f"{changed:.0%} changed, pre-copy: of {len(cks)} measured intervals, "
                  f"{sum(1 for c in cks if c[11])} ran copying rounds, {sum(1 for c in cks if c[12] and not c[11])} "
                  f"only hash-only probes, {sum(1 for c in cks if not c[11] and not c[12])} none")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
