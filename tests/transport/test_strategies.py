"""Every save strategy writes the same format: any strategy's checkpoint loads on any rank count."""

import os
import re

import pytest

from mpitools import run_mpi
from testpaths import TESTS

SCRIPT = os.path.join(TESTS, "scripts", "strategy_roundtrip.py")
SIMULATED_NODES = {"HPCCKPT_RANKS_PER_NODE": "2"}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("strategy", ["file-per-rank", "aggregated", "shared-file", "auto"])
@pytest.mark.parametrize("nsave,nload,seed", [(4, 3, 1), (3, 4, 2), (2, 1, 3)])
def test_strategy_round_trip_with_reshard(tmp_path, strategy, nsave, nload, seed):
    root = tmp_path / "ck"
    saved = run_mpi(nsave, SCRIPT, root, "save", strategy, seed, env=SIMULATED_NODES)
    expected = strategy if strategy != "auto" else ""
    assert f"saved {expected}" in saved.stdout
    loaded = run_mpi(nload, SCRIPT, root, "load", strategy, seed, env=SIMULATED_NODES)
    assert "loaded ok" in loaded.stdout


@pytest.mark.timeout(300)
@pytest.mark.parametrize("strategy", ["file-per-rank", "aggregated"])
def test_write_failure_on_one_rank_fails_every_rank_without_hang(tmp_path, strategy):
    root = tmp_path / "ck"
    # rank 2 is an aggregator with 2 ranks per node, and a plain writer in file-per-rank
    proc = run_mpi(4, SCRIPT, root, "save", strategy, 5, 2, env=SIMULATED_NODES, check=False, timeout=120)
    assert proc.returncode != 0
    reports = re.findall(r"rank (\d) CheckpointError: (.*?No space left on device)", proc.stdout)
    assert sorted(rank for rank, _ in reports) == ["0", "1", "2", "3"], proc.stdout + proc.stderr
    assert all("rank 2: OSError" in message for _, message in reports)
    assert not os.path.exists(root), "a failed save must leave no partial checkpoint behind"
