"""Launching mpiexec from a serial test: the environment's own mpiexec, with a timeout so a hang fails.

A plain module (not conftest) so that tests import it by name: ``from mpitools import run_mpi``
(tests/conftest.py puts tests/support/ on the path); tests/slurm has a conftest of its own, which would
shadow ``from conftest import``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass

import pytest

from testpaths import REPO as ROOT, TESTS

#: Where the test helpers are: on the path of every program a test launches, as under pytest (tests/conftest.py)
SUPPORT = os.path.join(TESTS, "support")


def mpiexec_path() -> str:
    """The mpiexec of this environment (dev.py sets HPCCKPT_TEST_MPIEXEC), never a system one by accident."""
    found = os.environ.get("HPCCKPT_TEST_MPIEXEC") or os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if not os.path.exists(found):
        pytest.skip("no mpiexec next to this Python; run the suite through dev.py")
    return found


@dataclass(frozen=True)
class Runtime:
    """Where an MPI program runs: the mpiexec command, the Python it runs, and directories it imports from
    before this tree (a library of another Python: tests/support/petsc_env.py)."""

    mpiexec: tuple[str, ...]
    python: str
    pythonpath: tuple[str, ...] = ()


def project_runtime() -> Runtime:
    """This environment's own: its mpiexec and the Python running the tests."""
    return Runtime((mpiexec_path(),), sys.executable)


def run_mpi(nranks: int, script: str, *args, timeout: float = 120, env: dict | None = None, check: bool = True,
            cwd: str = ROOT, runtime: Runtime | None = None):
    """Run ``python script args`` under ``mpiexec -n nranks`` in ``cwd`` (this environment's, or ``runtime``'s
    mpiexec and Python); fail the test on timeout (a hang)."""
    runtime = runtime or project_runtime()
    cmd = [*runtime.mpiexec, "-n", str(nranks), runtime.python, script, *map(str, args)]
    path = os.pathsep.join((*runtime.pythonpath, ROOT, SUPPORT, os.environ.get("PYTHONPATH", "")))
    full_env = dict(os.environ, PYTHONPATH=path, **(env or {}))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env, cwd=cwd)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{' '.join(cmd)} hung for {timeout} s; output so far: {exc.stdout!r} {exc.stderr!r}")
    if check and proc.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


class CountingComm:
    """Wraps a communicator and counts every MPI call made through it."""

    def __init__(self, comm):
        self._comm, self.calls = comm, []

    def __getattr__(self, name):
        attr = getattr(self._comm, name)
        if callable(attr) and name not in ("Get_rank", "Get_size"):
            def counted(*a, **k):
                self.calls.append(name)
                return attr(*a, **k)
            return counted
        return attr


def force_dedup_exchange(monkeypatch, exchange: str) -> None:
    """Make an incremental save deduplicate through ``exchange`` at any communicator size (serially too):
    "owners" (the owners' two alltoalls, hpcckpt.incremental.dedup_owners) or "allgather"."""
    from hpcckpt.incremental import dedup_owners

    if exchange not in ("owners", "allgather"):
        raise ValueError(f"HPCCKPT_TEST_DEDUP={exchange!r}: owners or allgather")
    monkeypatch.setattr(dedup_owners, "OWNERS_FROM_RANKS", 1 if exchange == "owners" else 1 << 62)
