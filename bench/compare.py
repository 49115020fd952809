#!/usr/bin/env python
"""hpcckpt against its peers ("Benchmark against peers"): one run, same data, same rules.

Run it WITHOUT mpiexec (it starts one mpiexec job per scenario itself):

    flock /tmp/hpcckpt-bench.lock .venv/bin/python bench/compare.py

(``--size-mib 64 --repeats 1`` for a quick run; ``--help`` for the rest.)

Scenarios (each an mpiexec job of its own):

* ``big``: 4 ranks hold a ``--size-mib`` (512) MiB float64 array split by rows
  (1024 columns); save on 4, load on 4, reshard load on 3 (ranks 0-2 of the
  same job, on a communicator ``COMM_WORLD.Split`` makes; rank 3 sleeps in a
  polled non-blocking barrier); loads warm (right after the save or the previous
  load: page cache) and cold (the method's files dropped first with
  posix_fadvise(DONTNEED); they are clean after the fsync).  With
  ``--same-files``, each cold load is paired with a raw cold read of the
  method's own data files (every file but metadata: whole files dealt to the
  ranks, or each file cut in one byte range per rank; one ``preadv`` a piece):
  the raw cold read of the same bytes by the same ranks, as the files lie.
  It comes before the cold load in even repeats and after it in odd ones: on
  this VM the first cold read of a version just saved and a later one differ,
  for any reader (docs/performance.md, "Save, load and reshard against raw I/O").
* ``small``: 16 ranks x ``--small-mib`` (4) MiB: the per-file costs dominate.
  ``HPCCKPT_RANKS_PER_NODE=4`` simulates 4 nodes of 4 ranks for hpcckpt.  Save,
  load on 16, reshard load on 12.
* ``throttled``: the ``big`` data and ranks, saves only, under a writer that
  imitates a slow shared file system of ``--throttle-mbps`` (300) MB/s aggregate
  (see "Throttle" below).

Methods (each skipped, with a line saying why, if it cannot be imported):

* ``raw``: each rank ``ndarray.tofile`` + fsync of its rows into its own file;
  loads ``readinto`` (reshard: each rank preads, straight into its array, the
  byte ranges of the 4 files that its rows overlap): the physical limit here.
* ``hpcckpt:<strategy>``: ``hpcckpt.save(..., strategy=s)`` for file-per-rank,
  aggregated, shared-file and auto (a first save into a fresh directory through
  ``hpcckpt.save``, so auto has no bandwidth history: its static rule decides),
  ``hpcckpt.load`` into Blocks of the target decomposition.
* ``h5py``: one HDF5 file per rank (dataset ``u``, contiguous), plus a JSON index
  of (file, first row, rows) written by rank 0; files fsynced after close.  Loads
  open every file the rank's rows overlap and ``read_direct`` the hyperslab.
* ``torch-dcp``: ``torch.distributed.checkpoint.save``/``load`` of a DTensor
  ``Shard(0)`` over a gloo process group (initialised inside the same mpiexec
  ranks, rank and world size from MPI, TCP store on 127.0.0.1); the DTensor
  wraps the same numpy memory (``torch.from_numpy``), loads go into it in place.
  Reshard: a DTensor sharded over a 3-rank DeviceMesh, loaded by those 3 ranks.
  DCP's defaults: one file per rank, fsync on.  ``torch.set_num_threads(1)``.
* ``adios2``: the PyPI wheel has no MPI, so one serial BP5 stream per rank
  (``adios2.Stream(path, "w")``, variable ``u`` declared with its global shape,
  start and count), files fsynced after close, plus the same JSON index; loads
  open the files the rank's rows overlap (``ReadRandomAccess``) and ``Get`` a
  global selection straight into the target.  ADIOS2's defaults otherwise.

Every method gets a fresh directory per repeat (``repK/<method>``), removed after
its loads; the order of the methods rotates from repeat to repeat.  Every load
is checked against the expected contents after it is timed.  Timing: ``Barrier;
t0; operation; Barrier; t1`` on every rank, rank 0's ``t1 - t0`` (the slowest
rank).  The table shows medians over repeats; ratios for the targets are the
median over repeats of the paired per-repeat ratio (which cancels most of the
drift of a shared machine).

Throttle: a small C library (compiled here with ``cc``, LD_PRELOADed into every
rank of the throttled scenario) wraps ``write``, ``pwrite``, ``writev``,
``pwritev`` (and their 64/2 variants) and ``fwrite`` (numpy's tofile uses
fwrite, whose inner write glibc does not route through the interposable
symbol).  After a write of n bytes to a file under the benchmark directory it
books n / rate seconds in a token bucket shared by all ranks (a next-free time
in a shared mmap, advanced with an atomic compare-and-swap) and sleeps until
its booking ends.  So all ranks together never exceed the rate, whatever
library does the writing (Python, HDF5, ADIOS2, ROMIO, torch); creates, fsyncs
and metadata are not slowed.  The shim counts the bytes it throttled; the table
shows them per save, as proof that each method's writes went through it.

MPICH busy-polls in collectives, which on 2 cores starves the ranks that do
the work; every scenario runs with MPIR_CVAR_CH4_PROGRESS_THROTTLE=1 and
MPIR_CVAR_POLLS_BEFORE_YIELD=1 (``--no-mpich-yield`` to drop them).
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np
from benchutil import drop_cache, fill_rows, print_table  # noqa: E402 - bench/ is the script's folder

HERE = os.path.dirname(os.path.abspath(__file__))
NCOLS = 1024
MIB = float(1 << 20)
GIB = float(1 << 30)
STRATEGIES = ("file-per-rank", "aggregated", "shared-file", "auto")
ALL_METHODS = ("raw",) + tuple(f"hpcckpt:{s}" for s in STRATEGIES) + ("h5py", "torch-dcp", "adios2")
OPS = ("save", "load", "load cold", "reshard", "reshard cold")

THROTTLE_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

/* shared state: [0] next free time (ns, CLOCK_MONOTONIC), [1] bytes throttled */
static volatile uint64_t *state = NULL;
static double ns_per_byte = 0.0;
static const char *prefix = NULL;
static size_t prefix_len = 0;
static int ready = 0;

static void setup(void) {
    if (ready) return;
    ready = -1;
    const char *path = getenv("CMP_THROTTLE_STATE"), *bps = getenv("CMP_THROTTLE_BPS");
    prefix = getenv("CMP_THROTTLE_PREFIX");
    if (!path || !bps || !prefix) return;
    int fd = open(path, O_RDWR);
    if (fd < 0) return;
    void *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return;
    state = (volatile uint64_t *)p;
    ns_per_byte = 1e9 / atof(bps);
    prefix_len = strlen(prefix);
    ready = 1;
}

static void throttle(int fd, ssize_t n) {
    if (n <= 0) return;
    setup();
    if (ready != 1) return;
    char link[64], target[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t len = readlink(link, target, sizeof target - 1);
    if (len < (ssize_t)prefix_len || strncmp(target, prefix, prefix_len) != 0) return;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t now = (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
    uint64_t cost = (uint64_t)(n * ns_per_byte), old, start, end;
    do {
        old = __atomic_load_n(&state[0], __ATOMIC_SEQ_CST);
        start = old > now ? old : now;
        end = start + cost;
    } while (!__atomic_compare_exchange_n(&state[0], &old, end, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST));
    __atomic_add_fetch(&state[1], (uint64_t)n, __ATOMIC_SEQ_CST);
    ts.tv_sec = end / 1000000000ull;
    ts.tv_nsec = end % 1000000000ull;
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) != 0) {}
}

#define REAL(name) static __typeof__(name) *real_##name; if (!real_##name) real_##name = dlsym(RTLD_NEXT, #name)

ssize_t write(int fd, const void *b, size_t n) { REAL(write); ssize_t r = real_write(fd, b, n); throttle(fd, r); return r; }
ssize_t pwrite(int fd, const void *b, size_t n, off_t o) { REAL(pwrite); ssize_t r = real_pwrite(fd, b, n, o); throttle(fd, r); return r; }
ssize_t pwrite64(int fd, const void *b, size_t n, off_t o) { REAL(pwrite64); ssize_t r = real_pwrite64(fd, b, n, o); throttle(fd, r); return r; }
ssize_t writev(int fd, const struct iovec *v, int c) { REAL(writev); ssize_t r = real_writev(fd, v, c); throttle(fd, r); return r; }
ssize_t pwritev(int fd, const struct iovec *v, int c, off_t o) { REAL(pwritev); ssize_t r = real_pwritev(fd, v, c, o); throttle(fd, r); return r; }
ssize_t pwritev64(int fd, const struct iovec *v, int c, off_t o) { REAL(pwritev64); ssize_t r = real_pwritev64(fd, v, c, o); throttle(fd, r); return r; }
ssize_t pwritev2(int fd, const struct iovec *v, int c, off_t o, int f) { REAL(pwritev2); ssize_t r = real_pwritev2(fd, v, c, o, f); throttle(fd, r); return r; }
size_t fwrite(const void *b, size_t s, size_t n, FILE *f) {
    REAL(fwrite); size_t r = real_fwrite(b, s, n, f); throttle(fileno(f), (ssize_t)(r * s)); return r;
}
"""


