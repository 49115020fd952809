"""Two jobs on one root, for tests/storage/test_root_safety.py (run under mpiexec).

    root_jobs.py race ROOT TAG GO    save step 1 (taking the lock) or fail; the winner saves 2 and 3, waits for
                                     the file GO, then closes.  Every rank prints "OK won TAG" or
                                     "OK locked out TAG: <error>"
    root_jobs.py hold ROOT           save step 1, then SIGKILL every rank (the lock stays behind)

The data of a job is ``values(tag, step, rank)``, so the test can tell whose data a version holds.
"""

import os
import signal
import sys
import time

import numpy as np
from mpi4py import MPI

from hpcckpt import Block, Checkpointer, CheckpointError

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size
N = 500


def values(tag: int, step: int, r: int) -> np.ndarray:
    return np.full(N, 1000.0 * tag + 10.0 * step + r)


def state(tag: int, step: int) -> dict:
    return {"u": Block(values(tag, step, rank), (rank * N,), (size * N,)), "tag": tag}


def race(root: str, tag: int, go: str) -> None:
    ck = Checkpointer(root, track_failures=False)
    try:
        ck.save(state(tag, 1), 1)
    except CheckpointError as exc:
        print(f"rank {rank}: OK locked out {tag}: {exc}", flush=True)
        ck.close()
        return
    for step in (2, 3):
        ck.save(state(tag, step), step)
    while not os.path.exists(go):  # hold the lock until the test saw the other job fail
        time.sleep(0.05)
    ck.close()
    print(f"rank {rank}: OK won {tag}", flush=True)


def hold(root: str) -> None:
    ck = Checkpointer(root, track_failures=False)
    ck.save(state(7, 1), 1)
    comm.Barrier()
    print(f"rank {rank}: OK holding", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "race":
        race(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    elif cmd == "hold":
        hold(sys.argv[2])
    else:
        raise SystemExit(f"unknown command {cmd}")
