#!/usr/bin/env python3
"""A 2-D heat equation on a Cartesian process grid, checkpointed with hpcckpt.

Run it under MPI, for example::

    mpiexec -n 4 python apps/heat2d.py --root run/ckpt --steps 400 --every 50 --out run/final

What it computes
    The global field ``u`` has ``ny x nx`` cells.  Every step, each cell moves
    towards the mean of its four neighbours (explicit 5-point stencil).  Outside
    the domain the temperature is held fixed: 1.0 above the top edge, 0.0 on the
    other three sides.  The initial field is a function of the global cell index
    only (two hot discs plus a little integer-hash "noise"), so it is the same
    whatever the number of ranks.

    A few "tracer particles" wander over the grid on integer paths and add up the
    temperature of the cell they sit on ("dose").  Each tracer lives on the rank
    that owns its cell and migrates between ranks as it moves; in a checkpoint the
    tracers are an ``hpcckpt.Ragged`` table (a structured dtype), so a restart on
    another number of ranks gets an even share of them and sends each to its owner.

How it is parallelised
    ``MPI.Compute_dims`` picks a process grid (4 ranks: 2 x 2; 3 ranks: 3 x 1),
    ``comm.Create_cart`` builds it, each rank owns one rectangle of cells plus a
    one-cell halo, and neighbours exchange halos with ``Sendrecv`` every step.

Why a restart is bitwise identical on any process grid
    Each new cell value is ``c + r*((n + s) + (w + e) - 4*c)``, evaluated
    elementwise by numpy in that fixed order from the same neighbour values, and
    the tracers use integer arithmetic plus one addition per step: no sums over
    ranks, no reductions whose order depends on the decomposition.  So an
    uninterrupted run, a run stopped and restarted, and a run on another number
    of ranks give the same bits.

Checkpointing
    ``--root DIR`` holds numbered versions (``hpcckpt.Checkpointer``, newest
    ``--keep`` kept), one every ``--every`` steps and one at the end.  At start,
    if the root holds a committed version, the run restores the newest valid one
    and continues from its step.  ``--out DIR`` receives the final state as one
    checkpoint directory (``hpcckpt.open(DIR).read("u")`` reads it back).

Output files
    ``--log FILE`` appends one text line per step (the step, the hottest and
    coldest cell, the temperature at the centre cell); ``--series FILE`` keeps
    the same figures in a binary time series whose header (the record count)
    is rewritten in place at every step (``SERIES_HEADER`` then one
    ``SERIES_RECORD`` per step).  Rank 0 writes both.  The figures are a
    maximum, a minimum and one cell, exact on any decomposition.  Both files
    are tracked by the Checkpointer (``files=``, docs/files.md): a restart
    rolls them back to the restored step, so after a crash and a restart
    (on any number of ranks) they are bitwise those of an uninterrupted run.

Resizing while running
    ``--resize-step S --resize-to N`` changes the number of ranks after step S
    (after that step's checkpoint, if it has one) without stopping:
    ``hpcckpt.redistribute`` moves the field and the tracers from the old
    process grid to one of N ranks in memory, and the Checkpointer continues on
    the new ranks (``Checkpointer.resize``).  Fewer ranks: the last ones hand
    their cells over and exit.  More ranks: rank 0 starts the missing ones with
    ``MPI.Comm_spawn`` (they run this script with ``--joined``) and the old and
    new ranks merge into one communicator.  The result is bitwise that of an
    uninterrupted run, for the reason above.

Stopping
    SIGUSR1, SIGTERM (a SLURM pre-emption or ``sbatch --signal``) or SIGINT
    (Ctrl-C of mpiexec) sets a flag, and ``hpcckpt halt ROOT`` writes a halt
    file; at the next step boundary all ranks agree (one small allreduce), save
    a checkpoint and exit with status 0, printing what stopped them (the
    signal's name, the halt file and its reason, or the deadline).  ``--kill-rank R --kill-step S`` makes
    rank R kill itself with a real SIGKILL after step S (after that step's
    checkpoint, if it has one): a crash, for the demo and the tests.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

import numpy as np
from mpi4py import MPI

try:
    import hpcckpt
except ModuleNotFoundError as exc:  # running from a source tree where hpcckpt is not installed
    if exc.name != "hpcckpt":
        raise
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import hpcckpt
from hpcckpt.policy import FixedSteps

#: Diffusion number alpha*dt/dx^2; the explicit scheme is stable for r <= 0.25.
R = 0.2
#: Fixed temperature outside the domain: above the top edge, and on the other three sides.
TOP, OTHER = 1.0, 0.0

#: The --series file: a header (magic, format version, number of records), rewritten at every step, then records.
SERIES_HEADER = np.dtype([("magic", "S4"), ("version", "<u4"), ("records", "<u8")])
SERIES_RECORD = np.dtype([("step", "<i8"), ("max", "<f8"), ("min", "<f8"), ("centre", "<f8")])

TRACER_DTYPE = np.dtype([("id", "<i8"), ("i", "<i8"), ("j", "<i8"), ("di", "<i8"), ("dj", "<i8"),
                         ("dose", "<f8")])


# --------------------------------------------------------------------------- decomposition

def bounds(n: int, parts: int) -> np.ndarray:
    """Start of each part when ``n`` cells are split into ``parts`` nearly equal parts (plus the end)."""
    return np.array([p * n // parts for p in range(parts + 1)], dtype=np.int64)


class Grid:
    """This rank's place in the Cartesian process grid and the cells it owns."""

    def __init__(self, comm, ny: int, nx: int):
        self.ny, self.nx = ny, nx
        self.dims = MPI.Compute_dims(comm.Get_size(), 2)
        self.cart = comm.Create_cart(self.dims, periods=[False, False], reorder=False)
        self.rank = self.cart.Get_rank()
        self.size = self.cart.Get_size()
        self.coords = self.cart.Get_coords(self.rank)
        self.ybounds, self.xbounds = bounds(ny, self.dims[0]), bounds(nx, self.dims[1])
        cy, cx = self.coords
        self.y0, self.y1 = int(self.ybounds[cy]), int(self.ybounds[cy + 1])
        self.x0, self.x1 = int(self.xbounds[cx]), int(self.xbounds[cx + 1])
        self.up, self.down = self.cart.Shift(0, 1)      # neighbours above (smaller row) and below
        self.left, self.right = self.cart.Shift(1, 1)   # neighbours left and right
        self.rank_of = np.array([[self.cart.Get_cart_rank([a, b]) for b in range(self.dims[1])]
                                 for a in range(self.dims[0])], dtype=np.int64)

    @property
    def shape(self) -> tuple[int, int]:
        return self.y1 - self.y0, self.x1 - self.x0

    def owner(self, i: np.ndarray, j: np.ndarray) -> np.ndarray:
        """The rank that owns global cells (i, j)."""
        cy = np.searchsorted(self.ybounds, i, side="right") - 1
        cx = np.searchsorted(self.xbounds, j, side="right") - 1
        return self.rank_of[cy, cx]


