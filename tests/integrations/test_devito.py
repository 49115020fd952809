"""Devito through hpcckpt.adapters: apps/acoustic2d.py, a 2-D acoustic wave equation (TimeFunction of space
order 8, three time buffers), killed by a real SIGKILL after a checkpoint and restarted on the same and on
another rank count, against uninterrupted runs.

A restart on the decomposition that wrote the checkpoint is bitwise that decomposition's uninterrupted run; a
restart on another one is within the difference between the uninterrupted runs of the two decompositions,
measured here.  Devito runs with DEVITO_MPI=1 (on one rank too) and compiles its operators with the mpicc of
this environment's MPI, first on PATH.  Devito is installed when missing (tests/support/optional_libs.py).
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
    return {"DEVITO_MPI": "1", "DEVITO_LOGGING": "WARNING",
            "PATH": os.pathsep.join((os.path.dirname(sys.executable), os.environ.get("PATH", "")))}


def _run(env, tmp, name, nranks, *extra, check=True):
    return run_mpi(nranks, APP, "--root", tmp / name, "--steps", STEPS, "--every", EVERY, *extra, env=env,
                   timeout=300, check=check, cwd=str(tmp))


def _final(path) -> np.ndarray:
    with hpcckpt.open(path) as view:
        assert view.values["step"] == STEPS
        return view.read("u")


@pytest.mark.timeout(900)
def test_a_killed_wave_run_restarts_on_the_same_and_on_another_rank_count(devito_env, tmp_path):
    ref = {}
    for n in (1, 2):
        _run(devito_env, tmp_path, f"ref{n}", n, "--out", tmp_path / f"ref{n}.out")
        ref[n] = _final(tmp_path / f"ref{n}.out")
    assert ref[1].shape == (3, 101, 101) and np.abs(ref[1]).max() > 1.0  # every time buffer; the wave is there
    between = float(np.abs(ref[1] - ref[2]).max())  # Devito's own difference between the two decompositions
    for wrote, restarts in ((2, (2, 1)), (1, (1, 2))):
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
            else:
                assert float(np.abs(got - ref[n]).max()) <= between, f"{wrote} -> {n}"


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
