"""Integrity of a Checkpointer root: errors that reach one rank, two jobs on one root (the writer
lock), read-only roots, restore's fallback over unusable versions, and version confinement.

The MPI part runs with ``mpiexec -n N python tests/mpi_pytest.py --with-mpi -m mpi tests/storage/test_root_safety.py``;
the serial part launches its own mpiexec jobs (tests/scripts/root_jobs.py) where two jobs are needed.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpcckpt import Block, CheckpointError, Checkpointer, TemplateMismatchError
from hpcckpt.root import lock as rootlock
from hpcckpt.root.catalog import list_versions
from hpcckpt.policy.history import FailureHistory
from mpitools import mpiexec_path, run_mpi
from testpaths import REPO, TESTS

SCRIPT = os.path.join(TESTS, "scripts", "root_jobs.py")
N = 500


def _save_two(root, **kw):
    """Steps 1 and 2 of a one-process state (a = step * 100 + index, t = step)."""
    with Checkpointer(root, track_failures=False, **kw) as ck:
        for step in (1, 2):
            ck.save({"a": Block(np.arange(N) + 100.0 * step), "t": step}, step)


def _restore(root, **kw):
    """(restored t, a, warning messages) from a fresh Checkpointer on ``root``."""
    a = np.zeros(N)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with Checkpointer(root, track_failures=False, **kw) as ck:
            out = ck.restore({"a": Block(a), "t": None})
    return out["t"], a, [str(w.message) for w in caught]


# ------------------------------------------------------------ the writer lock (pure)
_ids = st.one_of(st.none(), st.sampled_from(["1", "2"]))
_holders = st.fixed_dictionaries({
    "hostname": st.sampled_from(["here", "there"]), "pid": st.one_of(st.integers(-2, 6), st.none(), st.text()),
    "slurm_job_id": _ids, "slurm_restart_count": st.one_of(st.none(), st.integers(0, 3)),
    "expires": st.one_of(st.none(), st.integers(0, 4), st.floats(0, 4), st.text(max_size=2))})


@given(_holders, st.one_of(st.none(), st.integers(0, 3)), _ids, st.booleans(), st.booleans(),
       st.one_of(st.none(), st.floats(0, 4)))
def test_stale_reason_takes_over_only_provably_dead_holders(holder, my_rc, my_job, alive, flock_free, now):
    """A lease (``expires``) makes a holder on another host stale once it is past ``now``; a holder on this host
    is judged by its process alone; no lease is judged without a clock."""
    me = {"hostname": "here", "pid": 5, "slurm_job_id": my_job, "slurm_restart_count": my_rc}
    why = rootlock.stale_reason(holder, me, lambda pid: alive, flock_free, now)
    earlier_attempt = (holder["slurm_job_id"] is not None and holder["slurm_job_id"] == my_job
                       and holder["slurm_restart_count"] is not None and my_rc is not None
                       and holder["slurm_restart_count"] < my_rc)
    pid, expires = holder["pid"], holder["expires"]
    local = holder["hostname"] == "here" and type(pid) is int and pid > 0
    expired = now is not None and type(expires) in (int, float) and expires < now
    assert (why is not None) == (earlier_attempt or local and (pid == 5 or not alive or flock_free)
                                 or not local and expired)


# ------------------------------------------------------------ the writer lock (processes)
def test_lock_names_the_holder_and_close_releases_it(tmp_path):
    ck = Checkpointer(tmp_path, track_failures=False)
    assert not os.path.exists(tmp_path / rootlock.LOCK_FILE)  # restore-only use takes no lock
    ck.save({"a": Block(np.arange(N) * 1.0)}, 1)
    body = json.loads((tmp_path / rootlock.LOCK_FILE).read_text())
    assert body["pid"] == os.getpid() and body["format"] == "hpcckpt-lock"
    assert [e.step for e in list_versions(tmp_path)] == [1]  # the lock is not a version
    ck.close()
    assert not os.path.exists(tmp_path / rootlock.LOCK_FILE)


def test_lock_of_another_host_is_refused_until_broken(tmp_path):
    foreign = {"format": "hpcckpt-lock", "version": 1, "hostname": "node-elsewhere", "pid": 1234,
               "slurm_job_id": "99", "slurm_restart_count": 0, "start": 0.0}
    (tmp_path / rootlock.LOCK_FILE).write_text(json.dumps(foreign))
    ck = Checkpointer(tmp_path, track_failures=False)
    with pytest.raises(CheckpointError, match="pid 1234 on host node-elsewhere, SLURM job 99"):
        ck.save({"a": Block(np.arange(N) * 1.0)}, 1)
    assert list_versions(tmp_path) == []
    with pytest.warns(RuntimeWarning, match="break_lock=True was given"):
        ck = Checkpointer(tmp_path, track_failures=False, break_lock=True)
        ck.save({"a": Block(np.zeros(N))}, 1)
    assert rootlock.break_lock(tmp_path)["pid"] == os.getpid()  # the way out without a Checkpointer
    assert not os.path.exists(tmp_path / rootlock.LOCK_FILE)
    ck.close()  # its lock was broken: close leaves the root alone


def test_lock_of_an_unclosed_checkpointer_of_this_process_is_taken_over(tmp_path):
    first = Checkpointer(tmp_path, track_failures=False)
    first.save({"a": Block(np.zeros(N))}, 1)
    second = Checkpointer(tmp_path, track_failures=False)
    with pytest.warns(RuntimeWarning, match="not closed") as caught:
        second.save({"a": Block(np.ones(N))}, 2)
    assert [w.filename for w in caught] == [__file__]  # the application's call, not a line of hpcckpt's
    first.close()  # must not remove the lock that is now the second's
    assert json.loads((tmp_path / rootlock.LOCK_FILE).read_text())["pid"] == os.getpid()
    second.close()
    assert not os.path.exists(tmp_path / rootlock.LOCK_FILE)


@pytest.mark.timeout(240)
def test_two_jobs_racing_on_one_root_one_wins_and_its_data_is_whole(tmp_path):
    root, go = tmp_path / "root", tmp_path / "go"
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    jobs = [subprocess.Popen([mpiexec_path(), "-n", "2", sys.executable, SCRIPT, "race", str(root), str(tag), str(go)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
            for tag in (1, 2)]
    try:
        outs = {}
        while len(outs) < 2:
            for tag, job in zip((1, 2), jobs):
                if tag not in outs and job.poll() is not None:
                    outs[tag] = job.communicate()
            if len(outs) == 1:
                go.touch()  # the loser is out: the winner may finish
            try:
                jobs[0].wait(0.1)
            except subprocess.TimeoutExpired:
                pass
    finally:
        go.touch()
        for job in jobs:
            try:
                job.wait(120)
            except subprocess.TimeoutExpired:
                job.kill()
                pytest.fail("a job on the shared root hung")
    won = [tag for tag, (out, _) in outs.items() if out.count(f"OK won {tag}") == 2]
    lost = [tag for tag, (out, _) in outs.items() if out.count(f"OK locked out {tag}") == 2]
    assert len(won) == 1 and len(lost) == 1, outs
    assert "is being written by another job" in outs[lost[0]][0] and "pid" in outs[lost[0]][0]
    assert [e.step for e in list_versions(root) if e.committed] == [1, 2, 3]
    with Checkpointer(root, track_failures=False) as ck:
        for step in (1, 2, 3):
            a = np.zeros(2 * N)
            ck.restore({"u": Block(a), "tag": None}, step=step)
            assert np.array_equal(a, np.concatenate([np.full(N, 1000.0 * won[0] + 10.0 * step + r)
                                                     for r in (0, 1)]))


@pytest.mark.timeout(180)
def test_lock_left_by_a_sigkilled_job_on_this_host_is_taken_over(tmp_path):
    out = run_mpi(2, SCRIPT, "hold", tmp_path, check=False)
    assert out.stdout.count("OK holding") == 2 and out.returncode != 0
    assert os.path.exists(tmp_path / rootlock.LOCK_FILE)
    with pytest.warns(RuntimeWarning, match="is gone") as caught:
        with Checkpointer(tmp_path, track_failures=False) as ck:
            ck.save({"u": Block(np.zeros(2 * N)), "tag": 0}, 2)
            assert ck.steps() == [1, 2]
    assert [w.filename for w in caught] == [__file__]
    assert not os.path.exists(tmp_path / rootlock.LOCK_FILE)


# ------------------------------------------------------------ read-only roots
@pytest.fixture
def readonly_mount(tmp_path):
    """A tmpfs mounted at tmp_path/ro; call the returned function to remount it read-only."""
    where = tmp_path / "ro"
    where.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(where)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root and CAP_SYS_ADMIN): the monkeypatched test covers it")
    yield where, lambda: subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True)
    subprocess.run(["umount", "-l", str(where)], check=False)


def test_restore_from_a_really_read_only_root(readonly_mount):
    root, make_readonly = readonly_mount
    with Checkpointer(root) as ck:  # failure tracking on (the default), as an application runs
        ck.save({"a": Block(np.arange(N) * 3.0), "t": 1}, 1)
    make_readonly()
    with pytest.raises(OSError):
        (root / "probe").write_text("x")
    with pytest.warns(RuntimeWarning, match="failure history"):
        ck = Checkpointer(root)
    a = np.zeros(N)
    assert ck.restore({"a": Block(a), "t": None})["t"] == 1 and np.array_equal(a, np.arange(N) * 3.0)
    assert ck.latest() == 1
    with pytest.raises(CheckpointError, match="read-only or non-writable root"):
        ck.save({"a": Block(a), "t": 2}, 2)
    ck.close()


def test_restore_from_a_non_writable_root_monkeypatched(tmp_path, monkeypatch):
    _save_two(tmp_path)
    real_open = os.open

    def refusing(path, flags, *args, **kwargs):
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT) and str(path).startswith(str(tmp_path)):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), path)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", refusing)
    with pytest.warns(RuntimeWarning, match="failure history"):
        ck = Checkpointer(tmp_path)
    a = np.zeros(N)
    assert ck.restore({"a": Block(a), "t": None})["t"] == 2 and np.array_equal(a, np.arange(N) + 200.0)
    with pytest.raises(CheckpointError, match="Read-only file system"):
        ck.save({"a": Block(a), "t": 3}, 3)
    ck.close()


# ------------------------------------------------------------ restore falls back over unusable versions
def _version(root, step):
    return os.path.join(root, f"step-{step:012d}")


def _data_files(vdir):
    return [os.path.join(d, f) for d, _, fs in os.walk(vdir) for f in fs if f != "metadata.json"]


def _unreadable(root, monkeypatch):
    real_open = os.open
    bad = _version(root, 2)

    def denied(path, *args, **kwargs):
        if str(path).startswith(bad) and not str(path).endswith("metadata.json"):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", denied)


def _directory_in_place(root, monkeypatch):
    for f in _data_files(_version(root, 2)):
        os.unlink(f)
        os.mkdir(f)


def _too_deep(root, monkeypatch):
    with open(os.path.join(_version(root, 2), "metadata.json"), "w") as f:
        f.write("[" * 200000 + "]" * 200000)


def _step_mismatch(root, monkeypatch):
    os.rename(_version(root, 2), _version(root, 5))  # version 5 holds step 2's data and says so
    shutil.copytree(_version(root, 1), _version(root, 2))


@pytest.mark.parametrize("damage", [_unreadable, _directory_in_place, _too_deep, _step_mismatch])
def test_restore_falls_back_over_an_unusable_newest_version(tmp_path, monkeypatch, damage):
    _save_two(tmp_path)
    damage(str(tmp_path), monkeypatch)
    t, a, caught = _restore(tmp_path)
    want = 1
    assert t == want and np.array_equal(a, np.arange(N) + 100.0 * want)
    assert any("skipping unusable version" in m for m in caught), caught


def test_step_mismatch_is_named_and_a_requested_step_still_raises(tmp_path, monkeypatch):
    _save_two(tmp_path)
    _step_mismatch(str(tmp_path), monkeypatch)
    with Checkpointer(tmp_path, track_failures=False) as ck:
        with pytest.raises(CheckpointError, match="named for step 5 but its metadata holds step 2"):
            ck.restore({"a": Block(np.zeros(N)), "t": None}, step=5)


def test_template_mismatch_still_raises_at_once(tmp_path, monkeypatch):
    _save_two(tmp_path)
    with Checkpointer(tmp_path, track_failures=False) as ck:
        with pytest.raises(TemplateMismatchError):
            ck.restore({"a": Block(np.zeros(N, np.float32)), "t": None})
        with pytest.raises(TemplateMismatchError):
            ck.restore({"b": Block(np.zeros(N)), "t": None})


def test_a_version_linked_from_outside_the_root_is_not_a_version(tmp_path):
    root, elsewhere = tmp_path / "root", tmp_path / "elsewhere"
    _save_two(root)
    _save_two(elsewhere)
    os.symlink(_version(elsewhere, 2), _version(root, 9))
    os.symlink(_version(root, 2), root / "step-000000000003.r1")  # a link inside the root is listed ...
    assert [e.name for e in list_versions(root)] == ["step-000000000001", "step-000000000002", "step-000000000003.r1"]
    t, a, caught = _restore(root)  # ... but holds step 2, not 3: skipped
    assert t == 2 and np.array_equal(a, np.arange(N) + 200.0)
    assert any("named for step 3 but its metadata holds step 2" in m for m in caught)


# ------------------------------------------------------------ errors that reach one rank (serial)
def test_unwritable_failure_history_is_one_warning_not_an_error(tmp_path, monkeypatch):
    def full(self):
        raise OSError(errno.ENOSPC, "No space left on device (injected)")

    ck = Checkpointer(tmp_path)
    monkeypatch.setattr(FailureHistory, "save", full)
    with pytest.warns(RuntimeWarning, match="failure history.*No space left") as caught:
        for step in (1, 2):
            ck.save({"a": Block(np.arange(N) * 1.0)}, step)
        ck.close()
    assert sum("failure history" in str(w.message) for w in caught) == 1  # then kept in memory only
    assert [e.step for e in list_versions(tmp_path) if e.committed] == [1, 2]


def test_a_checkpointers_root_is_reached_through_its_storage(tmp_path):
    """The root directory, the listing, retention, the writer lock, the halt file and the failure history of a
    Checkpointer go through ``Checkpointer.storage`` (a root can live in another Storage)."""
    from hpcckpt.storage import PosixStorage, Storage

    class Recording(PosixStorage):
        def __init__(self):
            self.calls = set()

        def __getattribute__(self, name):
            if name in Storage.__dict__ and not name.startswith("_"):
                object.__getattribute__(self, "calls").add(name)
            return super().__getattribute__(name)

    class Mine(Checkpointer):
        storage = Recording()

    root = tmp_path / "root"
    with Mine(root, keep=1, handle_signals=False) as ck:
        for step in (1, 2):
            ck.save({"a": Block(np.arange(N) * 1.0)}, step)
        assert not ck.should_save(3)
    assert {"make_directories", "listdir", "stat", "is_file", "create", "sync", "names_handle", "remove_file",
            "remove_tree", "exists", "read_file", "atomic_write"} <= Mine.storage.calls
    assert [e.step for e in list_versions(root)] == [2] and not (root / rootlock.LOCK_FILE).exists()


# ------------------------------------------------------------ under mpiexec
@pytest.fixture
def comm():
    from mpi4py import MPI

    return MPI.COMM_WORLD


def _inject(monkeypatch, where):
    """Make one piece of rank 0's bookkeeping fail with ENOSPC."""
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device (injected)")

    if where == "history":
        monkeypatch.setattr(FailureHistory, "save", full)
    elif where == "io":
        from hpcckpt.storage import POSIX
        from hpcckpt.transport import io_history

        write = POSIX.atomic_write

        def full_for_the_bandwidth_file(path, *args, **kwargs):
            if os.path.basename(path) == io_history.FILE_NAME:
                full()
            return write(path, *args, **kwargs)

        monkeypatch.setattr(POSIX, "atomic_write", full_for_the_bandwidth_file)
    else:
        import hpcckpt.saving.run

        monkeypatch.setattr(hpcckpt.saving.run, "removable", full)  # retention, inside every save's commit


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(60)
@pytest.mark.parametrize("asynchronous", [False, True])
@pytest.mark.parametrize("where", ["history", "io", "retention"])
def test_bookkeeping_failing_on_rank_0_is_a_warning_there_and_no_error_anywhere(comm, mpi_tmp, monkeypatch,
                                                                                asynchronous, where):
    if asynchronous and where == "io":
        pytest.skip("asynchronous saves write file-per-rank and record no bandwidth")
    a = np.arange(N) + 1000.0 * comm.rank
    # the bandwidth history is written by saves with strategy auto only (its one reader)
    ck = Checkpointer(mpi_tmp, asynchronous=asynchronous, keep=1, strategy="auto" if where == "io" else "file-per-rank")
    if comm.rank == 0:
        _inject(monkeypatch, where)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in (1, 2, 3):
            ck.save({"u": Block(a, (comm.rank * N,), (comm.size * N,))}, step)
        ck.wait()  # commits an asynchronous step 3: steps() lists committed versions only
        steps = ck.steps()
        ck.close()
    monkeypatch.undo()
    messages = [str(w.message) for w in caught if "injected" in str(w.message)]
    assert comm.allgather(bool(messages)) == [True] + [False] * (comm.size - 1)
    assert steps[-1] == 3 and comm.allgather(steps) == [steps] * comm.size
    b = np.zeros(N)
    with Checkpointer(mpi_tmp, track_failures=False) as ck:
        ck.restore({"u": Block(b, (comm.rank * N,), (comm.size * N,))})
        assert ck.last_restored.endswith("step-000000000003")
    assert np.array_equal(b, a)


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(60)
@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_foreign_lock_is_the_same_error_on_every_rank(comm, mpi_tmp, asynchronous):
    if comm.rank == 0:
        with open(os.path.join(mpi_tmp, rootlock.LOCK_FILE), "w") as f:
            json.dump({"format": "hpcckpt-lock", "hostname": "node-elsewhere", "pid": 42}, f)
    comm.Barrier()
    ck = Checkpointer(mpi_tmp, asynchronous=asynchronous, track_failures=False)
    with pytest.raises(CheckpointError, match="pid 42 on host node-elsewhere") as err:
        ck.save({"u": Block(np.zeros(N), (comm.rank * N,), (comm.size * N,))}, 1)
    assert comm.allgather(str(err.value)) == [str(err.value)] * comm.size
    assert ck.latest() is None
    ck.close()


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(60)
def test_restore_falls_back_in_step_on_every_rank_when_one_rank_cannot_open(comm, mpi_tmp, monkeypatch):
    a = np.arange(N) + 1000.0 * comm.rank
    with Checkpointer(mpi_tmp, track_failures=False, strategy="file-per-rank") as ck:
        for step in (1, 2):
            ck.save({"u": Block(a + step, (comm.rank * N,), (comm.size * N,))}, step)
    if comm.rank == comm.size - 1:
        _unreadable(mpi_tmp, monkeypatch)
    b = np.zeros(N)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        with Checkpointer(mpi_tmp, track_failures=False) as ck:
            ck.restore({"u": Block(b, (comm.rank * N,), (comm.size * N,))})
            restored = ck.last_restored
    assert restored.endswith("step-000000000001") and np.array_equal(b, a + 1)
    assert comm.allgather(restored) == [restored] * comm.size


