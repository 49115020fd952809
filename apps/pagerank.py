#!/usr/bin/env python3
"""PageRank on a graph partitioned over the MPI ranks, checkpointed incrementally with hpcckpt.

Run it under MPI, for example::

    mpiexec -n 4 python apps/pagerank.py --root run/pr --scale 16 --out run/pr-final

The graph
    ``--scale S --edge-factor F --seed X``: an R-MAT graph (Chakrabarti, Zhan
    and Faloutsos 2004; Graph500 probabilities a=0.57, b=c=0.19) with 2**S
    vertices and F * 2**S generated edges.  Every edge is a function of its
    index and the seed only (a counter-based hash, no random state), so each
    rank generates its own share of the indices and the graph is the same on
    any number of ranks.  Vertex ids are scrambled by an odd multiplier modulo
    2**S (a bijection) so that the high-degree vertices do not all land on
    rank 0.  ``--graph FILE`` reads an edge list instead: a ``.npy`` integer
    array of shape (E, 2), or a text file of ``src dst`` lines (``#``
    comments); vertices are 0 .. max id.  Self-loops and duplicate edges are
    dropped.

How it is parallelised
    Rank r owns the vertices ``even_rows(N, size, r)`` (a contiguous range)
    and the edges that point into them, sorted by (dst, src).  Each iteration
    every rank allgathers the rank vector (N float64 per rank: the memory and
    the message grow with N, not with E), and computes, for its own vertices,
    ``x'[v] = (1-d)/N + d * (sum over in-edges u->v of x[u]/outdeg[u] + D/N)``
    with D the rank held by dangling vertices (no out-edges).  The iteration
    stops when the L1 change falls below ``--tol`` or after ``--max-iter``.

Why the result is bitwise identical on every rank count
    The in-edge sum of a vertex is ``np.bincount`` over its in-edges in
    (dst, src) order: a sequential sum in the same order whatever the
    partition.  D and the L1 change are ``math.fsum`` (correctly rounded, so
    independent of the order) over the full gathered vector, the same on every
    rank.  Everything else is elementwise.  So a run interrupted and restarted
    on any number of ranks ends with the same bits as an uninterrupted run on
    any other number, after the same number of iterations.

Checkpointing
    ``hpcckpt.Checkpointer(root, incremental=True)`` with a registered
    Stateful object: the edges (a ``Ragged`` table of (src, dst) rows: in rank
    order, globally sorted by (dst, src), the same rows at the same global
    positions on any rank count) and the rank vector (a ``Block``).  The first
    version stores both; every later one finds the edge blocks already stored
    and references them, so it writes only the rank vector (``--max-chain`` is
    large by default: a full version would write the edges again).  When to save
    is left to ``maybe_save`` with the default policy (Daly's interval from the
    measured save cost and the MTBF learned from the failure history under the
    root, ``--mtbf`` seconds as its prior); ``--every K`` saves every K
    iterations instead.  Signals (SIGUSR1/SIGTERM/SIGINT) and ``hpcckpt halt``
    stop the run cleanly after a checkpoint.  At start, the newest committed
    version is restored on whatever number of ranks: the edges come back as an
    even split of the table and are sent to the owners of their targets.

    Rank 0 prints ``SAVED iteration kind written total`` per checkpoint.
    ``--kill-rank R --kill-after-saves K`` makes rank R SIGKILL itself right
    after the K-th checkpoint of this run (a crash, for tests).
"""

from __future__ import annotations

import argparse
import math
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
from hpcckpt.mpi.collective import agree
from hpcckpt.policy import FixedSteps
from hpcckpt.core.regions import even_rows

EDGE = np.dtype([("src", "<i8"), ("dst", "<i8")])
#: R-MAT quadrant probabilities (Graph500): a (top left), b (top right), c (bottom left); d = 1 - a - b - c.
RMAT_A, RMAT_B, RMAT_C = 0.57, 0.19, 0.19
#: An odd multiplier: v -> v * SCRAMBLE mod 2**S is a bijection of the vertex ids.
SCRAMBLE = 0x9E3779B97F4A7C15 | 1


# --------------------------------------------------------------------------- the graph

