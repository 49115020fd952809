"""The writer lock against what may lie at ``ROOT/.hpcckpt-lock``: things hpcckpt cannot have written there, and a
holder that is still running.

Every such lock is one clear CheckpointError for a save; ``hpcckpt unlock`` and ``break_lock=True`` remove it
(never a directory that holds something); a holder running on this host is refused, named, unless forced.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpcckpt import Block, CheckpointError, Checkpointer, cli
from hpcckpt.root import lock as rootlock
from mpitools import ROOT as REPO

N = 64
_LOCK = {"format": "hpcckpt-lock", "version": 1, "hostname": socket.gethostname(), "pid": 4242,
         "slurm_job_id": None, "slurm_restart_count": None, "start": 0.0}


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def _plant(path, kind: str) -> None:
    """Put at ``path`` a lock of the hostile ``kind``."""
    if kind == "over 64 KiB":
        path.write_text(json.dumps(dict(_LOCK, pad="x" * (1 << 16))))
    elif kind == "FIFO":
        os.mkfifo(path)
    elif kind == "symlink to /dev/zero":
        os.symlink("/dev/zero", path)
    elif kind == "deeply nested JSON":
        path.write_text(_nested(30000))  # within 64 KiB, deeper than any parser recursion limit
    elif kind == "deeply nested hostname":
        path.write_text(json.dumps(dict(_LOCK, hostname="DEEP")).replace('"DEEP"', _nested(20000)))
    elif kind == "empty directory":
        os.mkdir(path)
    elif kind == "pid 2**80 on this host":
        path.write_text(json.dumps(dict(_LOCK, pid=2 ** 80)))
    elif kind == "pid 2**80 on another host":
        path.write_text(json.dumps(dict(_LOCK, pid=2 ** 80, hostname="node-elsewhere")))
    else:
        raise ValueError(kind)


#: Each hostile lock and a distinctive part of what a save says about it.
HOSTILE = {
    "over 64 KiB": r"is a file of \d+ bytes, longer than any lock",
    "FIFO": "is a FIFO, not a lock any job holds",
    "symlink to /dev/zero": "is a symbolic link \\(to '/dev/zero'\\)",
    "deeply nested JSON": "nested too deeply to be a lock",
    "deeply nested hostname": "nested too deeply to be a lock",
    "empty directory": "is an empty directory, not a lock any job holds",
    "pid 2**80 on this host": f"naming pid {2 ** 80}, which no process can have",
    "pid 2**80 on another host": f"naming pid {2 ** 80}, which no process can have",
}


def _save(root, **kw) -> Checkpointer:
    ck = Checkpointer(root, track_failures=False, **kw)
    ck.save({"a": Block(np.arange(N) * 1.0)}, 1)
    return ck


def _is_ours(lock_path) -> bool:
    return not os.path.islink(lock_path) and json.loads(lock_path.read_text())["pid"] == os.getpid()


@pytest.mark.timeout(30)  # a FIFO must never block a reader
@pytest.mark.parametrize("kind", list(HOSTILE))
def test_a_hostile_lock_fails_a_save_with_one_clear_error(tmp_path, kind):
    _plant(tmp_path / rootlock.LOCK_FILE, kind)
    with pytest.raises(CheckpointError, match=HOSTILE[kind]) as err:
        _save(tmp_path)
    assert "hpcckpt unlock ROOT" in str(err.value) and "break_lock=True" in str(err.value)
    assert os.path.lexists(tmp_path / rootlock.LOCK_FILE)  # refused, not taken over


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", list(HOSTILE))
def test_hpcckpt_unlock_removes_a_hostile_lock(tmp_path, capsys, kind):
    lock = tmp_path / rootlock.LOCK_FILE
    _plant(lock, kind)
    assert cli.main(["unlock", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"removed the writer lock of {tmp_path} (held by no job: it is " in out
    assert not os.path.lexists(lock) and os.listdir(tmp_path) == []  # nothing left aside either
    assert os.path.exists("/dev/zero")  # a link is removed, never its target
    _save(tmp_path).close()  # the root is free again


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", list(HOSTILE))
def test_break_lock_takes_over_a_hostile_lock(tmp_path, kind):
    lock = tmp_path / rootlock.LOCK_FILE
    _plant(lock, kind)
    with pytest.warns(RuntimeWarning, match="break_lock=True was given"):
        ck = _save(tmp_path, break_lock=True)
    assert _is_ours(lock) and ck.steps() == [1]
    ck.close()
    assert not os.path.lexists(lock)


def test_a_directory_that_holds_something_is_never_removed(tmp_path, capsys):
    lock = tmp_path / rootlock.LOCK_FILE
    lock.mkdir()
    (lock / "notes.txt").write_text("someone's data")
    assert cli.main(["unlock", "--force", str(tmp_path)]) == 1
    assert "is a directory that is not empty, not a lock hpcckpt wrote" in capsys.readouterr().err
    for kw in ({}, {"break_lock": True}):
        with pytest.raises(CheckpointError, match="is a directory that is not empty, not a lock any job holds. "
                                                  "hpcckpt never makes a directory there: look at what it holds"):
            _save(tmp_path, **kw)
    assert (lock / "notes.txt").read_text() == "someone's data" and os.listdir(tmp_path) == [rootlock.LOCK_FILE]


# ------------------------------------------------------------ a holder that is still running
@pytest.fixture
def live_holder(tmp_path):
    """A process of this host holding the writer lock of ``tmp_path`` (and its flock) until its stdin closes."""
    code = ("import sys; from hpcckpt import rootlock; lock = rootlock.acquire(sys.argv[1]); print('held', flush=True);"
            " sys.stdin.read(); rootlock.release(lock)")
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout.readline() == "held\n"
        yield proc
    finally:
        proc.stdin.close()
        proc.wait(30)


@pytest.mark.timeout(60)
def test_hpcckpt_unlock_refuses_a_running_holder_unless_forced(tmp_path, capsys, live_holder):
    lock = tmp_path / rootlock.LOCK_FILE
    assert cli.main(["unlock", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert f"pid {live_holder.pid} on host {socket.gethostname()}" in err and "is running on this host" in err
    assert "--force" in err and json.loads(lock.read_text())["pid"] == live_holder.pid  # left alone
    with pytest.raises(CheckpointError, match=f"pid {live_holder.pid} on host .*is running on this host"):
        rootlock.break_lock(tmp_path)
    for kw in ({}, {"break_lock": True}):
        with pytest.raises(CheckpointError, match=f"pid {live_holder.pid} .*running on this host, so neither "
                                                  "break_lock=True nor `hpcckpt unlock` takes its lock"):
            _save(tmp_path, **kw)
    assert json.loads(lock.read_text())["pid"] == live_holder.pid

    assert cli.main(["unlock", "--force", str(tmp_path)]) == 0
    assert f"removed the writer lock of {tmp_path} (held by pid {live_holder.pid} on host" in capsys.readouterr().out
    assert not os.path.lexists(lock)
    ck = _save(tmp_path)
    live_holder.stdin.close()  # the old holder releases: it must leave the new lock alone
    live_holder.wait(30)
    assert _is_ours(lock)
    ck.close()


# ------------------------------------------------------------ pure: the checked body
_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                max_size=3),
                     max_leaves=12)
_fields = st.fixed_dictionaries({"format": st.just("hpcckpt-lock")}, optional={
    "hostname": st.one_of(st.sampled_from(["here", "there", "", "a\nb", "h" * 300]), _json),
    "pid": st.one_of(st.integers(), st.sampled_from([2 ** 80, -(2 ** 80), 2 ** 31 - 1, 2 ** 31]), _json),
    "slurm_job_id": _json, "slurm_restart_count": st.one_of(st.integers(), _json), "start": _json,
    "version": _json, "expires": st.one_of(st.floats(), _json), "lease_seconds": st.one_of(st.floats(), _json)})


@given(st.one_of(_fields, _json), st.booleans(), st.booleans())
def test_only_a_checked_holder_reaches_the_liveness_checks(doc, alive, flock_free):
    holder, problem = rootlock.check_holder(doc)
    assert (holder == {}) == (problem is not None)
    if problem is not None:
        return
    assert 0 < holder["pid"] < 2 ** 31 and holder["hostname"].isprintable() and len(holder["hostname"]) <= 255
    assert holder["start"] is None or type(holder["start"]) in (int, float)
    for key in ("expires", "lease_seconds"):  # a lease's times: finite numbers, or none
        assert holder[key] is None or type(holder[key]) in (int, float) and abs(holder[key]) < float("inf")
    assert "\n" not in rootlock.describe(holder)
    asked = []
    me = {"hostname": "here", "pid": 5, "slurm_job_id": None, "slurm_restart_count": None}
    live = rootlock.alive_here(holder, me, lambda pid: asked.append(pid) or alive, flock_free)
    assert all(0 < pid < 2 ** 31 for pid in asked)  # os.kill can take every pid it is asked about
    assert live == (holder["hostname"] == "here" and holder["pid"] != 5 and alive and not flock_free)

