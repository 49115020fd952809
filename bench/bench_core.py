#!/usr/bin/env python
"""Core benchmark of hpcckpt ("Performance"): save, load, reshard, memory, 100k-chunk open.

Run it under mpiexec with 4 ranks (the script checks):

    .venv/bin/mpiexec -n 4 .venv/bin/python bench/bench_core.py --size-mib 512 --repeats 3

One run measures, for a float64 global array of ``--size-mib`` MiB split by rows
(1024 columns, so 8 KiB per row):

* raw baseline, 4 ranks: each rank ``ndarray.tofile`` + fsync of its rows into a
  file of its own, and ``FileIO.readinto`` of the same bytes into a preallocated
  array;
* ``hpcckpt.save`` vs the raw save, ``hpcckpt.load`` on 4 ranks vs the raw read;
* reshard: the checkpoint written by 4 ranks is loaded by 3 ranks, compared with
  a raw read by 3 ranks of the same bytes laid out for 3 ranks (3 files written
  by those 3 ranks, each read back by its writer: the best a same-count load
  can do).  The 3-rank phase runs in the same mpiexec job, on a communicator
  ``MPI.COMM_WORLD.Split`` makes of ranks 0-2 (hpcckpt gets that communicator
  and sees a 3-rank job); rank 3 waits in a sleeping poll of a non-blocking
  barrier, so it takes no CPU from the 3 working ranks;
* memory: the peak extra memory of each operation over the state it moves,
  measured two ways in a separate, untimed pass: tracemalloc's peak (numpy
  reports its allocations to tracemalloc) and the growth of the peak resident
  set (VmHWM of /proc/self/status, reset through /proc/self/clear_refs before
  the operation, minus VmRSS before it);
* metadata: rank 0 alone saves a small 2-D variable with ``chunk_bytes=8`` so
  that its metadata lists ``--meta-chunks`` (100,000) chunks, then times
  ``hpcckpt.open()`` on it (median of 5).

Timing: ``Barrier; t0; operation; Barrier; t1`` on every rank; the time is rank
0's ``t1 - t0``, so it is the time of the slowest rank.  Every repeat uses a fresh
directory and runs every method once, alternating which method goes first; the
ratio printed is the median over repeats of (method / baseline of the same
repeat), which cancels most of the slow drift of a shared machine.  Every load
is checked for correct contents after it is timed.

Caches: "warm" reads follow the write directly, so the data is in the page cache
(this machine has far more RAM than the data).  "cold" reads first drop the
files' pages with posix_fadvise(DONTNEED) (the files are clean after fsync, so
the kernel drops them); on a VM the host may still cache the disk.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import tracemalloc

import numpy as np
from mpi4py import MPI
from benchutil import drop_cache, fill_rows, print_table  # noqa: E402 - bench/ is the script's folder

try:
    import hpcckpt
except ImportError:  # running from a checkout without installing: use the checkout's package
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import hpcckpt
from hpcckpt.core.regions import even_rows  # rank r of n gets rows [r*T//n, (r+1)*T//n)

NCOLS = 1024  # float64 columns: 8 KiB rows
GIB = float(1 << 30)
MIB = float(1 << 20)

TARGETS = {  # method -> (baseline method, largest ratio allowed)
    "hpcckpt.save": ("raw save", 1.15),
    "hpcckpt.load": ("raw load", 1.20),
    "hpcckpt.load 4->3 (reshard)": ("raw load 3 ranks", 1.50),
}


# ----------------------------------------------------------------------------- helpers

def fill_expected(out: np.ndarray, row0: int) -> None:
    """Element (i, j) of the global array is i*NCOLS + j."""
    fill_rows(out, row0, NCOLS)


def check_expected(out: np.ndarray, row0: int, what: str) -> None:
    flat = out.reshape(-1)
    step = 1 << 20
    for a in range(0, flat.size, step):
        b = min(flat.size, a + step)
        if not np.array_equal(flat[a:b], np.arange(row0 * NCOLS + a, row0 * NCOLS + b, dtype=np.float64)):
            raise SystemExit(f"bench_core: {what} read wrong data")


def timed(comm, fn) -> float:
    comm.Barrier()
    t0 = time.perf_counter()
    fn()
    comm.Barrier()
    return comm.bcast(time.perf_counter() - t0, root=0)


def idle_wait(comm) -> None:
    """Wait for the other ranks without spinning (MPI collectives busy-poll; this rank sleeps)."""
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(0.002)


def join(comm) -> None:
    """The working ranks' side of idle_wait."""
    comm.Ibarrier().Wait()



