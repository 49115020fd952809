"""Shared fixtures: a temporary directory that all MPI ranks agree on (launching mpiexec: mpitools.py)."""

from __future__ import annotations

import shutil
import tempfile

import pytest


@pytest.fixture
def mpi_tmp():
    """A fresh directory, the same on every rank (rank 0 creates it and broadcasts the name)."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    path = tempfile.mkdtemp(prefix="hpcckpt-") if comm.rank == 0 else None
    path = comm.bcast(path, root=0)
    yield path
    comm.Barrier()
    if comm.rank == 0:
        shutil.rmtree(path, ignore_errors=True)
