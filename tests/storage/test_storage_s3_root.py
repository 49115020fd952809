"""A Checkpointer root in a bucket of the real Ceph gateway (tests/storage/conftest.py): incremental chains,
node-local levels flushing to the bucket, the writer lock's lease."""

from __future__ import annotations

import uuid

import numpy as np

import hpcckpt
from hpcckpt.incremental.chain import compact
from hpcckpt.root.catalog import current, gc, list_versions, referenced
from hpcckpt.storage import POSIX


def _root(kind: str) -> str:
    return f"s3://hpcckpt/{kind}-{uuid.uuid4().hex[:8]}"


def _s3(root: str):
    from hpcckpt.storage.s3 import storage_for

    return storage_for(root, POSIX)


def _state(step: int) -> dict:
    """A state of which one row and the table's tail change at each step (most blocks stay as they were)."""
    u = np.random.default_rng(1).random((64, 40))
    u[step % 64] += step
    return {"u": hpcckpt.Block(u), "t": hpcckpt.Ragged(np.arange(500 + 40 * step, dtype=np.int64) * 3),
            "step": step}


def _exact(path: str, state: dict) -> None:
    with hpcckpt.open(path) as view:
        assert view.verify() == []
        assert view.values["step"] == state["step"]
        for name in ("u", "t"):
            assert np.array_equal(view.read(name), state[name].local), (path, name)


def test_incremental_chains_in_a_bucket(gateway):
    """Incremental saves reference their base's objects; retention never removes a base a kept version
    references; every kept version restores exactly; compaction then gc leave two self-contained versions."""
    root = _root("incremental")
    st = _s3(root)
    saved = {}
    with hpcckpt.Checkpointer(root, keep=2, incremental=True, block_bytes=1024, max_chain=8,
                              track_failures=False) as ck:
        for step in range(7):
            saved[step] = _state(step)
            info = ck.save(saved[step], step=step).incremental
            assert step == 0 or info["kind"] == "incremental" or info["depth"] == 0
            live = current(list_versions(root, st))
            names = {e.name for e in live}
            for e in live:
                assert referenced(e.path, st) <= names, (e.name, names)  # a referenced base stays committed
            for e in live[-2:]:
                _exact(e.path, saved[e.step])
        live = current(list_versions(root, st))
        assert len(live) > 2 and referenced(live[-1].path, st) - {e.name for e in live[-2:]}, \
            "retention kept no base outside the newest two"
        got = ck.restore({"u": hpcckpt.Block(np.zeros((64, 40))), "t": hpcckpt.Ragged(np.zeros(0, np.int64)),
                          "step": None})
        assert got["step"] == 6 and np.array_equal(got["u"].local, saved[6]["u"].local)
        assert np.array_equal(got["t"].local, saved[6]["t"].local)
    assert compact(root, keep=2, storage=st)
    gc(root, keep=2, storage=st)
    live = current(list_versions(root, st))
    assert [e.step for e in live] == [5, 6]
    for e in live:
        assert referenced(e.path, st) <= {x.name for x in live}
        _exact(e.path, saved[e.step])
    assert not referenced(live[0].path, st)


def test_node_local_levels_flush_to_a_bucket(gateway, tmp_path):
    """4 ranks on two simulated nodes save with partner copies into node-local directories and flush to the bucket
    (the newest at the close); 3 ranks with empty node directories restore exactly from the bucket (L4)."""
    from mpitools import run_mpi

    from hpcckpt.storage.s3 import split_path

    root = _root("levels")
    proc = run_mpi(4, "tests/scripts/s3_ranks.py", "save", root, tmp_path / "local", timeout=300)
    st = _s3(root)
    # flushed: step 1 (due at the first save), step 3 (the newest, at the close); step 2 stayed node-local
    assert [e.step for e in current(list_versions(root, st))] == [1, 3]
    assert st.is_file(f"{root}/levels.json") and not st.exists(f"{root}/flush-in-progress.json")
    bucket, key = split_path(root)
    assert not any(k.endswith(".part") for k in st._keys_under(bucket, key + "/")), "a flush's .part object left"
    proc = run_mpi(3, "tests/scripts/s3_ranks.py", "restore", root, tmp_path / "other", timeout=300)
    assert "restored step 3 on 3 ranks" in proc.stdout and "restored from L4" in proc.stdout, proc.stdout
