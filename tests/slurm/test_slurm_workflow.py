"""The SLURM workflow end to end, on a real slurmctld/slurmd (conftest.py brings them up).

apps/heat2d.py is submitted through slurm/hpcckpt.sbatch with 4 tasks, pre-empted
mid-run with ``scancel -b -s USR1`` (the trap forwards the signal to the step, the
app checkpoints and exits 0), requeued with ``scontrol requeue`` (it resumes, and
sees SLURM_RESTART_COUNT=1), stopped again, and the remainder is resubmitted on 3
tasks with slurm/resubmit.sh.  The final field must equal, bit for bit, that of an
uninterrupted 4-rank run under mpiexec.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
APP = os.path.join(ROOT, "apps", "heat2d.py")
TEMPLATE = os.path.join(ROOT, "slurm", "hpcckpt.sbatch")
RESUBMIT = os.path.join(ROOT, "slurm", "resubmit.sh")
LOOP = os.path.join(ROOT, "slurm", "restart-loop.sh")

STEPS, EVERY = 60, 10
#: heat2d's line when it stops on a signal: "[heat2d] SIGUSR1 received: stopped cleanly after step 13 ..."
#: or "[heat2d] stop requested (signal: ...): stopped cleanly after step 13 ..." (both wordings accepted).
STOPPED = r"^\[heat2d\] (.*)stopped cleanly after step (\d+) with a checkpoint"
#: heat2d arguments shared by the reference and the SLURM runs (small grid, slowed steps so that
#: the pre-emptions land mid-run on a 2-core machine).
APP_ARGS = ["--nx", "48", "--ny", "40", "--steps", str(STEPS), "--every", str(EVERY), "--tracers", "32"]
SLEEP = ["--sleep", "0.15"]


def job_env(cluster) -> dict:
    env = cluster.env()
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["HPCCKPT_PYTHON"] = sys.executable
    env["HPCCKPT_REQUEUE_ON_SIGNAL"] = "0"
    env.pop("HPCCKPT_SLURM_DIR", None)  # the template must find restart-loop.sh by itself
    return env


def run(cmd, env, timeout=60, check=True):
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    if check and proc.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


class Job:
    def __init__(self, cluster, env, log):
        self.cluster, self.env, self.log = cluster, env, log
        self.id = None

    def field(self, name: str, job=None) -> str:
        out = run(["scontrol", "show", "job", str(job or self.id)], self.env).stdout
        m = re.search(rf"(?:^|\s){name}=(\S*)", out)
        return m.group(1) if m else ""

    def text(self) -> str:
        try:
            with open(self.log) as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def wait(self, what: str, pred, timeout: float):
        deadline = time.time() + timeout
        while time.time() < deadline:
            got = pred()
            if got:
                return got
            time.sleep(0.25)
        pytest.fail(f"job {self.id}: timed out after {timeout} s waiting for {what}; state "
                    f"{self.field('JobState')}\n--- job log:\n{self.text()}\n--- daemons:\n{self.cluster.logs()}")

    def wait_log(self, pattern: str, timeout: float = 60, after: int = 0):
        return self.wait(f"/{pattern}/ in its log",
                         lambda: re.search(pattern, self.text()[after:], re.M), timeout)

    def wait_state(self, *states: str, timeout: float = 60):
        return self.wait(f"state {states}", lambda: self.field("JobState") in states, timeout)


def read_final(path):
    from hpcckpt import open as ck_open

    view = ck_open(path)
    return view.read("u"), view.read("tracers")


@pytest.mark.timeout(900)  # includes bringing the cluster up (and apt-get on a fresh machine)
def test_preempt_requeue_resubmit_bitwise(slurm_cluster, tmp_path):
    t0 = time.time()
    env = job_env(slurm_cluster)
    mpiexec = os.environ.get("HPCCKPT_TEST_MPIEXEC") or os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if not os.path.exists(mpiexec):
        pytest.skip("no mpiexec next to this Python for the reference run; run the suite through dev.py")

    # -- the reference: one uninterrupted 4-rank run under mpiexec ------------------------------
    ref = tmp_path / "ref"
    run([mpiexec, "-n", "4", sys.executable, APP, "--root", str(tmp_path / "ref-ckpt"), *APP_ARGS,
         "--quiet", "--out", str(ref)], env, timeout=120)
    timings = {"reference": time.time() - t0}

    # -- 1. first submission, 4 tasks; pre-empt it once it has written a periodic checkpoint -----
    root, out, log = tmp_path / "ckpt", tmp_path / "final", tmp_path / "job.log"
    job = Job(slurm_cluster, env, str(log))
    sub = run(["sbatch", "--parsable", "-n", "4", "-o", str(log), "--chdir", str(tmp_path), TEMPLATE, APP,
               "--root", str(root), *APP_ARGS, *SLEEP, "--out", str(out)], env)
    job.id = int(sub.stdout.strip().split(";")[0])
    job.wait_log(rf"^\[heat2d\] step {EVERY}/{STEPS}: checkpoint saved", timeout=90)
    run(["scancel", "-b", "-s", "USR1", str(job.id)], env)
    job.wait_state("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", timeout=60)
    text = job.text()
    assert job.field("JobState") == "COMPLETED" and job.field("ExitCode") == "0:0", text
    assert "hpcckpt.sbatch" in text and "got SIGUSR1: forwarding it to the job step" in text, text
    m = re.search(STOPPED, text, re.M)
    assert m and ("SIGUSR1" in m.group(1) or "signal" in m.group(1)), text
    stop1 = int(m.group(2))
    assert EVERY <= stop1 < STEPS, text
    assert "end: exit status 0" in text
    assert not out.exists()  # stopped before the end: no final field yet
    timings["first run"] = time.time() - t0

    # -- 2. requeue it: same job id, SLURM_RESTART_COUNT=1, resumes from the checkpoint ---------
    # slurmd revokes the job's credential when it ends, with a time stamp in whole seconds: a rerun
    # of the same job id allocated within that second is killed ("Job credential revoked"), which is
    # what SLURM's own requeue delay avoids.  So let the node go idle and the second pass first.
    job.wait("the node to be idle", lambda: run(["sinfo", "-h", "-o", "%t"], env).stdout.split() == ["idle"], 30)
    time.sleep(2)
    mark = len(text)
    run(["scontrol", "requeue", str(job.id)], env)
    job.wait_state("PENDING", timeout=30)
    job.wait("StartTime=now to be accepted",
             lambda: run(["scontrol", "update", f"JobId={job.id}", "StartTime=now"], env, check=False).returncode == 0,
             timeout=30)
    job.wait_log(r"SLURM_RESTART_COUNT=1: hpcckpt\.slurm: job=\d+ restart=1 ", timeout=60, after=mark)
    m = job.wait_log(r"^\[heat2d\] restored step (\d+) from ", timeout=90, after=mark)
    assert int(m.group(1)) == stop1
    assert job.field("Restarts") == "1"
    # let it write one more periodic checkpoint, then stop it again
    nxt = (stop1 // EVERY + 1) * EVERY
    job.wait_log(rf"^\[heat2d\] step {nxt}/{STEPS}: checkpoint saved", timeout=60, after=mark)
    run(["scancel", "-b", "-s", "USR1", str(job.id)], env)
    job.wait_state("COMPLETED", "FAILED", "CANCELLED", timeout=60)
    text = job.text()[mark:]
    m = re.search(STOPPED, text, re.M)
    assert m and ("SIGUSR1" in m.group(1) or "signal" in m.group(1)) and job.field("ExitCode") == "0:0", text
    stop2 = int(m.group(2))
    assert nxt <= stop2 < STEPS, text
    timings["requeued run"] = time.time() - t0

    # -- 3. resubmit the remainder on 3 tasks with the helper ----------------------------------
    mark = len(job.text())
    res = run([RESUBMIT, "--job", str(job.id), "-n", "3"], env)
    assert f"newest checkpoint under {root}: step {stop2}" in res.stdout, res.stdout
    new = re.search(r"Submitted batch job (\d+)", res.stdout)
    assert new, res.stdout
    job2 = Job(slurm_cluster, env, str(log))  # same log file, appended to
    job2.id = int(new.group(1))
    job2.wait_state("COMPLETED", "FAILED", "CANCELLED", timeout=120)
    text = job2.text()[mark:]
    assert job2.field("ExitCode") == "0:0", text
    assert re.search(rf"restored step {stop2} from .*saved by 4 ranks, restored on 3", text), text
    assert "3 ranks on a 3 x 1 process grid" in text and "tasks=3 per_node=3" in text, text
    assert re.search(rf"finished {STEPS - stop2} steps", text), text
    timings["resubmitted run"] = time.time() - t0

    # -- the final state equals the uninterrupted run's, bit for bit --------------------------
    u_ref, tr_ref = read_final(ref)
    u, tr = read_final(out)
    assert u.dtype == u_ref.dtype and u.shape == u_ref.shape == (40, 48)
    assert u.tobytes() == u_ref.tobytes()
    order, order_ref = np.argsort(tr["id"], kind="stable"), np.argsort(tr_ref["id"], kind="stable")
    assert tr[order].tobytes() == tr_ref[order_ref].tobytes()
    print("\nSLURM workflow timings (cumulative s): "
          + ", ".join(f"{k} {v:.1f}" for k, v in timings.items()))


def test_restart_loop_reruns_a_failed_step(slurm_cluster, tmp_path):
    """restart-loop.sh inside one allocation: a rank crashes (SIGKILL), the loop reruns the step,
    the rerun restores the newest checkpoint and finishes."""
    env = job_env(slurm_cluster)
    env.update(HPCCKPT_MAX_RESTARTS="2", HPCCKPT_RESTART_DELAY="1", HPCCKPT_MIN_TIME="10")
    log = tmp_path / "loop.log"
    job = Job(slurm_cluster, env, str(log))
    # heat2d's --kill-rank/--kill-step crash again on the rerun (they are in the arguments), unless
    # the rerun starts after the kill step: it does, because the crash comes after that step's checkpoint.
    sub = run(["sbatch", "--parsable", "-n", "2", "-t", "10", "-o", str(log), "--chdir", str(tmp_path), TEMPLATE,
               APP, "--root", str(tmp_path / "ckpt"), "--nx", "32", "--ny", "32", "--steps", "30", "--every", "10",
               "--quiet", "--kill-rank", "1", "--kill-step", "20"], env)
    job.id = int(sub.stdout.strip().split(";")[0])
    job.wait_state("COMPLETED", "FAILED", "CANCELLED", timeout=120)
    text = job.text()
    assert job.field("ExitCode") == "0:0", text
    assert re.search(r"restart-loop: .* attempt 0 ended with exit status [1-9]", text), text
    assert "restart-loop: " in text and re.search(r"attempt 1: srun", text), text
    assert "restored step 20 from" in text, text
    assert re.search(r"end_in=\d+s", text), text  # SLURM_JOB_END_TIME known (set or derived from squeue)
