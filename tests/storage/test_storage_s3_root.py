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
