"""Asynchronous saves (issue 7): the staging pool, and collective behaviour under mpiexec (pytest-mpi).

Run the MPI part with ``mpiexec -n N python tests/mpi_pytest.py --with-mpi -m mpi tests/test_async.py``.
The background writer is slowed down (a sleep before each write) so that a save
that did not copy the state aside would see the application's later writes.
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

import hpcckpt
from hpcckpt import Block, Checkpointer, CheckpointError
from hpcckpt.staging import SlotQueue, StagingPool, stage
from hpcckpt.transport import file_per_rank


# ----------------------------------------------------------- staging (serial)
def test_staging_copies_every_layout_and_packs_small_pieces():
    a = np.arange(24.0).reshape(4, 6)
    f = np.asfortranarray(np.arange(12, dtype=np.int32).reshape(3, 4))
    small = {f"s{i}": np.full(3, i, np.int16) for i in range(5)}
    arrays = {"a": a, "f": f, "v": a[:, ::2], **small}
    boxes = {"a": ((10, 0), None), "f": ((0, 0), None), "v": ((0, 0), None), **{k: ((0,), None) for k in small}}
    pool, queue = StagingPool(1 << 20, 256), SlotQueue()
    nbytes, npieces = stage(arrays, boxes, pool, queue)
    slots = []
    while (s := queue.get()) is not None:
        slots.append(s)
    got = {}
    for s in slots:
        for name, start, count, dtype, off, n in s.pieces:
            assert n <= pool.slot_bytes and off % 64 == 0
            got.setdefault(name, []).append((start, s.buffer[off:off + n].view(dtype).reshape(count).copy()))
    assert nbytes == sum(x.nbytes for x in arrays.values())
    assert np.array_equal(np.concatenate([p for _, p in got["a"]]), a)
    assert got["a"][0][0] == (10, 0)
    assert np.array_equal(np.concatenate([p for _, p in got["f"]]), f)
    assert np.array_equal(np.concatenate([p for _, p in got["v"]]), a[:, ::2])
    assert len(slots) < npieces  # small pieces share slots


def test_staging_pool_is_bounded_and_blocks_until_a_slot_is_released():
    pool = StagingPool(256, 128)
    a, b = pool.acquire(), pool.acquire()
    assert pool.allocated_bytes == 256
    got = []
    t = threading.Thread(target=lambda: got.append(pool.acquire()))
    t.start()
    time.sleep(0.1)
    assert not got  # the pool is full: acquire waits
    pool.release(a)
    t.join(2)
    assert got and got[0] is a and pool.allocated_bytes == 256  # the same buffer, reused
    pool.release(b)


def test_serial_asynchronous_round_trip(tmp_path):
    a = np.arange(1000.0)
    with Checkpointer(tmp_path, asynchronous=True, track_failures=False, staging_bytes=4096,
                      chunk_bytes=1024) as ck:
        res = ck.save({"a": Block(a), "t": 1}, 1)
        assert res.strategy == "asynchronous"
        a[:] = -1
        assert ck.latest() == 1
        b = np.zeros(1000)
        ck.restore({"a": Block(b), "t": None})
        assert np.array_equal(b, np.arange(1000.0))


def test_unknown_and_bad_options(tmp_path):
    with pytest.raises(CheckpointError, match="staging_bytes"):
        Checkpointer(tmp_path, asynchronous=True, staging_bytes=0, track_failures=False)
    with pytest.raises(CheckpointError, match="unknown save option"):
        Checkpointer(tmp_path, asynchronous=True, stagingbytes=1, track_failures=False)


# ------------------------------------------------------------ under mpiexec
def _slow_writes(monkeypatch, seconds):
    original = file_per_rank.SequentialFile.append

    def slow(self, buffer):
        time.sleep(seconds)
        return original(self, buffer)

    monkeypatch.setattr(file_per_rank.SequentialFile, "append", slow)


def _block(comm, a):
    n = a.shape[0]
    return Block(a, (comm.rank * n,), (comm.size * n,))


@pytest.fixture
def comm():
    from mpi4py import MPI

    return MPI.COMM_WORLD


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(60)
@pytest.mark.parametrize("levels", [False, True])
def test_mutate_right_after_save_keeps_the_saved_values(comm, mpi_tmp, monkeypatch, levels):
    _slow_writes(monkeypatch, 0.02)
    extra = {"local_dir": os.path.join(mpi_tmp, "local"), "ranks_per_node": 1, "partner_every": 1} if levels else {}
    a = np.arange(2000.0) + 10000 * comm.rank
    blocking = []
    with Checkpointer(os.path.join(mpi_tmp, "root"), asynchronous=True, track_failures=False, chunk_bytes=2048,
                      staging_bytes=8192, **extra) as ck:  # 16 KB per rank through an 8 KB pool: save waits once
        monkeypatch.setattr(ck.pacer, "record_save", lambda step, s: blocking.append(s))
        ck.save({"u": _block(comm, a), "t": 0.5}, 1)
        a[:] = -1.0  # the application overwrites its state at once
        ck.save({"u": _block(comm, a), "t": 0.75}, 2)
        a[:] = -2.0
        ck.wait()
        assert ck.steps() == [1, 2]
    with Checkpointer(os.path.join(mpi_tmp, "root"), asynchronous=True, track_failures=False, **extra) as ck:
        for step, want in [(1, np.arange(2000.0) + 10000 * comm.rank), (2, np.full(2000, -1.0))]:
            b = np.zeros(2000)
            got = ck.restore({"u": _block(comm, b), "t": None}, step=step)
            assert np.array_equal(b, want) and got["t"] == {1: 0.5, 2: 0.75}[step]
    assert len(blocking) == 2


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(60)
def test_save_blocks_only_for_the_copy_and_skip_if_busy(comm, mpi_tmp, monkeypatch):
    _slow_writes(monkeypatch, 0.5)  # the background write takes >= 0.5 s
    a = np.ones(1000)
    blocking = []
    with Checkpointer(mpi_tmp, asynchronous=True, skip_if_busy=True, track_failures=False) as ck:
        monkeypatch.setattr(ck.pacer, "record_save", lambda step, s: blocking.append(s))
        t = time.perf_counter()
        ck.save({"u": _block(comm, a)}, 1)
        assert time.perf_counter() - t < 0.4
        assert ck.save({"u": _block(comm, a)}, 2) is None  # busy: skipped, counted
        assert ck.skipped == 1
        assert ck.latest() == 1  # waits for and commits step 1
        assert ck.steps() == [1]
    assert blocking and blocking[0] < 0.4  # the pacer sees the foreground part only


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(60)
def test_failure_in_background_is_every_ranks_error_and_not_committed(comm, mpi_tmp, monkeypatch):
    if comm.rank == comm.size - 1:
        def broken(self, buffer):
            raise OSError(5, "injected I/O error")
        monkeypatch.setattr(file_per_rank.SequentialFile, "append", broken)
    a = np.ones(1000)
    ck = Checkpointer(mpi_tmp, asynchronous=True, track_failures=False)
    ck.save({"u": _block(comm, a)}, 1)
    with pytest.raises(CheckpointError, match=f"rank {comm.size - 1}: OSError: .*injected"):
        ck.wait()
    assert not os.path.exists(os.path.join(mpi_tmp, "step-000000000001"))
    monkeypatch.undo()
    ck.save({"u": _block(comm, a)}, 2)
    assert ck.steps() == [2]
    ck.close()