# ============================================================================ worker (inside mpiexec)

def rows_of(nrows: int, nparts: int, part: int) -> tuple[int, int]:
    """torch.chunk's split (what DTensor Shard(0) uses), for every method alike."""
    c = -(-nrows // nparts)
    lo = min(part * c, nrows)
    return lo, min(lo + c, nrows)


def fill(out: np.ndarray, row0: int) -> None:
    fill_rows(out, row0, NCOLS)



def fsync_tree(path: str) -> None:
    paths = [path] if os.path.isfile(path) else [os.path.join(r, f) for r, _, fs in os.walk(path) for f in fs]
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_index(directory: str, comm, nrows: int, lo: int, hi: int, name: str) -> None:
    """Rank 0 writes index.json: which file holds which rows (h5py, adios2)."""
    parts = comm.gather((lo, hi), root=0)
    if comm.Get_rank() == 0:
        files = [{"file": name.format(rank=r), "row0": a, "rows": b - a} for r, (a, b) in enumerate(parts)]
        with open(os.path.join(directory, "index.json"), "w") as f:
            json.dump({"shape": [nrows, NCOLS], "files": files}, f)
            f.flush()
            os.fsync(f.fileno())


def overlaps(directory: str, lo: int, hi: int):
    """(file, first file row, first target row, rows) for every indexed file that rows [lo, hi) overlap."""
    with open(os.path.join(directory, "index.json")) as f:
        index = json.load(f)
    for e in index["files"]:
        a, b = max(lo, e["row0"]), min(hi, e["row0"] + e["rows"])
        if a < b:
            yield os.path.join(directory, e["file"]), a - e["row0"], a - lo, b - a


def read_files_raw(directory: str, rank: int, size: int, scratch: np.ndarray) -> None:
    """A raw read of a method's own data files (every file under ``directory`` but metadata): whole files
    dealt round-robin when there are at least as many as ranks, otherwise each file cut into ``size`` byte
    ranges, one per rank; one preadv per piece into ``scratch`` (the cold read of the same bytes)."""
    files = sorted(os.path.join(root, n) for root, _, names in os.walk(directory) for n in names
                   if not n.startswith("metadata") and not n.endswith(".json"))
    if len(files) >= size:
        pieces = [(f, 0, os.path.getsize(f)) for f in files[rank::size]]
    else:
        pieces = []
        for f in files:
            n = os.path.getsize(f)
            pieces.append((f, n * rank // size, n * (rank + 1) // size))
    view = memoryview(scratch)
    for path, lo, hi in pieces:
        fd = os.open(path, os.O_RDONLY)
        try:
            at = lo
            while at < hi:  # straight into scratch, a scratch-full at a time (a piece larger than it wraps)
                n = os.preadv(fd, [view[:min(hi - at, len(view))]], at)
                if not n:
                    raise SystemExit(f"compare: {path} is short")
                at += n
        finally:
            os.close(fd)


class Raw:
    def save(self, d, comm, arr, lo, hi, nrows):
        with open(os.path.join(d, f"raw-{comm.Get_rank():06d}.bin"), "wb") as f:
            arr.tofile(f)
            f.flush()
            os.fsync(f.fileno())

    def load(self, d, comm, out, lo, hi, nrows, writer_parts):
        for r, (a0, b0) in enumerate(writer_parts):  # the writers' files, their rows a0..b0
            a, b = max(lo, a0), min(hi, b0)
            if a >= b:
                continue
            view = memoryview(out[a - lo:b - lo].reshape(-1)).cast("B")
            fd = os.open(os.path.join(d, f"raw-{r:06d}.bin"), os.O_RDONLY)
            try:
                off, done = (a - a0) * NCOLS * 8, 0
                while done < len(view):
                    n = os.preadv(fd, [view[done:]], off + done)
                    if not n:
                        raise SystemExit("compare: raw file is short")
                    done += n
            finally:
                os.close(fd)


class Hpcckpt:
    def __init__(self, strategy, ranks_per_node):
        import hpcckpt
        self.h, self.strategy, self.rpn, self.chosen = hpcckpt, strategy, ranks_per_node, []

    def save(self, d, comm, arr, lo, hi, nrows):
        box = {"u": self.h.Block(arr, offset=(lo, 0), global_shape=(nrows, NCOLS))}
        res = self.h.save(box, d, comm=comm, strategy=self.strategy, ranks_per_node=self.rpn)
        self.chosen.append(res.strategy)

    def load(self, d, comm, out, lo, hi, nrows, writer_parts):
        self.h.load({"u": self.h.Block(out, offset=(lo, 0), global_shape=(nrows, NCOLS))}, d, comm=comm)


class H5:
    def __init__(self):
        import h5py
        self.h5py = h5py

    def save(self, d, comm, arr, lo, hi, nrows):
        name = f"part-{comm.Get_rank():06d}.h5"
        with self.h5py.File(os.path.join(d, name), "w") as f:
            f.create_dataset("u", data=arr)
            f.attrs["row0"] = lo
        fsync_tree(os.path.join(d, name))
        write_index(d, comm, nrows, lo, hi, "part-{rank:06d}.h5")

    def load(self, d, comm, out, lo, hi, nrows, writer_parts):
        for path, src, dst, n in overlaps(d, lo, hi):
            with self.h5py.File(path, "r") as f:
                f["u"].read_direct(out, np.s_[src:src + n], np.s_[dst:dst + n])


class Adios:
    def __init__(self):
        import adios2
        self.adios2 = adios2
        self.adios = adios2.Adios()
        self.n = 0

    def save(self, d, comm, arr, lo, hi, nrows):
        path = os.path.join(d, f"part-{comm.Get_rank():06d}.bp")
        with self.adios2.Stream(path, "w") as s:
            s.write("u", arr, [nrows, NCOLS], [lo, 0], [hi - lo, NCOLS])
        fsync_tree(path)
        write_index(d, comm, nrows, lo, hi, "part-{rank:06d}.bp")

    def load(self, d, comm, out, lo, hi, nrows, writer_parts):
        mode = self.adios2.bindings.Mode
        for path, src, dst, n in overlaps(d, lo, hi):
            self.n += 1
            io = self.adios.declare_io(f"r{self.n}")
            io.set_engine("BP5")
            eng = io.open(path, mode.ReadRandomAccess)
            try:
                var = io.inquire_variable("u")
                var.set_selection([[dst + lo, 0], [n, NCOLS]])  # a global selection
                eng.get(var, out[dst:dst + n], mode.Sync)
            finally:
                eng.close()
            self.adios.remove_io(f"r{self.n}")


class TorchDCP:
    def __init__(self, world, m):
        import torch
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.tensor import DTensor, Shard
        torch.set_num_threads(1)
        self.torch, self.dist, self.dcp, self.DTensor, self.Shard = torch, dist, dcp, DTensor, Shard
        port = None
        if world.Get_rank() == 0:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
        port = world.bcast(port, root=0)
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(world.Get_rank()),
                          WORLD_SIZE=str(world.Get_size()))
        dist.init_process_group("gloo", rank=world.Get_rank(), world_size=world.Get_size())
        self.meshes = {world.Get_size(): DeviceMesh("cpu", list(range(world.Get_size())))}
        self.meshes[m] = DeviceMesh("cpu", list(range(m)))  # every rank takes part in creating its group

    def _dt(self, arr, nranks, nrows):
        return self.DTensor.from_local(self.torch.from_numpy(arr), self.meshes[nranks], [self.Shard(0)],
                                       run_check=False, shape=(nrows, NCOLS), stride=(NCOLS, 1))

    def save(self, d, comm, arr, lo, hi, nrows):
        mesh = self.meshes[comm.Get_size()]
        self.dcp.save({"u": self._dt(arr, comm.Get_size(), nrows)}, checkpoint_id=d, process_group=mesh.get_group())

    def load(self, d, comm, out, lo, hi, nrows, writer_parts):
        dt = self._dt(out, comm.Get_size(), nrows)
        self.dcp.load({"u": dt}, checkpoint_id=d, process_group=self.meshes[comm.Get_size()].get_group())
        if dt.to_local().data_ptr() != out.ctypes.data:
            raise SystemExit("compare: torch DCP did not load in place")

    def close(self):
        self.dist.destroy_process_group()


def make_methods(names, world, m, ranks_per_node):
    methods, skipped = {}, {}
    for name in names:
        try:
            if name == "raw":
                methods[name] = Raw()
            elif name.startswith("hpcckpt:"):
                methods[name] = Hpcckpt(name.split(":", 1)[1], ranks_per_node)
            elif name == "h5py":
                methods[name] = H5()
            elif name == "adios2":
                methods[name] = Adios()
            elif name == "torch-dcp":
                methods[name] = TorchDCP(world, m)
            else:
                raise ValueError(f"unknown method {name!r}")
        except ImportError as e:
            skipped[name] = f"cannot import: {e}"
    # every rank must agree (a peer importable on one rank only would hang the others)
    got = world.allgather(sorted(skipped))
    for rank_skips in got:
        for name in rank_skips:
            if name not in skipped:
                skipped[name] = "not importable on every rank"
                methods.pop(name, None)
    return methods, skipped


def first_load_worker(args) -> None:
    """``--first MODE``: save every method into ``--base`` (MODE save), or, in a new job, time one method's first
    load into an untouched ``np.empty`` target (MODE = the method): nothing loaded before in this process."""
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    nrows = args.nrows
    lo, hi = rows_of(nrows, size, rank)
    parts = [rows_of(nrows, size, r) for r in range(size)]
    names = args.methods.split(",") if args.first == "save" else [args.first]
    methods, skipped = make_methods(names, world, size, args.ranks_per_node)
    if args.first == "save":
        state = np.empty((hi - lo, NCOLS))
        fill(state, lo)
        for name in methods:
            d = os.path.join(args.base, name.replace(":", "-"))
            if rank == 0 and not name.startswith("hpcckpt") and name != "torch-dcp":
                os.makedirs(d)
            world.Barrier()
            methods[name].save(d, world, state, lo, hi, nrows)
        if "torch-dcp" in methods:
            methods["torch-dcp"].close()
        if rank == 0:
            with open(args.out, "w") as f:
                json.dump({"skipped": skipped}, f)
        return
    name = args.first
    if name not in methods:
        if rank == 0:
            with open(args.out, "w") as f:
                json.dump({"skipped": skipped}, f)
        return
    target = np.empty((hi - lo, NCOLS))  # untouched: its first-touch page faults fall inside the load
    world.Barrier()
    t0 = time.perf_counter()
    methods[name].load(os.path.join(args.base, name.replace(":", "-")), world, target, lo, hi, nrows, parts)
    world.Barrier()
    t = time.perf_counter() - t0
    expect = np.empty_like(target)
    fill(expect, lo)
    if not np.array_equal(target, expect):
        raise SystemExit(f"compare: {name} first load read wrong data on rank {rank}")
    if "torch-dcp" in methods:
        methods["torch-dcp"].close()
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"time": t}, f)


