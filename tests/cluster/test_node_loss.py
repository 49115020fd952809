"""Multi-level checkpointing with real node losses, on the namespace cluster (conftest.py).

Four nodes, one rank each: L1 is each node's private tmpfs, L2 the partner
copy on another node, L3 XOR parity across the nodes, L4 the shared
directory.  A job saves step 1 (flushed to L4) and step 2 (node-local levels
only), keeps computing, and a node is lost for real: every process of its
namespaces is SIGKILLed and its tmpfs disappears with its mount namespace.
The job must end by itself (no hang); the relaunch of the four ranks on the
three survivors (two ranks on one node, so ranks change nodes) or on a spare
node restores step 2 exactly from L2 or L3, or, when two nodes of the parity
group are lost, step 1 from L4 with a message that says why; with
Reed-Solomon parity (k=2, m=2) the same two lost nodes are rebuilt, step 2.

The last tests restore with an even split of uneven Ragged rows and Block
parts, so that each rank reads files other nodes hold (levels/fetch.py): on
the same nodes, fewer nodes, fewer ranks, from the persistent-memory tier and
after a node loss; and a file on no node of the run falls back to the root.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(os.path.dirname(HERE), "scripts", "levels_run.py")
STEP2 = "step-000000000002"


def files_on(cluster, node, version=STEP2):
    """The data/parity files ``node``'s own tmpfs holds for ``version`` (as that node sees them)."""
    out = cluster.run(node, "sh", "-c", f"cd {cluster.local}/{version} 2>/dev/null && "
                      "ls data parity 2>/dev/null | grep -v :; true").stdout
    return sorted(out.split())


def run_and_lose(cluster, job, opts, lost, check=None):
    """Save steps 1 and 2 on every node, call ``check()`` mid-run, lose the nodes ``lost``: the job must end."""
    root = os.path.join(cluster.test_dir, "root")
    j = job([(n, 1) for n in cluster.names], SCRIPT, "running", root, cluster.local, 2, json.dumps(opts))
    j.wait_for("OK running", cluster.k)
    assert not os.path.exists(os.path.join(root, STEP2)), "step 2 must be on the node-local levels only"
    assert os.listdir(cluster.local) == [], "a node's tmpfs is visible outside the node"
    if check:
        check()
    for node in lost:
        cluster.lose(node)
        assert node not in cluster.alive()
    assert j.wait(timeout=60) != 0, f"the job went on after losing {lost}:\n{j.text()}"
    return root


def survivors(cluster, lost):
    """Four ranks on the surviving nodes, the first survivor taking the lost nodes' ranks."""
    alive = [n for n in cluster.names if n not in lost]
    return [(n, 1 + (len(lost) if i == 0 else 0)) for i, n in enumerate(alive)]


def restore(cluster, job, hosts, root, step, level, opts):
    out = job(hosts, SCRIPT, "restore", root, cluster.local, step, level, json.dumps(opts)).finish()
    assert out.count(f"OK restored step {step} from {level}") == 4, out
    return out


@pytest.mark.parametrize("relaunch", ["survivors", "spare"])
def test_lost_node_restores_from_partner_copy(cluster, job, relaunch):
    opts = {"asynchronous": True, "partner_every": 1, "flush_every": 2}
    n = cluster.names

    def partner_copy_crossed():
        held = {x: files_on(cluster, x) for x in n}
        assert all(len(v) == 2 for v in held.values()), held  # its own rank's file and one partner copy
        assert "part-000002.bin" in held[n[2]]
        assert len([x for x in n if x != n[2] and "part-000002.bin" in held[x]]) == 1, held

    root = run_and_lose(cluster, job, opts, [n[2]], partner_copy_crossed)
    if relaunch == "survivors":
        out = restore(cluster, job, survivors(cluster, [n[2]]), root, 2, "L2", opts)
        assert out.count(f"on {n[0]}") == 2 and f"on {n[2]}" not in out, out
    else:
        spare = cluster.add_node(cluster.k)
        out = restore(cluster, job, [(n[0], 1), (n[1], 1), (spare, 1), (n[3], 1)], root, 2, "L2", opts)
        assert f"rank 2: OK restored step 2 from L2 on {spare}" in out, out
        assert "part-000002.bin" in files_on(cluster, spare)  # copied onto the replacement node


