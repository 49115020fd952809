"""Shared fixtures: a temporary directory that all MPI ranks agree on (launching mpiexec: mpitools.py)."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

import pytest

# the helpers every test imports by name (mpitools, decompositions, ...): tests/support/
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))

from expected_skips import pytest_addoption, pytest_configure  # noqa: E402,F401  (the --only-expected-skips plugin)
from mpitools import force_dedup_exchange  # noqa: E402


@pytest.fixture
def mpi_tmp():
    """A fresh directory, the same on every rank (rank 0 creates it and broadcasts the name)."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    path = tempfile.mkdtemp(prefix="hpcckpt-") if comm.rank == 0 else None
    path = comm.bcast(path, root=0)
    yield path
    comm.Barrier()
    if comm.rank == 0:
        shutil.rmtree(path, ignore_errors=True)


#: Directories whose tests start their own daemons, nodes and mpiexec jobs: never collected under mpiexec.
SERIAL_ONLY = tuple(os.path.join(os.path.dirname(os.path.abspath(__file__)), d) for d in ("slurm", "cluster"))
#: Files that share one session's daemons (tests/storage/conftest.py: one Ceph gateway), by the start of their
#: path: one worker of a parallel run takes them all.
SHARED_DAEMONS = ("tests/storage/test_storage_s3",)


def _serial_only(path) -> bool:
    return any(str(path) == d or str(path).startswith(d + os.sep) for d in SERIAL_ONLY)


def pytest_ignore_collect(collection_path, config):
    """Skip tests/slurm and tests/cluster under mpiexec (dev.py runs ``pytest --with-mpi -m mpi`` on every rank)."""
    try:
        with_mpi = config.getoption("with_mpi")
    except ValueError:
        with_mpi = False
    return True if with_mpi and _serial_only(collection_path) else None


@pytest.hookimpl(trylast=True)  # after pytest-mpi's own
def pytest_collection_modifyitems(items):
    """The tests of SERIAL_ONLY first, in their order, then the others in theirs: each of those directories is
    the longest unit of work of a parallel run (pytest_xdist_make_scheduler), so one worker starts it while the
    others take the files, instead of it running alone at the end.  A test that would run nowhere is a usage
    error (run_nowhere)."""
    lost = run_nowhere(items)
    if lost:
        raise pytest.UsageError(f"{len(lost)} tests would run nowhere: they have the keyword 'mpi' (a directory, "
                                f"module or parameter named mpi) without the mpi marker, e.g. {lost[0]}")
    items.sort(key=lambda item: not _serial_only(item.path))


def run_nowhere(items) -> list[str]:
    """The tests pytest-mpi takes for MPI tests (it looks for the keyword ``mpi``, which the name of a directory,
    module or parameter gives every test in it) that are not marked ``mpi``: skipped in the serial run,
    deselected by ``-m mpi`` under mpiexec."""
    return [item.nodeid for item in items if "mpi" in item.keywords and item.get_closest_marker("mpi") is None]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Under pytest-xdist (``-n``) a worker takes a whole test file, and a whole directory of SERIAL_ONLY: the
    module-scoped fixtures of a file are made once, and each directory's daemons (one SLURM cluster, one namespace
    cluster) and those of SHARED_DAEMONS (one Ceph gateway) are started by one worker only, never twice at a
    time."""
    from xdist.scheduler import LoadFileScheduling

    config.option.loadscopereorder = False  # collection order: the directories first (pytest_collection_modifyitems)
    prefixes = tuple(os.path.relpath(d, str(config.rootpath)).replace(os.sep, "/") + "/" for d in SERIAL_ONLY)
    prefixes += SHARED_DAEMONS

    class FilesAndDaemonDirectories(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return next((p for p in prefixes if nodeid.startswith(p)), None) or super()._split_scope(nodeid)

    return FilesAndDaemonDirectories(config, log)


@pytest.fixture(params=["json", "columnar"])
def table_form(request, monkeypatch):
    """Each form of the chunk table (docs/format.md 3.3): "columnar" makes the writer store every table, empty
    ones included, as a columnar block (hpcckpt.format.chunk_columns), as it does from COLUMNAR_MIN_CHUNKS chunks on;
    "json" keeps every table as JSON arrays.  Set on each rank (under mpiexec, rank 0 writes the metadata)."""
    from hpcckpt.format import chunk_columns

    monkeypatch.setattr(chunk_columns, "COLUMNAR_MIN_CHUNKS", 0 if request.param == "columnar" else 1 << 62)
    return request.param


@pytest.fixture(params=["allgather", "owners"])
def dedup_exchange(request, monkeypatch):
    """Each exchange of an incremental save's deduplication, whatever the rank count (set on each rank)."""
    force_dedup_exchange(monkeypatch, request.param)
    return request.param


@pytest.fixture(autouse=True)
def dedup_exchange_from_environment(monkeypatch):
    """``HPCCKPT_TEST_DEDUP=owners`` (or ``allgather``) runs every test with that exchange (tests that ask for
    :func:`dedup_exchange` still get theirs); unset, the sizes decide as in production."""
    exchange = os.environ.get("HPCCKPT_TEST_DEDUP")
    if exchange:
        force_dedup_exchange(monkeypatch, exchange)
