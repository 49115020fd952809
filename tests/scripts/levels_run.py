"""Multi-level / asynchronous checkpoint scenarios for tests/levels/test_levels.py (run under mpiexec).

    levels_run.py save ROOT LOCAL NSTEPS OPTIONS_JSON        save steps 1..NSTEPS, close
    levels_run.py restore ROOT LOCAL STEP LEVEL OPTIONS_JSON  restore, check exact data of STEP and the level
    levels_run.py running ROOT LOCAL NSTEPS OPTIONS_JSON     save steps 1..NSTEPS (the first flushed), commit the
                                                              last on the node-local levels, print "OK running",
                                                              then go on computing until killed (a node is lost)
    levels_run.py flushing ROOT LOCAL OPTIONS_JSON            save 1 (flushed), save 2 (committed on the node-local
                                                              levels, its flush started), go on until killed
    levels_run.py flushkill ROOT LOCAL OPTIONS_JSON           save 1 (flushed), save 2, SIGKILL every rank mid-flush
    levels_run.py failwrite ROOT LOCAL OPTIONS_JSON           a background write fails on rank 1
    levels_run.py failclose ROOT LOCAL OPTIONS_JSON           save 1 (flush in progress), save 2 fails (node-local
                                                              storage full) and its error surfaces in close()

The data of step s on rank r is deterministic (``values(s, r)``) so any run can
check what it restored bit for bit.  Every rank prints ``OK`` lines; failures
raise (non-zero exit).
"""

import json
import os
import signal
import sys
import time
import warnings

import numpy as np
from mpi4py import MPI

from hpcckpt import Block, Checkpointer, CheckpointError

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size
N = 3000  # float64 per rank and step (24 KB): several chunks with chunk_bytes=8192


def values(step, r):
    return np.random.default_rng(1000 * step + r).standard_normal(N)


def state_for(a):
    return {"u": Block(a, (rank * N,), (size * N,)), "step": None}


def make(root, local, opts):
    return Checkpointer(root, local_dir=local, track_failures=False, chunk_bytes=8192, **opts)


def save(root, local, nsteps, opts):
    a = np.empty(N)
    with make(root, local, opts) as ck:
        for s in range(1, nsteps + 1):
            a[:] = values(s, rank)
            ck.save({"u": Block(a, (rank * N,), (size * N,)), "step": s}, s)
            a[:] = np.nan  # the application overwrites its state at once
    print(f"rank {rank}: OK saved {nsteps}", flush=True)


def restore(root, local, step, level, opts):
    a = np.zeros(N)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with make(root, local, opts) as ck:
            out = ck.restore(state_for(a))
            got_level = ck.engine.restored_level
    for w in caught:
        print(f"rank {rank}: WARNING {w.message}", flush=True)
    assert out["step"] == step, (out["step"], step)
    assert np.array_equal(a, values(step, rank)), "restored data differ"
    assert got_level == level, (got_level, level)
    print(f"rank {rank}: OK restored step {step} from {got_level} on {MPI.Get_processor_name()}", flush=True)


def running(root, local, nsteps, opts):
    a = np.empty(N)
    ck = make(root, local, opts)
    for s in range(1, nsteps + 1):
        a[:] = values(s, rank)
        ck.save({"u": Block(a, (rank * N,), (size * N,)), "step": s}, s)
        a[:] = np.nan
        if s == 1:
            ck.wait()  # the first version is committed on every level it is due for, the root included
    ck.engine.sync()  # commits the last save on the node-local levels (and its partner copies / parity)
    print(f"rank {rank}: OK running after step {nsteps} on {MPI.Get_processor_name()}", flush=True)
    compute_until_killed()


def compute_until_killed():
    """The application goes on (without calling the Checkpointer) until a node loss ends the job."""
    while True:
        comm.Barrier()
        time.sleep(0.05)


def flushing(root, local, opts):
    a = np.empty(N)
    ck = make(root, local, opts)
    for s in (1, 2):
        a[:] = values(s, rank)
        ck.save({"u": Block(a, (rank * N,), (size * N,)), "step": s}, s)
        a[:] = np.nan
        if s == 1:
            ck.wait()  # step 1 committed everywhere, the root included
    ck.engine.sync()  # commits step 2 on the node-local levels and starts its (throttled) flush
    assert ck.engine.node.flushing == "step-000000000002", ck.engine.node.flushing
    print(f"rank {rank}: OK running during the flush of step-000000000002", flush=True)
    compute_until_killed()


