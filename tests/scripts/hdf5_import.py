"""Load a plain h5py-written file (tests/integrations/test_hdf5.py:write_foreign) on any number of ranks; check every byte.

argv: H5PATH MODE.  MODE is
  ok        uneven 2-D blocks (C and Fortran-ordered locals), Ragged() and Ragged(rows=k), values;
  mismatch  a template whose dtype differs: every rank must raise TemplateMismatchError naming 'u';
  corrupt   the file is damaged: every rank must raise CorruptCheckpointError.
Prints 'rank R ok' per rank; exits non-zero on any difference.
"""

import sys

import numpy as np
from mpi4py import MPI

import hpcckpt
from hpcckpt.hdf5 import load_hdf5

comm = MPI.COMM_WORLD
path, mode = sys.argv[1], sys.argv[2]
G0, G1 = 13, 7  # keep in sync with tests/integrations/test_hdf5.py:write_foreign
NREC = 10


def cuts(n, parts):
    """Uneven cut points: part k gets a share proportional to k + 1."""
    weights = np.arange(1, parts + 1)
    edges = np.concatenate([[0], np.cumsum(weights)]) * n // weights.sum()
    return edges.tolist()


def grid(size):
    return {1: (1, 1), 2: (1, 2), 3: (3, 1), 4: (2, 2)}.get(size, (size, 1))


py, px = grid(comm.size)
ry, rx = divmod(comm.rank, px)
rows, cols = cuts(G0, py), cuts(G1, px)
r0, r1, c0, c1 = rows[ry], rows[ry + 1], cols[rx], cols[rx + 1]
order = "F" if comm.rank % 2 else "C"
dtype = np.float32 if mode == "mismatch" else np.float64
u = np.zeros((r1 - r0, c1 - c0), dtype=dtype, order=order)
p = np.zeros((r1 - r0, c1 - c0), dtype=np.int32)
state = {
    "u": hpcckpt.Block(u, (r0, c0), (G0, G1)),
    "grp/p": hpcckpt.Block(p, (r0, c0), (G0, G1)),  # on odd ranks nested, {"grp": {"p": ...}}: the same dataset
    "even": hpcckpt.Ragged(),
    "counted": hpcckpt.Ragged(rows=NREC if comm.rank == comm.size - 1 else 0),
    "dt": None,
    "title": None,
    "config": None,
}
if comm.rank % 2:
    state["grp"] = {"p": state.pop("grp/p")}
try:
    out = load_hdf5(state, path, comm, strict=False)
except hpcckpt.TemplateMismatchError as exc:
    if mode != "mismatch" or "'u'" not in str(exc):
        raise
    print(f"rank {comm.rank} ok: {exc}", flush=True)
    sys.exit(0)
except hpcckpt.CorruptCheckpointError as exc:
    if mode != "corrupt":
        raise
    print(f"rank {comm.rank} ok: {exc}", flush=True)
    sys.exit(0)
if mode != "ok":
    sys.exit(f"rank {comm.rank}: mode {mode} expected an error, the load succeeded")

i, j = np.meshgrid(np.arange(r0, r1), np.arange(c0, c1), indexing="ij")
assert np.array_equal(u, i * 1000.0 + j), (comm.rank, u)
assert np.array_equal(p, (i * 7 + j).astype(np.int32)), (comm.rank, p)
lo, hi = comm.rank * NREC // comm.size, (comm.rank + 1) * NREC // comm.size
even = out["even"].local
assert even.dtype.names == ("id", "xyz"), even.dtype
assert np.array_equal(even["id"], np.arange(lo, hi)), (comm.rank, even)
assert np.array_equal(even["xyz"], np.arange(lo, hi)[:, None] * np.ones(3) * 0.5)
counted = out["counted"].local
want = np.arange(NREC, dtype=np.int64) if comm.rank == comm.size - 1 else np.zeros(0, np.int64)
assert np.array_equal(counted, want) and counted.dtype == np.dtype(">i8"), (comm.rank, counted)
assert out["dt"] == 0.25 and isinstance(out["dt"], float), out["dt"]
assert out["title"] == "initial conditions", out["title"]
assert out["config"] == {"n": [1, 2, 3], "name": "x"}, out["config"]
assert (out["grp"]["p"] if comm.rank % 2 else out["grp/p"]).local is p  # the result nested as the template
print(f"rank {comm.rank} ok", flush=True)
