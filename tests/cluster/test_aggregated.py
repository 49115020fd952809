"""The aggregated strategy on real nodes: one aggregator per node, and a failing aggregator node.

MPI tells which ranks share a node (their hostnames differ per namespace
node; no ``ranks_per_node``), so the aggregators are the first rank of each
real node.  A node whose mount of the shared file system turns read-only (in
that node's mount namespace only: nothing injected into the program) makes its
aggregator's write fail: every rank, on every node, gets the CheckpointError
naming that rank, nobody hangs, and no partial checkpoint is left.
"""

from __future__ import annotations

import os
import re

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(os.path.dirname(HERE), "scripts", "strategy_roundtrip.py")


def test_one_aggregator_per_real_node_and_any_rank_count_loads(cluster, job):
    n = cluster.names
    root = os.path.join(cluster.test_dir, "ck")
    out = job([(n[0], 2), (n[1], 1), (n[2], 1)], SCRIPT, root, "save", "aggregated", 1).finish()
    assert "saved aggregated" in out, out
    # ranks 0-1 on node 0, rank 2 on node 1, rank 3 on node 2: one aggregator file per node
    assert sorted(os.listdir(os.path.join(root, "data"))) == ["agg-000000.bin", "agg-000002.bin", "agg-000003.bin"]
    out = job([(n[3], 1), (n[1], 2)], SCRIPT, root, "load", "aggregated", 1).finish()
    assert "loaded ok from aggregated" in out, out


def test_aggregator_node_losing_its_shared_mount_fails_every_rank_without_hang(cluster, job):
    n = cluster.names
    root = os.path.join(cluster.test_dir, "ck")
    cluster.run(n[1], "sh", "-c", f"mount --bind {cluster.shared} {cluster.shared} && "
                f"mount -o remount,bind,ro {cluster.shared}")
    try:
        assert os.access(cluster.shared, os.W_OK)  # read-only on node 1 only
        j = job([(n[0], 2), (n[1], 2)], SCRIPT, root, "save", "aggregated", 5)  # rank 2 aggregates node 1
        rc = j.wait(timeout=90)
        out = j.text()
    finally:
        cluster.lose(n[1])  # out of service (the next test gets a fresh node 1)
    assert rc != 0, out
    # hydra may join the ranks' lines (a line's newline written apart from its text): split on the next report
    reports = re.findall(r"rank (\d) CheckpointError: (.*?)(?=rank \d CheckpointError|$)", out, re.M)
    assert sorted(rank for rank, _ in reports) == ["0", "1", "2", "3"], out
    assert all("rank 2" in message and "Read-only file system" in message for _, message in reports), out
    assert not os.path.exists(root), "a failed save must leave no partial checkpoint behind"