def raw_save(directory: str, local: np.ndarray, rank: int) -> None:
    with open(os.path.join(directory, f"raw-{rank:06d}.bin"), "wb") as f:
        local.tofile(f)
        f.flush()
        os.fsync(f.fileno())


def raw_load(directory: str, out: np.ndarray, rank: int) -> None:
    view = memoryview(out.reshape(-1)).cast("B")
    with open(os.path.join(directory, f"raw-{rank:06d}.bin"), "rb", buffering=0) as f:
        done = 0
        while done < len(view):
            n = f.readinto(view[done:])
            if not n:
                raise SystemExit("bench_core: raw file is short")
            done += n


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return -1


def measure_memory(fn) -> tuple[int, int]:
    """(tracemalloc peak bytes, peak-RSS growth bytes) of ``fn()``; the state must already be resident."""
    gc.collect()
    rss0 = _status("VmRSS")
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM to the current RSS (Linux >= 4.0)
        hwm_ok = True
    except OSError:
        hwm_ok = False
    tracemalloc.start()
    try:
        fn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    hwm = _status("VmHWM") - rss0 if hwm_ok else -1
    return peak, hwm


# ----------------------------------------------------------------------------- phases

def run_repeats(args, world, sub, base: str, nrows: int, times: dict, save_phases: list) -> None:
    rank, size = world.Get_rank(), world.Get_size()
    lo, hi = even_rows(nrows, size, rank)
    state = np.empty((hi - lo, NCOLS), np.float64)
    fill_expected(state, lo)
    target = np.zeros_like(state)
    if sub != MPI.COMM_NULL:
        lo3, hi3 = even_rows(nrows, 3, sub.Get_rank())
        state3 = np.empty((hi3 - lo3, NCOLS), np.float64)
        fill_expected(state3, lo3)
        target3 = np.zeros_like(state3)
    caches = ("warm", "cold") if args.cold else ("warm",)

    def record(name, seconds):
        times.setdefault(name, []).append(seconds)

    for rep in range(args.repeats):
        rep_dir = os.path.join(base, f"rep{rep}")
        raw_dir, ck_dir, raw3_dir = (os.path.join(rep_dir, d) for d in ("raw", "ckpt", "raw3"))
        if rank == 0:
            os.makedirs(raw_dir)
            os.makedirs(raw3_dir)
        world.Barrier()
        first_raw = rep % 2 == 0
        order = ("raw", "ck") if first_raw else ("ck", "raw")

        # ---- save, 4 ranks
        for m in order:
            if m == "raw":
                record("raw save", timed(world, lambda: raw_save(raw_dir, state, rank)))
            else:
                box = {"u": hpcckpt.Block(state, offset=(lo, 0), global_shape=(nrows, NCOLS))}
                res = {}
                record("hpcckpt.save", timed(world, lambda: res.setdefault("r", hpcckpt.save(box, ck_dir, comm=world))))
                save_phases.append(world.gather(res["r"].timings, root=0))

        # ---- load, 4 ranks
        for cache in caches:
            sfx = "" if cache == "warm" else " (cold)"
            for m in order:
                target.fill(0.0)
                if cache == "cold":
                    if rank == 0:
                        drop_cache(raw_dir if m == "raw" else ck_dir)
                    world.Barrier()
                if m == "raw":
                    record("raw load" + sfx, timed(world, lambda: raw_load(raw_dir, target, rank)))
                else:
                    tmpl = {"u": hpcckpt.Block(target, offset=(lo, 0), global_shape=(nrows, NCOLS))}
                    record("hpcckpt.load" + sfx, timed(world, lambda: hpcckpt.load(tmpl, ck_dir, comm=world)))
                check_expected(target, lo, f"{m} load")

        # ---- reshard: 3 ranks read the 4-rank checkpoint; baseline: raw same-count read of 3 files
        if sub == MPI.COMM_NULL:
            idle_wait(world)
        else:
            r3 = sub.Get_rank()
            raw_save(raw3_dir, state3, r3)  # untimed setup of the same-count baseline
            sub.Barrier()
            for cache in caches:
                sfx = "" if cache == "warm" else " (cold)"
                for m in order:
                    target3.fill(0.0)
                    if cache == "cold":
                        if r3 == 0:
                            drop_cache(raw3_dir if m == "raw" else ck_dir)
                        sub.Barrier()
                    if m == "raw":
                        t = timed(sub, lambda: raw_load(raw3_dir, target3, r3))
                        name = "raw load 3 ranks"
                    else:
                        tmpl = {"u": hpcckpt.Block(target3, offset=(lo3, 0), global_shape=(nrows, NCOLS))}
                        t = timed(sub, lambda: hpcckpt.load(tmpl, ck_dir, comm=sub))
                        name = "hpcckpt.load 4->3 (reshard)"
                    if r3 == 0:
                        record(name + sfx, t)
                    check_expected(target3, lo3, f"{m} 3-rank load")
            join(world)

        world.Barrier()
        if rank == 0:
            shutil.rmtree(rep_dir)
        world.Barrier()
        if rank == 0:
            print(f"  repeat {rep + 1}/{args.repeats} done", flush=True)


