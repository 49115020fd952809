"""SIGKILL one rank at random moments of a loop of saves, then restart (maybe on another rank count).

Two ways to kill: the victim rank kills itself just before its k-th file-system
call (a seeded schedule: inside a data write, before an fsync, before the
metadata rename, during retention), or the test kills a random rank's pid after
a random delay.  Afterwards: mpiexec has terminated (MPICH's hydra aborts the
job), the newest committed version is one whose save finished or was being
committed, its data are exactly that step's, the partial version is invisible,
and the next save cleans the leftovers.
"""

from __future__ import annotations

import importlib.util
import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import hpcckpt
from hpcckpt.root.catalog import current, list_versions
from mpitools import ROOT, mpiexec_path, run_mpi
from testpaths import TESTS

HERE = TESTS
SCRIPT = os.path.join(HERE, "scripts", "crash_saves.py")
BASE = int(os.environ.get("HPCCKPT_TEST_SEED", "0"))

pytestmark = pytest.mark.timeout(300)


def global_data(step):
    return np.arange(64 * 96, dtype=np.float64).reshape(64, 96) * 1.5 + step * 1e6


def presave(root: str, nsteps: int) -> None:
    spec = importlib.util.spec_from_file_location("crash_saves", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    comm = hpcckpt.mpi.collective.SerialComm()
    ck = hpcckpt.Checkpointer(root, comm=comm, keep=2, chunk_bytes=8192)
    for k in range(nsteps):
        ck.save(mod.state_for(comm, k), step=k)


def saved_steps(stdout: str) -> list[int]:
    return [int(line.split()[1]) for line in stdout.splitlines() if line.startswith("SAVED ")]


def check_after_crash(root: str, last_saved: int | None) -> int | None:
    """The committed versions are sound; the newest is the last finished save or the one being committed."""
    entries = list_versions(root)
    live = current(entries)
    latest = live[-1].step if live else None
    allowed = {None, 0} if last_saved is None else {last_saved, last_saved + 1}
    assert latest in allowed, (latest, last_saved, entries)
    if latest is not None:
        with hpcckpt.open(live[-1].path) as view:
            assert view.verify() == []
            assert view.values["step"] == latest
            assert np.array_equal(view.read("u"), global_data(latest))
    ck = hpcckpt.Checkpointer(root, comm=hpcckpt.mpi.collective.SerialComm())
    assert ck.latest() == latest  # partial versions never count
    return latest


def restart(root: str, nranks: int, latest: int | None) -> None:
    proc = run_mpi(nranks, SCRIPT, root, "restore", 1, timeout=120)
    assert f"RESTORED {latest}" in proc.stdout, proc.stdout
    new = 0 if latest is None else latest + 1
    assert saved_steps(proc.stdout) == [new]
    entries = list_versions(root)
    assert all(e.committed for e in entries), entries  # the save cleaned every leftover
    assert current(entries)[-1].step == new


def _run_until_killed(cmd, env, timeout):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"mpiexec did not terminate after a SIGKILL within {timeout} s: {exc.stdout!r} {exc.stderr!r}")


def _killed_run(root: str, nranks: int, nsteps: int, victim: int, kill_at: int, env, timeout: int):
    """crash_saves.py under mpiexec, its rank ``victim`` killing itself at its ``kill_at``-th file-system call;
    once that kill has fired (the victim's marker is there and mpiexec failed): the mpiexec result, the steps
    saved, the victim and its call.  A run that ends first is run again, continuing from what it committed: a
    schedule beyond its last call is drawn again within the calls it made, and a victim that made none (its
    writes all go through MPI-IO) is replaced by rank 0, which writes the metadata."""
    marks = os.path.join(os.path.dirname(os.path.abspath(root)), "pids")
    outputs = ""
    for _ in range(3):
        cmd = [mpiexec_path(), "-n", nranks, sys.executable, SCRIPT, root, "save", nsteps, victim, kill_at]
        proc = _run_until_killed(list(map(str, cmd)), env, timeout)
        outputs += proc.stdout
        if os.path.exists(os.path.join(marks, "killed")):
            assert proc.returncode != 0, (proc.returncode, proc.stdout, proc.stderr)
            return proc, saved_steps(outputs), victim, kill_at
        unkilled = os.path.join(marks, "unkilled")
        assert proc.returncode == 0 and os.path.exists(unkilled), (proc.returncode, proc.stdout, proc.stderr)
        with open(unkilled) as f:
            made = int(f.read())
        os.unlink(unkilled)
        victim, kill_at = (victim, 1 + (kill_at - 1) % made) if made else (0, kill_at)
    pytest.fail(f"rank {victim} was never killed: {outputs}")