def worker(args) -> None:
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    m = args.reshard_ranks
    nrows = args.nrows
    sub = world.Split(0 if rank < m else MPI.UNDEFINED, rank)
    methods, skipped = make_methods(args.methods.split(","), world, m, args.ranks_per_node)
    names = [n for n in args.methods.split(",") if n in methods]

    lo, hi = rows_of(nrows, size, rank)
    writer_parts = [rows_of(nrows, size, r) for r in range(size)]
    state = np.empty((hi - lo, NCOLS), np.float64)
    fill(state, lo)
    target = np.empty_like(state)
    if sub != MPI.COMM_NULL:
        lo3, hi3 = rows_of(nrows, m, rank)
        expect3 = np.empty((hi3 - lo3, NCOLS), np.float64)
        fill(expect3, lo3)
        target3 = np.empty_like(expect3)
    ops = ("save",) if args.save_only else OPS if args.cold else ("save", "load", "reshard")

    counter = None
    if os.environ.get("CMP_THROTTLE_STATE"):
        fd = os.open(os.environ["CMP_THROTTLE_STATE"], os.O_RDWR)
        counter = mmap.mmap(fd, 4096)
        os.close(fd)

    def throttled_bytes():
        return struct.unpack_from("<Q", counter, 8)[0] if counter is not None else 0

    def timed(comm, fn):
        comm.Barrier()
        t0 = time.perf_counter()
        fn()
        comm.Barrier()
        return comm.bcast(time.perf_counter() - t0, root=0)

    def idle_wait():
        req = world.Ibarrier()
        while not req.Test():
            time.sleep(0.002)

    times: dict = {}
    tbytes: dict = {}
    scratch = np.ones(state.nbytes + (1 << 20), np.uint8) if args.same_files else None

    def same_files_cold(d, rec):
        """--same-files: the raw cold read of the method's own files, timed like its loads."""
        if rank == 0:
            drop_cache(d)
        world.Barrier()
        rec.setdefault("same files cold", []).append(timed(world, lambda: read_files_raw(d, rank, size, scratch)))

    def one(name, d, nrows, lo, hi, parts, state, target, lo3, hi3, expect3, target3, rec, same_first=True):
        """Save, then every load, of one method into the fresh directory d; rec None: untimed (warm-up).
        ``same_first``: with --same-files, the raw read of the files comes before the cold load, else after it
        (alternated over the repeats: on this VM a first cold read after a save and a second differ)."""
        meth = methods[name]
        rec = rec if rec is not None else {}
        if rank == 0:
            os.makedirs(os.path.dirname(d), exist_ok=True)
            if not name.startswith("hpcckpt") and name != "torch-dcp":
                os.makedirs(d)  # hpcckpt and DCP create their directory themselves
        world.Barrier()
        b0 = throttled_bytes()
        rec.setdefault("save", []).append(timed(world, lambda: meth.save(d, world, state, lo, hi, nrows)))
        if counter is not None and rank == 0:
            rec.setdefault("throttled", []).append(throttled_bytes() - b0)
        for op in ("load", "load cold"):
            if op not in ops:
                continue
            target.fill(0.0)
            same_files = op == "load cold" and args.same_files
            if same_files and same_first:
                same_files_cold(d, rec)
            if op == "load cold":
                if rank == 0:
                    drop_cache(d)
                world.Barrier()
            rec.setdefault(op, []).append(timed(world, lambda: meth.load(d, world, target, lo, hi, nrows, parts)))
            if not np.array_equal(target, state):
                raise SystemExit(f"compare: {name} {op} read wrong data on rank {rank}")
            if same_files and not same_first:
                same_files_cold(d, rec)
        if "reshard" in ops:
            if sub == MPI.COMM_NULL:
                idle_wait()
            else:
                for op in ("reshard", "reshard cold"):
                    if op not in ops:
                        continue
                    target3.fill(0.0)
                    if op == "reshard cold":
                        if rank == 0:
                            drop_cache(d)
                        sub.Barrier()
                    t = timed(sub, lambda: meth.load(d, sub, target3, lo3, hi3, nrows, parts))
                    if rank == 0:
                        rec.setdefault(op, []).append(t)
                    if not np.array_equal(target3, expect3):
                        raise SystemExit(f"compare: {name} {op} read wrong data on rank {rank}")
                world.Ibarrier().Wait()
        world.Barrier()
        if rank == 0:
            shutil.rmtree(d)
        world.Barrier()

    base = args.base
    # untimed warm-up of every method on a small array of the same layout (first-call costs: lazy imports,
    # process-group and planner set-up), so the repeats measure steady-state checkpointing
    wn = 8 * size * m
    wlo, whi = rows_of(wn, size, rank)
    wstate = np.empty((whi - wlo, NCOLS))
    fill(wstate, wlo)
    wparts = [rows_of(wn, size, r) for r in range(size)]
    wlo3, whi3 = rows_of(wn, m, rank)
    wexp3 = np.empty((max(0, whi3 - wlo3), NCOLS))
    fill(wexp3, wlo3)
    for name in names:
        one(name, os.path.join(base, "warmup", name.replace(":", "-")), wn, wlo, whi, wparts, wstate,
            np.empty_like(wstate), wlo3, whi3, wexp3, np.empty_like(wexp3), None)
    for name in names:
        if isinstance(methods[name], Hpcckpt):
            methods[name].chosen.clear()
    if rank == 0:
        print(f"  [{args.scenario}] warm-up done", flush=True)

    for rep in range(args.repeats):
        k = rep % len(names)
        order = names[k:] + names[:k]
        for name in order:
            rec = times.setdefault(name, {})
            one(name, os.path.join(base, f"rep{rep}", name.replace(":", "-")), nrows, lo, hi, writer_parts,
                state, target, lo3 if sub != MPI.COMM_NULL else 0, hi3 if sub != MPI.COMM_NULL else 0,
                expect3 if sub != MPI.COMM_NULL else None, target3 if sub != MPI.COMM_NULL else None, rec, same_first=rep % 2 == 0)
            if "throttled" in rec:
                tbytes.setdefault(name, []).extend(rec.pop("throttled"))
        if rank == 0:
            print(f"  [{args.scenario}] repeat {rep + 1}/{args.repeats} done", flush=True)

    chosen = {n: methods[n].chosen for n in names if isinstance(methods[n], Hpcckpt)}
    if "torch-dcp" in methods:
        methods["torch-dcp"].close()
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"scenario": args.scenario, "ranks": size, "reshard_ranks": m, "nrows": nrows,
                       "bytes": nrows * NCOLS * 8, "times": times, "skipped": skipped, "chosen": chosen,
                       "throttled_bytes": tbytes}, f, indent=1)


