"""Save on N ranks to a Checkpointer root in a bucket, or restore there on any other number (tests/storage/test_storage_s3*.py).

    mpiexec -n 4 python tests/scripts/s3_ranks.py save s3://bucket/root [LOCAL_DIR]
    mpiexec -n 3 python tests/scripts/s3_ranks.py restore s3://bucket/root [LOCAL_DIR]

The endpoint and keys come from boto3's environment variables.  A 1-d field of
GLOBAL rows of width 7, split by rows as evenly as the ranks allow.  With
LOCAL_DIR, node-local levels too: two ranks per (simulated) node, partner
copies at every save, the flush to the bucket every second one (and the newest
at the end); the restore prints the level it read from.
"""

import sys

import numpy as np
from mpi4py import MPI

import hpcckpt

GLOBAL = 1001


def share(comm):
    lo = comm.rank * GLOBAL // comm.size
    hi = (comm.rank + 1) * GLOBAL // comm.size
    return lo, hi


def field(step, lo, hi):
    return (np.arange(lo * 7, hi * 7, dtype=np.float64).reshape(-1, 7) + 1000 * step)


comm = MPI.COMM_WORLD
mode, root = sys.argv[1], sys.argv[2]
levels = dict(local_dir=sys.argv[3], ranks_per_node=2, partner_every=1, flush_every=2) if len(sys.argv) > 3 else {}
lo, hi = share(comm)
with hpcckpt.Checkpointer(root, comm, keep=2, **levels) as ck:
    if mode == "save":
        for step in (1, 2, 3):
            ck.save({"u": hpcckpt.Block(field(step, lo, hi), (lo, 0), (GLOBAL, 7)), "step": step}, step=step)
    else:
        out = np.zeros((hi - lo, 7))
        got = ck.restore({"u": hpcckpt.Block(out, (lo, 0), (GLOBAL, 7)), "step": None})
        assert got["step"] == 3, got["step"]
        assert np.array_equal(out, field(3, lo, hi)), f"rank {comm.rank}: wrong rows"
        total = comm.allreduce(out.size)
        assert total == GLOBAL * 7
        if comm.rank == 0:
            print(f"restored step {got['step']} on {comm.size} ranks, versions {ck.steps()}")
            if levels:
                print(f"restored from {ck.engine.restored_level}")
