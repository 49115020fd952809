"""hpcckpt calls made on a subset of the ranks (driven by tests/mpi_layer/test_watchdog.py).

    mpiexec -n N python subset_call.py ROOT MODE

MODE ``query``: rank 0 alone asks ``steps()``/``latest()`` (not collective), of a blocking, an asynchronous
and a multi-level Checkpointer (a pending save is not listed until the next collective call commits it); every rank
then goes on.  ``save-on-one``: rank 0 alone calls the collective ``save``; the other ranks wait in the
application's own Barrier: with HPCCKPT_DEBUG=1 the job ends within HPCCKPT_DEBUG_TIMEOUT seconds with one line
naming the call (without it, it hangs).  ``different-calls``: rank 0 saves while the others restore: with
HPCCKPT_DEBUG=1 every rank raises a CheckpointError naming both calls.
"""

from __future__ import annotations

import os
import sys

import numpy as np


def state(comm, value=0.0):
    import hpcckpt

    return {"u": hpcckpt.Block(np.full(10, value), (10 * comm.rank,), (10 * comm.size,))}


def query(root: str, comm) -> None:
    import hpcckpt

    ck = hpcckpt.Checkpointer(root, comm=comm, track_failures=False)
    ck.save(state(comm, 1.0), 1)
    ck.save(state(comm, 2.0), 2)
    if comm.rank == 0:
        print("STEPS", ck.steps(), "LATEST", ck.latest(), flush=True)
    out = state(comm)
    ck.restore(out)  # collective, after the subset call: every rank got here
    assert np.all(out["u"].local == 2.0)
    ck.close()
    ack = hpcckpt.Checkpointer(os.path.join(root, "async"), comm=comm, asynchronous=True, track_failures=False)
    ack.save(state(comm, 1.0), 1)
    ack.wait()
    ack.save(state(comm, 2.0), 2)  # pending
    if comm.rank == comm.size - 1:
        print("PENDING", ack.steps(), ack.latest(), flush=True)
    ack.wait()
    if comm.rank == comm.size - 1:
        print("COMMITTED", ack.steps(), ack.latest(), flush=True)
    ack.close()
    lck = hpcckpt.Checkpointer(os.path.join(root, "levels"), comm=comm, local_dir=os.path.join(root, "local"),
                               ranks_per_node=1, flush_every=2, track_failures=False)
    for step in (1, 2, 3):  # 2 is flushed to the root; 3 lives on the node-local level only
        lck.save(state(comm, float(step)), step)
    if comm.rank == 0:
        print("LEVELS", lck.steps(), lck.latest(), flush=True)
    lck.close()
    comm.Barrier()
    print(f"DONE {comm.rank}", flush=True)  # one string: lines of several ranks may interleave


def save_on_one(root: str, comm) -> None:
    import hpcckpt

    ck = hpcckpt.Checkpointer(root, comm=comm, track_failures=False)
    ck.save(state(comm), 1)
    if comm.rank == 0:
        ck.save(state(comm), 2)  # collective: the other ranks never call it
        print("SAVED", flush=True)
    comm.Barrier()  # the application's own synchronisation (not hpcckpt's): rank 0 never gets here
    ck.close()


def different_calls(root: str, comm) -> None:
    import hpcckpt

    ck = hpcckpt.Checkpointer(root, comm=comm, track_failures=False)
    ck.save(state(comm), 1)
    try:
        if comm.rank == 0:
            ck.save(state(comm), 2)
        else:
            ck.restore(state(comm))
    except hpcckpt.CheckpointError as exc:
        print(f"ERROR {comm.rank}: {exc}", flush=True)
    comm.Barrier()
    print(f"DONE {comm.rank}", flush=True)  # one string: lines of several ranks may interleave


def main(root: str, mode: str) -> int:
    from mpi4py import MPI

    {"query": query, "save-on-one": save_on_one, "different-calls": different_calls}[mode](root, MPI.COMM_WORLD)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
