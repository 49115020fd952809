"""Multi-level checkpointing: layouts and rebuild plans (pure), and failures of the levels under mpiexec.

The node-loss scenarios (L2 from a partner copy, L3 from parity, L4 when two
nodes of a parity group are lost, a node lost during the flush) run on real
namespace nodes in tests/cluster/test_node_loss.py.  The scenarios here
(background write failures, SIGKILL of every rank during the flush) need no
distinct nodes: they use simulated nodes (HPCCKPT_RANKS_PER_NODE, one rank
each, ``local_dir/node-<k>``), which also keeps that code path tested.
"""

from __future__ import annotations

import json
import math
import os
import shutil

import numpy as np
import pytest

from hpcckpt.errors import CheckpointError
from hpcckpt.levels import LevelOptions, parity_groups, partners
from hpcckpt.transport.topology import simulated_layout
from testpaths import TESTS

SCRIPT = os.path.join(TESTS, "scripts", "levels_run.py")


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
        LevelOptions.from_kwargs(local_dir="/tmp/x", flush_every=0)
    with pytest.raises(CheckpointError, match="need local_dir"):
        LevelOptions.from_kwargs(partner_every=1)
    lv = LevelOptions.from_kwargs(local_dir="/tmp/x", partner_every=1, parity_every=2, flush_every=3).intervals()
    due = [lv.due(i) for i in range(4)]
    assert not any(d["pmem"] for d in due)
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


def test_background_write_failure_on_one_rank(tmp_path):
    opts = json.dumps({"asynchronous": True, "partner_every": 1})
    out = _run(3, 1, "failwrite", tmp_path / "root", tmp_path / "local", opts)
    assert out.stdout.count("OK CheckpointError at the next call") == 3
    assert out.stdout.count("OK next save committed") == 3


def test_a_finished_flush_is_committed_when_a_later_save_fails_at_close(tmp_path):
    root, local = tmp_path / "root", tmp_path / "local"
    opts = json.dumps({"asynchronous": True, "flush_every": 1, "flush_bandwidth": 20000})  # ~1 s per 24 KB file
    out = _run(2, 1, "failclose", root, local, opts)
    assert out.stdout.count("OK close raised") == 2 and out.stdout.count("OK flushed step 1 committed") == 2
    assert not os.path.exists(root / "flush-in-progress.json")
    shutil.rmtree(local)  # every node lost: the root has step 1, whole
    out = _run(2, 1, "restore", root, local, 1, "L4", opts)
    assert out.stdout.count("OK restored step 1 from L4") == 2


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


# --------------------------------------------- derived intervals and `hpcckpt ls` (serial)
def test_derived_flush_every_follows_benoit_et_al():
    from hpcckpt.levels import derived_flush_every
    from hpcckpt.policy import multilevel_intervals

    # n_local / n_L4 = sqrt((f / (1 - f)) * C_L4 / C_local): 3 * sqrt(9) = 9 for f = 0.9
    assert derived_flush_every(1.0, 9.0, 0.9) == 9
    assert derived_flush_every(1.0, 1.0, 0.5) == 1  # a flush as cheap as the local level: every time
    assert derived_flush_every(0.5, 40.0, 0.85) == multilevel_intervals([0.5, 40.0], [0.85, 0.15]).counts[0]
    with pytest.raises(CheckpointError, match="local_failure_fraction"):
        derived_flush_every(1.0, 2.0, 1.0)


def test_learned_flush_every_is_the_learned_models_ratio():
    from hpcckpt.levels import derived_flush_every
    from hpcckpt.policy import learned_levels, multilevel

    for local, flush, f, mtbf in [(2.0, 60.0, 0.85, 86400.0), (10.0, 600.0, 0.7, 20000.0), (1.0, 1.0, 0.5, 3600.0)]:
        config = multilevel.LevelConfig((local, flush), (local, flush), (f / mtbf, (1 - f) / mtbf), 100 * mtbf)
        k = derived_flush_every(local, flush, f, method="learned", mtbf=mtbf)
        assert k == learned_levels.predict(config).ratios[0] >= 1
        # the learned ratio stays near the first-order one (the formula is close to optimal for long jobs)
        assert abs(math.log(k / derived_flush_every(local, flush, f))) <= math.log(2)
    with pytest.raises(CheckpointError, match="level_method"):
        derived_flush_every(1.0, 2.0, 0.8, method="guess")
    with pytest.raises(CheckpointError, match="level_mtbf"):
        derived_flush_every(1.0, 2.0, 0.8, method="learned", mtbf=0)


