#!/usr/bin/env python
"""Per-save and per-restart overhead of hpcckpt against raw I/O of the same bytes.

Run it WITHOUT mpiexec (it starts its mpiexec jobs itself):

    flock /tmp/hpcckpt-bench.lock .venv/bin/python bench/latency.py --json latency.json

Part ``saves`` (one 4-rank job): for each size per rank (``--sizes``, default
64 KiB, 1 MiB, 16 MiB of float64), ``--saves`` steps after ``--warmup``; every
step runs, in an order that alternates from step to step:

* ``raw``: each rank ``tofile`` + fsync of its bytes into a new file of its
  own, then rank 0 writes and fsyncs a JSON index of the step's files (after a
  gather of the ranks' extents): the physical floor of a save with an index;
* ``hpcckpt``: ``Checkpointer.save`` of the same bytes (``keep=2``,
  file-per-rank, fsync on), the same layout every step;
* ``hpcckpt nofsync``: the same with ``fsync=False``, to tell the share of the
  fsyncs (``fsync`` column = its write+commit subtracted from hpcckpt's).

Then ``--loads`` loads of the last step, alternating: raw ``readinto`` of each
rank's own bytes and ``hpcckpt.load`` of the last version, warm (page cache)
and cold (the files dropped first with posix_fadvise(DONTNEED)).  The first
save of each size (the plan is new, the root lock is taken) is shown apart.
Timing: ``Barrier; t0; operation; Barrier; t1``, rank 0's clock (the slowest
rank).  Phases come from ``SaveResult.timings`` (plan, write, commit of the
slowest rank; rank 0's retention) and the load's PhaseTimer (metadata, plan,
read).  Collectives: every call through the communicator, counted by
tests/support/mpitools.CountingComm (point-to-point Isend/Irecv of a load's exchange
excluded), for the last save and load.

Part ``restart`` (``--restart-rounds`` pairs of fresh jobs): a 4-rank job
writes a ``--restart-mib`` (256) MiB checkpoint and the same bytes as raw
files; then, alternating, a fresh 3-rank job that imports hpcckpt and loads the
checkpoint once into a 3-rank decomposition (a reshard), and a fresh 3-rank job
that reads the same rows with ``preadv`` from the raw files.  Both start cold
(DONTNEED) and time, on rank 0, from before ``import hpcckpt`` (numpy and
mpi4py are imported by both) through the allocation of the target (np.empty)
to the Barrier after the load: what a restart pays.  Bytecode is cached in a
scratch PYTHONPYCACHEPREFIX (an installed package has its .pyc files), the
jobs run with PYTHONDONTWRITEBYTECODE unset.

Every timing is reported as the median, and every ratio as the median of the
paired per-step (per-round) ratio, which cancels most of a shared machine's drift.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from benchutil import drop_cache, print_table  # noqa: E402 - bench/ is the script's folder

NCOLS = 1024  # restart array: rows of 1024 float64
P2P = {"Isend", "Irecv", "isend", "irecv"}


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def paired(a, b):
    return statistics.median(x / y for x, y in zip(a, b)) if a and b else float("nan")


def parse_size(text: str) -> int:
    text = text.strip().upper()
    for suffix, mult in (("KIB", 1 << 10), ("MIB", 1 << 20), ("K", 1 << 10), ("M", 1 << 20)):
        if text.endswith(suffix):
            return int(float(text[:-len(suffix)]) * mult)
    return int(text)


# ============================================================================ part "saves" (inside mpiexec)

def timed(comm, fn):
    comm.Barrier()
    t0 = time.perf_counter()
    out = fn()
    comm.Barrier()
    return time.perf_counter() - t0, out


def raw_save(comm, directory: str, step: int, arr: np.ndarray, offset: int) -> None:
    """Each rank: tofile + fsync of a new file; rank 0: the step's index (gathered extents), fsynced."""
    name = f"raw-{step}-{comm.rank}.bin"
    with open(os.path.join(directory, name), "wb") as f:
        arr.tofile(f)
        f.flush()
        os.fsync(f.fileno())
    parts = comm.gather((name, offset, arr.size), root=0)
    if comm.rank == 0:
        with open(os.path.join(directory, f"index-{step}.json"), "w") as f:
            json.dump(parts, f)
            f.flush()
            os.fsync(f.fileno())


