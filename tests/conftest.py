"""Shared fixtures: a temporary directory that all MPI ranks agree on, and a launcher for mpiexec runs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def mpiexec_path() -> str:
    """The mpiexec of this environment (dev.py sets HPCCKPT_TEST_MPIEXEC), never a system one by accident."""
    found = os.environ.get("HPCCKPT_TEST_MPIEXEC") or os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if not os.path.exists(found):
        pytest.skip("no mpiexec next to this Python; run the suite through dev.py")
    return found


def run_mpi(nranks: int, script: str, *args, timeout: float = 120, env: dict | None = None, check: bool = True):
    """Run ``python script args`` under ``mpiexec -n nranks``; fail the test on timeout (a hang)."""
    cmd = [mpiexec_path(), "-n", str(nranks), sys.executable, script, *map(str, args)]
    full_env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env or {}))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env, cwd=ROOT)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{' '.join(cmd)} hung for {timeout} s; output so far: {exc.stdout!r} {exc.stderr!r}")
    if check and proc.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


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