#: Every strategy must survive a SIGKILL; the seeds rotate through them (2 ranks per simulated node).
STRATEGIES = ("file-per-rank", "aggregated", "shared-file")


def _env(seed: int = 0):
    return dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
                HPCCKPT_TEST_STRATEGY=STRATEGIES[seed % len(STRATEGIES)], HPCCKPT_RANKS_PER_NODE="2")


@pytest.mark.parametrize("seed", [BASE + k for k in range(5)])
def test_kill_at_seeded_io_call(tmp_path, seed):
    rng = random.Random(seed)
    nranks = rng.choice([2, 3])
    victim = rng.randrange(nranks)
    kill_at = rng.randint(1, 60)
    root = str(tmp_path / "root")
    # two versions saved before (here, by one plain process), so that there is something to protect
    presave(root, 2)
    proc, saved, victim, kill_at = _killed_run(root, nranks, 6, victim, kill_at, _env(seed), timeout=90)
    last = saved[-1] if saved else 1
    latest = check_after_crash(root, last)
    print(f"{STRATEGIES[seed % 3]}: {nranks} ranks, rank {victim} killed at call {kill_at}: exit {proc.returncode}, saved {saved}, "
          f"latest {latest}, partial {[e.name for e in list_versions(root) if not e.committed]}")
    assert latest >= 1  # the versions committed before the crashed run are still there
    restart(root, rng.choice([1, 2, 3, 4]), latest)


