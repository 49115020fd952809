"""The SLURM workflow of slurm/ on four real nodes, with a node lost for real (conftest.py, slurmcluster.py).

apps/heat2d.py is submitted through slurm/hpcckpt.sbatch on 4 nodes (one
rank each; nothing but ``-N 4 -n 4``: the template's own ``#SBATCH --no-kill``
is what lets the allocation outlive a node), and then:

1. pre-empted (``scancel -b -s USR1``: it checkpoints and exits 0) and
   requeued (``scontrol requeue``): it resumes from its checkpoint on 4 nodes;
2. a node is lost mid-run (every process of its namespaces SIGKILLed, slurmd
   included): the step fails, slurmctld marks the node not responding, and
   slurm/restart-loop.sh reruns the step inside the allocation without that
   node, on 3 ranks (hpcckpt reshards the 4-rank checkpoint);
3. pre-empted again, and the remainder resubmitted with slurm/resubmit.sh on
   2 nodes, which finishes the run.

The final field and tracers must equal, bit for bit, those of one
uninterrupted 4-rank run.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "slurm"))
from test_slurm_workflow import APP, APP_ARGS, EVERY, RESUBMIT, SLEEP, STEPS, STOPPED, TEMPLATE, job_env, \
    read_final  # noqa: E402


class NodeJob:
    """A batch job of the node cluster's SLURM; client commands run on its head node."""

    def __init__(self, slurm, env, log):
        self.slurm, self.env, self.log, self.id = slurm, env, log, None

    def client(self, *cmd, check=True, timeout=60):
        proc = subprocess.run(self.slurm.where("client") + list(cmd), capture_output=True, text=True,
                              env=self.env, timeout=timeout)
        if check and proc.returncode != 0:
            pytest.fail(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
        return proc

    def field(self, name: str) -> str:
        m = re.search(rf"(?:^|\s){name}=(\S*)", self.client("scontrol", "show", "job", str(self.id)).stdout)
        return m.group(1) if m else ""

    def text(self) -> str:
        try:
            with open(self.log) as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def wait(self, what, pred, timeout):
        deadline = time.time() + timeout
        while time.time() < deadline:
            got = pred()
            if got:
                return got
            time.sleep(0.25)
        pytest.fail(f"job {self.id}: timed out after {timeout} s waiting for {what}; state "
                    f"{self.field('JobState')}\n--- job log:\n{self.text()}\n--- daemons:\n{self.slurm.logs()}")

    def wait_log(self, pattern, timeout=60, after=0):
        return self.wait(f"/{pattern}/ in its log", lambda: re.search(pattern, self.text()[after:], re.M), timeout)

    def wait_state(self, *states, timeout=60):
        return self.wait(f"state {states}", lambda: self.field("JobState") in states, timeout)


def stopped_at(text: str) -> int:
    m = re.search(STOPPED, text, re.M)
    assert m, text
    return int(m.group(2))


@pytest.mark.timeout(600)
def test_preempt_requeue_lose_a_node_resubmit_on_two_bitwise(cluster, slurm):
    t0 = time.time()
    n = cluster.names
    env = job_env(slurm)
    env.update(HPCCKPT_MAX_RESTARTS="2", HPCCKPT_RESTART_DELAY="12", HPCCKPT_MIN_TIME="10")
    work = cluster.test_dir
    timings = {}

    # -- the reference: one uninterrupted 4-rank run (plain mpiexec on the host) -----------------
    ref = os.path.join(work, "ref")
    from mpitools import mpiexec_path

    subprocess.run([mpiexec_path(), "-n", "4", sys.executable, APP, "--root", os.path.join(work, "ref-ckpt"), *APP_ARGS,
                    "--quiet", "--out", ref], env=env, check=True, capture_output=True, timeout=120)
    timings["reference"] = time.time() - t0

    # -- 1. 4 nodes, pre-empted after its first checkpoint, requeued -----------------------------
    root, out, log = os.path.join(work, "ckpt"), os.path.join(work, "final"), os.path.join(work, "job.log")
    job = NodeJob(slurm, env, log)
    sub = job.client("sbatch", "--parsable", "-N", "4", "-n", "4", "-o", log, "--chdir", work,
                     TEMPLATE, APP, "--root", root, *APP_ARGS, *SLEEP, "--out", out)
    job.id = int(sub.stdout.strip().split(";")[0])
    job.wait_log(rf"^\[heat2d\] step {EVERY}/{STEPS}: checkpoint saved", timeout=90)
    job.client("scancel", "-b", "-s", "USR1", str(job.id))
    job.wait_state("COMPLETED", "FAILED", "CANCELLED", timeout=60)
    text = job.text()
    assert job.field("ExitCode") == "0:0", text
    stop1 = stopped_at(text)
    assert "4 ranks on a 2 x 2 process grid" in text and f"start on {n[0]}" in text, text
    job.wait("the nodes to be idle", lambda: set(job.client("sinfo", "-h", "-N", "-o", "%t").stdout.split())
             == {"idle"}, 30)
    time.sleep(2)  # a rerun of the same job id within the second of its end gets a revoked credential
    mark = len(text)
    job.client("scontrol", "requeue", str(job.id))
    job.wait_state("PENDING", timeout=30)
    job.wait("StartTime=now to be accepted", lambda: job.client(
        "scontrol", "update", f"JobId={job.id}", "StartTime=now", check=False).returncode == 0, timeout=30)
    m = job.wait_log(r"^\[heat2d\] restored step (\d+) from ", timeout=90, after=mark)
    assert int(m.group(1)) == stop1
    timings["pre-empted and requeued"] = time.time() - t0

    # -- 2. a node lost mid-run: restart-loop reruns without it, on 3 ranks -------------------------
    nxt = (stop1 // EVERY + 1) * EVERY
    job.wait_log(rf"^\[heat2d\] step {nxt}/{STEPS}: checkpoint saved", timeout=60, after=mark)
    cluster.lose(n[3])
    job.wait_log(rf"restart-loop: .* excluding nodes that went down: {n[3]}$", timeout=90, after=mark)
    m = job.wait_log(r"^\[heat2d\] restored step (\d+) from .*saved by 4 ranks, restored on 3", timeout=90,
                     after=mark)
    assert int(m.group(1)) >= nxt
    assert re.search(rf"attempt 1: srun .*--exclude={n[3]}", job.text()[mark:]), job.text()[mark:]
    timings["node lost, rerun on 3"] = time.time() - t0

    # -- 3. pre-empted again; the remainder resubmitted on 2 nodes ---------------------------------
    mark2 = len(job.text())
    job.wait_log(r"^\[heat2d\] step \d+/\d+: checkpoint saved", timeout=60, after=mark2)
    job.client("scancel", "-b", "-s", "USR1", str(job.id))
    job.wait_state("COMPLETED", "FAILED", "CANCELLED", timeout=60)
    text = job.text()[mark:]
    assert job.field("ExitCode") == "0:0", text
    stop2 = stopped_at(job.text()[mark2:])
    assert stop2 < STEPS, text
    mark = len(job.text())
    res = job.client(RESUBMIT, "--job", str(job.id), "-N", "2", "-n", "2")
    assert f"newest checkpoint under {root}: step {stop2}" in res.stdout, res.stdout
    job2 = NodeJob(slurm, env, log)
    job2.id = int(re.search(r"Submitted batch job (\d+)", res.stdout).group(1))
    job2.wait_state("COMPLETED", "FAILED", "CANCELLED", timeout=120)
    text = job2.text()[mark:]
    assert job2.field("ExitCode") == "0:0", text
    assert re.search(rf"restored step {stop2} from .*saved by 3 ranks, restored on 2", text), text
    assert f"{n[3]}" not in job2.field("NodeList"), job2.field("NodeList")
    assert re.search(rf"finished {STEPS - stop2} steps", text), text
    timings["resubmitted on 2"] = time.time() - t0

    # -- the final state equals the uninterrupted run's, bit for bit ------------------------------
    import numpy as np

    u_ref, tr_ref = read_final(ref)
    u, tr = read_final(out)
    assert u.tobytes() == u_ref.tobytes() and u.shape == u_ref.shape
    order, order_ref = np.argsort(tr["id"], kind="stable"), np.argsort(tr_ref["id"], kind="stable")
    assert tr[order].tobytes() == tr_ref[order_ref].tobytes()
    print("\nSLURM on nodes, timings (cumulative s): " + ", ".join(f"{k} {v:.1f}" for k, v in timings.items()))
