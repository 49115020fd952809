"""apps/heat2d.py with tracked output files: crash after a checkpoint and several more steps, restart on another
rank count, finish; the log and the binary series are bitwise those of an uninterrupted run.

Serial pytest that runs mpiexec itself (mpitools.run_mpi); skips without one.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from mpitools import ROOT, run_mpi

HEAT2D = os.path.join(ROOT, "apps", "heat2d.py")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

COMMON = ["--nx", 48, "--ny", 56, "--steps", 120, "--every", 25, "--tracers", 20, "--quiet"]


def outputs(d):
    return ["--root", d / "ck", "--log", d / "log.txt", "--series", d / "series.bin"]


@pytest.mark.parametrize("ranks", [(2, 3), (3, 1)])
def test_crash_and_restart_on_another_rank_count_gives_the_uninterrupted_files(tmp_path, ranks):
    first, second = ranks
    ref, run = tmp_path / "ref", tmp_path / "run"
    ref.mkdir()
    run.mkdir()
    run_mpi(1, HEAT2D, *outputs(ref), *COMMON, timeout=180)

    crashed = run_mpi(first, HEAT2D, *outputs(run), *COMMON, "--kill-rank", first - 1, "--kill-step", 60,
                      timeout=180, check=False)
    assert crashed.returncode != 0, crashed.stdout
    lines = (run / "log.txt").read_text().splitlines()
    assert len(lines) >= 60 and lines[49] == (ref / "log.txt").read_text().splitlines()[49]  # steps 51.. exist

    resumed = run_mpi(second, HEAT2D, *outputs(run), *COMMON, timeout=180)
    assert "restored step 50" in resumed.stdout, resumed.stdout
    assert (run / "log.txt").read_bytes() == (ref / "log.txt").read_bytes()
    assert (run / "series.bin").read_bytes() == (ref / "series.bin").read_bytes()
    series = np.frombuffer((ref / "series.bin").read_bytes()[16:], [("step", "<i8"), ("f", "<f8", 3)])
    assert series["step"].tolist() == list(range(1, 121))  # one record per step, none twice
