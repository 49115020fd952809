"""A real single-node SLURM cluster on localhost for the tests in this directory (one per session).

The ``slurm_cluster`` fixture installs Debian's slurm-wlm and munge when they
are missing (apt-get; skips with the reason where that is impossible, fails where
apt-get fails: tests/support/aptget.py), starts
munged, slurmctld and slurmd by hand with a private configuration under a
temporary directory (see localslurm.py), and stops exactly those daemons, by PID,
at the end of the session, whatever happened in the tests.

These tests are not MPI tests: they launch their own MPI jobs.  Under the
mpiexec runs of dev.py (``--with-mpi``) this directory is not collected at all,
so that N ranks never start N clusters.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import localslurm as _cluster  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line("markers", "slurm: runs jobs on a private SLURM cluster on localhost (tests/slurm)")


def pytest_collection_modifyitems(items):
    here = os.path.dirname(os.path.abspath(__file__))
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.slurm)
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def slurm_cluster(request):
    if os.environ.get("HPCCKPT_SKIP_SLURM"):
        pytest.skip("HPCCKPT_SKIP_SLURM is set")
    _cluster.ensure_installed()
    # A short path: slurmd and munged put UNIX sockets under it (108-byte limit).
    workdir = tempfile.mkdtemp(prefix="hpcckpt-slurm-", dir="/tmp")
    c = _cluster.LocalSlurm(workdir)
    keep = bool(os.environ.get("HPCCKPT_KEEP_SLURM_DIR"))

    def finish():
        c.stop()
        left = c.alive()
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
        assert not left, f"daemons still running after stop: {left}"

    request.addfinalizer(finish)
    try:
        c.start()
    except RuntimeError as exc:
        pytest.fail(f"could not bring up the SLURM cluster: {exc}")
    return c