def test_engine_uses_the_learned_intervals_when_asked(tmp_path):
    from hpcckpt.levels import derived_flush_every

    with _serial_ck(tmp_path, level_costs=(0.5, 40.0), level_method="learned", level_mtbf=7200.0) as ck:
        assert ck.engine.node.levels.flush_every == derived_flush_every(0.5, 40.0, 0.85, "learned", 7200.0)
    assert json.loads((tmp_path / "root" / "levels.json").read_text())["level_method"] == "learned"
    with pytest.raises(CheckpointError, match="level_method"):
        _serial_ck(tmp_path, level_method="learned", flush_every=3)
    with pytest.raises(CheckpointError, match="level_method"):
        _serial_ck(tmp_path, level_method="neural")
    from hpcckpt import Checkpointer

    with pytest.raises(CheckpointError, match="local_dir"):
        Checkpointer(tmp_path / "r2", asynchronous=True, level_method="learned", track_failures=False)


def _serial_ck(tmp_path, **kw):
    from hpcckpt import Checkpointer

    return Checkpointer(tmp_path / "root", local_dir=tmp_path / "local", track_failures=False, **kw)


def test_intervals_derived_from_given_costs_unless_explicit(tmp_path):
    with _serial_ck(tmp_path, level_costs=(0.2, 20.0), local_failure_fraction=0.9) as ck:
        assert ck.engine.node.levels.flush_every == derived_flush(0.2, 20.0, 0.9) == 30
        assert ck.engine.node.levels.every["partner"] == 0  # one node: no partner to copy to
    with _serial_ck(tmp_path, flush_every=4) as ck:  # explicit: taken as given, nothing derived
        assert ck.engine.node.levels.flush_every == 4 and not ck.engine.node.auto_levels
    with pytest.raises(CheckpointError, match="level_costs"):
        _serial_ck(tmp_path, flush_every=2, level_costs=(1, 2))


def derived_flush(a, b, f):
    from hpcckpt.levels import derived_flush_every

    return derived_flush_every(a, b, f)


def test_intervals_derived_from_measured_costs_after_the_first_flush(tmp_path):
    from hpcckpt import Block

    a = np.arange(200_000.0)
    with _serial_ck(tmp_path, asynchronous=True) as ck:
        eng = ck.engine.node
        assert eng.auto_levels and eng.levels.flush_every == 1 and eng.level_costs is None
        ck.save({"u": Block(a)}, 1)
        ck.wait()  # the first checkpoint reaches L4; its costs set the interval
        local, flush = eng.level_costs
        assert local > 0 and flush > 0
        assert eng.levels.flush_every == derived_flush(local, flush, 0.85)
    conf = json.loads((tmp_path / "root" / "levels.json").read_text())
    assert conf["flush_every"] == eng.levels.flush_every and conf["derived_from_costs"] == [local, flush]


def test_ls_shows_levels_and_a_flush_in_progress(tmp_path, capsys):
    from hpcckpt import Block
    from hpcckpt.cli import main

    a = np.arange(100_000.0)  # 800 KB flushed at 2 MB/s: still in progress when sync polls it right after
    with _serial_ck(tmp_path, asynchronous=True, flush_every=2, flush_bandwidth=2e6) as ck:
        for step in (1, 2, 3):
            ck.save({"u": Block(a)}, step)
        ck.engine.sync()  # commits step 3: due for a flush (count 2)
        assert ck.engine.node.flushing == "step-000000000003"
        assert (tmp_path / "root" / "flush-in-progress.json").exists()
        ck.engine.node.flush.thread.join()
        main(["ls", str(tmp_path / "root")])
        out = capsys.readouterr().out
        assert "flush to L4 of step-000000000003 in progress" in out
    assert not (tmp_path / "root" / "flush-in-progress.json").exists()  # removed at the flush's commit
    main(["ls", str(tmp_path / "root")])
    out = capsys.readouterr().out
    assert "levels: L1 in" in out and "flush every 2" in out and "flush to L4" not in out
    lines = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.strip().startswith("step-")
             and len(line.split()) == 7}
    assert lines["step-000000000001"] == ["1/1", "-", "-", "-", "-", "yes"]  # L1 and L4 (not L2, L3, RS, PM)
    assert lines["step-000000000002"] == ["1/1", "-", "-", "-", "-", "-"]  # L1 only
    assert lines["step-000000000003"] == ["1/1", "-", "-", "-", "-", "yes"]
    main(["ls", "--json", str(tmp_path / "root")])
    doc = json.loads(capsys.readouterr().out)
    assert [v["L4"] for v in doc["levels"]["versions"]] == [True, False, True]