# ============================================================================ driver

def build_throttle(workdir: str) -> str | None:
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return None
    src = os.path.join(workdir, "throttle.c")
    lib = os.path.join(workdir, "libcmpthrottle.so")
    with open(src, "w") as f:
        f.write(THROTTLE_C)
    r = subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", lib, src, "-ldl"], capture_output=True, text=True)
    if r.returncode != 0:
        print(r.stderr, file=sys.stderr)
        return None
    return lib


def run_scenario(args, name, ranks, nrows, reshard, workdir, env_extra, save_only=False):
    base = os.path.join(workdir, name)
    os.makedirs(base)
    out = os.path.join(workdir, f"{name}.json")
    env = dict(os.environ)
    if args.mpich_yield:
        env.update(MPIR_CVAR_CH4_PROGRESS_THROTTLE="1", MPIR_CVAR_POLLS_BEFORE_YIELD="1")
    env.update(env_extra)
    env.setdefault("OMP_NUM_THREADS", "1")
    cmd = [args.mpiexec, "-n", str(ranks), sys.executable, os.path.abspath(__file__), "--worker",
           "--scenario", name, "--nrows", str(nrows), "--reshard-ranks", str(reshard), "--base", base,
           "--out", out, "--methods", args.methods,
           "--repeats", str(args.small_repeats if name == "small" else args.repeats)]
    if args.same_files:
        cmd.append("--same-files")
    if env_extra.get("HPCCKPT_RANKS_PER_NODE"):
        cmd += ["--ranks-per-node", env_extra["HPCCKPT_RANKS_PER_NODE"]]
    if not args.cold:
        cmd.append("--no-cold")
    if save_only:
        cmd.append("--save-only")
    print(f"[{name}] {ranks} ranks, {nrows * NCOLS * 8 / MIB:.0f} MiB, reshard {ranks} -> {reshard}"
          + (", saves only" if save_only else "") + (f", env {env_extra}" if env_extra else ""), flush=True)
    t0 = time.time()
    r = subprocess.run(cmd, env=env)
    if r.returncode != 0 or not os.path.exists(out):
        print(f"[{name}] FAILED (exit {r.returncode})", flush=True)
        return None
    print(f"[{name}] {time.time() - t0:.0f} s", flush=True)
    with open(out) as f:
        return json.load(f)


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def paired(a, b):
    """Median over repeats of a[i] / b[i]."""
    return statistics.median(x / y for x, y in zip(a, b)) if a and b else float("nan")


