"""SIGUSR1 to the mpiexec launcher (as SLURM's --signal=B:USR1 does to the batch step) ends the run cleanly."""

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from mpitools import ROOT, mpiexec_path, run_mpi

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "signal_loop.py")


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