def flushkill(root, local, opts):
    a = np.empty(N)
    ck = make(root, local, opts)
    a[:] = values(1, rank)
    ck.save({"u": Block(a, (rank * N,), (size * N,)), "step": 1}, 1)
    ck.wait()  # step 1 committed on L1 and flushed to the root
    a[:] = values(2, rank)
    ck.save({"u": Block(a, (rank * N,), (size * N,)), "step": 2}, 2)
    ck.engine.sync()  # commits step 2 on L1 and starts its (throttled) flush
    assert ck.engine.node.flushing is not None
    time.sleep(0.3)
    comm.Barrier()
    print(f"rank {rank}: OK killing during the flush of {ck.engine.node.flushing}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def failwrite(root, local, opts):
    from hpcckpt.transport import file_per_rank

    a = np.empty(N)
    ck = make(root, local, opts)
    original = file_per_rank.SequentialFile.append
    if rank == 1:
        def broken(self, buffer):
            raise OSError(28, "No space left on device (injected)")
        file_per_rank.SequentialFile.append = broken
    a[:] = values(1, rank)
    ck.save({"u": Block(a, (rank * N,), (size * N,)), "step": 1}, 1)  # returns: the failure is in the background
    print(f"rank {rank}: OK save returned", flush=True)
    try:
        ck.engine.sync()  # commits the pending save: the background failure surfaces
    except CheckpointError as exc:
        assert "rank 1" in str(exc) and "injected" in str(exc), str(exc)
        print(f"rank {rank}: OK CheckpointError at the next call: {exc}", flush=True)
    else:
        raise AssertionError("the background failure was lost")
    if rank == 1:
        file_per_rank.SequentialFile.append = original
    assert ck.latest() is None, "the failed version was committed"
    for d in (os.path.join(root, "step-000000000001"), os.path.join(ck.engine.node.node_dir, "step-000000000001")):
        assert not os.path.exists(os.path.join(d, "metadata.json")), d
    a[:] = values(2, rank)  # the next save works
    ck.save({"u": Block(a, (rank * N,), (size * N,)), "step": 2}, 2)
    ck.engine.sync()
    assert ck.latest() == 2
    ck.close()
    print(f"rank {rank}: OK next save committed", flush=True)


def failclose(root, local, opts):
    from hpcckpt.transport import file_per_rank

    a = np.empty(N)
    ck = make(root, local, opts)
    a[:] = values(1, rank)
    ck.save({"u": Block(a, (rank * N,), (size * N,)), "step": 1}, 1)
    ck.engine.sync()  # commits step 1 on L1 and starts its (throttled) flush
    assert ck.engine.node.flushing == "step-000000000001"

    def full(self, buffer):
        raise OSError(28, "No space left on device (injected)")

    file_per_rank.SequentialFile.append = full  # node-local storage is full from now on
    a[:] = values(2, rank)
    ck.save({"u": Block(a, (rank * N,), (size * N,)), "step": 2}, 2)  # asynchronous: fails in the background
    try:
        ck.close()
    except CheckpointError as exc:
        assert "injected" in str(exc), str(exc)
        print(f"rank {rank}: OK close raised: {exc}", flush=True)
    else:
        raise AssertionError("the failed save was lost")
    assert os.path.exists(os.path.join(root, "step-000000000001", "metadata.json")), "the flush was not committed"
    print(f"rank {rank}: OK flushed step 1 committed", flush=True)


if __name__ == "__main__":
    cmd, root, local = sys.argv[1:4]
    rest = sys.argv[4:]
    opts = json.loads(rest[-1]) if rest else {}
    if cmd == "save":
        save(root, local, int(rest[0]), opts)
    elif cmd == "restore":
        restore(root, local, int(rest[0]), rest[1], opts)
    elif cmd == "running":
        running(root, local, int(rest[0]), opts)
    elif cmd == "flushing":
        flushing(root, local, opts)
    elif cmd == "flushkill":
        flushkill(root, local, opts)
    elif cmd == "failwrite":
        failwrite(root, local, opts)
    elif cmd == "failclose":
        failclose(root, local, opts)
    else:
        raise SystemExit(f"unknown command {cmd}")