def splitmix64(z: np.ndarray) -> np.ndarray:
    """A 64-bit integer hash (wrapping uint64 arithmetic: the same bits on every machine)."""
    z = z.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def rmat_edges(scale: int, first: int, last: int, seed: int) -> np.ndarray:
    """R-MAT edges with indices ``first .. last-1``: each from its index and the seed only."""
    ids = np.arange(first, last, dtype=np.uint64)
    src = np.zeros(len(ids), np.uint64)
    dst = np.zeros(len(ids), np.uint64)
    key = ids * np.uint64(scale + 1) + np.uint64(seed) * np.uint64(0xD1B54A32D192ED03)
    with np.errstate(over="ignore"):
        for level in range(scale):
            u = (splitmix64(key + np.uint64(level)) >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
            down = u >= RMAT_A + RMAT_B
            right = ((u >= RMAT_A) & ~down) | (u >= RMAT_A + RMAT_B + RMAT_C)
            src = (src << np.uint64(1)) | down.astype(np.uint64)
            dst = (dst << np.uint64(1)) | right.astype(np.uint64)
        mask = np.uint64((1 << scale) - 1)
        out = np.empty(len(ids), EDGE)
        out["src"] = ((src * np.uint64(SCRAMBLE)) & mask).astype(np.int64)
        out["dst"] = ((dst * np.uint64(SCRAMBLE)) & mask).astype(np.int64)
    return out


def read_edge_file(path: str, rank: int, size: int) -> tuple[np.ndarray, int]:
    """This rank's share of the rows of an edge-list file, and the number of vertices (1 + the largest id)."""
    if path.endswith(".npy"):
        table = np.load(path, mmap_mode="r")
    else:
        table = np.loadtxt(path, dtype=np.int64, comments="#", ndmin=2)
    if table.ndim != 2 or table.shape[1] != 2 or not np.issubdtype(table.dtype, np.integer):
        raise ValueError(f"an edge list must be integer rows (src, dst), got {table.dtype} of shape {table.shape}")
    lo, hi = even_rows(len(table), size, rank)
    part = np.asarray(table[lo:hi], dtype=np.int64)
    if part.size and part.min() < 0:
        raise ValueError(f"negative vertex id {int(part.min())}")
    out = np.empty(len(part), EDGE)
    out["src"], out["dst"] = part[:, 0], part[:, 1]
    return out, int(part.max()) + 1 if part.size else 0


class Partition:
    """The contiguous vertex range of each rank, and which rank owns a vertex."""

    def __init__(self, comm, nvertices: int):
        self.comm, self.n = comm, nvertices
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.starts = np.array([even_rows(nvertices, self.size, r)[0] for r in range(self.size)] + [nvertices])
        self.v0, self.v1 = int(self.starts[self.rank]), int(self.starts[self.rank + 1])
        self.counts = np.diff(self.starts)

    def owner(self, v: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.starts, v, side="right") - 1

    def block(self, local: np.ndarray) -> hpcckpt.Block:
        return hpcckpt.Block(local, offset=(self.v0,), global_shape=(self.n,))


def repartition(part: Partition, edges: np.ndarray) -> np.ndarray:
    """Send each edge to the owner of its target; this rank's in-edges sorted by (dst, src), no duplicates."""
    owner = part.owner(edges["dst"])
    incoming = part.comm.alltoall([edges[owner == r] for r in range(part.size)])
    mine = np.concatenate(incoming) if incoming else edges[:0]
    mine = mine[np.lexsort((mine["src"], mine["dst"]))]
    keep = mine["src"] != mine["dst"]  # no self-loops
    keep[1:] &= (mine["src"][1:] != mine["src"][:-1]) | (mine["dst"][1:] != mine["dst"][:-1])  # no duplicates
    return mine[keep]


# --------------------------------------------------------------------------- the solver

class PageRank:
    """The solver's state; a Stateful object (``state_dict`` / ``load_state_dict``) for the Checkpointer."""

    def __init__(self, part: Partition, edges: np.ndarray, damping: float, params: dict):
        self.part, self.damping, self.params = part, damping, params
        self.x = np.full(part.v1 - part.v0, 1.0 / part.n)
        self.iteration, self.residual = 0, math.inf
        self.set_edges(edges)

    def set_edges(self, edges: np.ndarray) -> None:
        """Take this rank's in-edges (sorted by (dst, src)) and count every vertex's out-degree."""
        self.edges = edges
        local = np.bincount(edges["src"], minlength=self.part.n).astype(np.int64)
        self.outdeg = np.empty_like(local)
        self.part.comm.Allreduce(local, self.outdeg, op=MPI.SUM)  # integers: exact in any order
        self.dangling = self.outdeg == 0
        self.inv_outdeg = np.where(self.dangling, 0.0, 1.0 / np.maximum(self.outdeg, 1))
        self.full = self.gather()

    def gather(self) -> np.ndarray:
        """The whole rank vector (every rank gets the same array)."""
        full = np.empty(self.part.n)
        self.part.comm.Allgatherv(self.x, (full, self.part.counts))
        return full

    def step(self) -> None:
        """One Jacobi iteration: the new rank of this rank's vertices, then the L1 change over all vertices."""
        n, d, full = self.part.n, self.damping, self.full
        contrib = full * self.inv_outdeg
        dangling = math.fsum(full[self.dangling])
        sums = np.bincount(self.edges["dst"] - self.part.v0, weights=contrib[self.edges["src"]],
                           minlength=len(self.x))
        self.x = (1.0 - d) / n + d * (sums + dangling / n)
        new = self.gather()
        self.residual = math.fsum(np.abs(new - full))
        self.full = new
        self.iteration += 1

    def state_dict(self) -> dict:
        return {"edges": hpcckpt.Ragged(self.edges), "rank": self.part.block(self.x),
                "iteration": self.iteration, "residual": self.residual, "params": self.params}

    def load_state_dict(self, d: dict) -> None:
        if d["params"] != self.params:
            # not a damaged version (which restore would skip for an older one): a usage error, raised at once
            raise hpcckpt.TemplateMismatchError(f"the checkpoint was written with {d['params']}, not "
                                                f"{self.params}: use the same graph options, or another --root")
        self.iteration, self.residual = int(d["iteration"]), float(d["residual"])
        self.set_edges(repartition(self.part, d["edges"].local))  # self.x was filled in place


# --------------------------------------------------------------------------- the program

def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", required=True, help="checkpoint root (numbered versions live here)")
    ap.add_argument("--scale", type=int, default=14, help="R-MAT graph of 2**SCALE vertices (14)")
    ap.add_argument("--edge-factor", type=int, default=16, help="R-MAT edges generated per vertex (16)")
    ap.add_argument("--seed", type=int, default=1, help="R-MAT seed (1)")
    ap.add_argument("--graph", help="read the edge list from this file (.npy (E, 2) integers, or text) instead")
    ap.add_argument("--damping", type=float, default=0.85, help="damping factor d (0.85)")
    ap.add_argument("--tol", type=float, default=1e-10, help="stop when the L1 change is below this (1e-10)")
    ap.add_argument("--max-iter", type=int, default=200, help="stop after this many iterations in all (200)")
    ap.add_argument("--every", type=int, default=0, help="checkpoint every K iterations (0: the default adaptive policy)")
    ap.add_argument("--mtbf", type=float, default=None, help="prior MTBF in seconds for the adaptive policy")
    ap.add_argument("--keep", type=int, default=3, help="keep the newest this many versions (and what they need)")
    ap.add_argument("--block-bytes", type=int, default=1 << 20, help="incremental block size (1 MiB)")
    ap.add_argument("--max-chain", type=int, default=1 << 30, help="a full version (edges written again) after "
                    "this many incremental ones (practically never)")
    ap.add_argument("--sleep", type=float, default=0.0, help="pause this many seconds per iteration (tests)")
    ap.add_argument("--kill-rank", type=int, default=None, help="this rank SIGKILLs itself ...")
    ap.add_argument("--kill-after-saves", type=int, default=None, help="... right after this many checkpoints")
    ap.add_argument("--out", help="write the final state here as one checkpoint directory")
    args = ap.parse_args(argv)
    if not 1 <= args.scale <= 40 or args.edge_factor < 1 or args.max_iter < 0 or args.every < 0 or args.keep < 1:
        ap.error("--scale must be in 1..40, --edge-factor/--keep positive, --max-iter/--every not negative")
    if not 0.0 < args.damping < 1.0 or not args.tol > 0.0:
        ap.error("--damping must be in (0, 1) and --tol positive")
    if (args.kill_rank is None) != (args.kill_after_saves is None):
        ap.error("--kill-rank and --kill-after-saves go together")
    return args


def describe_graph(args) -> dict:
    """What defines the graph (stored with every checkpoint and compared at a restart)."""
    if args.graph:
        return {"graph": os.path.abspath(args.graph)}
    return {"graph": "rmat", "scale": args.scale, "edge_factor": args.edge_factor, "seed": args.seed}


def load_graph(args, comm) -> tuple[np.ndarray, int]:
    """This rank's share of the input edges (any rows) and the number of vertices."""
    rank, size = comm.Get_rank(), comm.Get_size()
    if args.graph:
        # a file that cannot be read on one rank is the same CheckpointError on every rank
        edges, n = agree(comm, f"reading the edge list {args.graph!r}", lambda: read_edge_file(args.graph, rank, size))
        return edges, comm.allreduce(n, op=MPI.MAX)
    n = 1 << args.scale
    lo, hi = even_rows(args.edge_factor * n, size, rank)
    return rmat_edges(args.scale, lo, hi, args.seed), n


def main(argv=None) -> int:
    args = parse_args(argv)
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()

    def say(msg: str) -> None:
        if rank == 0:
            print(f"[pagerank] {msg}", flush=True)

    policy = FixedSteps(args.every) if args.every else None  # None: the default (Learned) policy
    ck = hpcckpt.Checkpointer(args.root, comm=comm, keep=args.keep, policy=policy, mtbf=args.mtbf,
                              handle_signals=True, incremental=True, block_bytes=args.block_bytes,
                              max_chain=args.max_chain)
    restarting = ck.latest() is not None
    t0 = time.perf_counter()
    if restarting and not args.graph:  # the edges come from the checkpoint: nothing to generate
        raw, n = np.empty(0, EDGE), 1 << args.scale
    else:  # a file is read at a restart too, for its number of vertices
        raw, n = load_graph(args, comm)
    part = Partition(comm, n)
    pr = PageRank(part, np.empty(0, EDGE) if restarting else repartition(part, raw), args.damping,
                  {**describe_graph(args), "damping": args.damping})
    ck.register(pr)  # the safe form: state_dict() is read when a save starts
    if restarting:
        ck.restore()  # fills pr.x in place, then pr.load_state_dict repartitions the restored edges
        saved_by = hpcckpt.open(ck.last_restored).meta.nranks if rank == 0 else None
        say(f"RESTORED {pr.iteration} from {ck.last_restored} (saved by {saved_by} ranks, on {part.size})")
    nedges = comm.allreduce(len(pr.edges))
    say(f"{part.size} ranks, {n} vertices, {nedges} edges, ready in {time.perf_counter() - t0:.2f} s; "
        f"pids {' '.join(map(str, comm.gather(os.getpid(), root=0) or []))}")

    saves, saved_at = 0, pr.iteration if restarting else None
    t_run = time.perf_counter()
    while pr.iteration < args.max_iter and not pr.residual < args.tol:
        pr.step()
        if args.sleep:
            time.sleep(args.sleep)
        result = ck.maybe_save(pr.iteration)
        if result is not None:
            saves, saved_at = saves + 1, pr.iteration
            inc = result.incremental
            say(f"SAVED {pr.iteration} {inc['kind']} {result.bytes_written} {inc['total_bytes']}")
            if args.kill_after_saves == saves:  # every rank: the crash comes after rank 0 has said SAVED
                comm.Barrier()
                if args.kill_rank == rank:
                    print(f"[pagerank] rank {rank}: simulating a crash: SIGKILL to myself after iteration "
                          f"{pr.iteration}", flush=True)
                    time.sleep(0.5)  # mpiexec drops output it has not forwarded yet when the job is torn down
                    os.kill(os.getpid(), signal.SIGKILL)
        if ck.should_exit():
            say(f"stopping ({ck.stop_reason}) after iteration {pr.iteration} with a checkpoint")
            ck.close()
            return 0
    if saved_at != pr.iteration:  # finish with a checkpoint: a rerun then has nothing to do
        result = ck.save(pr.iteration)
        say(f"SAVED {pr.iteration} {result.incremental['kind']} {result.bytes_written} "
            f"{result.incremental['total_bytes']}")
    ck.close()
    say(f"finished at iteration {pr.iteration} (L1 change {pr.residual:.3e}) in {time.perf_counter() - t_run:.2f} s; "
        f"sum of ranks {math.fsum(pr.full):.15f}")
    if args.out:
        hpcckpt.save({"rank": part.block(pr.x), "iteration": pr.iteration, "residual": pr.residual},
                     args.out, comm=comm, step=pr.iteration, overwrite=True)
    return 0


if __name__ == "__main__":
    with hpcckpt.report_errors(MPI.COMM_WORLD):  # a CheckpointError: one line from rank 0; else traceback + Abort
        sys.exit(main())
