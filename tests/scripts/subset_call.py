"""Rank 0 alone calls a collective Checkpointer method (driven by tests/test_watchdog.py).

    mpiexec -n 2 python subset_call.py ROOT

The other ranks wait in the application's own Barrier.  With HPCCKPT_DEBUG=1 the job must end within
HPCCKPT_DEBUG_TIMEOUT seconds with one line naming the call; without it, it hangs.
"""

from __future__ import annotations

import sys

import numpy as np


def main(root: str) -> int:
    from mpi4py import MPI

    import hpcckpt

    comm = MPI.COMM_WORLD
    ck = hpcckpt.Checkpointer(root, comm=comm, track_failures=False)
    ck.save({"u": hpcckpt.Block(np.zeros(10), (10 * comm.rank,), (10 * comm.size,))}, 1)
    if comm.Get_rank() == 0:
        print("STEPS", ck.steps(), flush=True)  # collective: the other ranks never call it
    comm.Barrier()  # the application's own synchronisation (not hpcckpt's): rank 0 never gets here
    ck.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
