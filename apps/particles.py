#!/usr/bin/env python3
"""Particles in a 2-D box over a mostly static background field, checkpointed incrementally.

Run it under MPI, for example::

    mpiexec -n 4 python apps/particles.py --root run/pckpt --steps 200 --every 10 --out run/pfinal

What it computes
    The box is ``ny x nx`` cells.  A background field ``field`` (float64, one
    value per cell) starts as a function of the global cell index only.
    Particles (id, position, velocity) fly through the box, bouncing off its
    walls; every step ``--inject`` new particles appear at a source near the
    left edge, so the number of particles grows.  Each cell visited by at least
    one particle during a step is "marked": ``f = 0.5 * f + 0.5``, once per
    step whatever the number of particles in it; the particles feel the field
    they sit on (``vy += 0.01 * (f - 0.5)``).  Far from the particles' plume the
    field never changes: between two checkpoints only the cells under the
    plume do, which is what incremental checkpoints exploit.

How it is parallelised
    The box is cut into strips of rows, one per rank (``even_rows``).  A rank
    owns the field of its strip and the particles whose cell lies in it; after
    every move, particles that crossed a strip boundary migrate to their new
    owner (``alltoall``).  New particles are generated from their id alone, by
    every rank, and each keeps those that fall in its strip.

Why a restart is bitwise identical on any number of ranks
    Positions and velocities change only through elementwise +, -, * and
    comparisons per particle (no transcendental functions, no sums over
    particles); the field changes per cell, once per step, from the set of
    visited cells, which does not depend on who owns which particle.  So the
    field is bitwise the same, and the particles (as a table sorted by id)
    are the same, whatever the number of ranks, with or without restarts.

Checkpointing
    ``hpcckpt.Checkpointer(root, incremental=True)``: every ``--every`` steps
    (and at the end, or at ``--stop-at``) the state is saved: the field as a
    ``Block``, the particles as a ``Ragged`` table whose per-rank row counts
    and total change every step.  Only the blocks (``--block-bytes``) that are
    not already stored in the chain are written; a full version is made when
    the chain is ``--max-chain`` deep.  At start the newest committed version
    is restored, on whatever number of ranks: the field is resharded by
    hpcckpt, the particles come back evenly split and are sent to their owners.
    Rank 0 prints one ``SAVED step kind written total`` line per checkpoint.
    ``--stop-at S`` stops cleanly after step S with a checkpoint (an
    interruption, for tests); ``--out DIR`` writes the final state as one
    plain checkpoint directory.
"""

from __future__ import annotations

import argparse
import os
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
from hpcckpt.core.regions import even_rows

PARTICLE = np.dtype([("id", "<i8"), ("y", "<f8"), ("x", "<f8"), ("vy", "<f8"), ("vx", "<f8")])
#: Largest speed in cells per step (below 1, so one reflection per step is enough).
VMAX = 0.9


def splitmix64(z: np.ndarray) -> np.ndarray:
    """A 64-bit integer hash (wrapping uint64 arithmetic: the same bits on every machine)."""
    z = z.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def unit(ids: np.ndarray, salt: int) -> np.ndarray:
    """A uniform number in [0, 1) per id (53 bits of the hash: exact in float64)."""
    return (splitmix64(ids * np.int64(4) + np.int64(salt)) >> np.uint64(11)).astype(np.float64) * 2.0 ** -53


class Strips:
    """Row strips of the box, one per rank."""

    def __init__(self, comm, ny: int, nx: int):
        self.comm, self.ny, self.nx = comm, ny, nx
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.y0, self.y1 = even_rows(ny, self.size, self.rank)
        self.starts = np.array([even_rows(ny, self.size, r)[0] for r in range(self.size)] + [ny])

    def owner(self, y: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.starts, np.floor(y).astype(np.int64), side="right") - 1

    def block(self, local: np.ndarray) -> hpcckpt.Block:
        return hpcckpt.Block(local, offset=(self.y0, 0), global_shape=(self.ny, self.nx))


def initial_field(s: Strips) -> np.ndarray:
    i = np.arange(s.y0, s.y1, dtype=np.int64)[:, None]
    j = np.arange(s.nx, dtype=np.int64)[None, :]
    return ((i * 131 + j * 71) % 97).astype(np.float64) / 97.0


def new_particles(s: Strips, first_id: int, count: int) -> np.ndarray:
    """Particles ``first_id .. first_id+count-1`` (from their id only) that fall in this rank's strip."""
    ids = np.arange(first_id, first_id + count, dtype=np.int64)
    p = np.zeros(count, PARTICLE)
    p["id"] = ids
    p["y"] = s.ny * 0.5 + (unit(ids, 0) - 0.5) * max(1.0, s.ny * 0.1)
    p["x"] = s.nx * 0.1 + unit(ids, 1) * max(1.0, s.nx * 0.05)
    p["vy"] = (unit(ids, 2) - 0.5) * 0.6
    p["vx"] = 0.1 + unit(ids, 3) * 0.5
    for c, n in (("y", s.ny), ("x", s.nx)):  # keep inside the box on tiny grids
        p[c] = np.minimum(np.maximum(p[c], 0.0), np.nextafter(float(n), 0.0))
    return p[s.owner(p["y"]) == s.rank]


def migrate(s: Strips, p: np.ndarray) -> np.ndarray:
    """Send every particle to the rank whose strip holds it; this rank's particles, sorted by id."""
    owner = s.owner(p["y"])
    incoming = s.comm.alltoall([p[owner == r] for r in range(s.size)])
    out = np.concatenate(incoming) if incoming else p[:0]
    return out[np.argsort(out["id"], kind="stable")]