def run_first(args, name, nrows, workdir, rpn=None):
    """Fresh-process first loads: one job saves every method, then per repeat one new mpiexec per method (order
    rotating) loads it once into an untouched target; files in the page cache.  ``{"times": {method: {"first
    load": [s, ...]}}}``."""
    base = os.path.join(workdir, name)
    os.makedirs(base)
    env = dict(os.environ)
    if args.mpich_yield:
        env.update(MPIR_CVAR_CH4_PROGRESS_THROTTLE="1", MPIR_CVAR_POLLS_BEFORE_YIELD="1")
    env.setdefault("OMP_NUM_THREADS", "1")
    names = [n for n in args.methods.split(",") if n]
    out = os.path.join(workdir, f"{name}.json")

    def job(mode):
        cmd = [args.mpiexec, "-n", "4", sys.executable, os.path.abspath(__file__), "--worker", "--first", mode,
               "--scenario", name, "--nrows", str(nrows), "--base", base, "--out", out, "--methods", ",".join(names)]
        if os.path.exists(out):
            os.unlink(out)
        r = subprocess.run(cmd, env=env)
        if r.returncode != 0 or not os.path.exists(out):
            print(f"[{name}] {mode} FAILED (exit {r.returncode})", flush=True)
            return None
        with open(out) as f:
            return json.load(f)

    print(f"[{name}] 4 ranks, {nrows * NCOLS * 8 / MIB:.0f} MiB, a new job per first load", flush=True)
    saved = job("save")
    if saved is None:
        return None
    skipped = saved["skipped"]
    names = [n for n in names if n not in skipped]
    times: dict = {}
    for rep in range(args.repeats):
        k = rep % len(names)
        for m in names[k:] + names[:k]:
            got = job(m)
            if got and "time" in got:
                times.setdefault(m, {}).setdefault("first load", []).append(got["time"])
    return {"times": times, "skipped": skipped, "chosen": {}, "bytes": nrows * NCOLS * 8, "ranks": 4,
            "reshard_ranks": 4}


