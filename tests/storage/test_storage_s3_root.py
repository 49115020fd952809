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


def test_incremental_saves_on_four_ranks_restore_on_three_and_continue(gateway):
    """4 ranks save an incremental chain into the bucket; 3 ranks restore it exactly; 4 ranks of a new job restore
    it, save one more incremental version on the restored base (whose block index rank 0 reads from the bucket
    and broadcasts) and restore that exactly."""
    from mpitools import run_mpi

    root = _root("incremental-ranks")
    run_mpi(4, "tests/scripts/s3_ranks.py", "save", root, "incremental=1", timeout=300)
    st = _s3(root)
    live = current(list_versions(root, st))
    assert [e.step for e in live] == [1, 2, 3]  # keep=2, and step 1 holds blocks the kept ones reference
    assert referenced(live[-1].path, st) >= {"step-000000000001"}
    proc = run_mpi(3, "tests/scripts/s3_ranks.py", "restore", root, "incremental=1", timeout=300)
    assert "restored step 3 on 3 ranks" in proc.stdout, proc.stdout
    proc = run_mpi(4, "tests/scripts/s3_ranks.py", "resume", root, "incremental=1", timeout=300)
    assert "restored step 4 on 4 ranks, versions [1, 3, 4]" in proc.stdout, proc.stdout
    assert "step 4: incremental" in proc.stdout and " 0 bytes referenced" not in proc.stdout, proc.stdout


def test_node_local_levels_flush_to_a_bucket(gateway, tmp_path):
    """4 ranks on two simulated nodes save with partner copies into node-local directories and flush to the bucket
    (the newest at the close); 3 ranks with empty node directories restore exactly from the bucket (L4)."""
    from mpitools import run_mpi

    from hpcckpt.storage.s3 import split_path

    root = _root("levels")
    proc = run_mpi(4, "tests/scripts/s3_ranks.py", "save", root, f"local={tmp_path / 'local'}", timeout=300)
    st = _s3(root)
    # flushed: step 1 (due at the first save), step 3 (the newest, at the close); step 2 stayed node-local
    assert [e.step for e in current(list_versions(root, st))] == [1, 3]
    assert st.is_file(f"{root}/levels.json") and not st.exists(f"{root}/flush-in-progress.json")
    bucket, key = split_path(root)
    assert not any(k.endswith(".part") for k in st._keys_under(bucket, key + "/")), "a flush's .part object left"
    proc = run_mpi(3, "tests/scripts/s3_ranks.py", "restore", root, f"local={tmp_path / 'other'}", timeout=300)
    assert "restored step 3 on 3 ranks, versions [1, 3]" in proc.stdout and "restored from L4" in proc.stdout, \
        proc.stdout


def _dead_holders_lease(st, root: str, expires: float) -> str:
    """The lock a job on a node that died left in the bucket: a lease it can no longer renew."""
    import json

    from hpcckpt.root import lock as rootlock

    path = f"{root}/{rootlock.LOCK_FILE}"
    st.make_directories(root)
    st.atomic_write(path, json.dumps({"format": "hpcckpt-lock", "version": 1, "hostname": "node-that-died",
                                      "pid": 4242, "slurm_job_id": None, "slurm_restart_count": None,
                                      "start": expires - 100, "lease_seconds": 100.0, "expires": expires}).encode())
    return path


