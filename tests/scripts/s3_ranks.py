"""Save on N ranks to a Checkpointer root in a bucket, or restore there on any other number (tests/storage/test_storage_s3*.py).

    mpiexec -n 4 python tests/scripts/s3_ranks.py save s3://bucket/root [local=DIR] [incremental=1]
        [strategy=S ranks_per_node=K]
    mpiexec -n 3 python tests/scripts/s3_ranks.py restore s3://bucket/root [local=DIR] [incremental=1]
    mpiexec -n 3 python tests/scripts/s3_ranks.py resume s3://bucket/root incremental=1

The endpoint and keys come from boto3's environment variables.  A 1-d field of
GLOBAL rows of width 7, split by rows as evenly as the ranks allow, of which
the first 100 * step rows change at each step.  ``save`` saves steps 1 to 3,
``restore`` restores step 3, ``resume`` restores step 3, saves step 4 and
restores that.  With local=DIR, node-local levels too: two ranks per
(simulated) node, partner copies at every save, the flush to the bucket every
second one (and the newest at the end); the restore prints the level it read
from.  With incremental=1, incremental saves in blocks of 4 KiB.  With strategy=S
ranks_per_node=K, the saves use strategy S on simulated nodes of K ranks and
print the strategy each used.
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
    u = np.arange(lo * 7, hi * 7, dtype=np.float64).reshape(-1, 7)
    u[np.arange(lo, hi) < 100 * step] += 1000 * step
    return u


def state(step, lo, hi):
    return {"u": hpcckpt.Block(field(step, lo, hi), (lo, 0), (GLOBAL, 7)), "step": step}


def restore_exact(ck, step, lo, hi):
    out = np.zeros((hi - lo, 7))
    got = ck.restore({"u": hpcckpt.Block(out, (lo, 0), (GLOBAL, 7)), "step": None})
    assert got["step"] == step, got["step"]
    assert np.array_equal(out, field(step, lo, hi)), f"rank {comm.rank}: wrong rows"
    assert comm.allreduce(out.size) == GLOBAL * 7
    if comm.rank == 0:
        print(f"restored step {got['step']} on {comm.size} ranks, versions {ck.steps()}")


comm = MPI.COMM_WORLD
mode, root = sys.argv[1], sys.argv[2]
given = dict(arg.split("=", 1) for arg in sys.argv[3:])
options = {}
if "local" in given:
    options.update(local_dir=given["local"], ranks_per_node=2, partner_every=1, flush_every=2)
if given.get("incremental"):
    options.update(incremental=True, block_bytes=4096)
if "strategy" in given:
    options.update(strategy=given["strategy"], ranks_per_node=int(given["ranks_per_node"]))
lo, hi = share(comm)
with hpcckpt.Checkpointer(root, comm, keep=2, **options) as ck:
    if mode == "save":
        for step in (1, 2, 3):
            result = ck.save(state(step, lo, hi), step=step)
            if comm.rank == 0:
                print(f"step {step}: {result.strategy}")
    else:
        restore_exact(ck, 3, lo, hi)
        if comm.rank == 0 and "local" in given:
            print(f"restored from {ck.engine.restored_level}")
        if mode == "resume":
            result = ck.save(state(4, lo, hi), step=4)
            if comm.rank == 0:
                print(f"step 4: {result.incremental['kind']}, {result.incremental['referenced_bytes']} bytes "
                      "referenced")
            restore_exact(ck, 4, lo, hi)