@pytest.mark.timeout(30)
def test_a_fifo_in_place_of_the_histories_neither_blocks_nor_fails(tmp_path):
    os.mkfifo(tmp_path / "failure_history.json")
    os.mkfifo(tmp_path / ".hpcckpt-io.json")
    with pytest.warns(RuntimeWarning, match="cannot read the failure history"):
        ck = Checkpointer(tmp_path)
    ck.save({"a": Block(np.arange(N) * 1.0)}, 1)  # strategy "auto" reads the bandwidth history
    ck.close()
    assert ck.pacer.history.directory is None and [e.step for e in list_versions(tmp_path)] == [1]


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(60)
def test_a_node_listing_failing_on_one_rank_fails_its_query_and_every_ranks_restore(comm, mpi_tmp, monkeypatch):
    import hpcckpt.saving.asynchronous
    import hpcckpt.levels.restore

    local = os.path.join(mpi_tmp, "local")
    ck = Checkpointer(os.path.join(mpi_tmp, "root"), local_dir=local, ranks_per_node=1, track_failures=False)
    ck.save({"u": Block(np.zeros(N), (comm.rank * N,), (comm.size * N,))}, 1)
    if comm.rank == comm.size - 1:
        def broken(path, *storage):
            raise OSError(errno.EIO, "injected I/O error")
        monkeypatch.setattr(hpcckpt.saving.asynchronous, "list_versions", broken)
        monkeypatch.setattr(hpcckpt.levels.restore, "list_versions", broken)
    if comm.rank == comm.size - 1:  # latest() is not collective: the failing rank alone raises, naming itself
        with pytest.raises(CheckpointError, match=f"on rank {comm.size - 1}: OSError: .*injected"):
            ck.latest()
    else:
        assert ck.latest() == 1
    with pytest.raises(CheckpointError, match=f"rank {comm.size - 1}: OSError: .*injected"):  # restore: every rank
        ck.restore({"u": Block(np.zeros(N), (comm.rank * N,), (comm.size * N,))})
    monkeypatch.undo()
    assert ck.latest() == 1
    ck.close()


def test_hpcckpt_unlock_breaks_a_foreign_lock(tmp_path, capsys):
    from hpcckpt import cli

    foreign = {"format": "hpcckpt-lock", "version": 1, "hostname": "node-elsewhere", "pid": 1234,
               "slurm_job_id": "99", "slurm_restart_count": 0, "start": 0.0}
    (tmp_path / rootlock.LOCK_FILE).write_text(json.dumps(foreign))
    assert cli.main(["unlock", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "removed the writer lock" in out and "node-elsewhere" in out
    assert not os.path.exists(tmp_path / rootlock.LOCK_FILE)
    ck = Checkpointer(tmp_path, track_failures=False)
    ck.save({"a": Block(np.arange(N) * 1.0)}, 1)  # the root is free again
    ck.close()
    assert cli.main(["unlock", str(tmp_path)]) == 0 and "has no writer lock" in capsys.readouterr().out