PEERS = ("raw", "h5py", "adios2", "torch-dcp")


def best_peer(times: dict, op: str) -> list:
    """Per repeat, the fastest peer's time of ``op`` (the peers that ran it every repeat)."""
    have = [times[p][op] for p in PEERS if p in times and op in times[p]]
    n = min((len(x) for x in have), default=0)
    return [min(x[i] for x in have) for i in range(n)]


def report(results: dict, args) -> list[tuple]:
    header = ["scenario", "method", "save s", "save GiB/s", "save/raw", "load s", "load cold s",
              "reshard s", "reshard cold s", "first load s", "note"]
    rows = []
    for scen, res in results.items():
        times = res["times"]
        raw = times.get("raw", {}).get("save", [])
        for name, rec in times.items():
            note = ""
            if name in res["chosen"] and name.endswith("auto"):
                note = "chose " + ",".join(sorted(set(res["chosen"][name])))
            if name in res.get("throttled_bytes", {}):
                note = (note + "; " if note else "") + \
                    f"throttled {med(res['throttled_bytes'][name]) / MIB:.0f} MiB"
            def cell(op, rec=rec, name=name, times=times):
                if op not in rec:
                    return "-"
                best = best_peer(times, op)
                if name.startswith("hpcckpt") and best:
                    return f"{med(rec[op]):.3f} ({paired(rec[op], best):.2f}x)"
                return f"{med(rec[op]):.3f}"

            rows.append([scen, name, cell("save"),
                         f"{res['bytes'] / GIB / med(rec['save']):.2f}" if "save" in rec else "-",
                         f"{paired(rec['save'], raw):.2f}" if raw and "save" in rec else "-", cell("load"),
                         cell("load cold"), cell("reshard"), cell("reshard cold"), cell("first load"), note])
    print()
    print(f"Seconds, median of {args.repeats} repeats ({args.small_repeats} for small; slowest rank); "
          "save/raw = median of per-repeat ratios; reshard = load on the smaller rank count; (N.NNx) after an "
          "hpcckpt figure: median of its per-repeat ratios to the best peer of that repeat (raw, h5py, ADIOS2, "
          "torch DCP); first load: a new mpiexec per load, untouched target, files in the page cache")
    print_table(header, rows)

    # ---- targets
    checks = []

    def check(what, value, ok, detail):
        checks.append((what, value, "PASS" if ok else "FAIL", detail))

    fixed = [f"hpcckpt:{s}" for s in STRATEGIES if s != "auto"]
    for scen, res in results.items():
        times = res["times"]
        ceiling = 1.05 if res["bytes"] / res["ranks"] >= 64 * MIB else 1.2  # the targets: at least as fast as the best peer
        for s in [n for n in times if n.startswith("hpcckpt")]:  # every hpcckpt figure against the best peer
            for op in ("load", "load cold", "reshard", "reshard cold", "first load", "save"):
                best = best_peer(times, op)
                if op in times[s] and best:
                    r = paired(times[s][op], best)
                    check(f"[{scen}] {s.split(':')[1]} {op} <= {ceiling}x best peer", f"{r:.2f}x", r <= ceiling,
                          f"{med(times[s][op]):.3f} s against {med(best):.3f} s")
        if scen.startswith("first"):
            continue
        have = [s for s in fixed if s in times]
        if not have:
            continue
        best = min(have, key=lambda s: med(times[s]["save"]))
        if scen == "big":
            if "raw" in times:
                r = paired(times[best]["save"], times["raw"]["save"])
                check(f"[{scen}] best strategy save <= 1.1x raw", f"{r:.2f}x", r <= 1.1, f"best = {best}")
            if "torch-dcp" in times:
                r = paired(times["torch-dcp"]["save"], times[best]["save"])
                ceil = paired(times["torch-dcp"]["save"], times["raw"]["save"]) if "raw" in times else float("nan")
                check(f"[{scen}] best strategy save >= 2x faster than torch DCP", f"{r:.2f}x", r >= 2.0,
                      f"best = {best}; ceiling: torch DCP / raw = {ceil:.2f}x")
                for op in ("reshard", "reshard cold"):
                    if op in times["torch-dcp"] and "hpcckpt:auto" in times:
                        r = paired(times["torch-dcp"][op], times["hpcckpt:auto"][op])
                        worst = max((s for s in fixed + ["hpcckpt:auto"] if s in times),
                                    key=lambda s: med(times[s][op]))
                        rw = paired(times["torch-dcp"][op], times[worst][op])
                        ceil = paired(times["torch-dcp"][op], times["raw"][op]) if "raw" in times else float("nan")
                        check(f"[{scen}] {op} 4->3 >= 5x faster than torch DCP", f"{r:.2f}x", r >= 5.0,
                              f"auto's checkpoint; slowest strategy ({worst}) {rw:.2f}x; "
                              f"ceiling: torch DCP / raw = {ceil:.2f}x")
        if "hpcckpt:auto" in times:
            r = paired(times["hpcckpt:auto"]["save"], times[best]["save"])
            chose = ",".join(sorted(set(res["chosen"].get("hpcckpt:auto", []))))
            check(f"[{scen}] auto save within 10% of best fixed", f"{r:.2f}x", r <= 1.10,
                  f"auto chose {chose}; best = {best} ({med(times[best]['save']):.3f} s); "
                  + ", ".join(f"{s.split(':')[1]} {med(times[s]['save']):.3f}" for s in have))
        if "raw" in times:  # every strategy's loads against the raw read of the same bytes, same ranks
            for s in have + (["hpcckpt:auto"] if "hpcckpt:auto" in times else []):
                for op, ceiling in (("load", 1.2), ("reshard", 1.2), ("load cold", 1.1), ("reshard cold", 1.1)):
                    if op in times[s] and op in times["raw"]:
                        r = paired(times[s][op], times["raw"][op])
                        check(f"[{scen}] {s.split(':')[1]} {op} <= {ceiling}x raw", f"{r:.2f}x", r <= ceiling,
                              f"{med(times[s][op]):.3f} s against raw {med(times['raw'][op]):.3f} s")
                if "same files cold" in times[s]:  # --same-files: against a raw read of the method's own files
                    r = paired(times[s]["load cold"], times[s]["same files cold"])
                    check(f"[{scen}] {s.split(':')[1]} load cold <= 1.1x raw read of its files", f"{r:.2f}x",
                          r <= 1.1, f"{med(times[s]['load cold']):.3f} s against "
                          f"{med(times[s]['same files cold']):.3f} s (raw's own files: "
                          f"{med(times['raw'].get('same files cold', [])):.3f} s)")
        if scen == "small" and "hpcckpt:aggregated" in times and "hpcckpt:file-per-rank" in times:
            r = paired(times["hpcckpt:file-per-rank"]["save"], times["hpcckpt:aggregated"]["save"])
            check(f"[{scen}] aggregated save beats file-per-rank", f"{r:.2f}x", r > 1.0,
                  "file-per-rank / aggregated")
    print()
    print("Targets (paired per-repeat ratios, median)")
    print_table(["target", "ratio", "result", "detail"], checks)
    return checks