def run_memory(args, world, sub, base: str, nrows: int) -> list[tuple]:
    """Peak extra memory per operation, max over ranks, in an untimed pass."""
    rank, size = world.Get_rank(), world.Get_size()
    lo, hi = even_rows(nrows, size, rank)
    state = np.empty((hi - lo, NCOLS), np.float64)
    fill_expected(state, lo)
    target = np.zeros_like(state)
    d = os.path.join(base, "mem")
    raw_dir, ck_dir = os.path.join(d, "raw"), os.path.join(d, "ckpt")
    if rank == 0:
        os.makedirs(raw_dir)
    world.Barrier()
    rows = []

    def one(name, comm, fn, local_bytes):
        comm.Barrier()
        peak, hwm = measure_memory(fn)
        comm.Barrier()
        got = comm.gather((peak, hwm, local_bytes), root=0)
        if comm.Get_rank() == 0:
            rows.append((name, max(g[2] for g in got), max(g[0] for g in got), max(g[1] for g in got),
                         max(max(g[0], g[1]) / g[2] for g in got)))

    box = {"u": hpcckpt.Block(state, offset=(lo, 0), global_shape=(nrows, NCOLS))}
    tmpl = {"u": hpcckpt.Block(target, offset=(lo, 0), global_shape=(nrows, NCOLS))}
    one("raw save", world, lambda: raw_save(raw_dir, state, rank), state.nbytes)
    one("hpcckpt.save", world, lambda: hpcckpt.save(box, ck_dir, comm=world), state.nbytes)
    one("raw load", world, lambda: raw_load(raw_dir, target, rank), target.nbytes)
    check_expected(target, lo, "raw load")
    target.fill(0.0)
    one("hpcckpt.load", world, lambda: hpcckpt.load(tmpl, ck_dir, comm=world), target.nbytes)
    check_expected(target, lo, "hpcckpt.load")
    state = target = box = tmpl = None  # free the 4-rank arrays before the reshard's memory is measured
    if sub == MPI.COMM_NULL:
        idle_wait(world)
    else:
        lo3, hi3 = even_rows(nrows, 3, sub.Get_rank())
        target3 = np.empty((hi3 - lo3, NCOLS), np.float64)
        target3.fill(0.0)  # make it resident first: only memory beyond the target counts
        tmpl3 = {"u": hpcckpt.Block(target3, offset=(lo3, 0), global_shape=(nrows, NCOLS))}
        one("hpcckpt.load 4->3 (reshard)", sub, lambda: hpcckpt.load(tmpl3, ck_dir, comm=sub), target3.nbytes)
        check_expected(target3, lo3, "reshard load")
        join(world)
    world.Barrier()
    if rank == 0:
        shutil.rmtree(d)
    return rows


