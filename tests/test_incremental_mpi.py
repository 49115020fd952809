"""Incremental chains under mpiexec: saves of a dynamic state continued across rank-count changes.

Each run restores the newest version (checking it is exactly what its step
held), then saves more steps incrementally; the next run uses another rank
count.  Afterwards every committed version (retention kept some, and whatever
they reference) is read back serially and compared with its step's state.
"""

from __future__ import annotations

import importlib.util
import os
import random

import numpy as np
import pytest

import hpcckpt
from hpcckpt.catalog import current, list_versions
from mpitools import run_mpi

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "scripts", "incremental_chain.py")
SEED = int(os.environ.get("HPCCKPT_TEST_SEED", "0"))

pytestmark = pytest.mark.timeout(240)

_spec = importlib.util.spec_from_file_location("incremental_chain", SCRIPT)
chain = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(chain)


def check_version(path: str, seed: int) -> None:
    with hpcckpt.open(path) as view:
        assert view.verify() == [], path
        step = view.values["step"]
        g = chain.global_state(seed, step)
        names = {n for n, v in g.items() if isinstance(v, np.ndarray)}
        assert set(view.variables) == names, (path, sorted(view.variables))
        for name in names:
            got = view.read(name)
            assert got.dtype == g[name].dtype and np.array_equal(got, g[name]), (path, name)


def parse(stdout: str) -> list[tuple]:
    out = []
    for line in stdout.splitlines():
        if line.startswith("SAVED "):
            _, step, kind, written, referenced, dedup = line.split()
            out.append((int(step), kind, int(written), int(referenced), int(dedup)))
    return out


def test_chain_across_rank_counts(tmp_path):
    rng = random.Random(SEED)
    root = str(tmp_path / "ckpt")
    counts = [4, 3, 2, 4] if SEED == 0 else [rng.choice([1, 2, 3, 4]) for _ in range(4)]
    step = 0
    saves = []
    for i, n in enumerate(counts):
        k = 3
        proc = run_mpi(n, SCRIPT, root, step, k, SEED, timeout=120)
        if i:
            assert f"RESTORED {step - 1}" in proc.stdout, proc.stdout
        saves += parse(proc.stdout)
        step += k
    assert [s[0] for s in saves] == list(range(step))
    kinds = [s[1] for s in saves]
    assert kinds[0] == "full" and "incremental" in kinds
    # the first save after each restart on another rank count still reuses the chain (global blocks)
    for first in (3, 6, 9):
        assert saves[first][1] == "incremental" and saves[first][3] > 0, saves[first]
    # a full version stores the zero region once (dedup); incremental ones find it in the chain
    assert all(s[4] > 0 for s in saves if s[1] == "full"), saves
    live = current(list_versions(root))
    assert [e.step for e in live][-3:] == [step - 3, step - 2, step - 1]
    for e in live:
        check_version(e.path, SEED)