def chart(results: dict, png: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no matplotlib: no chart")
        return
    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results) + 2, 4.8), squeeze=False)
    names = list(ALL_METHODS)
    cmap = plt.get_cmap("tab10")
    for ax, (scen, res) in zip(axes[0], results.items()):
        ops = [op for op in OPS + ("first load",) if any(op in rec for rec in res["times"].values())]
        present = [n for n in names if n in res["times"]]
        w = 0.8 / max(1, len(present))
        for i, n in enumerate(present):
            rec = res["times"][n]
            ys = [res["bytes"] / GIB / med(rec[op]) if op in rec else 0 for op in ops]
            ax.bar([j + i * w for j in range(len(ops))], ys, w, label=n, color=cmap(names.index(n)))
        ax.set_xticks([j + 0.4 - w / 2 for j in range(len(ops))])
        ax.set_xticklabels(ops, rotation=20)
        ax.set_ylabel("GiB/s (data / median time)")
        ax.set_title(f"{scen}: {res['ranks']} ranks, {res['bytes'] / MIB:.0f} MiB"
                     + (f", reshard -> {res['reshard_ranks']}" if len(ops) > 1 else ""))
        ax.grid(axis="y", alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, loc="lower center", ncol=len(labels))
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    os.makedirs(os.path.dirname(os.path.abspath(png)), exist_ok=True)
    fig.savefig(png, dpi=110)
    print(f"chart: {png}")


