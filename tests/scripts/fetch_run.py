"""Node-local restores that read other nodes' files, for tests/cluster/test_node_loss.py (run under mpiexec).

    fetch_run.py save ROOT LOCAL OPTIONS_JSON
        save steps 1 (flushed to ROOT) and 2 (node-local levels only): a Ragged table of uneven rows (rank r
        saves ROWS * (r + 1)) and a Block of uneven parts, then close
    fetch_run.py running ROOT LOCAL OPTIONS_JSON
        the same, then print "OK running" and go on computing until killed (a node is lost)
    fetch_run.py restore ROOT LOCAL SAVED_RANKS STEP LEVEL OPTIONS_JSON
        restore with an even split of both (Ragged(), and Blocks of even_rows) on however many ranks run;
        check the exact data of STEP and the level

Every rank prints ``OK`` lines and its warnings; failures raise (non-zero exit).
"""

import json
import sys
import time
import warnings

import numpy as np
from mpi4py import MPI

from hpcckpt import Block, Checkpointer, Ragged
from hpcckpt.core.regions import even_rows

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size
ROWS, PART = 700, 3000  # rank r saves ROWS * (r + 1) rows of 3 float64 and PART * (r + 1) float64


def before(unit: int, r: int) -> int:
    return unit * r * (r + 1) // 2


def table(step: int, nrows: int) -> np.ndarray:
    return np.arange(nrows * 3, dtype=np.float64).reshape(nrows, 3) + 0.5 * step


def vector(step: int, lo: int, hi: int) -> np.ndarray:
    return np.arange(lo, hi, dtype=np.float64) + 1e7 * step


def make(root, local, opts):
    return Checkpointer(root, local_dir=local, track_failures=False, chunk_bytes=8192, **opts)


def save(root, local, opts, keep_running=False):
    lo, hi = before(ROWS, rank), before(ROWS, rank + 1)
    b0, b1 = before(PART, rank), before(PART, rank + 1)
    ck = make(root, local, {"flush_every": 2, **opts})
    for s in (1, 2):
        ck.save({"t": Ragged(table(s, before(ROWS, size))[lo:hi]),
                 "u": Block(vector(s, b0, b1), (b0,), (before(PART, size),)), "step": s}, s)
        if s == 1:
            ck.wait()  # step 1 committed everywhere, the root included
    if keep_running:
        ck.engine.sync()  # step 2 committed on the node-local levels
        print(f"rank {rank}: OK running on {MPI.Get_processor_name()}", flush=True)
        while True:
            comm.Barrier()
            time.sleep(0.05)
    ck.close()
    print(f"rank {rank}: OK saved on {MPI.Get_processor_name()}", flush=True)


def restore(root, local, saved_ranks, step, level, opts):
    nrows, length = before(ROWS, saved_ranks), before(PART, saved_ranks)
    lo, hi = even_rows(length, size, rank)
    u = np.full(hi - lo, -1.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with make(root, local, opts) as ck:
            out = ck.restore({"t": Ragged(), "u": Block(u, (lo,), (length,)), "step": None})
            got_level = ck.engine.restored_level
    for w in caught:
        print(f"rank {rank}: WARNING {w.message}", flush=True)
    a, b = even_rows(nrows, size, rank)
    assert (out["step"], got_level) == (step, level), (out["step"], got_level, step, level)
    assert np.array_equal(out["t"].local, table(step, nrows)[a:b]), "restored rows differ"
    assert np.array_equal(u, vector(step, lo, hi)), "restored block differs"
    print(f"rank {rank}: OK restored step {step} from {got_level} on {MPI.Get_processor_name()}", flush=True)


if __name__ == "__main__":
    cmd, root, local = sys.argv[1:4]
    rest = sys.argv[4:]
    options = json.loads(rest[-1])
    if cmd in ("save", "running"):
        save(root, local, options, keep_running=cmd == "running")
    elif cmd == "restore":
        restore(root, local, int(rest[0]), int(rest[1]), rest[2], options)
    else:
        raise SystemExit(f"unknown command {cmd}")
