"""``hpcckpt stats`` on a real multi-rank save: per-phase table, bandwidth, straggler, timeline plot."""

import os

import pytest

from hpcckpt.cli import main
from metadata_tools import sealed
from mpitools import run_mpi
from testpaths import TESTS

SCRIPT = os.path.join(TESTS, "scripts", "strategy_roundtrip.py")


@pytest.mark.timeout(120)
def test_stats_and_timeline_of_a_three_rank_save(tmp_path, capsys):
    root = tmp_path / "ck"
    run_mpi(3, SCRIPT, root, "save", "aggregated", 4, env={"HPCCKPT_RANKS_PER_NODE": "2"})
    png = tmp_path / "timeline.png"
    assert main(["stats", str(root), "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "saved by 3 ranks with strategy aggregated" in out
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.split()[:1] in (["plan"], ["write"])}
    assert set(rows) == {"plan", "write"} and all(len(v) == 4 for v in rows.values())
    assert "slowest: rank" in out and "GB/s" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_stats_without_a_record_is_one_clean_error(tmp_path, capsys):
    import hpcckpt
    import numpy as np

    hpcckpt.save({"a": hpcckpt.Block(np.arange(4))}, tmp_path / "ck")
    meta_path = tmp_path / "ck" / "metadata.json"
    meta_path.write_bytes(sealed(meta_path.read_bytes().replace(b'"stats":', b'"nostats":')))
    assert main(["stats", str(tmp_path / "ck")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("hpcckpt: error:") and "no timing record" in err and "Traceback" not in err