def test_a_dead_holders_lease_is_taken_over_once_expired(gateway):
    """A lease still running refuses a new writer with the error a held POSIX lock gives; once expired (on the
    injected clock) it is taken over with the take-over warning, and of two takers that judged the same lease
    exactly one gets it (If-Match on its ETag)."""
    import pytest

    from hpcckpt.errors import CheckpointError
    from hpcckpt.root import lock as rootlock

    root = _root("lease")
    st = _s3(root)
    t0 = 2_000_000_000.0
    path = _dead_holders_lease(st, root, t0 + 100)
    with pytest.raises(CheckpointError, match="is being written by another job: pid 4242 on host node-that-died"
                                              r".*run `hpcckpt unlock ROOT` or pass break_lock=True"):
        rootlock.acquire(root, storage=st, clock=lambda: t0 + 99)
    stale = rootlock._inspect(st, path)
    with pytest.warns(RuntimeWarning, match="taking over the lock .* of pid 4242 on host node-that-died.*: its lease "
                                            "expired at .* and was not renewed"):
        mine = rootlock.acquire(root, storage=st, clock=lambda: t0 + 101)
    assert mine.holder["pid"] != 4242 and mine.holder["expires"] == t0 + 101 + rootlock.LEASE_SECONDS
    assert rootlock._take_over_lease(stale, rootlock.this_process(t0 + 101, 100.0)) is None  # the second taker
    assert rootlock._inspect(st, path).holder["expires"] == mine.holder["expires"]
    rootlock.release(mine)
    assert not st.exists(path)


def test_a_lease_is_renewed_and_a_holder_that_lost_it_stops(gateway, monkeypatch):
    """A Checkpointer renews its lease at a save once a quarter of it has passed (not before); when another job
    took the lease over (it had expired), the next save raises and the close leaves that job's lock alone."""
    import json

    import pytest

    from hpcckpt.errors import CheckpointError
    from hpcckpt.root import lock as rootlock

    root = _root("renew")
    st = _s3(root)
    t = [2_000_000_000.0]
    monkeypatch.setattr(rootlock, "now", lambda: t[0])
    lease = rootlock.LEASE_SECONDS
    path = f"{root}/{rootlock.LOCK_FILE}"
    u = np.arange(100.0)
    with hpcckpt.Checkpointer(root, track_failures=False) as ck:
        ck.save({"u": hpcckpt.Block(u)}, step=1)
        expires = rootlock._inspect(st, path).holder["expires"]
        assert expires == t[0] + lease
        t[0] += 0.2 * lease
        ck.save({"u": hpcckpt.Block(u)}, step=2)
        assert rootlock._inspect(st, path).holder["expires"] == expires  # not due yet: no request
        t[0] += 0.1 * lease
        ck.save({"u": hpcckpt.Block(u)}, step=3)
        assert rootlock._inspect(st, path).holder["expires"] == t[0] + lease  # renewed
        t[0] += 2 * lease  # the job stalled past its lease: another job takes it over
        other = rootlock._inspect(st, path)
        body = json.dumps({**other.holder, "hostname": "node-other", "pid": 77, "expires": t[0] + lease}).encode()
        assert st.write_if_unchanged(path, body, other.stat)
        with pytest.raises(CheckpointError, match="writer lock .* is no longer this job's: its lease expired at "
                                                  ".* now held by pid 77 on host node-other"):
            ck.save({"u": hpcckpt.Block(u)}, step=4)
    assert rootlock._inspect(st, path).holder["pid"] == 77  # the close left the other job's lock


def test_the_persistent_memory_tier_restores_a_version_held_only_in_the_bucket(gateway, tmp_path):
    """A node whose local directory was lost but whose persistent-memory image survived restores the newest
    version from the image, reading everything else (the metadata) from the bucket."""
    import shutil

    root = _root("pmem")
    opts = {"local_dir": str(tmp_path / "local"), "pmem_dir": str(tmp_path / "pm"), "ranks_per_node": 1,
            "track_failures": False, "flush_every": 1}
    with hpcckpt.Checkpointer(root, **opts) as ck:
        for step in (1, 2):
            ck.save(_state(step), step)
        assert "PM" in ck.last_result.levels
    assert [e.step for e in current(list_versions(root, _s3(root)))] == [1, 2]
    shutil.rmtree(tmp_path / "local")
    target = {"u": hpcckpt.Block(np.zeros((64, 40))), "t": hpcckpt.Ragged(), "step": 0}
    with hpcckpt.Checkpointer(root, **opts) as ck:
        got = ck.restore(target)
        assert got["step"] == 2 and ck.engine.restored_level == "PM"
    want = _state(2)
    assert np.array_equal(target["u"].local, want["u"].local)
    assert np.array_equal(got["t"].local, want["t"].local)
