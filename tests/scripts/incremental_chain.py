"""Incremental saves of a dynamic state under mpiexec, continuing a chain across rank-count changes.

usage: incremental_chain.py ROOT FIRST_STEP NSTEPS SEED [json|columnar [allgather|owners]]

Restores the newest version (if any) and checks it equals what its step held,
then saves steps FIRST_STEP .. FIRST_STEP+NSTEPS-1 incrementally.  The global
state of a step is a pure function of (seed, step) (``global_state``), so the
test (and any rank count) can recompute what each version must hold:
a Block field whose global shape changes at some steps and whose rows change a
few at a time, a Ragged table that grows at its end, sometimes shrinks, and whose
rows are split unevenly (and differently every step) between the ranks, a
variable that appears and disappears, and a zero region (deduplicated).
Prints ``SAVED step kind written referenced`` per save.  ``columnar`` makes
every chunk table columnar (docs/format.md 3.3.1), as from 4096 chunks on;
``owners`` deduplicates through the keys' owners (hpcckpt.incremental.dedup_owners), as from
OWNERS_FROM_RANKS ranks on.
"""

from __future__ import annotations

import sys

import numpy as np

import hpcckpt
from hpcckpt.format import chunk_columns
from hpcckpt.incremental import dedup_owners
from hpcckpt.core.regions import even_rows

RECORD = np.dtype([("id", "<i8"), ("x", "<f4"), ("v", "<f4", (2,))])


def _rng(seed: int, *salt: int):
    return np.random.default_rng([seed, *salt])


def global_state(seed: int, step: int) -> dict:
    """The whole state at ``step`` (every version's expected content)."""
    rng = _rng(seed, 0)
    rows = 64 + 16 * int(rng.integers(0, 3))
    field_rows = [rows]
    for s in range(1, step + 1):  # reshape now and then
        r = _rng(seed, 1, s)
        field_rows.append(field_rows[-1] + (16 if r.random() < 0.2 else 0))
    nrows = field_rows[step]
    field = _rng(seed, 2).random((nrows, 48))
    for s in range(1, step + 1):  # a few rows change per step
        r = _rng(seed, 3, s)
        for row in r.integers(0, nrows, size=3):
            field[row] += s
    n = 200
    table = np.zeros(0, RECORD)
    for s in range(step + 1):
        r = _rng(seed, 4, s)
        if s and r.random() < 0.25:
            n = max(0, n - int(r.integers(1, 40)))  # shrink at the end
        else:
            n += int(r.integers(0, 60))  # grow at the end
    table = np.zeros(n, RECORD)
    table["id"] = np.arange(n)
    table["x"] = np.arange(n, dtype=np.float32) * 0.5
    table["v"][:, 0] = np.arange(n) % 7
    state = {"field": field, "parts": table, "zeros": np.zeros((32, 512)), "step": step}
    if step % 5 in (2, 3):
        state["sometimes"] = _rng(seed, 5).integers(0, 9, size=(40, 30)).astype(np.int32)
    return state


def split_rows(seed: int, step: int, total: int, nranks: int) -> list[tuple[int, int]]:
    """An uneven split of ``total`` rows (different every step: rows migrate between ranks)."""
    cuts = np.sort(_rng(seed, 6, step, nranks).integers(0, total + 1, size=nranks - 1)) if nranks > 1 else []
    bounds = [0, *map(int, cuts), total]
    return [(bounds[r], bounds[r + 1]) for r in range(nranks)]


def local_state(seed: int, step: int, comm) -> dict:
    g = global_state(seed, step)
    rank, size = comm.Get_rank(), comm.Get_size()
    out = {"step": step}
    for name in ("field", "zeros", "sometimes"):
        if name in g:
            lo, hi = even_rows(g[name].shape[0], size, rank)
            out[name] = hpcckpt.Block(g[name][lo:hi].copy(), (lo, 0), g[name].shape)
    lo, hi = split_rows(seed, step, len(g["parts"]), size)[rank]
    out["parts"] = hpcckpt.Ragged(g["parts"][lo:hi].copy())
    return out


def template(seed: int, step: int, comm) -> dict:
    t = local_state(seed, step, comm)
    for name, value in t.items():
        if isinstance(value, hpcckpt.Block):
            value.local[...] = -1
    t["parts"] = hpcckpt.Ragged()
    return t


def main() -> int:
    from mpi4py import MPI

    root, first, nsteps, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    if sys.argv[5:6] == ["columnar"]:
        chunk_columns.COLUMNAR_MIN_CHUNKS = 0
    if sys.argv[6:] == ["owners"]:
        dedup_owners.OWNERS_FROM_RANKS = 1
    comm = MPI.COMM_WORLD
    ck = hpcckpt.Checkpointer(root, comm=comm, incremental=True, block_bytes=2048, max_chain=6,
                              full_threshold=0.6, keep=3, track_failures=False, strategy="file-per-rank")
    latest = ck.latest()
    if latest is not None:
        out = ck.restore(template(seed, latest, comm))
        g = global_state(seed, latest)
        got = comm.gather(out["parts"].local, root=0)
        for name, value in out.items():
            if isinstance(value, hpcckpt.Block):
                lo = value.offset[0]
                assert np.array_equal(value.local, g[name][lo:lo + value.local.shape[0]]), (name, latest)
        if comm.rank == 0:
            assert np.array_equal(np.concatenate(got), g["parts"]), latest
            assert out["step"] == latest
            print(f"RESTORED {latest}", flush=True)
    for step in range(first, first + nsteps):
        result = ck.save(local_state(seed, step, comm), step=step)
        if comm.rank == 0:
            info = result.incremental
            print(f"SAVED {step} {info['kind']} {info['written_bytes']} {info['referenced_bytes']} "
                  f"{info['deduplicated_bytes']}", flush=True)
    ck.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
