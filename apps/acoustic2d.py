#!/usr/bin/env python3
"""A 2-D acoustic wave equation in Devito, checkpointed with hpcckpt.

Run it under MPI, with Devito's MPI mode on and the MPI of mpi4py first on PATH
(Devito compiles its operator with the ``mpicc`` it finds there)::

    DEVITO_MPI=1 mpiexec -n 2 python apps/acoustic2d.py --root run/ckpt --steps 300 --every 50 --out run/final

What it computes
    ``m u_tt - laplace(u) = s(x, y) r(t)`` on an ``n x n`` grid of 10 m
    spacing (``TimeFunction`` with space order 8, two time steps back), with
    ``m = 1/v^2`` for a two-layer velocity model (1.5 km/s above 2.5 km/s), a
    Ricker wavelet ``r`` of 15 Hz and a Gaussian source ``s`` at the centre of
    the top third.  The source is written in the equation itself, so nothing
    of it is state: a restart recomputes it.

Checkpointing
    The state is the wavefield, all three of its time buffers, through
    ``hpcckpt.adapters.block(u)`` (its global shape and this rank's offset come
    from Devito's distributor; halos are not saved: Devito's operator exchanges
    them at its next run), and the number of time steps done.  The operator
    runs ``--every`` steps at a time; a checkpoint follows each run, one more at
    the end.  At start, a root that holds a committed version is restored from
    and the run continues from its step, on any number of ranks.

Crash and output
    ``--kill-rank R --kill-step S`` makes rank R kill itself with a real
    SIGKILL after the checkpoint of step S.  ``--out DIR`` receives the final
    wavefield as one checkpoint directory (``hpcckpt.open(DIR).read("u")``).
"""

from __future__ import annotations

import argparse
import os
import signal

import numpy as np
import sympy
from devito import Eq, Function, Grid, Operator, TimeFunction, solve

import hpcckpt
from hpcckpt.adapters import block

SPACING = 10.0  # m
DT = 1.0  # ms
F0 = 0.015  # kHz: a 15 Hz Ricker wavelet
T0 = 1.0 / F0  # its peak, ms


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", required=True, help="checkpoint root (numbered versions live here)")
    p.add_argument("--n", type=int, default=101, help="grid points along each axis")
    p.add_argument("--steps", type=int, default=300, help="time steps of the whole run")
    p.add_argument("--every", type=int, default=50, help="checkpoint every this many steps")
    p.add_argument("--out", help="write the final wavefield here as one checkpoint directory")
    p.add_argument("--kill-rank", type=int, default=None, help="this rank SIGKILLs itself ...")
    p.add_argument("--kill-step", type=int, default=None, help="... after the checkpoint of this step")
    args = p.parse_args(argv)
    if (args.kill_rank is None) != (args.kill_step is None):
        p.error("--kill-rank and --kill-step go together")
    return args


def model(n: int):
    """The grid, the wavefield u, and the operator that advances it one or more steps."""
    grid = Grid(shape=(n, n), extent=(SPACING * (n - 1),) * 2)
    x, y = grid.dimensions
    velocity = np.full((n, n), 1.5, dtype=np.float32)
    velocity[:, n // 2:] = 2.5  # the second axis is depth
    m = Function(name="m", grid=grid, space_order=8)
    m.data[:] = 1.0 / velocity**2  # the global array: each rank keeps its part
    src = Function(name="s", grid=grid, space_order=8)
    ix, iy = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    src.data[:] = np.exp(-((ix - n // 2) ** 2 + (iy - n // 3) ** 2) / 4.0).astype(np.float32)
    u = TimeFunction(name="u", grid=grid, time_order=2, space_order=8)
    t = grid.time_dim * DT - T0
    ricker = (1 - 2 * (np.pi * F0 * t) ** 2) * sympy.exp(-(np.pi * F0 * t) ** 2)
    pde = m * u.dt2 - u.laplace - src * ricker
    return grid, u, Operator([Eq(u.forward, solve(pde, u.forward))])


def main(argv=None) -> int:
    args = parse_args(argv)
    grid, u, op = model(args.n)
    comm = grid.distributor.comm
    done = 0  # time steps computed: u's newest time index is done + 1 (u[0] and u[1] start at rest)

    def say(msg: str) -> None:
        if comm.rank == 0:
            print(f"[acoustic2d] {msg}", flush=True)

    ck = hpcckpt.Checkpointer(args.root, comm=comm, keep=2)
    ck.register(lambda: {"u": block(u), "step": done})
    if ck.latest() is not None:
        done = ck.restore()["step"]
        say(f"restored step {done} from {ck.last_restored} on {comm.size} ranks")
    while done < args.steps:
        last = min(done + args.every, args.steps)
        op.apply(time_m=done + 1, time_M=last, dt=DT)  # computes u at the time indices done + 2 .. last + 1
        done = last
        ck.save(done)
        if args.kill_rank == comm.rank and args.kill_step == done:
            print(f"[acoustic2d] rank {comm.rank}: SIGKILL to myself after step {done}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
    ck.close()
    if args.out:
        hpcckpt.save({"u": block(u), "step": done}, args.out, comm=comm)
    say(f"done: {done} steps on {comm.size} ranks")
    return 0


if __name__ == "__main__":
    with hpcckpt.report_errors():
        raise SystemExit(main())