def reflect(pos: np.ndarray, vel: np.ndarray, n: int) -> None:
    low = pos < 0.0
    pos[low] = -pos[low]
    vel[low] = -vel[low]
    high = pos >= n
    pos[high] = 2.0 * n - pos[high]
    vel[high] = -vel[high]
    np.minimum(pos, np.nextafter(float(n), 0.0), out=pos)


def step(s: Strips, f: np.ndarray, p: np.ndarray, done: int, inject: int, n0: int) -> np.ndarray:
    """One step: move, bounce, migrate, inject, mark the visited cells, feel the field."""
    for c, v, n in (("y", "vy", s.ny), ("x", "vx", s.nx)):
        pos, vel = p[c].copy(), p[v].copy()
        pos += vel
        reflect(pos, vel, n)
        p[c], p[v] = pos, vel
    p = migrate(s, p)
    new = new_particles(s, n0 + (done - 1) * inject, inject)
    p = np.concatenate([p, new])
    p = p[np.argsort(p["id"], kind="stable")]
    li = np.floor(p["y"]).astype(np.int64) - s.y0
    lj = np.floor(p["x"]).astype(np.int64)
    cells = np.unique(li * s.nx + lj)
    flat = f.reshape(-1)
    flat[cells] = 0.5 * flat[cells] + 0.5
    p["vy"] = np.clip(p["vy"] + 0.01 * (f[li, lj] - 0.5), -VMAX, VMAX)
    return p


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", required=True, help="checkpoint root (numbered versions live here)")
    ap.add_argument("--ny", type=int, default=512, help="cells along y: rows, cut into strips (512)")
    ap.add_argument("--nx", type=int, default=512, help="cells along x (512)")
    ap.add_argument("--particles", type=int, default=200, help="particles at step 0 (200)")
    ap.add_argument("--inject", type=int, default=20, help="new particles per step (20)")
    ap.add_argument("--steps", type=int, default=200, help="total steps of the whole run (200)")
    ap.add_argument("--every", type=int, default=10, help="checkpoint every this many steps (10)")
    ap.add_argument("--keep", type=int, default=3, help="keep the newest this many versions (and what they need)")
    ap.add_argument("--block-bytes", type=int, default=16 << 10, help="incremental block size (16 KiB)")
    ap.add_argument("--max-chain", type=int, default=10, help="a full version after this many incremental ones")
    ap.add_argument("--stop-at", type=int, default=None, help="stop cleanly after this step, with a checkpoint")
    ap.add_argument("--out", help="write the final state here as one checkpoint directory")
    args = ap.parse_args(argv)
    if min(args.ny, args.nx, args.keep, args.every) < 1 or min(args.particles, args.inject, args.steps) < 0:
        ap.error("--ny/--nx/--keep/--every must be positive, --particles/--inject/--steps not negative")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    comm = MPI.COMM_WORLD
    s = Strips(comm, args.ny, args.nx)

    def say(msg: str) -> None:
        if s.rank == 0:
            print(f"[particles] {msg}", flush=True)

    if args.ny < s.size:
        say(f"{args.ny} rows are too few for {s.size} strips")
        return 2
    params = {"ny": args.ny, "nx": args.nx, "particles": args.particles, "inject": args.inject}
    f = initial_field(s)
    start = done = 0
    p = new_particles(s, 0, args.particles)

    def make_state() -> dict:
        # read at every save (registered below): step() rebinds p every step, done advances
        return {"field": s.block(f), "particles": hpcckpt.Ragged(p), "step": done, "params": params}

    ck = hpcckpt.Checkpointer(args.root, comm=comm, keep=args.keep, incremental=True,
                              block_bytes=args.block_bytes, max_chain=args.max_chain, track_failures=False)
    ck.register(make_state)  # the safe form: the state is built when a save starts, never a stale buffer
    if ck.latest() is not None:
        restored = ck.restore({"field": s.block(f), "particles": hpcckpt.Ragged(), "step": 0, "params": None})
        if restored["params"] != params:
            say(f"the checkpoint under {args.root} was written with {restored['params']}, not {params}")
            ck.close()
            return 2
        start = int(restored["step"])
        p = migrate(s, restored["particles"].local)
        say(f"RESTORED {start} from {ck.last_restored} on {s.size} ranks")
    else:
        say(f"no checkpoint under {args.root}: starting from step 0 on {s.size} ranks")

    end = args.steps if args.stop_at is None else min(args.steps, args.stop_at)
    t0 = time.perf_counter()
    done = start
    for done in range(start + 1, end + 1):
        p = step(s, f, p, done, args.inject, args.particles)
        if done % args.every == 0 or done == end:
            r = ck.save(step=done)  # saves what make_state() returns now
            inc = r.incremental
            say(f"SAVED {done} {inc['kind']} {r.bytes_written} {inc['total_bytes']}")
    ck.close()
    total = comm.allreduce(len(p))
    say(f"finished steps {start}..{done} in {time.perf_counter() - t0:.2f} s: {total} particles")
    if args.out:
        hpcckpt.save(make_state, args.out, comm=comm, step=done, overwrite=True)
    return 0


if __name__ == "__main__":
    with hpcckpt.report_errors(MPI.COMM_WORLD):  # a CheckpointError: one line from rank 0; else traceback + Abort
        sys.exit(main())
