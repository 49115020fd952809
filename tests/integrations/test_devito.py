"""Devito through hpcckpt.adapters: apps/acoustic2d.py, a 2-D acoustic wave equation (TimeFunction of space
order 8, three time buffers), killed by a real SIGKILL after a checkpoint and restarted on the same and on
another rank count, against uninterrupted runs on 1, 2 and 4 ranks.

A restart on the decomposition that wrote the checkpoint is bitwise that decomposition's uninterrupted run.  A
restart on another one ran its first steps on one decomposition and the rest on another, so it carries the
rounding of both: it is within twice the largest difference between the uninterrupted runs of any two
decompositions, measured here, which must itself be rounding-sized.

Devito runs with DEVITO_MPI=1 (on one rank too) and compiles its operators with the mpicc of this
environment's MPI (MPICH's, in the venv's bin/), first on PATH: the fixture checks it, since a system OpenMPI's
mpicc found first makes the operator abort with "MPI_Irecv() called before MPI_INIT" (docs/porting.md).
Devito is installed when missing (tests/support/optional_libs.py).
"""

from __future__ import annotations

import os
import re
import shutil
import sys

import numpy as np
import pytest

import hpcckpt
from hpcckpt.adapters import block
from mpitools import ROOT, run_mpi
from optional_libs import ensure_library

APP = os.path.join(ROOT, "apps", "acoustic2d.py")
STEPS, EVERY, KILL_STEP = 150, 50, 100


@pytest.fixture(scope="module")
def devito_env():
    """The environment of Devito's MPI programs: its MPI mode on, this environment's mpicc first on PATH."""
    ensure_library("devito")
    path = os.pathsep.join((os.path.dirname(sys.executable), os.environ.get("PATH", "")))
    mpicc = shutil.which("mpicc", path=path)
    assert mpicc == os.path.join(os.path.dirname(sys.executable), "mpicc"), f"Devito would compile with {mpicc}"
    return {"DEVITO_MPI": "1", "DEVITO_LOGGING": "WARNING", "PATH": path}


def _run(env, tmp, name, nranks, *extra, check=True):
    return run_mpi(nranks, APP, "--root", tmp / name, "--steps", STEPS, "--every", EVERY, *extra, env=env,
                   timeout=300, check=check, cwd=str(tmp))


def _final(path) -> np.ndarray:
    with hpcckpt.open(path) as view:
        assert view.values["step"] == STEPS
        return view.read("u")


#: rank count that writes the checkpoint -> the rank counts that restart from it (the first: the same one)
RESTARTS = {4: (4, 2, 1), 2: (2, 4)}


@pytest.mark.timeout(900)
def test_a_killed_wave_run_restarts_on_the_same_and_on_another_rank_count(devito_env, tmp_path):
    ref = {}
    for n in (1, 2, 4):
        _run(devito_env, tmp_path, f"ref{n}", n, "--out", tmp_path / f"ref{n}.out")
        ref[n] = _final(tmp_path / f"ref{n}.out")
    assert ref[1].shape == (3, 101, 101) and np.abs(ref[1]).max() > 1.0  # every time buffer; the wave is there
    # Devito's own difference between decompositions (a decomposition changes the order of its sums), a
    # rounding-sized one: a block placed or restored wrongly would differ by the size of the wave itself
    spread = max(float(np.abs(ref[a] - ref[b]).max()) for a in ref for b in ref)
    assert spread < 1e-3 * np.abs(ref[1]).max()
    for wrote, restarts in RESTARTS.items():
        crashed = _run(devito_env, tmp_path, f"crash{wrote}", wrote, "--kill-rank", 0, "--kill-step", KILL_STEP,
                       check=False)
        assert crashed.returncode != 0 and f"SIGKILL to myself after step {KILL_STEP}" in crashed.stdout, crashed
        for n in restarts:
            root = tmp_path / f"crash{wrote}-on{n}"
            shutil.copytree(tmp_path / f"crash{wrote}", root)
            out = _run(devito_env, tmp_path, root.name, n, "--out", tmp_path / f"{root.name}.out")
            assert f"restored step {KILL_STEP}" in out.stdout, out.stdout
            got = _final(tmp_path / f"{root.name}.out")
            if n == wrote:
                assert np.array_equal(got, ref[n]), f"{wrote} -> {n}: not bitwise"
            else:  # the first steps ran on one decomposition, the rest on another: rounding of both
                assert float(np.abs(got - ref[n]).max()) <= 2 * spread, f"{wrote} -> {n}: beyond 2 x {spread}"


def test_the_block_of_a_time_function_is_every_buffer_of_its_domain(devito_env):
    from devito import Function, Grid, TimeFunction

    grid = Grid(shape=(6, 5))
    u = TimeFunction(name="u", grid=grid, time_order=2, space_order=4)
    f = Function(name="f", grid=grid, space_order=2)
    b = block(u)
    assert b.global_shape == (3, 6, 5) and b.offset == (0, 0, 0) and type(b.local) is np.ndarray
    assert np.shares_memory(b.local, u.data) and b.local.shape == u.data.shape  # the domain, no halo
    assert block(f).global_shape == (6, 5)
    assert type(hpcckpt.Block(u.data).local) is np.ndarray  # Devito's Data, where a numpy array is taken


def test_the_program_of_docs_integrations_is_the_app():
    with open(os.path.join(ROOT, "docs", "integrations.md"), encoding="utf-8") as f:
        section = f.read().split("\n## Devito", 1)[1].split("\n## ", 1)[0]
    with open(APP, encoding="utf-8") as f:
        app = f.read()
    doc = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert app.endswith(doc) and doc.startswith("from __future__")  # everything but the module docstring
