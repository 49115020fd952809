"""Incremental saves on disk, one process: references and their confinement, retention, compaction, damage, crash."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import hpcckpt
from hpcckpt.mpi.collective import SerialComm
from hpcckpt.root.catalog import current, gc, list_versions
from hpcckpt.root.catalog import referenced
from hpcckpt.incremental.chain import compact
from hpcckpt.errors import CheckpointError, CorruptCheckpointError
from hpcckpt.format.metadata import check_relative_path
from hpcckpt.storage.posix import confined_path
from testpaths import TESTS

HERE = TESTS
ROOT = os.path.dirname(HERE)
COMM = SerialComm()


@pytest.mark.parametrize("name", ["@step-000000000001/data/part-000000.bin", "@a/b", "@x_1.r2/data/c"])
def test_references_accepted(name):
    assert check_relative_path(name) == name


@pytest.mark.parametrize("name", ["@", "@/x", "@../x", "@..", "@./x", "@.hidden/x", "@a", "@a/", "@a/../../x",
                                  "@a/@b/x", "@a b/x", "@a\\b/x", "@a/./x"])
def test_references_rejected(name):
    with pytest.raises(CorruptCheckpointError):
        check_relative_path(name)


def test_confined_path_resolves_references_inside_committed_siblings(tmp_path):
    root = tmp_path / "root"
    for name in ("v1", "v2"):
        (root / name / "data").mkdir(parents=True)
        (root / name / "data" / "f.bin").write_bytes(b"x")
    (root / "v1" / "metadata.json").write_text("{}")
    assert confined_path(str(root / "v2"), "@v1/data/f.bin") == str((root / "v1" / "data" / "f.bin").resolve())
    with pytest.raises(CorruptCheckpointError, match="not a committed"):
        confined_path(str(root / "v1"), "@v2/data/f.bin")  # v2 has no metadata.json
    outside = tmp_path / "outside"
    (outside / "data").mkdir(parents=True)
    (outside / "metadata.json").write_text("{}")
    (outside / "data" / "f.bin").write_bytes(b"secret")
    os.symlink(outside, root / "link")
    with pytest.raises(CorruptCheckpointError, match="outside"):
        confined_path(str(root / "v2"), "@link/data/f.bin")
    os.symlink(outside / "data", root / "v1" / "escape")
    with pytest.raises(CorruptCheckpointError, match="outside"):
        confined_path(str(root / "v2"), "@v1/escape/f.bin")


def state(rng, step, rows, table_rows):
    u = np.random.default_rng(1).random((rows, 40))
    u[step % rows] += step
    t = np.arange(table_rows, dtype=np.int64) * 3
    z = np.zeros((16, 300), np.float32)
    return {"u": hpcckpt.Block(u), "t": hpcckpt.Ragged(t), "z": hpcckpt.Block(z, codec="lz4"), "step": step}


def expected(st):
    return {n: (v.local if hasattr(v, "local") else v) for n, v in st.items()}


def check(path, exp):
    with hpcckpt.open(path) as view:
        assert view.verify() == []
        for name, value in exp.items():
            if name == "step":
                assert view.values["step"] == value
            else:
                assert np.array_equal(view.read(name), value), (path, name)


def test_chain_retention_compaction_and_gc(tmp_path, table_form):
    root = str(tmp_path / "ck")
    rng = np.random.default_rng(0)
    ck = hpcckpt.Checkpointer(root, comm=COMM, keep=2, incremental=True, block_bytes=1024, max_chain=4,
                              track_failures=False)
    saved = {}
    for step in range(9):
        rows = 50 if step < 5 else 60  # a reshape of u at step 5
        st = state(rng, step, rows, 500 + 40 * step)
        r = ck.save(st, step=step)
        saved[step] = expected(st)
        info = r.incremental
        assert info["depth"] <= 4
        if step == 0 or step == 5:
            pass
        else:
            assert info["kind"] == "incremental" or info["depth"] == 0
        live = current(list_versions(root))
        for e in live[-2:]:  # the kept versions always restore exactly, whatever retention removed
            check(e.path, saved[e.step])
        for e in live:  # nothing kept references a removed version
            for ref in referenced(e.path):
                assert os.path.isfile(os.path.join(root, ref, "metadata.json")), (e.name, ref)
    kinds = [json.load(open(os.path.join(e.path, "metadata.json")))["extra"]["incremental"]["kind"]
             for e in current(list_versions(root))]
    assert "incremental" in kinds
    before = {e.name for e in current(list_versions(root))}
    report = compact(root, keep=2)
    assert report
    removed = gc(root, keep=2)
    live = current(list_versions(root))
    assert {e.name for e in live} == before - set(removed) and len(live) == 2
    for e in live:
        check(e.path, saved[e.step])
        assert referenced(e.path) <= {x.name for x in live}
    oldest = json.load(open(os.path.join(live[0].path, "metadata.json")))
    assert oldest["extra"]["incremental"]["kind"] == "full" and oldest["format_version"] == 3
    assert all(("data" in v["chunks"]) == (table_form == "columnar") for v in oldest["variables"].values())
    assert not any(f.startswith("@") for f in oldest["files"])
    # the running Checkpointer notices the rewritten metadata (its cached index is stale) and continues
    st = state(rng, 9, 60, 900)
    ck.save(st, step=9)
    check(current(list_versions(root))[-1].path, expected(st))


def test_explicit_base_and_damage(tmp_path):
    a, b, c = (str(tmp_path / n) for n in ("a", "b", "c"))
    u = np.random.default_rng(2).random((64, 64))
    hpcckpt.save({"u": hpcckpt.Block(u)}, a, comm=COMM, incremental=True, block_bytes=4096)
    u2 = u.copy()
    u2[3] = 0
    r = hpcckpt.save({"u": hpcckpt.Block(u2)}, b, comm=COMM, base=a, block_bytes=4096)
    assert r.incremental["kind"] == "incremental" and r.bytes_written == 4096
    check(b, {"u": u2})
    with pytest.raises(CheckpointError, match="sibling"):
        hpcckpt.save({"u": hpcckpt.Block(u2)}, str(tmp_path / "sub" / "x"), comm=COMM, base=a)
    with pytest.raises(CheckpointError, match="not a committed"):
        hpcckpt.save({"u": hpcckpt.Block(u2)}, c, comm=COMM, base=str(tmp_path / "nothing"))
    assert not os.path.exists(c)
    # damage to the base's data is found when reading the version that references it
    with open(os.path.join(a, "data", "part-000000.bin"), "r+b") as f:
        f.seek(3 * 4096 + 100)  # a block b references (b wrote block 0 itself)
        f.write(b"\xff" * 8)
    with hpcckpt.open(b) as view:
        assert any("checksum" in p and "/a/" in p for p in view.verify())
    # a removed base: the reference is refused, never read from elsewhere
    os.remove(os.path.join(a, "metadata.json"))
    with hpcckpt.open(b) as view:
        assert any("not a committed version" in p for p in view.verify())


KILL_SCRIPT = r"""
import sys, numpy as np, hpcckpt
from hpcckpt.mpi.collective import SerialComm
root = sys.argv[1]
ck = hpcckpt.Checkpointer(root, comm=SerialComm(), keep=2, incremental=True, block_bytes=65536, max_chain=3,
                          track_failures=False)
