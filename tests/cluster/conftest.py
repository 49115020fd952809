"""A K-node namespace cluster (nodecluster.py) for the tests in this directory, one per session.

``node_cluster`` (session) brings the nodes up once; ``cluster`` (per test)
hands it over with every node alive -- a node a previous test lost is replaced
by a fresh one (empty tmpfs), as an operator would -- and a fresh directory of
the shared file system for the test.  The session's finalizer loses every node
(SIGKILL by namespace, by PID), deletes the bridge by name, and fails if
anything is left.  Skipped, with the reason, only where namespaces cannot be
made (not root, not Linux, unshare refused).

Not MPI tests: they launch their own MPI jobs across the nodes, so under the
``--with-mpi`` runs of dev.py this directory is not collected at all.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import nodecluster  # noqa: E402

#: Nodes of the test cluster.
K = 4


def pytest_collection_modifyitems(items):
    for item in items:
        if str(item.fspath).startswith(HERE):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def node_cluster(request):
    if os.environ.get("HPCCKPT_SKIP_CLUSTER"):
        pytest.skip("HPCCKPT_SKIP_CLUSTER is set")
    why = nodecluster.unavailable()
    if why:
        pytest.skip(f"no namespace cluster for the tests: {why}")
    nodecluster.sweep()
    c = nodecluster.NodeCluster(K, link_rate=os.environ.get("HPCCKPT_CLUSTER_LINK_RATE") or None)

    def finish():
        c.stop()
        left = c.leftovers()
        if not os.environ.get("HPCCKPT_KEEP_CLUSTER_DIR"):
            shutil.rmtree(c.dir, ignore_errors=True)
        assert not left, f"left after stop: {left}"

    request.addfinalizer(finish)
    try:
        c.start()
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        pytest.fail(f"could not bring up the namespace cluster: {exc}")
    print(f"\n[cluster] {K} nodes up in {c.up_seconds:.2f} s under {c.dir}")
    return c


@pytest.fixture
def cluster(node_cluster, request):
    """The session cluster with all K nodes alive, and ``cluster.test_dir`` fresh on the shared file system."""
    c = node_cluster
    all_compute_nodes_up(c)
    for name in c.names:  # node-local storage starts empty for every test
        c.run(name, "sh", "-c", f"rm -rf {c.local}/* {c.local}/.[!.]*", check=False)
    c.test_dir = os.path.join(c.shared, request.node.name)
    shutil.rmtree(c.test_dir, ignore_errors=True)
    os.makedirs(c.test_dir)
    yield c


def all_compute_nodes_up(c) -> None:
    """Replace the compute nodes an earlier test lost (fresh, empty tmpfs) and remove its spares."""
    for i, name in enumerate(c.names):
        if name not in c.holders:
            c.add_node(i)
    for name in list(c.holders):
        if name not in c.names and name not in c.service:
            c.lose(name)


class Job:
    """An MPI job across cluster nodes, in the background, its output in a file of the shared directory."""

    def __init__(self, cluster, hosts, script, *args, env=None, tag="job"):
        self.cluster = cluster
        self.out = os.path.join(cluster.test_dir, f"{tag}.out")
        from mpitools import mpiexec_path

        self.cmd = cluster.mpiexec_cmd(hosts, mpiexec_path(), [sys.executable, script, *map(str, args)])
        full_env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env or {}))
        full_env.pop("HPCCKPT_RANKS_PER_NODE", None)  # real nodes: MPI says which ranks share one
        with open(self.out, "w") as f:
            self.proc = subprocess.Popen(self.cmd, stdout=f, stderr=subprocess.STDOUT, env=full_env,
                                         stdin=subprocess.DEVNULL)
        self.t0 = time.monotonic()

    def text(self) -> str:
        with open(self.out, errors="replace") as f:
            return f.read()

    def wait_for(self, line: str, count: int, timeout: float = 90) -> None:
        """Until ``line`` appears ``count`` times in the output (fails if the job ends first or on timeout)."""
        deadline = time.monotonic() + timeout
        while self.text().count(line) < count:
            if self.proc.poll() is not None:
                pytest.fail(f"job ended (exit {self.proc.returncode}) before {count}x {line!r}:\n{self.text()}")
            if time.monotonic() > deadline:
                self.kill()
                pytest.fail(f"no {count}x {line!r} after {timeout} s:\n{self.text()}")
            time.sleep(0.1)

    def wait(self, timeout: float = 90) -> int:
        """The exit status; a job still running after ``timeout`` is a hang: killed, and the test fails."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"{' '.join(self.cmd)} hung for {timeout} s; output:\n{self.text()}")

    def finish(self, timeout: float = 90) -> str:
        """Wait, and fail the test unless the job succeeded; its output."""
        rc = self.wait(timeout)
        if rc != 0:
            pytest.fail(f"{' '.join(self.cmd)} exited {rc}:\n{self.text()}")
        return self.text()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def job(cluster):
    """``job(hosts, script, *args)`` starts a Job; every job of the test is killed at its end, whatever happened."""
    jobs = []

    def start(hosts, script, *args, **kw):
        jobs.append(Job(cluster, hosts, script, *args, tag=f"job{len(jobs)}", **kw))
        return jobs[-1]

    yield start
    for j in jobs:
        j.kill()
    for name in cluster.names:  # ranks and proxies that outlived their mpiexec (by namespace, then by name)
        if name in cluster.holders:
            for pid in cluster.processes(name):
                if is_job_process(pid):
                    try:
                        os.kill(pid, 9)
                    except ProcessLookupError:
                        pass


def is_job_process(pid: int) -> bool:
    """A process of an MPI job (a rank of this Python, a hydra proxy), not a daemon or a holder."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv0 = f.read().split(b"\0")[0].decode(errors="replace")
    except OSError:
        return False
    return argv0 == sys.executable or os.path.basename(argv0) in ("hydra_pmi_proxy", "mpiexec", "mpiexec.hydra")


@pytest.fixture(scope="session")
def slurm_nodes(node_cluster, request):
    """slurmctld on a head node, a slurmd on every compute node, munged (slurmcluster.py), once a session."""
    import slurmcluster

    slurmcluster.ensure_installed()
    all_compute_nodes_up(node_cluster)  # a slurmd for each
    s = slurmcluster.ClusterSlurm(node_cluster, os.path.join(node_cluster.dir, "slurm"))

    def finish():
        s.stop()
        assert not s.alive(), f"SLURM daemons still running after stop: {s.alive()}"

    request.addfinalizer(finish)
    t0 = time.monotonic()
    try:
        s.start()
    except RuntimeError as exc:
        pytest.fail(f"could not bring up SLURM on the nodes: {exc}")
    s.up_seconds = time.monotonic() - t0
    print(f"\n[cluster] SLURM up in {s.up_seconds:.2f} s on {node_cluster.names}")
    return s


@pytest.fixture
def slurm(slurm_nodes, cluster):
    """The SLURM of the nodes with a slurmd on every compute node (nodes a previous test lost are back)."""
    slurm_nodes.revive()
    yield slurm_nodes
    slurm_nodes.cancel_all()
