#!/usr/bin/env python3
"""Conjugate gradients for a 2-D Poisson problem, restarted from a lossless and from a lossy checkpoint.

Run it twice under MPI, on any numbers of ranks::

    mpiexec -n 4 python apps/cg.py --root run/cg --n 128 --checkpoint-at 150   # solve; checkpoint at 150
    mpiexec -n 3 python apps/cg.py --root run/cg --n 128 --checkpoint-at 150   # restart from both, compare

The problem
    ``A x = b`` with ``A`` the 5-point Laplacian (4 on the diagonal, -1 for
    the four neighbours, zero Dirichlet boundary) on an ``n x n`` grid and ``b``
    = h^2 f for a smooth ``f`` computed from global indices.  The grid is
    distributed by rows: each rank owns a band of rows, exchanges one halo row
    with each neighbour (``Sendrecv``) per matrix-vector product and sums its
    dot products with ``allreduce``.  CG stops when ||r|| <= tol ||b||.

The first run (no checkpoint under ``--root``) solves from x = 0 and, at
iteration ``--checkpoint-at``, writes two checkpoints with
``hpcckpt.Checkpointer``: ``ROOT/lossless`` (x, r, p and the scalars, exact:
a restart continues the very same iteration) and ``ROOT/lossy``.  Every later
run restores each of them (resharded to its own rank count), iterates to the
same tolerance, and prints the compression ratio, the iteration counts and
the true residual ||b - A x|| / ||b|| of both restarts (and a ``RESULT {json}``
line).

What the lossy checkpoint holds, and why (the numerical analysis)
    * ``r`` is not stored: a restart recomputes r = b - A x' from the x' it
      restored (one matrix-vector product).  A stored lossy r would no longer
      be the residual of x': CG's recurrence then drives the stored r below
      the tolerance while the true residual stays at the level of the
      perturbation A(x - x') (measured: ||b - Ax||/||b|| = 0.3 after
      "converging" from x, r, p all at rel 1e-4, n = 128).
    * ``x`` gets an absolute bound derived from the tolerance, not a relative
      1e-4: the perturbation d = x' - x changes the residual by A d, and
      ||A d||_2 <= ||A||_inf ||d||_inf sqrt(N) = 8 bound sqrt(N).  With
      bound = tol ||b|| / (8 sqrt(N)) the restart adds at most tol ||b|| to
      the residual: nothing CG has to remove.  A relative bound of 1e-4 of x's
      range is, for this matrix (condition number ~ n^2), a relative residual
      of ~0.3 of white noise, which CG needs nearly a whole solve to remove
      again (measured: 300 extra iterations of 362 at n = 128, tol 1e-8).
      ``--x-rel R`` stores x with Lossy(rel=R) instead, to see that.
    * ``p`` gets ``Lossy(rel=--p-rel)`` (default 1e-6): the search direction
      carries CG's Krylov memory; a restart with p = r (steepest descent) costs
      20-70 % extra iterations, a slightly perturbed p almost nothing.  The
      first step after a restart is made safe for a p that is not exactly
      conjugate: alpha = (r.p)/(p.Ap) (exact line search, as r.p = r.r no
      longer holds) and beta = -(r.Ap)/(p.Ap) (explicit A-conjugation); plain
      CG from the second step on.  With --p-rel 1e-4 the p stream compresses
      about twice as well, and the restart costs 0 extra iterations from a
      checkpoint in the second half of the solve but 15-18 % from one in the
      first quarter (n = 128).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import numpy as np
from mpi4py import MPI

try:
    import hpcckpt
except ModuleNotFoundError as exc:  # running from a source tree where hpcckpt is not installed
    if exc.name != "hpcckpt":
        raise
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import hpcckpt
from hpcckpt.codecs import Lossy


class Rows:
    """This rank's band of rows of the n x n grid, its neighbours, and the distributed operations."""

    def __init__(self, comm, n: int):
        self.comm, self.n = comm, n
        size, rank = comm.Get_size(), comm.Get_rank()
        self.r0, self.r1 = rank * n // size, (rank + 1) * n // size
        self.up = rank - 1 if rank > 0 else MPI.PROC_NULL
        self.down = rank + 1 if rank < size - 1 else MPI.PROC_NULL
        self.ext = np.zeros((self.r1 - self.r0 + 2, n))  # the operand of A with one halo row on each side

    def dot(self, a: np.ndarray, b: np.ndarray) -> float:
        return self.comm.allreduce(float(np.vdot(a, b)), op=MPI.SUM)

    def norm(self, a: np.ndarray) -> float:
        return math.sqrt(self.dot(a, a))

    def matvec(self, v: np.ndarray, out: np.ndarray) -> np.ndarray:
        """out = A v (the halo rows come from the neighbours; outside the grid they stay 0)."""
        u = self.ext
        u[1:-1] = v
        self.comm.Sendrecv(u[1], dest=self.up, recvbuf=u[-1], source=self.down)
        self.comm.Sendrecv(u[-2], dest=self.down, recvbuf=u[0], source=self.up)
        np.multiply(v, 4.0, out=out)
        out -= u[:-2]
        out -= u[2:]
        out[:, 1:] -= v[:, :-1]
        out[:, :-1] -= v[:, 1:]
        return out

    def rhs(self) -> np.ndarray:
        """b = h^2 f on this rank's rows, from global indices only (the same whatever the rank count)."""
        h = 1.0 / (self.n + 1)
        y = (np.arange(self.r0, self.r1)[:, None] + 1) * h
        x = (np.arange(self.n)[None, :] + 1) * h
        f = np.sin(np.pi * y) * np.sin(2 * np.pi * x) + 0.5 * np.exp(-50 * ((y - 0.3) ** 2 + (x - 0.6) ** 2))
        return h * h * f

    def block(self, arr: np.ndarray, codec=None) -> hpcckpt.Block:
        return hpcckpt.Block(arr, offset=(self.r0, 0), global_shape=(self.n, self.n), codec=codec)