latest = ck.latest()
start = 0 if latest is None else latest + 1
for step in range(start, start + 10000):
    u = np.full((256, 1024), 1.0)
    u[step % 256] = step
    t = np.arange(10000 + 100 * step, dtype=np.int64)
    ck.save({"u": hpcckpt.Block(u), "t": hpcckpt.Ragged(t), "step": step}, step=step)
    print("SAVED", step, flush=True)
"""


def test_sigkill_during_incremental_saves_leaves_the_chain_restorable(tmp_path):
    root = str(tmp_path / "ck")
    script = tmp_path / "loop.py"
    script.write_text(KILL_SCRIPT)
    env = dict(os.environ, HPCCKPT_NO_MPI="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    rng = np.random.default_rng(int(os.environ.get("HPCCKPT_TEST_SEED", "0")))
    for attempt in range(4):
        proc = subprocess.Popen([sys.executable, str(script), root], stdout=subprocess.PIPE, env=env, text=True)
        time.sleep(1.0 + float(rng.random()) * 1.5)
        proc.send_signal(signal.SIGKILL)
        out, _ = proc.communicate()
        assert proc.returncode == -signal.SIGKILL, out  # killed mid-loop, not ended on its own
        live = current(list_versions(root))
        for e in live:  # every committed version restores exactly what its step held
            with hpcckpt.open(e.path) as view:
                assert view.verify() == [], e.name
                step = view.values["step"]
                u = view.read("u")
                assert u[step % 256].tolist() == [step] * 1024 and np.count_nonzero(u != 1.0) <= 1024
                assert np.array_equal(view.read("t"), np.arange(10000 + 100 * step))
        if live:
            ck = hpcckpt.Checkpointer(root, comm=COMM, incremental=True, track_failures=False)
            out = ck.restore({"u": hpcckpt.Block(np.empty((256, 1024))), "t": hpcckpt.Ragged(), "step": None})
            assert out["step"] == live[-1].step


def test_chain_base_is_the_newest_save_or_the_version_restored_and_the_next_save_builds_on_it(tmp_path):
    root = str(tmp_path / "r")
    u = np.zeros((64, 1024))
    with hpcckpt.Checkpointer(root, comm=COMM, incremental=True, block_bytes=8192, track_failures=False) as ck:
        assert ck.chain_base is None
        for step in (1, 2, 3):
            u[step] = step
            ck.save({"u": hpcckpt.Block(u)}, step)
            assert ck.chain_base == os.path.join(root, f"step-{step:012d}")
        ck.restore({"u": hpcckpt.Block(u)}, step=1)
        assert ck.chain_base == os.path.join(root, "step-000000000001") and not u[2:4].any()
        u[10] = 10
        ck.save({"u": hpcckpt.Block(u)}, 4)
    with open(os.path.join(root, "step-000000000004", "metadata.json")) as f:
        meta = json.load(f)
    info = meta["extra"]["incremental"]
    assert info["kind"] == "incremental" and info["base"] == "step-000000000001" and info["depth"] == 1, info
    assert meta["files"] == ["data/part-000000.bin", "@step-000000000001/data/part-000000.bin"]
    with hpcckpt.open(os.path.join(root, "step-000000000004")) as view:
        assert view.verify() == [] and np.array_equal(view.read("u"), u)
