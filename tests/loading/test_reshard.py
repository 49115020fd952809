"""Save with N ranks, load with M ranks (real mpiexec runs), for every pair in 1..4 x 1..4.

Random uneven 2-D and 3-D decompositions (empty blocks included) come from a
numpy RNG seeded on the command line, so every rank of a run agrees on them and
a failure is reproducible: ``HPCCKPT_TEST_SEED=<base>`` shifts the seeds.
"""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

import hpcckpt
from mpitools import run_mpi
from testpaths import TESTS

HERE = TESTS
SCRIPT = os.path.join(HERE, "scripts", "reshard.py")
BASE = int(os.environ.get("HPCCKPT_TEST_SEED", "0"))
SEEDS = [BASE + k for k in range(4)]  # 2-D and 3-D cases, each with another save strategy
COUNTS = (1, 2, 3, 4)

pytestmark = pytest.mark.timeout(400)


def _script_module():
    spec = importlib.util.spec_from_file_location("reshard_script", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("reshard"))
    for n in COUNTS:
        proc = run_mpi(n, SCRIPT, "save", root, *SEEDS, timeout=180)
        assert proc.stdout.count("OK rank") == n, proc.stdout
    return root


def test_saved_checkpoints_read_exactly_from_one_process(saved):
    mod = _script_module()
    for n in COUNTS:
        for seed in SEEDS:
            c = mod.case(seed)
            with hpcckpt.open(os.path.join(saved, f"n{n}", f"case{seed}")) as view:
                assert np.array_equal(view.read("u"), c["u"])
                assert np.array_equal(view.read("m"), c["m"]) and view.variables["m"].dtype == np.dtype(">i2")
                assert view.read("table").tobytes() == c["table"].tobytes()
                assert view.values == {"seed": seed, "shape": list(c["shape"])}
                assert view.verify() == []


@pytest.mark.parametrize("m", COUNTS)
def test_load_on_m_ranks_from_every_n(saved, m):
    """Covers N -> M for N in 1..4 (4->3, 3->4, 2->1, 1->4 among them), every case, exact data on every rank."""
    proc = run_mpi(m, SCRIPT, "load", saved, ",".join(map(str, COUNTS)), *SEEDS, timeout=180)
    assert proc.stdout.count("OK rank") == m, proc.stdout
    assert f"OK rank 0 load {len(COUNTS) * len(SEEDS)}" in proc.stdout