def cg(g: Rows, b, x, r, p, rr: float, k: int, tol: float, maxit: int, *, safe_first: bool = False,
       on_iteration=None) -> tuple[np.ndarray, int]:
    """CG from the state (x, r, p, rr = r.r) at iteration k until ||r|| <= tol ||b||; (x, iterations).

    ``safe_first``: the first step works for a p that is not conjugate to the
    earlier directions (a restart from a lossy p); see the module docstring.
    """
    stop = tol * g.norm(b)
    ap = np.empty_like(x)
    while math.sqrt(rr) > stop and k < maxit:
        if on_iteration is not None:
            on_iteration(k, x, r, p, rr)
        g.matvec(p, ap)
        pap = g.dot(p, ap)
        alpha = (g.dot(r, p) if safe_first else rr) / pap
        x += alpha * p
        r -= alpha * ap
        rr_new = g.dot(r, r)
        beta = -g.dot(r, ap) / pap if safe_first else rr_new / rr
        p *= beta
        p += r
        rr, k, safe_first = rr_new, k + 1, False
    return x, k


def true_residual(g: Rows, b, x) -> float:
    return g.norm(b - g.matvec(x, np.empty_like(x))) / g.norm(b)


def x_bound(g: Rows, b, tol: float) -> float:
    """The absolute bound on x for which ||A (x' - x)||_2 <= tol ||b||_2: tol ||b|| / (8 sqrt(N))."""
    return tol * g.norm(b) / (8.0 * g.n)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", required=True, help="checkpoint root (ROOT/lossless and ROOT/lossy)")
    p.add_argument("--n", type=int, default=128, help="grid points per side (n x n unknowns)")
    p.add_argument("--tol", type=float, default=1e-8, help="stop when ||r|| <= tol ||b||")
    p.add_argument("--checkpoint-at", type=int, default=None,
                   help="iteration of the checkpoint (default: half of what the solve takes, found by the first run)")
    p.add_argument("--p-rel", type=float, default=1e-6, help="relative bound of p in the lossy checkpoint")
    p.add_argument("--x-rel", type=float, default=None,
                   help="store x with Lossy(rel=X-REL) instead of the bound derived from --tol")
    p.add_argument("--maxit", type=int, default=100000)
    args = p.parse_args(argv)
    if args.n < 2 or not 0 < args.tol < 1 or not 0 < args.p_rel < 0.5:
        p.error("--n >= 2, 0 < --tol < 1, 0 < --p-rel < 0.5")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    if size > args.n:
        if rank == 0:
            print(f"[cg] {args.n} rows cannot be shared by {size} ranks", file=sys.stderr)
        return 2

    def say(msg: str) -> None:
        if rank == 0:
            print(f"[cg] {msg}", flush=True)

    g = Rows(comm, args.n)
    b = g.rhs()
    shape = b.shape
    params = {"n": args.n, "tol": args.tol}
    roots = {kind: os.path.join(args.root, kind) for kind in ("lossless", "lossy")}
    cks = {kind: hpcckpt.Checkpointer(root, comm=comm, keep=1, handle_signals=False) for kind, root in roots.items()}
    try:
        if cks["lossless"].latest() is None or cks["lossy"].latest() is None:
            return first_run(args, g, b, cks, params, say)
        return restarts(args, g, b, cks, params, say, shape)
    finally:
        for ck in cks.values():
            ck.close()