@pytest.mark.parametrize("relaunch", ["survivors", "spare"])
def test_lost_node_restores_from_parity(cluster, job, relaunch):
    opts = {"asynchronous": True, "parity_every": 1, "parity_group": 4, "flush_every": 2}
    n = cluster.names

    def parity_without_copies():
        for i, x in enumerate(n):  # its rank's data file and its parity segment, no copy of another rank
            held = files_on(cluster, x)
            assert len(held) == 2 and [f for f in held if f.startswith("part-")] == [f"part-00000{i}.bin"], held

    root = run_and_lose(cluster, job, opts, [n[1]], parity_without_copies)
    if relaunch == "survivors":
        restore(cluster, job, survivors(cluster, [n[1]]), root, 2, "L3", opts)
    else:
        spare = cluster.add_node(cluster.k)
        assert files_on(cluster, spare) == []
        out = restore(cluster, job, [(n[0], 1), (spare, 1), (n[2], 1), (n[3], 1)], root, 2, "L3", opts)
        assert f"rank 1: OK restored step 2 from L3 on {spare}" in out, out
        assert "part-000001.bin" in files_on(cluster, spare)  # rebuilt onto the replacement node


def test_two_lost_nodes_of_a_parity_group_fall_back_to_the_shared_root(cluster, job):
    opts = {"asynchronous": True, "parity_every": 1, "parity_group": 4, "flush_every": 2}
    n = cluster.names
    root = run_and_lose(cluster, job, opts, [n[1], n[2]])
    out = restore(cluster, job, survivors(cluster, [n[1], n[2]]), root, 1, "L4", opts)
    assert "rank(s) [1, 2] of parity group [0, 1, 2, 3] are lost together" in out, out
    assert "restoring step-000000000001 from the shared root (L4)" in out, out


def test_two_lost_nodes_of_a_reed_solomon_group_are_rebuilt_exactly(cluster, job):
    """rs_group=(2, 2): nodes 1 and 2 lost together (XOR parity's failure case above); the four ranks on the
    two survivors restore step 2 exactly from Reed-Solomon parity."""
    opts = {"asynchronous": True, "rs_every": 1, "rs_group": [2, 2], "flush_every": 2}
    n = cluster.names

    def check_blocks_without_copies():
        for i, x in enumerate(n):  # its rank's data file and its check blocks, no copy of another rank
            assert files_on(cluster, x) == [f"part-00000{i}.bin", f"rs-00000{i}.bin"], files_on(cluster, x)

    root = run_and_lose(cluster, job, opts, [n[1], n[2]], check_blocks_without_copies)
    out = restore(cluster, job, survivors(cluster, [n[1], n[2]]), root, 2, "RS", opts)
    assert "cannot be restored" not in out, out


@pytest.mark.parametrize("partner", [True, False])
def test_node_lost_during_the_flush_restores_a_complete_version_never_the_partial_one(cluster, job, partner):
    """The flush of step 2 to the shared root is under way (throttled) when a node is lost.

    With partner copies, step 2 is complete on the node-local levels (L2); without, it is complete
    nowhere, and the restore takes step 1 from the root -- never the root's partial step 2."""
    opts = {"asynchronous": True, "flush_every": 1, "flush_bandwidth": 4000,  # ~6 s per 24 KB file
            "partner_every": 1 if partner else 0}
    n = cluster.names
    root = os.path.join(cluster.test_dir, "root")
    j = job([(x, 1) for x in n], SCRIPT, "flushing", root, cluster.local, json.dumps(opts))
    j.wait_for("OK running during the flush of step-000000000002", 4)
    cluster.lose(n[2])
    assert j.wait(timeout=60) != 0
    assert os.path.exists(os.path.join(root, "step-000000000001", "metadata.json"))
    assert not os.path.exists(os.path.join(root, STEP2, "metadata.json")), "the flush cannot have finished"
    assert os.listdir(os.path.join(root, STEP2, "data")), "the root must hold a partial step 2"
    step, level = (2, "L2") if partner else (1, "L4")
    out = restore(cluster, job, survivors(cluster, [n[2]]), root, step, level, opts)
    if not partner:
        assert (f"{STEP2} cannot be restored from the node-local levels: the files of rank(s) [2] are on no "
                "surviving node") in out, out