def run_metadata(args, base: str) -> dict:
    """Rank 0 alone: a checkpoint whose metadata lists ``args.meta_chunks`` chunks; time hpcckpt.open()."""
    ncols = 100
    nrows = -(-args.meta_chunks // ncols)
    arr = np.arange(nrows * ncols, dtype=np.float64).reshape(nrows, ncols)
    path = os.path.join(base, "meta-ckpt")
    t0 = time.perf_counter()
    res = hpcckpt.save({"v": hpcckpt.Block(arr), "step": 7}, path, comm=MPI.COMM_SELF, chunk_bytes=arr.itemsize)
    t_save = time.perf_counter() - t0
    opens = []
    for _ in range(5):
        t0 = time.perf_counter()
        view = hpcckpt.open(path)
        opens.append(time.perf_counter() - t0)
        nchunks = len(view.variables["v"].chunks)
        view.close()
    out = {"nchunks": nchunks, "metadata_bytes": os.path.getsize(os.path.join(path, "metadata.json")),
           "save_s": t_save, "open_s": statistics.median(opens), "open_all_s": opens,
           "result_nchunks": res.nchunks}
    if args.meta_read:
        with hpcckpt.open(path) as view:
            t0 = time.perf_counter()
            got = view.read("v")
            out["read_all_s"] = time.perf_counter() - t0
        assert np.array_equal(got, arr)
    if args.profile_open:
        import cProfile
        import pstats
        prof = cProfile.Profile()
        prof.enable()
        hpcckpt.open(path).close()
        prof.disable()
        pstats.Stats(prof).sort_stats("cumulative").print_stats(15)
    shutil.rmtree(path)
    return out


# ----------------------------------------------------------------------------- report

def table(times: dict, size_bytes: int) -> list[list[str]]:
    rows = []
    for name, ts in times.items():
        med = statistics.median(ts)
        cache = "cold" if name.endswith("(cold)") else ("warm" if "load" in name else "-")
        key = name.replace(" (cold)", "")
        sfx = " (cold)" if cache == "cold" else ""
        if key in TARGETS:
            base_name, limit = TARGETS[key]
            base = times[base_name + sfx]
            ratio = statistics.median(t / b for t, b in zip(ts, base))
            verdict = "PASS" if ratio <= limit else "FAIL"
            rows.append([key, cache, f"{med:.3f}", f"{min(ts):.3f}", f"{size_bytes / GIB / med:.2f}",
                         f"{ratio:.2f}", f"<= {limit:.2f} x {base_name}", verdict])
        else:
            rows.append([key, cache, f"{med:.3f}", f"{min(ts):.3f}", f"{size_bytes / GIB / med:.2f}",
                         "1.00", "(baseline)", ""])
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mib", type=int, default=512, help="global array size in MiB (default 512)")
    ap.add_argument("--repeats", type=int, default=3, help="repeats of every timed method (default 3)")
    ap.add_argument("--dir", default=None, help="parent directory for the files (default: a new temp dir)")
    ap.add_argument("--no-cold", dest="cold", action="store_false", help="skip the cold-cache reads")
    ap.add_argument("--meta-chunks", type=int, default=100_000, help="chunks in the metadata-open test")
    ap.add_argument("--meta-read", action="store_true", help="also time reading the whole 100k-chunk variable")
    ap.add_argument("--profile-open", action="store_true", help="cProfile one hpcckpt.open() of the 100k-chunk metadata")
    ap.add_argument("--json", default=None, help="write every measurement to this JSON file (rank 0)")
    args = ap.parse_args()

    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    if size < 4:
        if rank == 0:
            print("bench_core: run with mpiexec -n 4 (the reshard phase uses ranks 0-2 of the 4)", file=sys.stderr)
        world.Abort(2)
    nrows = (args.size_mib << 20) // (NCOLS * 8)
    size_bytes = nrows * NCOLS * 8

    base = None
    if rank == 0:
        parent = args.dir or tempfile.gettempdir()
        os.makedirs(parent, exist_ok=True)
        base = tempfile.mkdtemp(prefix="hpcckpt-bench-", dir=parent)
        print(f"bench_core: {size} ranks, {size_bytes / MIB:.0f} MiB float64 ({nrows} x {NCOLS}), "
              f"{args.repeats} repeats, files under {base}", flush=True)
    base = world.bcast(base, root=0)
    sub = world.Split(0 if rank < 3 else MPI.UNDEFINED, rank)

    times: dict[str, list[float]] = {}
    save_phases: list = []
    try:
        run_repeats(args, world, sub, base, nrows, times, save_phases)
        mem_rows = run_memory(args, world, sub, base, nrows)
        meta = None
        if rank == 0:
            meta = run_metadata(args, base)
            idle_wait(world)
        else:
            idle_wait(world)
    finally:
        world.Barrier()
        if rank == 0:
            shutil.rmtree(base, ignore_errors=True)
    if rank != 0:
        return

    order = ["raw save", "hpcckpt.save", "raw load", "hpcckpt.load", "raw load 3 ranks",
             "hpcckpt.load 4->3 (reshard)"]
    ordered = {n: times[n] for n in order}
    ordered.update({n + " (cold)": times[n + " (cold)"] for n in order if n + " (cold)" in times})
    print()
    print(f"Time ({args.repeats} repeats; GiB/s = {size_bytes / GIB:.2f} GiB / median; ratio = median over repeats "
          "of method / baseline of the same repeat)")
    print_table(["method", "cache", "median s", "min s", "GiB/s", "ratio", "target", "result"],
                table(ordered, size_bytes))

    phases = {}
    for per_rank in save_phases:
        for ph in per_rank[0]:
            phases.setdefault(ph, []).append(max(t[ph] for t in per_rank))
    print()
    print("hpcckpt.save phases (median over repeats of the slowest rank): "
          + ", ".join(f"{ph} {statistics.median(v):.3f} s" for ph, v in phases.items()))

    print()
    print("Memory (untimed pass; extra = max(tracemalloc peak, peak-RSS growth), max over ranks)")
    print_table(["operation", "local state MiB", "tracemalloc peak MiB", "peak RSS growth MiB", "extra / state",
                 "target", "result"],
                [[n, f"{loc / MIB:.1f}", f"{tm / MIB:.2f}", f"{hwm / MIB:.2f}", f"{frac * 100:.1f}%", "<= 10%",
                  "" if n.startswith("raw") else ("PASS" if frac <= 0.10 else "FAIL")]
                 for n, loc, tm, hwm, frac in mem_rows])

    print()
    print(f"Metadata: {meta['nchunks']} chunks, metadata.json {meta['metadata_bytes'] / MIB:.1f} MiB, "
          f"written in {meta['save_s']:.2f} s")
    print_table(["operation", "median s", "target", "result"],
                [["hpcckpt.open() (100k-chunk metadata)", f"{meta['open_s']:.3f}", "< 1 s",
                  "PASS" if meta["open_s"] < 1.0 else "FAIL"]]
                + ([["view.read(whole variable), info", f"{meta['read_all_s']:.3f}", "-", ""]]
                   if "read_all_s" in meta else []))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"size_bytes": size_bytes, "ranks": size, "times": times, "save_phases": save_phases,
                       "memory": mem_rows, "metadata": meta}, f, indent=1)


if __name__ == "__main__":
    main()
