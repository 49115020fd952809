"""Small, frequent saves on one process: what a repeated Checkpointer.save costs in collectives (two: it
plans locally from the cache and is checked at its commit) and in
side work (retention's deletions on a thread, the failure history's heartbeat written at most every
HEARTBEAT_SECONDS), that none of it changes what is committed or restored, and the plan stage's Ballot (the
allreduce's record: merged alike in any order and grouping)."""

from __future__ import annotations

import json
import os
from functools import reduce

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import hpcckpt
from hpcckpt.root import pacing
from hpcckpt.mpi.collective import SerialComm
from hpcckpt.policy import FailureHistory
from hpcckpt.saving.plan import Ballot, merge_ballots, merge_reports
from mpitools import CountingComm

COLLECTIVES = {"allgather", "gather", "bcast", "scatter", "allreduce", "exscan", "Scan", "alltoall", "Barrier", "barrier"}


def _state(k: float, n: int = 512) -> dict:
    return {"u": hpcckpt.Block(np.arange(n, dtype=np.float64) + k, offset=(0,), global_shape=(n,)), "t": k}


def test_a_repeated_save_on_one_rank_makes_two_collectives(tmp_path):
    """Planned locally from the cache and checked at the commit: the commit's gather and bcast alone."""
    comm = CountingComm(SerialComm())
    with hpcckpt.Checkpointer(tmp_path / "root", comm=comm, keep=2, strategy="file-per-rank",
                              track_failures=False) as ck:
        comm.calls.clear()
        ck.save(_state(0), 0)  # the first save: the lock's allgather, the plan (gather, bcast, scatter), the commit
        assert [c for c in comm.calls if c in COLLECTIVES] == ["allgather", "gather", "bcast", "scatter", "gather",
                                                               "bcast"]
        counts = []
        for step in (1, 2, 3):
            comm.calls.clear()
            ck.save(_state(step), step)
            counts.append([c for c in comm.calls if c in COLLECTIVES])
        assert counts == [["gather", "bcast"]] * 3, counts
        target = _state(-1)
        out = ck.restore(target)
    assert out["t"] == 3 and np.array_equal(target["u"].local, _state(3)["u"].local)


def test_retention_leaves_no_committed_extra_version_and_deletes_the_rest_before_the_next_save(tmp_path):
    root = tmp_path / "root"
    ck = hpcckpt.Checkpointer(root, keep=2, strategy="file-per-rank", track_failures=False)
    for step in range(5):
        ck.save(_state(step), step)
        # right after the save: exactly the newest two committed, whatever the thread has deleted yet
        committed = sorted(p for p in os.listdir(root) if (root / p / "metadata.json").is_file())
        assert committed == [f"step-{s:012d}" for s in range(max(0, step - 1), step + 1)]
        assert ck.steps() == list(range(max(0, step - 1), step + 1))
        ck.series.retirement.wait()  # what the next save does first
        assert sorted(p for p in os.listdir(root) if p.startswith("step-")) == committed
    ck.close()
    assert sorted(p for p in os.listdir(root) if p.startswith("step-")) == ["step-000000000003", "step-000000000004"]
    target = _state(-1)
    assert hpcckpt.Checkpointer(root, track_failures=False).restore(target)["t"] == 4


def test_a_retention_deletion_that_fails_is_a_warning_and_the_version_stays_uncommitted(tmp_path, monkeypatch):
    from hpcckpt.storage import POSIX

    root = tmp_path / "root"
    with hpcckpt.Checkpointer(root, keep=1, strategy="file-per-rank", track_failures=False) as ck:
        ck.save(_state(0), 0)

        def refuse(path, *a, **k):
            raise PermissionError(13, "Permission denied", str(path))

        monkeypatch.setattr(POSIX, "remove_tree", refuse)
        with pytest.warns(UserWarning, match="could not remove"):
            ck.save(_state(1), 1)
            ck.series.retirement.wait()
        monkeypatch.undo()
        assert not (root / "step-000000000000" / "metadata.json").exists()  # uncommitted: never restored
        assert ck.steps() == [1]
        ck.save(_state(2), 2)  # clears the leftover first
        ck.series.retirement.wait()
    assert sorted(p for p in os.listdir(root) if p.startswith("step-")) == ["step-000000000002"]


def test_a_directory_deleted_meanwhile_is_deleted_not_a_warning(tmp_path, monkeypatch):
    """Retention's thread and a ``hpcckpt gc`` beside it may delete the same files: the one that finds a file gone
    has what it wanted (no warning, the name reported); any other error is still a warning."""
    import shutil
    import warnings

    from hpcckpt.root.catalog import VersionEntry, delete_directories

    version = tmp_path / "step-000000000001"
    (version / "data").mkdir(parents=True)
    for k in range(3):
        (version / "data" / f"part-{k}.bin").write_bytes(b"x")
    entry = VersionEntry(version.name, str(version), 1, 0, False)
    real_unlink = os.unlink

    def raced_unlink(path, *args, **kwargs):  # the other deleter got there first
        real_unlink(path, *args, **kwargs)
        raise FileNotFoundError(2, "No such file or directory", path)

    monkeypatch.setattr(shutil.os, "unlink", raced_unlink)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert delete_directories([entry]) == [version.name]
    monkeypatch.undo()
    assert not version.exists()
    (version / "data").mkdir(parents=True)
    monkeypatch.setattr(shutil.os, "rmdir", lambda *a, **k: (_ for _ in ()).throw(PermissionError(13, "denied")))
    with pytest.warns(UserWarning, match="could not remove"):
        assert delete_directories([entry]) == []