# ---------------------------------------------- loads that read other nodes' files (levels/fetch.py)
FETCH = os.path.join(os.path.dirname(HERE), "scripts", "fetch_run.py")


def fetch_restore(cluster, job, hosts, root, step, level, opts):
    """Restore with an even split of uneven Ragged rows and Block parts saved by 4 ranks; exact data."""
    out = job(hosts, FETCH, "restore", root, cluster.local, 4, step, level, json.dumps(opts)).finish()
    assert out.count(f"OK restored step {step} from {level}") == sum(k for _, k in hosts), out
    return out


@pytest.mark.parametrize("restart", ["same", "three", "two", "pmem"])
def test_an_even_split_reads_the_files_other_nodes_hold(cluster, job, restart):
    """Step 2 on the node-local levels only; restored with an even split, which reads other nodes' files: on
    the same four nodes (with partner copies; or from the persistent-memory tier), on three of them (the
    fourth's file has its partner copy on the first), or, saved two ranks per node on two nodes, on one rank
    per node.  The newest step, exact, with no warning."""
    n = cluster.names
    opts = {"pmem_dir": os.path.join(cluster.local, "pmem")} if restart == "pmem" else {
        "partner_every": 1} if restart != "two" else {}
    root = os.path.join(cluster.test_dir, "root")
    saved = [(n[0], 2), (n[1], 2)] if restart == "two" else [(x, 1) for x in n]
    job(saved, FETCH, "save", root, cluster.local, json.dumps(opts)).finish()
    hosts = {"three": [(x, 1) for x in n[:3]], "two": [(n[0], 1), (n[1], 1)]}.get(restart, [(x, 1) for x in n])
    level = "PM" if restart == "pmem" else "L1"
    out = fetch_restore(cluster, job, hosts, root, 2, level, opts)
    assert "WARNING" not in out, out
    if restart == "three":
        assert "part-000003.bin" in files_on(cluster, n[1]) or "part-000003.bin" in files_on(cluster, n[2])


@pytest.mark.parametrize("level", ["L2", "L3", "RS"])
def test_an_even_split_after_a_node_loss_rebuilds_then_reads_other_nodes_files(cluster, job, level):
    """A node lost (two for RS, k=2 m=2): the four ranks on the survivors rebuild its file, then the even split
    reads the files the other survivors hold: step 2, exact."""
    n = cluster.names
    opts = {"L2": {"partner_every": 1}, "L3": {"parity_every": 1, "parity_group": 4},
            "RS": {"rs_every": 1, "rs_group": [2, 2]}}[level]
    lost = [n[1], n[2]] if level == "RS" else [n[1]]
    root = os.path.join(cluster.test_dir, "root")
    j = job([(x, 1) for x in n], FETCH, "running", root, cluster.local, json.dumps(opts))
    j.wait_for("OK running", cluster.k)
    for node in lost:
        cluster.lose(node)
    assert j.wait(timeout=60) != 0
    out = fetch_restore(cluster, job, survivors(cluster, lost), root, 2, level, opts)
    assert "cannot be restored" not in out, out


def test_a_file_on_no_node_of_the_run_falls_back_to_the_root_with_the_reason(cluster, job):
    """Saved on four nodes without copies or parity, restored on three: the fourth's file is on no node of the
    run, so step 1 comes from the root, with a warning that names the file."""
    n = cluster.names
    root = os.path.join(cluster.test_dir, "root")
    job([(x, 1) for x in n], FETCH, "save", root, cluster.local, json.dumps({})).finish()
    shutil.rmtree(os.path.join(root, STEP2))  # as a job killed before close() leaves it: step 2 node-local only
    out = fetch_restore(cluster, job, [(x, 1) for x in n[:3]], root, 1, "L4", {})
    assert "no node of this run holds a whole copy of data/part-000003.bin" in out, out