def first_run(args, g, b, cks, params, say) -> int:
    """Solve from x = 0, writing both checkpoints at iteration --checkpoint-at."""
    at = args.checkpoint_at
    if at is None:  # half of what the solve takes: a dry run first
        zero = np.zeros_like(b)
        _, total = cg(g, b, zero, b.copy(), b.copy(), g.dot(b, b), 0, args.tol, args.maxit)
        at = total // 2
    xb = x_bound(g, b, args.tol)
    x_codec = Lossy(rel=args.x_rel) if args.x_rel else Lossy(abs=xb)
    saved, now = {}, {}  # now: the iterate as cg() last handed it over

    def lossless_state() -> dict:  # read at the save (registered below): the exact iterate
        return {"x": g.block(now["x"]), "r": g.block(now["r"]), "p": g.block(now["p"]), "rr": now["rr"],
                "k": now["k"], "params": params}

    def lossy_state() -> dict:  # x within the bound that costs no iterations, p nearly exact, r recomputed
        return {"x": g.block(now["x"], x_codec), "p": g.block(now["p"], Lossy(rel=args.p_rel)), "x_bound": xb,
                "k": now["k"], "params": params}

    cks["lossless"].register(lossless_state)
    cks["lossy"].register(lossy_state)

    def on_iteration(k, x, r, p, rr):
        now.update(k=k, x=x, r=r, p=p, rr=rr)
        if k == at:
            for kind, ck in cks.items():
                saved[kind] = ck.save(step=k).bytes_written

    x, k = cg(g, b, np.zeros_like(b), b.copy(), b.copy(), g.dot(b, b), 0, args.tol, args.maxit,
              on_iteration=on_iteration)
    say(f"{g.comm.Get_size()} ranks, {args.n} x {args.n} grid, tol {args.tol:g}: converged in {k} iterations, "
        f"true residual {true_residual(g, b, x):.3e}")
    if not saved:
        say(f"the solve took {k} iterations, fewer than --checkpoint-at {at}: no checkpoint written")
        return 2
    say(f"checkpoints of iteration {at}: lossless (x, r, p) {saved['lossless']} bytes, "
        f"lossy (x {x_codec!r}, p Lossy(rel={args.p_rel:g})) {saved['lossy']} bytes; run again to restart")
    return 0


def restarts(args, g, b, cks, params, say, shape) -> int:
    """Restore each checkpoint (on this rank count), iterate to the tolerance, compare."""
    out = {"ranks": g.comm.Get_size(), "n": args.n, "tol": args.tol}
    for kind, ck in cks.items():
        vectors = ("x", "r", "p") if kind == "lossless" else ("x", "p")
        template = {v: g.block(np.empty(shape)) for v in vectors}
        template.update({"k": 0, "params": None, "rr" if kind == "lossless" else "x_bound": 0.0})
        state = ck.restore(template)
        if state["params"] != params:
            say(f"{ck.last_restored} was written with {state['params']}, not {params}")
            return 2
        x, p, k0 = state["x"].local, state["p"].local, int(state["k"])
        if kind == "lossless":  # the exact state: continue the very same iteration
            r, rr, safe = state["r"].local, float(state["rr"]), False
        else:  # r recomputed from the restored x; the first step allows for a perturbed p
            r = b - g.matvec(x, np.empty_like(x))
            rr, safe = g.dot(r, r), True
        restart_residual = math.sqrt(rr) / g.norm(b)
        x, k = cg(g, b, x, r, p, rr, k0, args.tol, args.maxit, safe_first=safe)
        meta = hpcckpt.open(ck.last_restored).meta if g.comm.Get_rank() == 0 else None
        raw = sum(v.nbytes for v in meta.variables.values()) if meta else 0
        stored = sum(v.stored_bytes for v in meta.variables.values()) if meta else 0
        out[kind] = {"checkpoint_iteration": k0, "iterations_after_restart": k - k0, "total_iterations": k,
                     "residual_at_restart": restart_residual, "true_residual": true_residual(g, b, x),
                     "raw_bytes": raw, "stored_bytes": stored,
                     "saved_by": meta.nranks if meta else None}
    if g.comm.Get_rank() != 0:
        return 0
    lo, ly = out["lossless"], out["lossy"]
    extra = ly["iterations_after_restart"] - lo["iterations_after_restart"]
    out["extra_iterations"] = extra
    out["extra_fraction"] = extra / max(1, lo["iterations_after_restart"])
    out["ratio_vs_lossless_checkpoint"] = lo["stored_bytes"] / ly["stored_bytes"]
    out["ratio_lossy_vectors"] = ly["raw_bytes"] / ly["stored_bytes"]
    say(f"restarted on {out['ranks']} ranks from checkpoints of iteration {lo['checkpoint_iteration']} "
        f"written by {lo['saved_by']} ranks")
    say("| restart | stored bytes | ratio | residual at restart | iterations after restart | total | true residual |")
    say("|---|---:|---:|---:|---:|---:|---:|")
    for kind, o in (("lossless (x, r, p)", lo), ("lossy (x, p; r recomputed)", ly)):
        say(f"| {kind} | {o['stored_bytes']} | {o['raw_bytes'] / o['stored_bytes']:.2f} | "
            f"{o['residual_at_restart']:.2e} | {o['iterations_after_restart']} | {o['total_iterations']} | "
            f"{o['true_residual']:.2e} |")
    say(f"lossy checkpoint: {out['ratio_vs_lossless_checkpoint']:.2f}x smaller than the lossless one "
        f"({out['ratio_lossy_vectors']:.2f}x on the vectors it stores); "
        f"{extra:+d} iterations ({100 * out['extra_fraction']:+.1f} %) against the lossless restart")
    print("RESULT " + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    with hpcckpt.report_errors(MPI.COMM_WORLD):  # a CheckpointError: one line from rank 0; else traceback + Abort
        sys.exit(main())