def test_level_files_go_through_the_storage_given():
    """A partner transfer, an inventory and a flush's copy over MemoryStorage: no byte touches the disk."""
    from mpi4py import MPI

    from hpcckpt.core.names import rank_file
    from hpcckpt.levels.fetch import inventory
    from hpcckpt.levels.flush import copy_file
    from hpcckpt.levels.partner import transfer
    from hpcckpt.storage import MemoryStorage

    storage, src, dst = MemoryStorage(), "/node-0/v1", "/node-1/v1"
    payload = bytes(range(256)) * 40
    storage.make_directories(os.path.join(src, "data"))
    storage.atomic_write(os.path.join(src, rank_file(0)), payload)
    storage.atomic_write(os.path.join(src, rank_file(0) + ".part"), b"a stale attempt")
    assert transfer(storage, MPI.COMM_SELF, [(0, 0, rank_file(0), len(payload))], src, dst, round_bytes=1000) \
        == len(payload)
    assert storage.read_file(os.path.join(dst, rank_file(0)), 1 << 20) == payload
    assert inventory(storage, dst) == {rank_file(0): len(payload)}  # no .part left, none listed
    assert copy_file(storage, os.path.join(dst, rank_file(0)), "/root/v1/" + rank_file(0)) == len(payload)
    assert storage.read_file("/root/v1/" + rank_file(0), 1 << 20) == payload
    assert not storage.exists("/root/v1/" + rank_file(0) + ".part")


def test_a_flush_copies_from_the_node_storage_into_the_roots(monkeypatch):
    """The L4 copy from one storage (the node directories') into another (the root's: a bucket, say), through a
    buffer smaller than the file: every byte arrives, nothing is written on the source side, no .part is left."""
    from hpcckpt.core.names import rank_file
    from hpcckpt.levels import flush
    from hpcckpt.storage import MemoryStorage

    monkeypatch.setattr(flush, "COPY_BYTES", 1000)
    node, root = MemoryStorage(), MemoryStorage()
    payload = bytes(range(256)) * 40
    src, dst = "/node-0/v1/" + rank_file(0), "/root/v1/" + rank_file(0)
    node.make_directories("/node-0/v1/data")
    node.atomic_write(src, payload)
    assert flush.copy_file(node, src, dst, target=root) == len(payload)
    assert root.read_file(dst, 1 << 20) == payload and not root.exists(dst + ".part")
    assert not node.exists("/root") and node.read_file(src, 1 << 20) == payload


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_save_with_other_options_on_the_levels_is_planned_again_and_restores(tmp_path, asynchronous):
    """After saves that plan on each rank against the cached plan, a save asking for another codec (and another
    chunk size) is planned collectively and commits; the newest version restores exactly, from the levels and
    from the root after the clean end's flush."""
    import hpcckpt
    from hpcckpt.mpi.collective import SerialComm

    options = dict(comm=SerialComm(), local_dir=str(tmp_path / "local"), track_failures=False,
                   handle_signals=False, asynchronous=asynchronous)
    u = np.arange(4000.0)
    with hpcckpt.Checkpointer(str(tmp_path / "root"), **options) as ck:
        for step in (1, 2, 3):
            u += 1
            ck.save({"u": hpcckpt.Block(u)}, step)
        u += 1
        result = ck.save({"u": hpcckpt.Block(u)}, 4, codec="zstd", chunk_bytes=1024)
        ck.wait()
        assert result.step == 4 and ck.last_result.nchunks == 32
    for where in ("levels", "root"):
        if where == "root":
            shutil.rmtree(tmp_path / "local")
        got = np.zeros_like(u)
        with hpcckpt.Checkpointer(str(tmp_path / "root"), **options) as ck:
            assert ck.restore({"u": hpcckpt.Block(got)}) is not None
        assert np.array_equal(got, u), where
