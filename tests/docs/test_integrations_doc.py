"""The programs of docs/integrations.md run as written: on 2 ranks (three checkpointed steps), then on 3 ranks
(restore, three more steps); the last checkpoint must hold exactly the field after six steps."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest

import hpcckpt
from mpitools import ROOT, run_mpi
from optional_libs import ensure_library

DOC = os.path.join(ROOT, "docs", "integrations.md")


def program(heading: str) -> str:
    """The first python block under the section whose heading starts with ``heading``."""
    with open(DOC, encoding="utf-8") as f:
        text = f.read()
    section = text.split(f"\n## {heading}", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def fft_expected():
    i, j, k = np.meshgrid(np.arange(16), np.arange(12), np.arange(10), indexing="ij")
    return (100 * i + 10 * j + k) * 2.0 ** 6


def petsc_expected():
    x, y = np.meshgrid(np.arange(16), np.arange(12), indexing="ij")
    return np.stack([10 * x + y, -(10 * x + y)], axis=-1) * 2.0 ** 6


def heat_expected():
    x, y = np.meshgrid(np.arange(16), np.arange(12), indexing="ij")
    return (10.0 * x + y) * 2.0 ** 6


CASES = {"mpi4py_fft": ("mpi4py-fft", "ckpt-fft", fft_expected), "petsc": ("petsc4py", "ckpt-petsc", petsc_expected),
         "heat": ("heat", "ckpt-heat", heat_expected)}


@pytest.mark.timeout(900)
@pytest.mark.parametrize("lib", sorted(CASES))
def test_the_documented_program_checkpoints_and_restores_on_another_rank_count(lib, tmp_path):
    runtime = ensure_library(lib)
    heading, root, expected = CASES[lib]
    script = tmp_path / "program.py"
    script.write_text(program(heading))
    for n in (2, 3):
        run_mpi(n, str(script), timeout=240, cwd=str(tmp_path), runtime=runtime)
    with hpcckpt.open(str(tmp_path / root)) as view:
        assert view.step == 6  # the 3-rank run resumed at step 3
        assert np.array_equal(view.read("u"), expected())
        if lib == "mpi4py_fft":  # the spectrum was computed from the restored field on 3 ranks
            u = view.read("u")
            assert np.allclose(view.read("u_hat"), np.fft.rfftn(u) / u.size)