@pytest.mark.parametrize("seed", [BASE + k for k in range(2)])
def test_kill_random_rank_after_random_delay(tmp_path, seed):
    rng = random.Random(1000 + seed)
    nranks = rng.choice([2, 3])
    root = str(tmp_path / "root")
    pid_dir = tmp_path / "pids"
    cmd = [mpiexec_path(), "-n", str(nranks), sys.executable, SCRIPT, root, "save", 100000]  # killed long before the end
    proc = subprocess.Popen(list(map(str, cmd)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(seed + 1), cwd=ROOT)
    try:
        deadline = time.time() + 60
        while time.time() < deadline and not (pid_dir.exists() and len(os.listdir(pid_dir)) == nranks):
            time.sleep(0.05)
        assert len(os.listdir(pid_dir)) == nranks, "the ranks never started"
        time.sleep(rng.uniform(1.0, 3.0))  # startup plus a few saves
        victim = rng.randrange(nranks)
        os.kill(int((pid_dir / str(victim)).read_text()), signal.SIGKILL)
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"mpiexec did not terminate after SIGKILL of a rank: {out!r} {err!r}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode != 0, "the job ended before the kill"
    saved = saved_steps(out)
    latest = check_after_crash(root, saved[-1] if saved else None)
    print(f"{nranks} ranks, rank {victim} killed: saved {saved[-3:]}, latest {latest}, "
          f"partial {[e.name for e in list_versions(root) if not e.committed]}")
    restart(root, rng.choice([1, 2, 3, 4]), latest)


#: Asynchronous incremental saves onto node-local levels (partner copies, flushes).
COMBINED = {"asynchronous": True, "incremental": True, "block_bytes": 4096, "local_dir": True}


def _committed_everywhere(tmp_path) -> dict[str, list[int]]:
    """Every committed version on the root and on each node directory checked exact for its step: every chunk's
    checksum, and its data read back equal to what that step saved (a node directory may hold only its own
    ranks' files: there, every chunk it holds, at least one); the steps found in each."""
    where = {"root": str(tmp_path / "root")}
    local = tmp_path / "local"
    if local.exists():
        where.update({d: str(local / d) for d in sorted(os.listdir(local))})
    found = {}
    for label, directory in where.items():
        found[label] = []
        for e in current(list_versions(directory)):
            with hpcckpt.open(e.path) as view:
                problems = view.verify()
                if label == "root":
                    assert problems == [], (e.path, problems)
                    assert np.array_equal(view.read("u"), global_data(e.step)), e.path
                else:
                    assert all(p.endswith(" is missing") for p in problems), (e.path, problems)
                    assert _held_chunks_exact(view, global_data(e.step)) > 0, e.path
                assert view.values["step"] == e.step
            found[label].append(e.step)
    return found


def _held_chunks_exact(view, data) -> int:
    """How many chunks of ``u`` the version holds, each asserted equal to ``data`` in its box."""
    chunks, held = view.variables["u"].chunks, 0
    for start, count in zip(chunks.start, chunks.count):
        box = tuple((int(a), int(a + n)) for a, n in zip(start, count))
        try:
            got = view.read("u", box)
        except hpcckpt.CorruptCheckpointError as exc:
            assert str(exc).endswith(" is missing"), exc
            continue
        assert np.array_equal(got, data[tuple(slice(a, b) for a, b in box)]), (view.path, box)
        held += 1
    return held


@pytest.mark.parametrize("seed", [BASE + k for k in range(4)])
def test_kill_asynchronous_incremental_multilevel_saves(tmp_path, seed):
    """SIGKILL during asynchronous incremental saves on node-local levels; every level stays exact after it."""
    import json

    rng = random.Random(2000 + seed)
    nranks = rng.choice([2, 4])
    victim = rng.randrange(nranks)
    kill_at = rng.randint(5, 80)
    root = str(tmp_path / "root")
    env = dict(_env(0), HPCCKPT_TEST_OPTIONS=json.dumps(COMBINED))
    proc, saved, victim, kill_at = _killed_run(root, nranks, 8, victim, kill_at, env, timeout=120)
    found = _committed_everywhere(tmp_path)
    newest = max((s for steps in found.values() for s in steps), default=None)
    if len(saved) > 1:  # a later save returned: the one before it was committed (each save commits the previous)
        assert newest is not None and newest >= saved[-1] - 1, (saved, found)
    print(f"{nranks} ranks, rank {victim} killed at call {kill_at}: exit {proc.returncode}, saved {saved}, "
          f"committed {found}")
    for restart_ranks in (nranks, rng.choice([1, 3])):
        proc = run_mpi(restart_ranks, SCRIPT, root, "restore", 1, timeout=120, env={
            "HPCCKPT_TEST_OPTIONS": json.dumps(COMBINED), "HPCCKPT_RANKS_PER_NODE": "2"})
        restored = proc.stdout.split("RESTORED ")[1].split()[0]
        restored = None if restored == "None" else int(restored)
        if restart_ranks == nranks:  # the same rank count restores the newest version from the node-local levels
            assert restored == newest, (restored, found)
        else:  # another count reads what its ranks find: never older than the newest version on the root
            assert restored is not None and max(found["root"], default=-1) <= restored <= newest, (restored, found)
        found = _committed_everywhere(tmp_path)
        newest = max(s for steps in found.values() for s in steps)


#: Combinations that compose since the save run became one: tracked output files with asynchronous saves, and
#: with blocking saves onto node-local levels with partner copies.
TRACKED = [{"asynchronous": True, "incremental": True, "files": True},
           {"incremental": True, "local_dir": True, "partner_every": 1, "files": True}]


@pytest.mark.parametrize("options", TRACKED, ids=["asynchronous", "node-local"])
@pytest.mark.parametrize("seed", [BASE + k for k in range(2)])
def test_kill_saves_that_track_files(tmp_path, options, seed):
    """SIGKILL at a random file-system call of a random rank; the restart restores the newest committed version
    and the script checks that its data and both tracked files (append-only and in place) are as they were at
    that save, then saves again."""
    import json

    rng = random.Random(3000 + seed)
    nranks = rng.choice([2, 3])
    victim, kill_at = rng.randrange(nranks), rng.randint(5, 60)
    root = str(tmp_path / "root")
    env = dict(_env(0), HPCCKPT_TEST_OPTIONS=json.dumps(options))
    proc, saved, victim, kill_at = _killed_run(root, nranks, 6, victim, kill_at, env, timeout=120)
    print(f"{nranks} ranks, rank {victim} killed at call {kill_at}: exit {proc.returncode}, saved {saved}")
    proc = run_mpi(nranks, SCRIPT, root, "restore", 1, timeout=120,
                   env={"HPCCKPT_TEST_OPTIONS": json.dumps(options)})
    restored = proc.stdout.split("RESTORED ")[1].split()[0]
    if len(saved) > 1:  # a later save returned: the one before it was committed
        assert restored != "None" and int(restored) >= saved[-1] - 1, (restored, saved)
    assert "SAVED" in proc.stdout.split("RESTORED ")[1], proc.stdout