def raw_read(path: str, out: np.ndarray) -> None:
    view = memoryview(out.reshape(-1)).cast("B")
    fd = os.open(path, os.O_RDONLY)
    try:
        done = 0
        while done < len(view):
            n = os.preadv(fd, [view[done:]], done)
            if not n:
                raise SystemExit("latency: raw file is short")
            done += n
    finally:
        os.close(fd)


def saves_worker(args) -> None:
    from mpi4py import MPI

    import hpcckpt
    from hpcckpt.loading import load as load_module
    from hpcckpt.loading.load import load_version
    from hpcckpt.core.monitor import PhaseTimer

    timers = []  # load_version times its phases with a PhaseTimer of its own: keep each one it makes

    class KeptTimer(PhaseTimer):
        def __init__(self) -> None:
            super().__init__()
            timers.append(self)

    load_module.PhaseTimer = KeptTimer

    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "support"))
    from mpitools import CountingComm

    world = MPI.COMM_WORLD
    rank, size = world.rank, world.size
    out = {"ranks": size, "sizes": {}}
    for nbytes in [parse_size(s) for s in args.sizes.split(",")]:
        n = nbytes // 8
        local = np.arange(n, dtype=np.float64) + rank * n
        base = os.path.join(args.base, f"s{nbytes}")
        dirs = {m: os.path.join(base, m) for m in ("raw", "hpcckpt", "nofsync")}
        if rank == 0:
            for d in dirs.values():
                os.makedirs(d)
        world.Barrier()
        comm = CountingComm(world)
        state = {"u": hpcckpt.Block(local, offset=(rank * n,), global_shape=(size * n,)), "step": 0}
        rec = {"raw": [], "hpcckpt": [], "nofsync": [], "phases": [], "phases_nofsync": [], "first": None}
        cks = {"hpcckpt": hpcckpt.Checkpointer(dirs["hpcckpt"], comm=comm, keep=2, strategy="file-per-rank",
                                               track_failures=False),
               "nofsync": hpcckpt.Checkpointer(dirs["nofsync"], comm=world, keep=2, strategy="file-per-rank",
                                               track_failures=False, fsync=False)}
        for step in range(args.warmup + args.saves):
            state["step"] = step
            local[0] = step
            order = ["raw", "hpcckpt", "nofsync"]
            order = order[step % 3:] + order[:step % 3]
            for m in order:
                if m == "raw":
                    t, _ = timed(world, lambda: raw_save(world, dirs["raw"], step, local, rank * n))
                    if step >= 2:  # the raw files' retention (keep 2), untimed
                        os.unlink(os.path.join(dirs["raw"], f"raw-{step - 2}-{rank}.bin"))
                        if rank == 0:
                            os.unlink(os.path.join(dirs["raw"], f"index-{step - 2}.json"))
                    res = None
                else:
                    if m == "hpcckpt":
                        comm.calls.clear()
                    t, res = timed(world, lambda: cks[m].save(state, step))
                if step == 0 and m == "hpcckpt":
                    rec["first"] = {"seconds": t, "phases": dict(res.timings)}
                if step >= args.warmup:
                    rec[m].append(t)
                    if m != "raw":
                        rec["phases" if m == "hpcckpt" else "phases_nofsync"].append(dict(res.timings))
        save_calls = [c for c in comm.calls if c not in P2P]
        last = cks["hpcckpt"].last_result.path
        for ck in cks.values():
            ck.close()
        # loads of the last step: raw readinto of each rank's own bytes against hpcckpt.load, warm and cold
        target = np.empty_like(local)
        raw_path = os.path.join(dirs["raw"], f"raw-{args.warmup + args.saves - 1}-{rank}.bin")
        loads = {"raw": [], "hpcckpt": [], "raw cold": [], "hpcckpt cold": [], "phases": []}
        load_calls = []
        for i in range(args.loads):
            order = ["raw", "hpcckpt"] if i % 2 == 0 else ["hpcckpt", "raw"]
            for cold in (False, True):
                for m in order:
                    if cold:
                        if rank == 0:
                            drop_cache(dirs[m])
                        world.Barrier()
                    target.fill(-1.0)
                    if m == "raw":
                        t, _ = timed(world, lambda: raw_read(raw_path, target))
                    else:
                        comm.calls.clear()
                        t, _ = timed(world, lambda: load_version(
                            {"u": hpcckpt.Block(target, offset=(rank * n,), global_shape=(size * n,)), "step": 0},
                            last, comm, shared_directory=True))  # as hpcckpt.load loads
                        timer = timers[-1]
                        load_calls = [c for c in comm.calls if c not in P2P]
                        if not cold:
                            loads["phases"].append(dict(timer.seconds))
                    if not np.array_equal(target, local):
                        raise SystemExit(f"latency: {m} load read wrong data on rank {rank}")
                    loads[m + (" cold" if cold else "")].append(t)
        out["sizes"][str(nbytes)] = {"saves": rec, "loads": loads, "save_calls": save_calls,
                                     "load_calls": load_calls}
        world.Barrier()
        if rank == 0:
            shutil.rmtree(base)
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(out, f)


