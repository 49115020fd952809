"""An MPI program whose main code fails, under ``hpcckpt.report_errors`` (driven by tests/mpi_layer/test_report_errors.py).

    mpiexec -n N python report_errors.py ROOT MODE

MODE ``checkpoint-error``: every rank restores from an empty root (a CheckpointError on every rank), in the
``with`` form; ``decorated``: the same through ``@hpcckpt.report_errors()``; ``crash-one``: rank 1 raises a
ValueError while the other ranks enter a collective save, which would wait for it forever;
``checkpoint-error-on-one``: rank 1 alone raises a CheckpointError while the others wait in a Barrier.
"""

from __future__ import annotations

import sys

import numpy as np
from mpi4py import MPI

import hpcckpt

comm = MPI.COMM_WORLD


def restore_from_empty(root: str) -> None:
    ck = hpcckpt.Checkpointer(root, comm=comm, track_failures=False)
    ck.restore({"u": hpcckpt.Block(np.zeros(4), (4 * comm.rank,), (4 * comm.size,))})
    print("NOT REACHED", flush=True)


@hpcckpt.report_errors()
def decorated(root: str) -> None:
    restore_from_empty(root)


def checkpoint_error_on_one(root: str) -> None:
    if comm.rank == 1:
        raise hpcckpt.CheckpointError("the application's own check failed on rank 1")
    comm.Barrier()  # the other ranks wait for rank 1
    print("NOT REACHED", flush=True)


def crash_one(root: str) -> None:
    ck = hpcckpt.Checkpointer(root, comm=comm, track_failures=False)
    if comm.rank == 1:
        raise ValueError("a bug in the application on rank 1")
    ck.save({"u": hpcckpt.Block(np.zeros(4), (4 * comm.rank,), (4 * comm.size,))}, 1)  # waits for rank 1
    print("NOT REACHED", flush=True)


if __name__ == "__main__":
    root, mode = sys.argv[1:3]
    if mode == "decorated":
        decorated(root)
    else:
        with hpcckpt.report_errors(comm):
            {"checkpoint-error": restore_from_empty, "crash-one": crash_one,
             "checkpoint-error-on-one": checkpoint_error_on_one}[mode](root)