def driver(args) -> None:
    wanted = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    parent = args.dir or tempfile.gettempdir()
    workdir = os.path.realpath(tempfile.mkdtemp(prefix="hpcckpt-compare-", dir=parent))
    print(f"compare: files under {workdir}; methods {args.methods}", flush=True)
    results = {}
    sizes = [float(x) for x in args.per_rank_mib.split(",")] if args.per_rank_mib else [None]
    try:
        for per_rank in sizes:
            tag = "" if per_rank is None else f"@{per_rank:g}MiB"
            big_rows = ((args.size_mib << 20) // (NCOLS * 8) if per_rank is None
                        else 4 * max(1, int(per_rank * (1 << 20)) // (NCOLS * 8)))
            small_mib = args.small_mib if per_rank is None else per_rank
            if "big" in wanted:
                results["big" + tag] = run_scenario(args, "big" + tag, 4, big_rows, 3, workdir, {})
            if "small" in wanted:
                n = args.small_ranks * max(1, int(small_mib * (1 << 20)) // (NCOLS * 8))
                results["small" + tag] = run_scenario(args, "small" + tag, args.small_ranks, n,
                                                      args.small_ranks * 3 // 4, workdir,
                                                      {"HPCCKPT_RANKS_PER_NODE": "4"})
            if "first" in wanted:
                results["first" + tag] = run_first(args, "first" + tag, big_rows, workdir)
            if "throttled" in wanted:
                lib = build_throttle(workdir)
                if lib is None:
                    print("[throttled] SKIPPED: no C compiler to build the write-throttle shim")
                else:
                    state = os.path.join(workdir, f"throttle{tag}.state")
                    with open(state, "wb") as f:
                        f.write(b"\0" * 4096)
                    env = {"LD_PRELOAD": lib, "CMP_THROTTLE_STATE": state,
                           "CMP_THROTTLE_BPS": str(int(args.throttle_mbps * 1e6)),
                           "CMP_THROTTLE_PREFIX": os.path.join(workdir, "throttled" + tag) + "/"}
                    results["throttled" + tag] = run_scenario(args, "throttled" + tag, 4, big_rows, 3, workdir, env,
                                                              save_only=True)
    finally:
        if args.keep_json:
            for name in results:
                shutil.copy(os.path.join(workdir, f"{name}.json"), args.keep_json.replace("{scenario}", name))
        shutil.rmtree(workdir, ignore_errors=True)
    results = {k: v for k, v in results.items() if v}
    if not results:
        raise SystemExit("compare: no scenario finished")
    print()
    for scen, res in results.items():
        for name, why in res["skipped"].items():
            print(f"[{scen}] {name} SKIPPED: {why}")
    checks = report(results, args)
    if args.png:
        chart(results, args.png)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": results, "checks": checks}, f, indent=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mib", type=int, default=512, help="global array of the big/throttled scenarios (512)")
    ap.add_argument("--small-ranks", type=int, default=16, help="ranks of the small scenario (16)")
    ap.add_argument("--small-mib", type=float, default=4, help="MiB per rank of the small scenario (4)")
    ap.add_argument("--throttle-mbps", type=float, default=300.0, help="aggregate write MB/s when throttled (300)")
    ap.add_argument("--repeats", type=int, default=3, help="repeats of every method, big/throttled (3)")
    ap.add_argument("--small-repeats", type=int, default=5, help="repeats of the small scenario (5)")
    ap.add_argument("--scenarios", default="big,small,throttled,first",
                    help="big, small, throttled, first (a new mpiexec per first load, untouched target)")
    ap.add_argument("--per-rank-mib", default=None,
                    help="run every scenario at each of these MiB per rank (e.g. 1,64) instead of --size-mib and "
                         "--small-mib")
    ap.add_argument("--methods", default=",".join(ALL_METHODS))
    ap.add_argument("--same-files", action="store_true",
                    help="before each cold load, time a raw cold read of the method's own files (same bytes)")
    ap.add_argument("--no-cold", dest="cold", action="store_false", help="skip the cold-cache loads")
    ap.add_argument("--no-mpich-yield", dest="mpich_yield", action="store_false",
                    help="do not set MPIR_CVAR_CH4_PROGRESS_THROTTLE/POLLS_BEFORE_YIELD")
    ap.add_argument("--mpiexec", default=os.path.join(os.path.dirname(sys.executable), "mpiexec"))
    ap.add_argument("--dir", default=None, help="parent of the scratch directory (default: the temp dir)")
    ap.add_argument("--png", default=os.path.join(HERE, "..", "docs", "img", "compare.png"),
                    help="bar chart (default docs/img/compare.png; '' for none)")
    ap.add_argument("--json", default=None, help="write all timings and target checks here")
    ap.add_argument("--keep-json", default=None, help=argparse.SUPPRESS)
    # worker-only
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--scenario", help=argparse.SUPPRESS)
    ap.add_argument("--nrows", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--reshard-ranks", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--ranks-per-node", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--base", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--save-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--first", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        if "hpcckpt" not in sys.modules:
            try:
                import hpcckpt  # noqa: F401
            except ImportError:
                sys.path.insert(0, os.path.dirname(HERE))
        first_load_worker(args) if args.first else worker(args)
    else:
        driver(args)


if __name__ == "__main__":
    main()