def test_the_bandwidth_file_is_written_at_most_every_period_and_at_close(tmp_path, monkeypatch):
    """strategy="auto" records each save's bandwidth: the file is written by the first save, then at most every
    WRITE_SECONDS (the measurements in between are used from memory), and by close."""
    from hpcckpt.transport import io_history

    path = tmp_path / io_history.FILE_NAME
    clock = [1000.0]
    monkeypatch.setattr(io_history.time, "monotonic", lambda: clock[0])
    ck = hpcckpt.Checkpointer(tmp_path, keep=2, track_failures=False)
    block = {"u": hpcckpt.Block(np.arange(1024.0))}
    ck.save(block, 1)
    assert len(json.loads(path.read_bytes())["saves"]) == 1
    ck.save(block, 2)
    assert len(json.loads(path.read_bytes())["saves"]) == 1 and len(io_history.read(str(tmp_path))) == 2
    clock[0] += io_history.WRITE_SECONDS
    ck.save(block, 3)
    assert len(json.loads(path.read_bytes())["saves"]) == 3
    ck.save(block, 4)
    ck.close()
    assert len(json.loads(path.read_bytes())["saves"]) == 4
    path.unlink()  # the Checkpointer let the root go: what a later reader sees is the file again
    assert io_history.read(str(tmp_path)) == []


def test_the_failure_history_is_written_at_most_every_heartbeat_period(tmp_path, monkeypatch):
    writes = []
    real = FailureHistory.save
    monkeypatch.setattr(FailureHistory, "save", lambda self: (writes.append(1), real(self)))
    root = tmp_path / "root"
    ck = hpcckpt.Checkpointer(root, keep=2, strategy="file-per-rank", handle_signals=False)
    assert len(writes) == 1  # the job start
    for step in range(4):
        ck.save(_state(step), step)
    assert len(writes) == 1  # four saves within HEARTBEAT_SECONDS: no rewrite
    monkeypatch.setattr(pacing, "HEARTBEAT_SECONDS", 0.0)
    ck.save(_state(4), 4)
    assert len(writes) == 2
    alive = json.loads((root / "failure_history.json").read_text())["runs"][-1]["last_alive"]
    assert alive is not None
    ck.close()  # the clean end is written whatever the period
    assert len(writes) == 3
    run = json.loads((root / "failure_history.json").read_text())["runs"][-1]
    assert run["end"] is not None and run["last_alive"] >= alive


# ---------------------------------------------------------------- the plan stage's ballot (pure)

_digests = st.one_of(st.none(), st.sampled_from(["0a", "1b", "2c", "ff"]))
_reports = st.one_of(st.none(), st.frozensets(st.integers(0, 5), max_size=4))


@st.composite
def _ballots(draw):
    """Every rank's ballot: rank 0 alone hands out a part, a rank that failed may send no digest."""
    n = draw(st.integers(1, 9))
    out = []
    for r in range(n):
        failed = draw(st.booleans())
        digest = draw(_digests) if failed else draw(st.sampled_from(["0a", "1b", "2c", "ff"]))
        out.append(Ballot(draw(st.booleans()) and not failed, digest, digest, ("dir", r) if r == 0 else None,
                          draw(_reports)))
    return out, draw(st.permutations(range(n))), draw(st.integers(0, n))


@settings(max_examples=300, deadline=None)
@given(_ballots())
def test_ballots_merge_the_same_in_any_order_and_grouping(case):
    """What an MPI reduction needs (it merges in a tree of its choosing), and what the plan stage reads."""
    ballots, order, cut = case
    merge = lambda a, b: merge_ballots(a, b, frozenset.intersection)  # noqa: E731
    shuffled = [ballots[i] for i in order]
    left, right = shuffled[:cut], shuffled[cut:]
    grouped = [reduce(merge, part) for part in (left, right) if part]
    got = reduce(merge, grouped)
    assert got == reduce(merge, ballots)
    digests = [b.low for b in ballots if b.low is not None]
    reports = [b.report for b in ballots if b.report is not None]
    assert got.unchanged == all(b.unchanged for b in ballots)
    assert (got.low, got.high) == ((min(digests), max(digests)) if digests else (None, None))
    assert got.root == ("dir", 0)
    assert got.report == (reduce(frozenset.intersection, reports) if reports else None)


def test_reports_without_a_combine_are_none():
    assert merge_reports(frozenset({1}), frozenset({1}), None) is None
    assert merge_reports(None, frozenset({2}), frozenset.intersection) == frozenset({2})