# ============================================================================ part "restart" (inside mpiexec)

def rows_of(nrows: int, nparts: int, part: int) -> tuple[int, int]:
    c = -(-nrows // nparts)
    lo = min(part * c, nrows)
    return lo, min(lo + c, nrows)


def restart_write(args) -> None:
    """The 4-rank job that writes the checkpoint and the raw files the restarts read."""
    from mpi4py import MPI

    import hpcckpt

    world = MPI.COMM_WORLD
    lo, hi = rows_of(args.nrows, world.size, world.rank)
    arr = np.arange(lo * NCOLS, hi * NCOLS, dtype=np.float64).reshape(hi - lo, NCOLS)
    hpcckpt.save({"u": hpcckpt.Block(arr, offset=(lo, 0), global_shape=(args.nrows, NCOLS))},
                 os.path.join(args.base, "ckpt"), comm=world, strategy=args.strategy)
    with open(os.path.join(args.base, f"raw-{world.rank}.bin"), "wb") as f:
        arr.tofile(f)
        f.flush()
        os.fsync(f.fileno())
    world.Barrier()


def restart_read(args, t_start: float) -> None:
    """A fresh job's one restart: hpcckpt (import + load) or raw (preadv of the same rows from the raw files)."""
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    writers = [rows_of(args.nrows, args.writers, r) for r in range(args.writers)]
    lo, hi = rows_of(args.nrows, world.size, world.rank)
    world.Barrier()
    t0 = time.perf_counter()
    if args.method == "hpcckpt":
        import hpcckpt

        out = np.empty((hi - lo, NCOLS))
        hpcckpt.load({"u": hpcckpt.Block(out, offset=(lo, 0), global_shape=(args.nrows, NCOLS))},
                     os.path.join(args.base, "ckpt"), comm=world)
    else:
        out = np.empty((hi - lo, NCOLS))
        for r, (a0, b0) in enumerate(writers):
            a, b = max(lo, a0), min(hi, b0)
            if a < b:
                view = memoryview(out[a - lo:b - lo].reshape(-1)).cast("B")
                fd = os.open(os.path.join(args.base, f"raw-{r}.bin"), os.O_RDONLY)
                try:
                    done, off = 0, (a - a0) * NCOLS * 8
                    while done < len(view):
                        done += os.preadv(fd, [view[done:]], off + done)
                finally:
                    os.close(fd)
    world.Barrier()
    t = time.perf_counter() - t0
    expect = np.arange(lo * NCOLS, hi * NCOLS, dtype=np.float64).reshape(hi - lo, NCOLS)
    if not np.array_equal(out, expect):
        raise SystemExit(f"latency: {args.method} restart read wrong data on rank {world.rank}")
    if world.rank == 0:
        print(json.dumps({"seconds": t, "since_process_start": time.perf_counter() - t_start}), flush=True)


# ============================================================================ driver

def job_env(workdir: str) -> dict:
    env = dict(os.environ, MPIR_CVAR_CH4_PROGRESS_THROTTLE="1", MPIR_CVAR_POLLS_BEFORE_YIELD="1",
               OMP_NUM_THREADS="1", PYTHONPYCACHEPREFIX=os.path.join(workdir, "pycache"))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def mpi(args, n: int, workdir: str, *extra) -> str:
    cmd = [args.mpiexec, "-n", str(n), sys.executable, os.path.abspath(__file__), *map(str, extra)]
    r = subprocess.run(cmd, env=job_env(workdir), capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"latency: {' '.join(cmd)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r.stdout


def ms(x: float) -> str:
    return f"{x * 1e3:.2f}"


def report_saves(res: dict) -> list:
    rows_s, rows_p, rows_l, checks = [], [], [], []
    for nbytes, r in res["sizes"].items():
        s, lo = r["saves"], r["loads"]
        label = f"{int(nbytes) // 1024} KiB" if int(nbytes) < (1 << 20) else f"{int(nbytes) >> 20} MiB"
        ratio = paired(s["hpcckpt"], s["raw"])
        first_ratio = s["first"]["seconds"] / med(s["raw"])
        rows_s.append([label, ms(med(s["raw"])), ms(med(s["hpcckpt"])), ms(med(s["hpcckpt"]) - med(s["raw"])),
                       f"{ratio:.2f}", ms(s["first"]["seconds"]), f"{first_ratio:.2f}", ms(med(s["nofsync"])),
                       len(r["save_calls"]), " ".join(r["save_calls"])])
        ph = {k: med([p.get(k, 0.0) for p in s["phases"]]) for k in ("plan", "write", "commit", "retention")}
        nf = {k: med([p.get(k, 0.0) for p in s["phases_nofsync"]]) for k in ("write", "commit")}
        fsync = ph["write"] + ph["commit"] - nf["write"] - nf["commit"]
        rows_p.append([label, ms(ph["plan"]), ms(ph["write"]), ms(ph["commit"]), ms(ph["retention"]),
                       ms(fsync), ms(nf["write"]), ms(nf["commit"])])
        lp = {k: med([p.get(k, 0.0) for p in lo["phases"]]) for k in ("metadata", "plan", "read")}
        rows_l.append([label, ms(med(lo["raw"])), ms(med(lo["hpcckpt"])), f"{paired(lo['hpcckpt'], lo['raw']):.2f}",
                       ms(med(lo["raw cold"])), ms(med(lo["hpcckpt cold"])),
                       f"{paired(lo['hpcckpt cold'], lo['raw cold']):.2f}",
                       f"{ms(lp['metadata'])} / {ms(lp['plan'])} / {ms(lp['read'])}",
                       len(r["load_calls"]), " ".join(r["load_calls"])])
        checks.append((f"[{label}] repeated save <= 1.3x raw", f"{ratio:.2f}x", ratio <= 1.3))
        checks.append((f"[{label}] first save <= 1.5x raw", f"{first_ratio:.2f}x", first_ratio <= 1.5))
        for op in ("hpcckpt", "hpcckpt cold"):
            rr = paired(lo[op], lo["raw" + op[7:]])
            checks.append((f"[{label}] load{op[7:]} <= 1.3x raw", f"{rr:.2f}x", rr <= 1.3))
        checks.append((f"[{label}] repeated save <= 3 collectives", str(len(r["save_calls"])),
                       len(r["save_calls"]) <= 3))
        checks.append((f"[{label}] load <= 3 collectives", str(len(r["load_calls"])), len(r["load_calls"]) <= 3))
    print(f"\nSaves, {res['ranks']} ranks, size per rank; ms, medians (slowest rank); ratio = median paired "
          "per-step ratio; first = the first save of the Checkpointer (new plan, root lock)")
    print_table(["size/rank", "raw ms", "hpcckpt ms", "overhead ms", "ratio", "first ms", "first/raw",
                 "nofsync ms", "collectives", "calls"], rows_s)
    print("\nWhere a repeated save's time goes (ms, medians; plan/write/commit: slowest rank; retention: rank 0; "
          "fsync: (write+commit) minus the same with fsync=False)")
    print_table(["size/rank", "plan", "write", "commit", "retention", "fsync", "write nofsync", "commit nofsync"],
                rows_p)
    print("\nLoads of the last version (ms, medians, slowest rank); phases: rank 0's metadata / plan / read (warm)")
    print_table(["size/rank", "raw", "hpcckpt", "ratio", "raw cold", "hpcckpt cold", "ratio cold",
                 "phases", "collectives", "calls"], rows_l)
    return checks


def report_restart(rec: dict) -> list:
    r = paired(rec["hpcckpt"], rec["raw"])
    print(f"\nRestart in a fresh {rec['ranks']}-rank job ({rec['mib']} MiB written by {rec['writers']} ranks, "
          "cold; s from before `import hpcckpt` to the Barrier after the load; medians)")
    print_table(["method", "median s", "runs", "since process start s"],
                [[m, f"{med(rec[m]):.3f}", " ".join(f"{x:.3f}" for x in rec[m]), f"{med(rec[m + ' total']):.3f}"]
                 for m in ("raw", "hpcckpt")])
    print(f"paired ratio hpcckpt / raw: {r:.2f}")
    return [("[restart] fresh-process reshard load <= 1.1x raw", f"{r:.2f}x", r <= 1.1)]


def driver(args) -> None:
    workdir = os.path.realpath(tempfile.mkdtemp(prefix="hpcckpt-latency-", dir=args.dir))
    load = os.getloadavg()
    print(f"latency: files under {workdir}; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}", flush=True)
    results, checks = {}, []
    try:
        if "saves" in args.parts:
            base = os.path.join(workdir, "saves")
            os.makedirs(base)
            out = os.path.join(workdir, "saves.json")
            mpi(args, args.ranks, workdir, "--worker", "saves", "--base", base, "--out", out, "--sizes", args.sizes,
                "--saves", args.saves, "--warmup", args.warmup, "--loads", args.loads)
            with open(out) as f:
                results["saves"] = json.load(f)
            checks += report_saves(results["saves"])
        if "restart" in args.parts:
            base = os.path.join(workdir, "restart")
            os.makedirs(base)
            nrows = (args.restart_mib << 20) // (NCOLS * 8)
            common = ["--base", base, "--nrows", nrows, "--writers", args.ranks]
            mpi(args, args.ranks, workdir, "--worker", "restart-write", "--strategy", args.strategy, *common)
            mpi(args, args.ranks - 1, workdir, "--worker", "restart-read", "--method", "hpcckpt", *common)  # .pyc
            rec = {"raw": [], "hpcckpt": [], "raw total": [], "hpcckpt total": [], "ranks": args.ranks - 1,
                   "writers": args.ranks, "mib": args.restart_mib}
            for i in range(args.restart_rounds):
                for m in (("raw", "hpcckpt") if i % 2 == 0 else ("hpcckpt", "raw")):
                    drop_cache(base)
                    row = json.loads(mpi(args, args.ranks - 1, workdir, "--worker", "restart-read", "--method", m,
                                         *common).strip().splitlines()[-1])
                    rec[m].append(row["seconds"])
                    rec[m + " total"].append(row["since_process_start"])
            results["restart"] = rec
            checks += report_restart(rec)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print("\nTargets (paired ratios, medians)")
    print_table(["target", "value", "result"], [(w, v, "PASS" if ok else "FAIL") for w, v, ok in checks])
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"load_average": load, "results": results,
                       "checks": [{"target": w, "value": v, "pass": ok} for w, v, ok in checks]}, f, indent=1)


def main() -> None:
    t_start = time.perf_counter()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="saves,restart", help="saves, restart (default both)")
    ap.add_argument("--sizes", default="64K,1M,16M", help="bytes per rank per save (default 64K,1M,16M)")
    ap.add_argument("--saves", type=int, default=30, help="timed saves per size (default 30)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--loads", type=int, default=10, help="loads per size and cache state (default 10)")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--restart-mib", type=int, default=256)
    ap.add_argument("--restart-rounds", type=int, default=5)
    ap.add_argument("--strategy", default="file-per-rank", help="of the restart's checkpoint")
    ap.add_argument("--mpiexec", default=os.path.join(os.path.dirname(sys.executable), "mpiexec"))
    ap.add_argument("--dir", default=None, help="parent of the scratch directory (default: the temp dir)")
    ap.add_argument("--json", default=None, help="write every timing and the target checks here")
    # inside the jobs
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--base", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--nrows", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--writers", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--method", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker == "saves":
        saves_worker(args)
    elif args.worker == "restart-write":
        restart_write(args)
    elif args.worker == "restart-read":
        restart_read(args, t_start)
    else:
        driver(args)


if __name__ == "__main__":
    main()
