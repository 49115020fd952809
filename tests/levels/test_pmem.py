"""The persistent-memory tier: the two-slot image file, SIGKILL during updates, restore and fallback.

Serial tests run with pytest; the MPI part (``-m mpi``) under ``mpiexec -n 2, 3, 4``:
``mpiexec -n N python tests/mpi_pytest.py --with-mpi -m mpi tests/levels/test_pmem.py``.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcckpt import Block, Checkpointer, CheckpointError
from hpcckpt.levels.pmem import HEADER_AT, PmemImage, PmemLevel, changed_blocks
from hpcckpt.testing import LevelTests
from testpaths import TESTS

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

_HERE = TESTS
_REPO = os.path.dirname(_HERE)
_UPDATER = os.path.join(_HERE, "scripts", "pmem_updates.py")
sys.path.insert(0, os.path.dirname(_UPDATER))
from pmem_updates import version_data  # noqa: E402


# ------------------------------------------------------------------ pure logic
@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300), st.binary(max_size=300), st.integers(1, 70))
def test_changed_blocks_are_those_a_bytewise_comparison_finds(old, new, block):
    old_a, new_a = np.frombuffer(old, np.uint8), np.frombuffer(new, np.uint8)
    want = [i for i in range(-(-len(new) // block))
            if old[i * block:(i + 1) * block][:len(new[i * block:(i + 1) * block])] != new[i * block:(i + 1) * block]
            or len(old) < min((i + 1) * block, len(new))]
    assert changed_blocks(old_a, new_a, block).tolist() == want


# ------------------------------------------------------------------ the image file
def _image(tmp_path, block=64):
    return PmemImage(str(tmp_path / "000000.pmem"), 0, 1, block)


def test_update_writes_only_changed_blocks_into_the_older_slot(tmp_path):
    img = _image(tmp_path)
    a = np.arange(10_000, dtype=np.uint8)
    assert img.update(a, "v1") == a.size  # a new file: everything
    b = a.copy()
    b[100] ^= 1
    assert img.update(b, "v2") == b.size  # slot 1 held nothing yet
    c = b.copy()
    c[5000] ^= 1
    assert img.update(c, "v3") == 2 * 64  # slot 0 held v1: the blocks of 100 and 5000
    assert [h["name"] for h in img.headers()] == ["v3", "v2"]
    assert np.array_equal(img.read_version("v3"), c) and np.array_equal(img.read_version("v2"), b)
    assert img.read_version("v1") is None
    assert img.update(c, "v4") == 64  # slot 1 held v2: the block of 5000 differs
    assert np.array_equal(img.read_version("v4"), c)


def test_growth_recreates_the_file_and_shorter_data_keeps_the_capacity(tmp_path):
    img = _image(tmp_path)
    img.update(np.ones(100, np.uint8), "v1")
    big = np.arange(9000, dtype=np.uint8)
    img.update(big, "v2")
    assert np.array_equal(img.read_version("v2"), big) and img.read_version("v1") is None
    img.update(np.full(10, 7, np.uint8), "v3")
    assert np.array_equal(img.read_version("v3"), np.full(10, 7, np.uint8))
    img.update(np.zeros(0, np.uint8), "v4")
    assert img.read_version("v4").size == 0 and np.array_equal(img.read_version("v3"), np.full(10, 7, np.uint8))


def test_a_torn_or_foreign_header_does_not_count(tmp_path):
    img = _image(tmp_path)
    img.update(np.arange(300, dtype=np.uint8), "v1")
    img.update(np.arange(300, dtype=np.uint8) + 1, "v2")
    with open(img.path, "r+b") as f:  # one byte of slot 1's header flipped, as a torn write leaves it
        f.seek(HEADER_AT[1] + 20)
        byte = f.read(1)
        f.seek(HEADER_AT[1] + 20)
        f.write(bytes([byte[0] ^ 0xFF]))
    assert img.headers()[1] is None and img.read_version("v2") is None
    assert np.array_equal(img.read_version("v1"), np.arange(300, dtype=np.uint8))
    assert PmemImage(img.path, 1, 1).holding("v1") is None  # another rank's image
    assert PmemImage(img.path, 0, 2).holding("v1") is None  # written by another rank count
    with pytest.raises(CheckpointError, match="pmem_block"):
        PmemImage(img.path, 0, 1, 0)


# ------------------------------------------------------------------ SIGKILL mid-update
@pytest.mark.timeout(300)
@pytest.mark.parametrize("block", [64, 4096])
def test_sigkill_at_random_instants_of_updates_leaves_the_old_or_the_new_version(tmp_path, block):
    """A child stores 6 versions back to back into one image (resuming from what the image holds) and is killed
    at a seeded random instant, 20 times.  The newest valid slot must hold, byte for byte, the last version the
    child reported done or the one after it, and the other slot its own version: never a mix."""
    rng = random.Random(1700 + block)
    path = str(tmp_path / "000000.pmem")
    env = {**os.environ, "PYTHONPATH": _REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done, mid_sequence = 0, 0
    for _ in range(20):
        child = subprocess.Popen([sys.executable, _UPDATER, path, str(block), "6"], stdout=subprocess.PIPE,
                                 env=env, text=True)
        assert child.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.0, 0.08))
        child.send_signal(signal.SIGKILL)
        reported = [int(x) for x in child.stdout.read().split()]
        assert child.wait() == -signal.SIGKILL  # killed (the child sleeps after its last update, never exits)
        last = reported[-1] if reported else done
        mid_sequence += last < done + 6
        headers = [h for h in PmemImage(path, 0, 1, block).headers() if h is not None]
        k = int(max(headers, key=lambda h: h["seq"])["name"][1:]) if headers else 0  # killed before any
        assert k in (last, last + 1), (k, last)
        for h in headers:
            v = int(h["name"][1:])
            assert np.array_equal(PmemImage(path, 0, 1, block).read_version(h["name"]), version_data(v)), v
        done = k
    assert mid_sequence >= 10  # most kills fell among the updates, not after the child's last one


# ------------------------------------------------------------------ options
def test_bad_pmem_options(tmp_path):
    with pytest.raises(CheckpointError, match="pmem_dir needs local_dir"):
        Checkpointer(str(tmp_path / "root"), pmem_dir=str(tmp_path / "pm"))
    with pytest.raises(CheckpointError, match="pmem_every needs pmem_dir"):
        Checkpointer(str(tmp_path / "root"), local_dir=str(tmp_path / "local"), pmem_every=1)
    with pytest.raises(CheckpointError, match="pmem_every must be"):
        Checkpointer(str(tmp_path / "root"), local_dir=str(tmp_path / "local"), pmem_dir=str(tmp_path / "pm"),
                     pmem_every=-1)
    with pytest.raises(CheckpointError, match="pmem_block"):
        Checkpointer(str(tmp_path / "root"), local_dir=str(tmp_path / "local"), pmem_dir=str(tmp_path / "pm"),
                     pmem_block=0)


# ------------------------------------------------------------------ MPI: restore and fallback
@pytest.fixture
def comm():
    from mpi4py import MPI

    return MPI.COMM_WORLD


def _state(comm, step, n=3000):
    u = np.arange(n, dtype=np.float64) * step + 1000 * comm.Get_rank()
    return {"u": Block(u, (n * comm.Get_rank(),), (n * comm.Get_size(),)), "step": step}


def _ck(comm, path, **more):
    opts = {"local_dir": os.path.join(path, "local"), "pmem_dir": os.path.join(path, "pmem"), "ranks_per_node": 1,
            "track_failures": False, "flush_every": 2, "pmem_block": 256, **more}
    return Checkpointer(os.path.join(path, "root"), comm=comm, **opts)


def _restore(comm, path, step_want, **more):
    with _ck(comm, path, **more) as ck:
        t = _state(comm, 0)
        t["u"].local[:] = -1
        got = ck.restore(t)
        assert got["step"] == step_want
        assert np.array_equal(t["u"].local, _state(comm, step_want)["u"].local)
        return ck.engine.restored_level


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("asynchronous", [False, True])
def test_restore_on_the_same_ranks_maps_the_tier_then_falls_back_when_it_is_gone(comm, mpi_tmp, asynchronous):
    with _ck(comm, mpi_tmp, asynchronous=asynchronous) as ck:
        for step in (1, 2, 3):
            ck.save(_state(comm, step), step)
        assert "PM" in (ck.wait() or ck.last_result).levels
    assert _restore(comm, mpi_tmp, 3) == "PM"
    comm.Barrier()
    if comm.Get_rank() == 0:  # the L1 files of node 1 are lost; its image is not
        shutil.rmtree(os.path.join(mpi_tmp, "local", "node-1"))
    comm.Barrier()
    assert _restore(comm, mpi_tmp, 3) == "PM"
    assert os.path.isfile(os.path.join(mpi_tmp, "local", f"node-{comm.Get_rank()}", "step-000000000003",
                                       "data", f"part-{comm.Get_rank():06d}.bin"))  # written back from the map
    assert _restore(comm, mpi_tmp, 3, pmem_dir=None) == "L1"  # the files written back are whole
    comm.Barrier()
    if comm.Get_rank() == 0:  # the tier is gone
        shutil.rmtree(os.path.join(mpi_tmp, "pmem"))
    comm.Barrier()
    assert _restore(comm, mpi_tmp, 3) == "L1"


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(120)
def test_a_changed_rank_count_falls_back_to_the_other_levels(comm, mpi_tmp):
    from mpi4py import MPI

    sub = comm.Split(0 if comm.Get_rank() < comm.Get_size() - 1 else MPI.UNDEFINED, comm.Get_rank())
    if sub != MPI.COMM_NULL:  # one rank fewer saves, with the same global array
        n = 3000 * comm.Get_size() // sub.Get_size()
        with _ck(sub, mpi_tmp, flush_every=1) as ck:
            for step in (1, 2):
                u = np.arange(n, dtype=np.float64) + n * sub.Get_rank()
                ck.save({"u": Block(u * step, (n * sub.Get_rank(),), (n * sub.Get_size(),)), "step": step}, step)
        sub.Free()
    comm.Barrier()
    n = 3000
    with _ck(comm, mpi_tmp) as ck:
        t = np.full(n, -1.0)
        got = ck.restore({"u": Block(t, (n * comm.Get_rank(),), (n * comm.Get_size(),)), "step": None})
        assert got["step"] == 2 and ck.engine.restored_level != "PM"
        assert np.array_equal(t, 2 * (np.arange(n, dtype=np.float64) + n * comm.Get_rank()))


_PMEM_DIR = tempfile.mkdtemp(prefix="hpcckpt-pmem-level-")  # one per rank: a rank only uses its own image


@pytest.fixture(scope="module", autouse=True)
def _remove_pmem_dir():
    yield
    shutil.rmtree(_PMEM_DIR, ignore_errors=True)


class TestPmemLevel(LevelTests):
    """The conformance suite: "the loss of one node" there removes node 1's L1 directory, not its image, so the
    version comes back from the tier (PM) with node 1's files written back from the map."""

    level = PmemLevel()
    options = {"pmem_dir": _PMEM_DIR, "pmem_every": 1}


def test_the_header_is_laid_out_as_format_md_section_10_says():
    import struct
    import zlib

    from hpcckpt.levels.pmem import HEADER_BYTES, pack_header

    raw = pack_header(1, 4, 3, 9, 8192, 5000, 64, "step-000000000002")
    assert len(raw) == HEADER_BYTES == 152 and HEADER_AT == (0, 2048)
    assert raw[0:8] == b"HCKPMEM1"
    assert struct.unpack_from("<III", raw, 8) == (1, 4, 3)
    assert struct.unpack_from("<QQQQ", raw, 20) == (9, 8192, 5000, 64)
    assert raw[52:148].rstrip(b"\0") == b"step-000000000002"
    assert struct.unpack_from("<I", raw, 148)[0] == zlib.crc32(raw[:148])
