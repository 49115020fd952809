"""SIGUSR1 to the mpiexec launcher (as SLURM's --signal=B:USR1 does to the batch step) ends the run cleanly."""

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from mpitools import ROOT, mpiexec_path, run_mpi
from testpaths import TESTS

SCRIPT = os.path.join(TESTS, "scripts", "signal_loop.py")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("signum", [signal.SIGUSR1, signal.SIGTERM])
def test_signal_to_launcher_checkpoints_exits_and_resumes(tmp_path, signum):
    root = tmp_path / "ck"
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.Popen([mpiexec_path(), "-n", "2", sys.executable, SCRIPT, str(root), "100000"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(1.0)
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    stopped = re.findall(r"rank (\d) stopped cleanly at step (\d+)", out)  # ranks' lines may interleave
    assert sorted(rank for rank, _ in stopped) == ["0", "1"], out
    assert len({step for _, step in stopped}) == 1, out  # every rank stopped at the same step
    step = int(stopped[0][1])
    assert os.path.isdir(root / f"step-{step:012d}")
    # Restart on 3 ranks and finish: the work done equals an uninterrupted run's.
    finish = step + 20
    done = run_mpi(3, SCRIPT, root, finish, timeout=120)
    assert f"final step {finish} total {finish * 12}" in done.stdout, done.stdout
    assert f"resumed at step {step}" in done.stdout


# --------------------------------------------------------------------------- SIGINT, replaced handlers, halt file
# tests/scripts/signal_app.py saves at every step (about half of a step's time is spent in saves), so a signal at a
# random instant often arrives inside a save's collectives.
APP = os.path.join(TESTS, "scripts", "signal_app.py")
CELLS = 400_000
BOUND = 60  # seconds: every rank must have exited this long after the signal


def _launch(root, nsteps=10**6, *extra):
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.Popen([mpiexec_path(), "-n", "2", sys.executable, APP, str(root), str(nsteps),
                             "--cells", str(CELLS), *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, cwd=ROOT, start_new_session=True)
    line = proc.stdout.readline().split()
    if not line or line[0] != "ready":
        proc.kill()
        pytest.fail(f"no 'ready' line: {line} {proc.communicate()}")
    return proc, [int(p) for p in line[1:]]


def _finish(proc):
    """Wait (bounded) for the launcher to end; a hang fails the test, and nothing is left running."""
    try:
        out, err = proc.communicate(timeout=BOUND)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"the job hung for {BOUND} s after the signal\nstdout:\n{out}\nstderr:\n{err}")
    return proc.returncode, out, err


def _stopped(out):
    """{rank: (step, reason)} of the 'stopped cleanly' lines; the ranks' lines may interleave."""
    return {int(r): (int(s), why) for r, s, why in re.findall(r"rank (\d) stopped cleanly at step (\d+) \((.*?)\); application", out)}


def _check_versions(root):
    """Only committed versions under the root, each holding exactly its step's field; their steps."""
    import numpy as np

    import hpcckpt
    from hpcckpt.root.catalog import list_versions

    entries = list_versions(str(root))
    assert entries and all(e.committed for e in entries), [(e.name, e.committed) for e in entries]
    for e in entries:
        assert np.array_equal(hpcckpt.open(e.path).read("u"), np.full(CELLS, e.step)), e.name
    return [e.step for e in entries]


@pytest.mark.timeout(900)
def test_sigint_to_launcher_or_to_one_rank_at_many_instants_checkpoints_and_exits(tmp_path):
    """Ctrl-C of mpiexec (forwarded to every rank) and SIGINT to one rank, 12 seeded instants: never a hang."""
    import random

    rng = random.Random(13)
    root = tmp_path / "ck"
    previous = 0
    for trial in range(12):
        proc, pids = _launch(root)
        time.sleep(rng.uniform(0.2, 2.0))
        target = proc.pid if trial % 3 != 2 else pids[trial % 2]  # every third trial: one rank only
        os.kill(target, signal.SIGINT)
        rc, out, err = _finish(proc)
        assert rc == 0, (trial, out, err)
        stopped = _stopped(out)
        assert sorted(stopped) == [0, 1], (trial, out, err)
        (step, why), = set(stopped.values())  # every rank stopped at the same step, for the same reason
        assert why == "SIGINT" and step > previous, (trial, stopped)
        assert max(_check_versions(root)) == step
        previous = step
    done = run_mpi(3, APP, root, previous + 5, "--cells", CELLS, timeout=120)  # resumes on another rank count
    assert f"final step {previous + 5} min {previous + 5}" in done.stdout, done.stdout


@pytest.mark.timeout(180)
def test_sigterm_after_the_application_replaced_the_handler_checkpoints_exits_and_calls_it(tmp_path):
    root = tmp_path / "ck"
    proc, _ = _launch(root, 10**6, "--app-handler", "record")
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    rc, out, err = _finish(proc)
    assert rc == 0, (out, err)
    assert err.count("SIGTERM handler of hpcckpt was replaced by") == 2, err  # one warning per rank
    stopped = _stopped(out)
    assert sorted(stopped) == [0, 1] and len(set(stopped.values())) == 1, out
    (step, why), = set(stopped.values())
    assert why == "SIGTERM" and out.count("application handler calls 1") == 2, out  # chained: it ran too
    assert max(_check_versions(root)) == step


@pytest.mark.timeout(180)
def test_an_application_handler_that_exits_does_so_after_the_final_checkpoint_on_every_rank(tmp_path):
    """Veros' signals_to_exception raises SystemExit from its handler: held until the final checkpoint."""
    root = tmp_path / "ck"
    proc, _ = _launch(root, 10**6, "--app-handler", "exit")
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    rc, out, err = _finish(proc)
    left = re.findall(r"rank (\d) left by SystemExit after step (\d+), checkpoint (\S+):", out)
    assert sorted(r for r, _, _ in left) == ["0", "1"], (out, err)
    assert len({(s, path) for _, s, path in left}) == 1, out  # the same step and checkpoint on every rank
    step, path = int(left[0][1]), left[0][2]
    assert path.endswith(f"step-{step:012d}") and max(_check_versions(root)) == step
    assert rc != 0  # the application asked to exit with an error: its choice, kept


@pytest.mark.timeout(180)
def test_halt_file_stops_every_rank_and_the_next_run_continues(tmp_path):
    root = tmp_path / "ck"
    proc, _ = _launch(root, 10**6, "--every", "1000")
    time.sleep(1.0)
    env = dict(os.environ, PYTHONPATH=ROOT)
    cli = subprocess.run([sys.executable, "-m", "hpcckpt", "halt", str(root), "--reason", "quota check"],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    assert cli.returncode == 0 and ".hpcckpt-halt" in cli.stdout, cli
    rc, out, err = _finish(proc)
    assert rc == 0, (out, err)
    stopped = _stopped(out)
    assert sorted(stopped) == [0, 1] and len(set(stopped.values())) == 1, out
    (step, why), = set(stopped.values())
    assert why == f"halt file {root / '.hpcckpt-halt'} (quota check)", why
    assert _check_versions(root) == [step]
    assert not os.path.exists(root / ".hpcckpt-halt")  # honoured and removed: the next run continues
    done = run_mpi(2, APP, root, step + 5, "--cells", CELLS, "--every", "1000", timeout=120)
    assert f"final step {step + 5} min {step + 5}" in done.stdout, done.stdout
