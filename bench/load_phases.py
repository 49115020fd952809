#!/usr/bin/env python
"""A load broken down by phase: hpcckpt.load and Checkpointer.restore against h5py read_direct and raw readinto.

    mpiexec -n 4 python bench/load_phases.py --mib 1,64 --repeats 7

Each rank saves ``--mib`` MiB of float64 rows (1024 columns) once per method
(hpcckpt.save, a Checkpointer, one HDF5 file per rank, one raw file per rank),
then loads it back on the saved decomposition, warm (files in the page cache),
``--repeats`` times; the methods alternate within every repeat (the order
rotates).  Each method is timed into a target that was touched before
("touched") and into a fresh ``np.empty`` target ("fresh": the first-touch page
faults of the caller's buffer fall inside the load, as in a new job's first
load).  ``--modes cold`` adds a load into a touched target with the method's
files dropped from the page cache first (posix_fadvise DONTNEED; every file
is synced after the set-up, so that its pages are clean and can be dropped).
Timing: Barrier; t0; load; Barrier; t1, rank 0's t1 - t0 (the slowest
rank).  ``faults`` is rank 0's minor page faults during the load
(getrusage).  ``touch`` is ``dst[...] = 0`` of a fresh array alone.

hpcckpt's phases (rank 0, median): hpcckpt's own PhaseTimer phases plus the
read system calls and the checksum, timed apart by an instrumented
storage.posix.read_segments (preadv calls and their sizes; xxh3 updates),
and the collectives (every comm method the load calls, timed).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from benchutil import drop_cache, fill_rows, print_table  # noqa: E402

NCOLS = 1024


def minflt() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


class Probe:
    """Times preadv, xxh3 updates and MPI calls inside a load (monkeypatched; off unless ``on``)."""

    def __init__(self):
        self.on = False
        self.reset()

    def reset(self):
        self.t = {"preadv": 0.0, "hash": 0.0, "mpi": 0.0}
        self.n = {"preadv": 0, "hash": 0, "mpi": 0}
        self.sizes: dict = {}
        self.calls: dict = {}

    def add(self, what, dt, size=None):
        self.t[what] = self.t.get(what, 0.0) + dt
        self.n[what] = self.n.get(what, 0) + 1
        if size is not None:
            self.sizes[size] = self.sizes.get(size, 0) + 1


PROBE = Probe()


def install_probe(comm):
    import hpcckpt.storage.posix as posix

    real_preadv = os.preadv

    def preadv(fd, bufs, offset, *a):
        if not PROBE.on:
            return real_preadv(fd, bufs, offset, *a)
        t0 = time.perf_counter()
        n = real_preadv(fd, bufs, offset, *a)
        PROBE.add("preadv", time.perf_counter() - t0, n)
        return n

    class TimedHasher:
        def __init__(self, h):
            self.h = h

        def update(self, b):
            t0 = time.perf_counter()
            self.h.update(b)
            PROBE.add("hash", time.perf_counter() - t0)

        def __getattr__(self, k):
            return getattr(self.h, k)

    posix.os = type(sys)("os_probe")  # the posix module's os with preadv timed
    posix.os.__dict__.update(os.__dict__)
    posix.os.preadv = preadv
    import hpcckpt.core.checksum as cs
    import hpcckpt.loading.reader as rd
    real_new = cs.new_hasher

    def new_hasher():
        return TimedHasher(real_new()) if PROBE.on else real_new()

    rd.new_hasher = new_hasher
    for mod_name in ("hpcckpt.storage.posix",):
        mod = sys.modules[mod_name]
        if hasattr(mod, "new_hasher"):
            mod.new_hasher = new_hasher

    # collectives: wrap the communicator's methods the load calls
    names = ("alltoall", "allgather", "bcast", "Barrier", "Scan", "Alltoall", "Allgather", "allreduce",
             "Allreduce", "Bcast", "Alltoallv", "Allgatherv", "Ibarrier", "Isend", "Irecv")

    class TimedComm:
        def __init__(self, c):
            self._c = c

        def __getattr__(self, k):
            v = getattr(self._c, k)
            if k in names and callable(v):
                def w(*a, **kw):
                    t0 = time.perf_counter()
                    r = v(*a, **kw)
                    if PROBE.on:
                        PROBE.add("mpi", time.perf_counter() - t0)
                        PROBE.calls[k] = PROBE.calls.get(k, 0) + 1
                    return r
                return w
            return v

    return TimedComm(comm)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", default="1,64")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--methods", default="hpcckpt.load,restore,h5py,raw",
                    help="also hpcckpt.load-noshift, restore-noshift: without storage.posix's short-distance shift; "
                         "hpcckpt.load-nogap: a checkpoint saved without storage.posix's phase gaps (chunks back to "
                         "back from offset 0, the layout of older files); hpcckpt.load-nohash: the load with xxh3 "
                         "skipped (what verification costs; the data is still compared after the load); "
                         "restore-noownmeta: the restore with rank 0's "
                         "metadata in the listing's broadcast instead of each rank reading it")
    ap.add_argument("--modes", default="touched,fresh",
                    help="touched, fresh, cold (a touched target, the method's files dropped from the page cache)")
    ap.add_argument("--no-probe", action="store_true", help="time without the instrumentation")
    args = ap.parse_args()

    from mpi4py import MPI
    import h5py
    import hpcckpt
    import hpcckpt.storage.posix as posix_storage
    import logging

    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    comm = world if args.no_probe else install_probe(world)
    phases: dict = {}
    if not args.no_probe:  # hpcckpt's own PhaseTimer lines (logger.info on rank 0)
        from hpcckpt.core.log import logger

        class Grab(logging.Handler):
            def emit(self, record):
                if PROBE.on and "loaded" in record.getMessage():
                    for part in record.getMessage().split(": ", 1)[1].split(", "):
                        k, v, _ = part.rsplit(" ", 2)
                        phases.setdefault(k, []).append(float(v))

        logger.addHandler(Grab())
        logger.setLevel(logging.INFO)
        logger.propagate = False

    base = None
    if rank == 0:
        base = tempfile.mkdtemp(prefix="hpcckpt-phases-", dir=args.dir)
    base = world.bcast(base, root=0)
    methods = args.methods.split(",")
    modes = args.modes.split(",")
    results = []
    try:
        for mib in [float(x) for x in args.mib.split(",")]:
            rows = max(1, int(mib * (1 << 20)) // (NCOLS * 8))
            nrows = rows * size
            lo = rank * rows
            state = np.empty((rows, NCOLS))
            fill_rows(state, lo, NCOLS)
            d = os.path.join(base, f"{mib:g}")
            if rank == 0:
                os.makedirs(os.path.join(d, "h5"))
                os.makedirs(os.path.join(d, "raw"))
            world.Barrier()
            hpcckpt.save({"u": hpcckpt.Block(state, (lo, 0), (nrows, NCOLS))}, os.path.join(d, "hp"), comm=world)
            if "hpcckpt.load-nogap" in args.methods.split(","):
                phased_min, posix_storage._PHASED_MIN = posix_storage._PHASED_MIN, 1 << 62
                try:
                    hpcckpt.save({"u": hpcckpt.Block(state, (lo, 0), (nrows, NCOLS))}, os.path.join(d, "hp-nogap"),
                                 comm=world)
                finally:
                    posix_storage._PHASED_MIN = phased_min
            ck = hpcckpt.Checkpointer(os.path.join(d, "ck"), comm=world)
            ck.save({"u": hpcckpt.Block(state, (lo, 0), (nrows, NCOLS))}, step=1)
            ck.wait() if hasattr(ck, "wait") else None
            with h5py.File(os.path.join(d, "h5", f"p{rank}.h5"), "w") as f:
                f.create_dataset("u", data=state)
            with open(os.path.join(d, "raw", f"r{rank}.bin"), "wb") as f:
                state.tofile(f)
            world.Barrier()

            def load_hp(out, name="hp"):
                hpcckpt.load({"u": hpcckpt.Block(out, (lo, 0), (nrows, NCOLS))}, os.path.join(d, name), comm=comm)

            ck_probe = hpcckpt.Checkpointer(os.path.join(d, "ck"), comm=comm) if not args.no_probe else ck

            def load_ck(out):
                ck_probe.restore({"u": hpcckpt.Block(out, (lo, 0), (nrows, NCOLS))})

            def load_h5(out):
                with h5py.File(os.path.join(d, "h5", f"p{rank}.h5"), "r") as f:
                    f["u"].read_direct(out)

            def load_raw(out):
                view = memoryview(out.reshape(-1)).cast("B")
                fd = os.open(os.path.join(d, "raw", f"r{rank}.bin"), os.O_RDONLY)
                try:
                    done = 0
                    while done < len(view):
                        n = os.preadv(fd, [view[done:]], done)
                        done += n
                finally:
                    os.close(fd)

            def without_shift(fn):  # the same load with storage.posix's short-distance shift off (paired A/B)
                def run(out):
                    posix_storage._SHIFT = 0
                    try:
                        fn(out)
                    finally:
                        posix_storage._SHIFT = 2048
                return run

            def without_checksum(out):  # the same load with xxh3 skipped: what verification costs (paired A/B)
                import hpcckpt.loading.reader as reader

                class Skipped:  # hashes nothing; its digest compares equal to any stored checksum
                    def update(self, data):
                        pass

                class Matches(str):
                    def __eq__(self, other):
                        return True

                    def __ne__(self, other):
                        return False

                    __hash__ = str.__hash__

                real = reader.new_hasher, reader.hexdigest
                reader.new_hasher, reader.hexdigest = Skipped, lambda hasher: Matches("")
                try:
                    load_hp(out)
                finally:
                    reader.new_hasher, reader.hexdigest = real

            def metadata_broadcast(out):  # the restore with rank 0's metadata in the listing's broadcast (paired A/B)
                import hpcckpt.checkpointer as checkpointer

                real, checkpointer.reads_metadata_itself = checkpointer.reads_metadata_itself, lambda nranks: False
                try:
                    load_ck(out)
                finally:
                    checkpointer.reads_metadata_itself = real

            fns = {"hpcckpt.load-noshift": without_shift(load_hp), "restore-noshift": without_shift(load_ck),
                   "restore-noownmeta": metadata_broadcast, "hpcckpt.load-nohash": without_checksum,
                   "hpcckpt.load-nogap": lambda out: load_hp(out, "hp-nogap"),
                   "hpcckpt.load": load_hp, "restore": load_ck, "h5py": load_h5, "raw": load_raw,}
            directories = {name: "ck" if name.startswith("restore") else "hp-nogap" if name.endswith("nogap")
                           else "hp" if name.startswith("hpcckpt") else "h5" if name == "h5py" else "raw"
                           for name in fns}
            if "cold" in modes:  # DONTNEED drops clean pages only: h5py's and raw files are written unsynced
                os.sync()
                world.Barrier()
            touched = np.zeros_like(state)
            for name in methods:  # warm-up (imports, first open)
                fns[name](touched)
            times: dict = {}
            faults: dict = {}
            probe: dict = {}
            touch = []
            for rep in range(args.repeats):
                order = methods[rep % len(methods):] + methods[:rep % len(methods)]
                for mode in modes:
                    for name in order:
                        out = np.empty_like(state) if mode == "fresh" else touched
                        if mode != "fresh":
                            out.fill(0.0)
                        if mode == "cold":  # every file of the method's directory out of the page cache
                            if rank == 0:
                                drop_cache(os.path.join(d, directories[name]))
                        world.Barrier()
                        PROBE.reset()
                        PROBE.on = name.startswith(("hpcckpt.load", "restore")) and not args.no_probe
                        f0 = minflt()
                        t0 = time.perf_counter()
                        fns[name](out)
                        world.Barrier()
                        t = time.perf_counter() - t0
                        f1 = minflt()
                        PROBE.on = False
                        if not np.array_equal(out, state):
                            raise SystemExit(f"{name} read wrong data")
                        key = (name, mode)
                        times.setdefault(key, []).append(world.bcast(t, root=0))
                        faults.setdefault(key, []).append(f1 - f0)
                        if name.startswith(("hpcckpt.load", "restore")):
                            p = probe.setdefault(key, {})
                            for k in PROBE.t:
                                p.setdefault(k, []).append(PROBE.t[k])
                            p.setdefault("n", []).append(dict(PROBE.n))
                            p.setdefault("sizes", []).append(dict(PROBE.sizes))
                            p.setdefault("calls", []).append(dict(PROBE.calls))
                        del out
                fresh = np.empty_like(state)
                world.Barrier()
                t0 = time.perf_counter()
                fresh[...] = 0
                world.Barrier()
                touch.append(world.bcast(time.perf_counter() - t0, root=0))
                del fresh
            results.append((mib, times, faults, probe, touch, dict(phases)))
            phases.clear()
            world.Barrier()
    finally:
        world.Barrier()
        if rank == 0:
            shutil.rmtree(base, ignore_errors=True)

    if rank != 0:
        return
    med = statistics.median
    print(f"uptime: {os.popen('uptime').read().strip()}")
    print(f"{size} ranks, repeats {args.repeats}, seconds (slowest rank), medians; ratio: median of paired "
          "per-repeat ratios to the best peer (h5py, raw) in the same mode")
    rows_out = []
    for mib, times, faults, probe, touch, ph in results:
        for mode in modes:
            peers = [m for m in ("h5py", "raw") if (m, mode) in times]
            for name in methods:
                key = (name, mode)
                ts = times[key]
                ratio = "-"
                if peers and name not in peers:
                    best = [min(times[(p, mode)][i] for p in peers) for i in range(len(ts))]
                    ratio = f"{med([a / b for a, b in zip(ts, best)]):.2f}"
                rows_out.append([f"{mib:g}", mode, name, f"{med(ts) * 1e3:.2f} ms", ratio,
                                 f"{med(faults[key]):.0f}"])
        rows_out.append([f"{mib:g}", "touch", "dst[...] = 0", f"{med(touch) * 1e3:.2f} ms", "-", "-"])
    print_table(["MiB/rank", "target", "method", "time", "/best peer", "faults r0"], rows_out)
    for mib, times, faults, probe, touch, ph in results:
        for mode in modes:
            for name in methods:
                if "-no" in name and (name.split("-no")[0], mode) in times:
                    a, b = times[(name.split("-no")[0], mode)], times[(name, mode)]
                    print(f"paired {mib:g} MiB {mode}: {name.split('-no')[0]} / {name} = "
                          f"{med([x / y for x, y in zip(a, b)]):.3f} (median of {len(a)})")
    for mib, times, faults, probe, touch, ph in results:
        for mode in modes:
            if ("restore", mode) in times and ("hpcckpt.load", mode) in times:
                a, b = times[("restore", mode)], times[("hpcckpt.load", mode)]
                print(f"paired {mib:g} MiB {mode}: restore / hpcckpt.load = "
                      f"{med([x / y for x, y in zip(a, b)]):.3f} (median of {len(a)})")
    if args.no_probe:
        return
    print("\nhpcckpt phases on rank 0 (ms, medians); preadv sizes: KiB x count per load")
    prow = []
    for mib, times, faults, probe, touch, ph in results:
        for key, p in probe.items():
            sizes = p["sizes"][-1]
            sz = ", ".join(f"{k >> 10}x{v}" for k, v in sorted(sizes.items()))
            calls = ", ".join(f"{k} {v}" for k, v in sorted(p["calls"][-1].items()))
            prow.append([f"{mib:g}", key[1], key[0], f"{med(times[key]) * 1e3:.2f}",
                         f"{med(p['preadv']) * 1e3:.2f}", f"{med(p['hash']) * 1e3:.2f}",
                         f"{med(p['mpi']) * 1e3:.2f}", sz, calls])
        hp = {k: v for k, v in ph.items()}
        if hp:
            prow.append([f"{mib:g}", "all", "PhaseTimer", "-", "-", "-", "-",
                         ", ".join(f"{k} {med(v) * 1e3:.2f}" for k, v in hp.items()), ""])
    print_table(["MiB/rank", "target", "method", "total", "preadv", "xxh3", "MPI calls", "preadv sizes",
                 "collectives"], prow)


if __name__ == "__main__":
    main()
