"""Multi-level checkpointing (issue 7): layouts and rebuild plans (pure), and node-loss scenarios under mpiexec.

"Losing a node" = the run ends (every rank exits) and the node's local
directory is deleted; the relaunched run must restore exact data from the
partner copies (L2) or XOR parity (L3), or fall back to the shared root (L4)
with a message that says why.  Simulated nodes: HPCCKPT_RANKS_PER_NODE.
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from hpcckpt.errors import CheckpointError
from hpcckpt.levels import LevelOptions, parity_groups, partners
from hpcckpt.transport.topology import simulated_layout

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "levels_run.py")


# ---------------------------------------------------------------- pure parts
def test_partners_are_on_another_node():
    for nranks, k in [(4, 1), (4, 2), (3, 1), (6, 2), (5, 2)]:
        layout = simulated_layout(nranks, k)
        p = partners(layout)
        assert all(layout.node_of[r] != layout.node_of[p[r]] for r in range(nranks))
    assert partners(simulated_layout(4, 4)) is None


def test_parity_groups_span_distinct_nodes():
    for nranks, k, g in [(4, 1, 4), (4, 2, 8), (8, 2, 2), (5, 1, 2), (7, 1, 3)]:
        layout = simulated_layout(nranks, k)
        groups = parity_groups(layout, g)
        for group in groups:
            assert len(group) >= 2
            assert len({layout.node_of[r] for r in group}) == len(group)
        flat = [r for grp in groups for r in grp]
        assert len(flat) == len(set(flat))
    assert parity_groups(simulated_layout(5, 1), 2) == [[0, 1], [2, 3, 4]]  # no group of one
    assert parity_groups(simulated_layout(2, 2), 8) == []  # one node: nothing to protect with


def test_level_options_validate_and_intervals():
    with pytest.raises(CheckpointError, match="flush_every"):
        LevelOptions("/tmp/x", flush_every=0)
    with pytest.raises(CheckpointError, match="need local_dir"):
        LevelOptions(None, partner_every=1)
    lv = LevelOptions("/tmp/x", partner_every=1, parity_every=2, flush_every=3)
    due = [lv.due(i) for i in range(4)]
    assert [d["flush"] for d in due] == [True, False, False, True]
    assert [d["parity"] for d in due] == [True, False, True, False]
    assert all(d["partner"] for d in due)


def test_xor_parity_segments_rebuild_any_one_member():
    """The segment arithmetic of levels/parity.py, checked without MPI (XOR in numpy)."""
    from hpcckpt.levels.parity import segment_bytes

    rng = np.random.default_rng(0)
    for g in (2, 3, 4, 5):
        sizes = [int(s) for s in rng.integers(0, 50, g)]
        sizes[0] = 37
        seg = segment_bytes(sizes)
        data = [np.concatenate([rng.integers(0, 256, s).astype(np.uint8), np.zeros(seg * (g - 1) - s, np.uint8)])
                for s in sizes]
        part = lambda j, k: data[j][k * seg:(k + 1) * seg]  # noqa: E731
        parity = [np.bitwise_xor.reduce([part(j, (i - j - 1) % g) for j in range(g) if j != i]) for i in range(g)]
        for x in range(g):
            rebuilt = np.zeros(seg * (g - 1), np.uint8)
            for i in range(g):
                if i != x:
                    k = (i - x - 1) % g
                    rebuilt[k * seg:(k + 1) * seg] = np.bitwise_xor.reduce(
                        [parity[i]] + [part(j, (i - j - 1) % g) for j in range(g) if j not in (i, x)])
            assert np.array_equal(rebuilt[:sizes[x]], data[x][:sizes[x]])


# ------------------------------------------------------- node-loss scenarios
def _run(n, rpn, *args, check=True):
    from mpitools import run_mpi

    return run_mpi(n, SCRIPT, *args, env={"HPCCKPT_RANKS_PER_NODE": str(rpn)}, timeout=90, check=check)


def _lose(local, *nodes):
    for k in nodes:
        shutil.rmtree(os.path.join(local, f"node-{k}"))


def test_lose_one_node_restores_from_partner(tmp_path):
    root, local = tmp_path / "root", tmp_path / "local"
    opts = json.dumps({"asynchronous": True, "partner_every": 1, "flush_every": 2})
    _run(4, 2, "save", root, local, 2, opts)  # step 1 reaches the root, step 2 only the node-local levels
    assert not os.path.exists(root / "step-000000000002")
    _lose(local, 1)
    out = _run(4, 2, "restore", root, local, 2, "L2", opts)
    assert out.stdout.count("OK restored step 2 from L2") == 4
    assert sorted(os.listdir(local / "node-1" / "step-000000000002" / "data")) == [
        "part-000002.bin", "part-000003.bin"]  # rebuilt on the replacement node


def test_lose_nodes_parity_rebuilds_one_and_falls_back_for_two(tmp_path):
    root, local, saved = tmp_path / "root", tmp_path / "local", tmp_path / "saved"
    opts = json.dumps({"asynchronous": True, "parity_every": 1, "parity_group": 4, "flush_every": 2})
    _run(4, 1, "save", root, local, 2, opts)
    shutil.copytree(local, saved)
    _lose(local, 2)
    out = _run(4, 1, "restore", root, local, 2, "L3", opts)
    assert out.stdout.count("OK restored step 2 from L3") == 4
    shutil.rmtree(local)
    shutil.copytree(saved, local)
    _lose(local, 1, 2)  # two members of the one parity group
    out = _run(4, 1, "restore", root, local, 1, "L4", opts)
    assert out.stdout.count("OK restored step 1 from L4") == 4
    assert "rank(s) [1, 2] of parity group [0, 1, 2, 3] are lost together" in out.stdout
    assert "restoring step-000000000001 from the shared root (L4)" in out.stdout


def test_background_write_failure_on_one_rank(tmp_path):
    opts = json.dumps({"asynchronous": True, "partner_every": 1})
    out = _run(3, 1, "failwrite", tmp_path / "root", tmp_path / "local", opts)
    assert out.stdout.count("OK CheckpointError at the next call") == 3
    assert out.stdout.count("OK next save committed") == 3


def test_sigkill_during_flush_keeps_last_committed_version(tmp_path):
    root, local = tmp_path / "root", tmp_path / "local"
    opts = json.dumps({"asynchronous": True, "flush_every": 1, "flush_bandwidth": 20000})  # ~1 s per 24 KB file
    out = _run(2, 1, "flushkill", root, local, opts, check=False)
    assert out.returncode != 0 and out.stdout.count("OK killing during the flush of step-000000000002") == 2
    assert os.path.exists(root / "step-000000000001" / "metadata.json")
    assert not os.path.exists(root / "step-000000000002" / "metadata.json")  # the flush never committed
    out = _run(2, 1, "restore", root, local, 2, "L1", opts)  # the node-local copy survived the kill
    assert out.stdout.count("OK restored step 2 from L1") == 2
    shutil.rmtree(local)  # every node lost: the root still has step 1
    out = _run(2, 1, "restore", root, local, 1, "L4", opts)
    assert out.stdout.count("OK restored step 1 from L4") == 2