# --------------------------------------------------------------------------- the physics

def initial_field(grid: Grid) -> np.ndarray:
    """The initial temperature of this rank's cells, from global indices only (integer arithmetic)."""
    i = np.arange(grid.y0, grid.y1, dtype=np.int64)[:, None]
    j = np.arange(grid.x0, grid.x1, dtype=np.int64)[None, :]
    ny, nx = grid.ny, grid.nx
    u = np.zeros(grid.shape)
    for ci, cj, rad, temp in ((ny // 3, nx // 3, max(ny, nx) // 8, 1.0), (2 * ny // 3, 3 * nx // 5, max(ny, nx) // 6, 0.75)):
        u[(i - ci) ** 2 + (j - cj) ** 2 < rad * rad] = temp
    noise = ((i * 73856093) ^ (j * 19349663)) % 1000  # a deterministic hash of the cell index
    return u + noise.astype(np.float64) / 10000.0


def with_halo(grid: Grid, interior: np.ndarray) -> np.ndarray:
    """A (h+2) x (w+2) array: the interior plus a halo preset to the fixed outside temperatures."""
    h, w = grid.shape
    u = np.full((h + 2, w + 2), OTHER)
    if grid.y0 == 0:
        u[0, :] = TOP
    u[1:-1, 1:-1] = interior
    return u


def exchange_halo(grid: Grid, u: np.ndarray) -> None:
    """Fill the halo of ``u`` from the four neighbours; sides without one keep their fixed value."""
    cart = grid.cart
    # rows are contiguous: send them straight from the array
    cart.Sendrecv(u[1, 1:-1], dest=grid.up, recvbuf=u[-1, 1:-1], source=grid.down)
    cart.Sendrecv(u[-2, 1:-1], dest=grid.down, recvbuf=u[0, 1:-1], source=grid.up)
    # columns are strided: go through contiguous buffers
    h = u.shape[0] - 2
    send, recv = np.ascontiguousarray(u[1:-1, 1]), np.empty(h)
    cart.Sendrecv(send, dest=grid.left, recvbuf=recv, source=grid.right)
    if grid.right != MPI.PROC_NULL:
        u[1:-1, -1] = recv
    send = np.ascontiguousarray(u[1:-1, -2])
    cart.Sendrecv(send, dest=grid.right, recvbuf=recv, source=grid.left)
    if grid.left != MPI.PROC_NULL:
        u[1:-1, 0] = recv


def stencil(u: np.ndarray, out: np.ndarray) -> None:
    """One explicit step on the interior; each cell's expression is fixed, so results are decomposition-free."""
    c = u[1:-1, 1:-1]
    n, s, w, e = u[:-2, 1:-1], u[2:, 1:-1], u[1:-1, :-2], u[1:-1, 2:]
    out[1:-1, 1:-1] = c + R * ((n + s) + (w + e) - 4.0 * c)


def initial_tracers(grid: Grid, count: int) -> np.ndarray:
    """The tracers this rank owns at step 0 (positions and velocities from the tracer id only)."""
    ids = np.arange(count, dtype=np.int64)
    t = np.zeros(count, TRACER_DTYPE)
    t["id"] = ids
    t["i"] = (ids * 7919 + 11) % grid.ny
    t["j"] = (ids * 104729 + 17) % grid.nx
    t["di"] = ids % 3 - 1
    t["dj"] = (ids // 3) % 3 - 1
    return t[grid.owner(t["i"], t["j"]) == grid.rank]


def migrate(grid: Grid, tracers: np.ndarray) -> np.ndarray:
    """Send every tracer to the rank that owns its cell; returns the tracers this rank now owns."""
    owner = grid.owner(tracers["i"], tracers["j"]) if len(tracers) else np.empty(0, np.int64)
    if grid.cart.allreduce(int(np.count_nonzero(owner != grid.rank)), op=MPI.SUM) == 0:
        return tracers
    outgoing = [tracers[owner == r] for r in range(grid.size)]
    incoming = grid.cart.alltoall(outgoing)
    return np.concatenate(incoming) if incoming else tracers[:0]


def move_tracers(grid: Grid, tracers: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Move each tracer one cell along its velocity (wrapping around), migrate, add the local temperature."""
    tracers["i"] = (tracers["i"] + tracers["di"]) % grid.ny
    tracers["j"] = (tracers["j"] + tracers["dj"]) % grid.nx
    tracers = migrate(grid, tracers)
    li, lj = tracers["i"] - grid.y0 + 1, tracers["j"] - grid.x0 + 1
    tracers["dose"] = tracers["dose"] + u[li, lj]
    return tracers


# --------------------------------------------------------------------------- output files

def figures(grid: Grid, u: np.ndarray, step: int) -> np.ndarray:
    """One SERIES_RECORD (on every rank): the hottest and coldest cell and the centre cell, exact on any grid."""
    interior = u[1:-1, 1:-1]
    ci, cj = grid.ny // 2, grid.nx // 2
    mine = grid.y0 <= ci < grid.y1 and grid.x0 <= cj < grid.x1
    centre = float(interior[ci - grid.y0, cj - grid.x0]) if mine else -np.inf
    out = np.empty(3)
    grid.cart.Allreduce(np.array([interior.max(), -interior.min(), centre]), out, op=MPI.MAX)
    hi, lo, centre = out
    return np.array([(step, hi, -lo, centre)], SERIES_RECORD)


def start_outputs(args) -> None:
    """Rank 0, a run from step 0: empty output files (a restart has its files rolled back instead)."""
    if args.log:
        open(args.log, "w").close()
    if args.series:
        with open(args.series, "wb") as f:
            f.write(np.array([(b"H2DS", 1, 0)], SERIES_HEADER).tobytes())


def write_outputs(args, record: np.ndarray) -> None:
    """Rank 0: append the step's line to --log, its record to --series and update the series' header in place."""
    r = record[0]
    if args.log:
        with open(args.log, "a") as f:
            f.write(f"step {int(r['step'])} max {float(r['max'])!r} min {float(r['min'])!r} "
                    f"centre {float(r['centre'])!r}\n")
    if args.series:
        with open(args.series, "r+b") as f:
            header = np.frombuffer(f.read(SERIES_HEADER.itemsize), SERIES_HEADER).copy()
            f.seek(SERIES_HEADER.itemsize + int(header["records"][0]) * SERIES_RECORD.itemsize)
            f.write(record.tobytes())
            header["records"] += 1
            f.seek(0)
            f.write(header.tobytes())


# --------------------------------------------------------------------------- stopping cleanly

def step_boundary(ck, done: int):
    """Called by every rank after each step: checkpoint when due or when asked to stop.

    ``Checkpointer.maybe_save`` decides collectively (every ``--every`` steps, or at
    once when any rank got SIGUSR1/SIGTERM, or when the job's end time is near);
    ``should_exit`` is then True on every rank.  Returns (SaveResult or None, stop?).
    """
    result = ck.maybe_save(done)  # the registered state, read now
    return result, ck.should_exit()


# --------------------------------------------------------------------------- resizing while running

def resize(args, grid: Grid | None, ck, state: dict | None):
    """Move the state to a process grid of ``args.resize_to`` ranks; ``(grid, ck, u, tracers, step, link)``.

    Called at the same step by every rank of the old grid (``state``: what it
    holds) and, when growing, by the spawned ranks (``grid``, ``ck``,
    ``state`` None).  A rank that leaves gets None.  ``link``: the
    intercommunicator to the spawning or spawned ranks (None when shrinking),
    disconnected at the end of the run.
    """
    link = None
    if grid is None:  # spawned by a grow: merge with the ranks that spawned us
        link = MPI.Comm.Get_parent()
        span = link.Merge(high=True)
        ck = hpcckpt.Checkpointer.join(span)
    elif args.resize_to > grid.size:
        link = grid.cart.Spawn(sys.executable, [os.path.abspath(__file__), *args.argv, "--joined"],
                               maxprocs=args.resize_to - grid.size, root=0)
        span = link.Merge(high=False)  # the old ranks keep their numbers
        ck.resize(span)
    else:
        span = grid.cart
    new = span if args.resize_to >= span.Get_size() else span.Split(
        0 if span.Get_rank() < args.resize_to else MPI.UNDEFINED, span.Get_rank())
    new_grid = Grid(new, args.ny, args.nx) if new != MPI.COMM_NULL else None
    template = None
    if new_grid is not None:
        u = with_halo(new_grid, np.zeros(new_grid.shape))
        template = {"u": hpcckpt.Block(u[1:-1, 1:-1], offset=(new_grid.y0, new_grid.x0),
                                       global_shape=(args.ny, args.nx)),
                    "tracers": hpcckpt.Ragged(), "step": 0, "params": None}
    restored = hpcckpt.redistribute(span, state, template)
    if new_grid is None:
        ck.resize(None)
        return None
    ck.resize(new_grid.cart)  # the communicator the run continues on
    return new_grid, ck, u, migrate(new_grid, restored["tracers"].local), int(restored["step"]), link


# --------------------------------------------------------------------------- the program

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", required=True, help="checkpoint root (numbered versions live here)")
    p.add_argument("--nx", type=int, default=256, help="global cells along x (columns)")
    p.add_argument("--ny", type=int, default=256, help="global cells along y (rows)")
    p.add_argument("--steps", type=int, default=400, help="total number of steps of the whole run")
    p.add_argument("--every", type=int, default=50, help="checkpoint every this many steps (0: only at the end)")
    p.add_argument("--keep", type=int, default=3, help="keep the newest this many checkpoints")
    p.add_argument("--tracers", type=int, default=64, help="number of tracer particles")
    p.add_argument("--out", help="write the final state here as one checkpoint directory")
    p.add_argument("--log", help="append one line per step to this file (tracked: rolled back on restart)")
    p.add_argument("--series", help="binary time series, header rewritten in place each step (tracked likewise)")
    p.add_argument("--kill-rank", type=int, default=None, help="this rank SIGKILLs itself ...")
    p.add_argument("--kill-step", type=int, default=None, help="... after this step (a crash, for demos and tests)")
    p.add_argument("--sleep", type=float, default=0.0, help="pause this many seconds per step (demos and tests)")
    p.add_argument("--quiet", action="store_true", help="print only the start and the end")
    p.add_argument("--resize-step", type=int, default=None, help="after this step, change the number of ranks ...")
    p.add_argument("--resize-to", type=int, default=None, help="... to this many (hpcckpt.redistribute, in memory)")
    p.add_argument("--joined", action="store_true", help=argparse.SUPPRESS)  # a rank spawned by a resize
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.nx < 1 or args.ny < 1 or args.steps < 0 or args.every < 0 or args.keep < 1 or args.tracers < 0:
        p.error("--nx/--ny/--keep must be positive, --steps/--every/--tracers not negative")
    if (args.kill_rank is None) != (args.kill_step is None):
        p.error("--kill-rank and --kill-step go together")
    if (args.resize_step is None) != (args.resize_to is None) or (args.resize_to is not None and args.resize_to < 1):
        p.error("--resize-step and --resize-to go together, and --resize-to must be positive")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.joined:  # spawned by a grow: everything comes from the ranks that spawned us
        grid, ck, u, tracers, start, link = resize(args, None, None, None)
    else:
        link = None
        grid = Grid(MPI.COMM_WORLD, args.ny, args.nx)
    rank = grid.rank

    def say(msg: str) -> None:
        if rank == 0:
            print(f"[heat2d] {msg}", flush=True)

    if args.ny < grid.dims[0] or args.nx < grid.dims[1]:
        say(f"the {args.ny}x{args.nx} grid is too small for a {grid.dims[0]}x{grid.dims[1]} process grid")
        return 2
    params = {"nx": args.nx, "ny": args.ny, "r": R, "tracers": args.tracers}

    def make_state() -> dict:
        # read at every save (registered below): u and unew swap each step, tracers migrate, done advances
        return {"u": hpcckpt.Block(u[1:-1, 1:-1], offset=(grid.y0, grid.x0), global_shape=(args.ny, args.nx)),
                "tracers": hpcckpt.Ragged(tracers),
                "step": done, "params": params}

    if not args.joined:
        u = with_halo(grid, initial_field(grid))
        policy = FixedSteps(args.every) if args.every else FixedSteps(10**12)
        # signal handlers now, before the pids are printed: from then on a signal is never lost
        ck = hpcckpt.Checkpointer(args.root, comm=grid.cart, keep=args.keep, policy=policy, handle_signals=True,
                                  files=args.log)  # append-only
        if args.series:  # rewritten in place: only its 4 KiB blocks that changed since the last save are stored
            ck.track_files(args.series, mode="inplace", block_bytes=4096)
        pids = grid.cart.gather(os.getpid(), root=0)
        say(f"{grid.size} ranks on a {grid.dims[0]} x {grid.dims[1]} process grid, {args.ny} x {args.nx} cells, "
            f"{args.steps} steps; pids {' '.join(map(str, pids)) if pids else ''}")
        start = 0
        tracers = initial_tracers(grid, args.tracers)
    outputs = bool(args.log or args.series)
    ck.register(make_state)  # the safe form: the state is built when a save starts, never a stale buffer
    unew = u.copy()  # same fixed halo; interiors are overwritten each step
    if not args.joined and ck.latest() is not None:
        t0 = time.perf_counter()
        template = {"u": hpcckpt.Block(u[1:-1, 1:-1], offset=(grid.y0, grid.x0), global_shape=(args.ny, args.nx)),
                    "tracers": hpcckpt.Ragged(), "step": 0, "params": None}
        restored = ck.restore(template)
        if restored["params"] != params:
            say(f"the checkpoint under {args.root} was written with {restored['params']}, not {params}: "
                "use the same --nx/--ny/--tracers, or another --root")
            ck.close()  # a usage error, not a failure of the machine
            return 2
        start = int(restored["step"])
        tracers = migrate(grid, restored["tracers"].local)
        unew[...] = u
        saved_by = hpcckpt.open(ck.last_restored).meta.nranks if rank == 0 else None
        say(f"restored step {start} from {ck.last_restored} in {time.perf_counter() - t0:.3f} s "
            f"(saved by {saved_by} ranks, restored on {grid.size}: hpcckpt resharded it)")
    elif not args.joined:
        say(f"no checkpoint under {args.root}: starting from step 0")
        if rank == 0:
            start_outputs(args)

    t_run = time.perf_counter()
    done = start
    for step in range(start, args.steps):
        exchange_halo(grid, u)
        stencil(u, unew)
        u, unew = unew, u
        tracers = move_tracers(grid, tracers, u)
        done = step + 1
        if outputs:
            record = figures(grid, u, done)
            if rank == 0:
                write_outputs(args, record)
        if args.sleep:
            time.sleep(args.sleep)
        result, stopping = step_boundary(ck, done)
        if result is not None:
            if not args.quiet or stopping:
                say(f"step {done}/{args.steps}: checkpoint saved to {result.path} "
                    f"({result.bytes_written / 1024:.0f} KiB, {sum(result.timings.values()) * 1000:.0f} ms)")
        if stopping:
            say(f"stopping ({ck.stop_reason}): stopped cleanly after step {done} with a checkpoint; "
                "run the same command again to continue")
            ck.close()
            return 0
        if args.kill_rank == rank and args.kill_step == done:
            print(f"[heat2d] rank {rank}: simulating a crash: SIGKILL to myself (pid {os.getpid()}) "
                  f"after step {done}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        if args.resize_step == done and not args.joined:
            t0 = time.perf_counter()
            old_size = grid.size
            resized = resize(args, grid, ck, make_state())
            if resized is None:  # this rank left: its cells live on in the others
                return 0
            grid, ck, u, tracers, _, link = resized
            unew, rank = u.copy(), grid.rank
            say(f"step {done}: resized from {old_size} to {grid.size} ranks in memory "
                f"({time.perf_counter() - t0:.3f} s)")
    elapsed = time.perf_counter() - t_run
    if ck.latest() != done:  # always finish with a checkpoint of the last step: a rerun then has nothing to do
        ck.save(step=done)
    ck.close()
    say(f"finished {done - start} steps in {elapsed:.2f} s (steps {start}..{done})")
    if args.out:
        hpcckpt.save(make_state, args.out, comm=grid.cart, step=done, overwrite=True)
        if rank == 0:
            view = hpcckpt.open(args.out)
            field = view.read("u")
            say(f"final state written to {args.out}: u {field.shape}, "
                f"mean temperature {float(field.mean()):.6f}, {len(view.read('tracers'))} tracers")
    if link is not None:
        link.Disconnect()  # the spawning and the spawned ranks part together
    return 0

if __name__ == "__main__":
    with hpcckpt.report_errors(MPI.COMM_WORLD):  # a CheckpointError: one line from rank 0; else traceback + Abort
        sys.exit(main())
