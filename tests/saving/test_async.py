"""Asynchronous saves: the staging pool, and collective behaviour under mpiexec (pytest-mpi).

Run the MPI part with ``mpiexec -n N python tests/mpi_pytest.py --with-mpi -m mpi tests/saving/test_async.py``.
The background writer is slowed down (a sleep before each write) so that a save
that did not copy the state aside would see the application's later writes, or
held (each write waits for an event the test sets) to prove what a save does
before its writes run.
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

from hpcckpt import Block, Checkpointer, CheckpointError
from hpcckpt.saving.staging import SlotQueue, StagingPool, stage
from hpcckpt.transport import file_per_rank
from mpitools import CountingComm


# ----------------------------------------------------------- staging (serial)
def _drain(queue):
    items = []
    while (s := queue.get()) is not None:
        items.append(s)
    return items


def _items(arrays, starts):
    """Selection items (variable, global start, array, cut) of whole arrays."""
    return [(name, starts[name], arr, True) for name, arr in arrays.items()]


def _reassemble(items, pool_piece=None):
    from hpcckpt.saving.transform import raw_pieces

    got = {}
    for s in items:
        for _, start, count, view in raw_pieces([s.item], pool_piece or 1 << 30):
            assert view.flags.c_contiguous
            got.setdefault(s.variable, []).append((start, view.reshape(count).copy()))
    return got


def test_staging_copies_every_layout_whole_with_one_copy_per_array():
    a = np.arange(24.0).reshape(4, 6)
    f = np.asfortranarray(np.arange(12, dtype=np.int32).reshape(3, 4))
    small = {f"s{i}": np.full(3, i, np.int16) for i in range(5)}
    arrays = {"a": a, "f": f, "v": a[:, ::2], "z": np.array(7.5), **small}
    starts = {"a": (10, 0), "f": (0, 0), "v": (0, 0), "z": (), **{k: (0,) for k in small}}
    pool, queue = StagingPool(1 << 20), SlotQueue()
    nbytes, count = stage(_items(arrays, starts), pool, queue)
    items = _drain(queue)
    assert count == len(items) == len(arrays)  # one buffer (one np.copyto) per array
    assert nbytes == sum(x.nbytes for x in arrays.values()) == pool.allocated_bytes
    got = _reassemble(items)
    for name, arr in arrays.items():
        assert len(got[name]) == 1 and np.array_equal(got[name][0][1], arr)
    assert got["a"][0][0] == (10, 0) and got["z"][0][0] == ()
    a[:] = -1  # the staged copies do not follow the caller's arrays
    assert np.array_equal(items[0].array, np.arange(24.0).reshape(4, 6))
    # the writer's pieces of a staged array are views of its buffer, cut at piece_bytes
    pieces = list(__import__("hpcckpt.saving.transform", fromlist=["raw_pieces"]).raw_pieces([items[0].item], 48))
    assert [p[1] for p in pieces] == [(10, 0), (11, 0), (12, 0), (13, 0)]
    assert all(np.shares_memory(p[3], items[0].buffer) for p in pieces)


def test_staging_in_pieces_and_buffers_are_reused():
    a = np.arange(1000.0)
    pool, queue = StagingPool(1 << 20), SlotQueue()
    nbytes, count = stage(_items({"a": a}, {"a": (5,)}), pool, queue, piece_bytes=800)
    items = _drain(queue)
    assert count == 10 and nbytes == a.nbytes and items[1].start == (105,)
    assert np.array_equal(np.concatenate([i.array for i in items]), a)
    first = [i.buffer for i in items]
    for i in items:
        pool.release(i.buffer)
    stage(_items({"a": a}, {"a": (5,)}), pool, queue, piece_bytes=800)
    again = _drain(queue)
    assert {id(i.buffer) for i in again} == {id(b) for b in first}  # warm pool: no new allocation
    assert pool.allocated_bytes == a.nbytes


def test_staging_pool_is_bounded_and_blocks_until_a_buffer_is_released():
    pool = StagingPool(256)
    a, b = pool.acquire(128), pool.acquire(128)
    assert pool.allocated_bytes == 256
    waiting = threading.Event()

    class NotingCondition(threading.Condition):
        def wait(self, timeout=None):
            waiting.set()
            return super().wait(timeout)

    pool._cond = NotingCondition()
    got = []
    t = threading.Thread(target=lambda: got.append(pool.acquire(128)))
    t.start()
    assert waiting.wait(30) and not got  # the pool is full: acquire waits for a release
    pool.release(a)
    t.join(2)
    assert got and got[0] is a and pool.allocated_bytes == 256  # the same buffer, reused
    pool.release(b)
    pool.release(got[0])
    c = pool.acquire(200)  # a new size: free buffers of other sizes are dropped to stay within the bound
    assert c.nbytes == 200 and pool.allocated_bytes <= 256
    assert pool.acquire(1000).nbytes == 1000  # larger than the whole pool: a one-off buffer
    assert pool.allocated_bytes <= 256


def test_writer_threads_are_reused_and_each_running_job_has_its_own():
    """A job handed over while another runs gets a thread of its own (the first waits for the second: no
    deadlock); once both threads are idle again, the next jobs run on them, and no new thread is started."""
    from hpcckpt.saving.background import IdleThreads

    threads = IdleThreads("test-writer")
    ran_on = []

    def run(wait_for=None, signal=None) -> None:
        finished = threading.Event()

        def job():
            ran_on.append(threading.get_ident())
            if wait_for is not None:
                assert wait_for.wait(60)
            if signal is not None:
                signal.set()
            finished.set()

        threads.run(job)
        return finished

    def idle(n):
        while threads._idle < n:  # a thread counts itself idle right after its job
            time.sleep(0.01)

    second_ran = threading.Event()
    first, second = run(wait_for=second_ran), run(signal=second_ran)
    assert first.wait(60) and second.wait(60)
    assert len(set(ran_on)) == 2
    idle(2)
    for _ in range(3):
        assert run().wait(60)
        idle(2)
    names = {t.ident for t in threading.enumerate() if t.name == "test-writer"}
    assert set(ran_on[2:]) <= set(ran_on[:2]) and names == set(ran_on[:2])


def test_serial_asynchronous_round_trip(tmp_path):
    a = np.arange(1000.0)
    with Checkpointer(tmp_path, asynchronous=True, track_failures=False, staging_bytes=4096,
                      chunk_bytes=1024) as ck:
        res = ck.save({"a": Block(a), "t": 1}, 1)
        assert res.pending and res.bytes_written == 0 and res.strategy == "file-per-rank"
        a[:] = -1
        assert ck.latest() is None  # pending: not committed yet (latest() is not collective, commits nothing)
        ck.wait()
        assert ck.latest() == 1
        b = np.zeros(1000)
        ck.restore({"a": Block(b), "t": None})
        assert np.array_equal(b, np.arange(1000.0))


def test_a_whole_staged_state_is_written_as_long_after_its_copy_as_the_copy_took(tmp_path, monkeypatch):
    """The ranks of a node copy their states together: a writer waits out one copy's time before it takes cores."""
    from hpcckpt.saving import staging

    copied_at, appended_at = [], []
    real_copy, real_append = staging.copy_into, file_per_rank.SequentialFile.append

    def slow_copy(dst, src):  # a copy that takes 0.3 s
        time.sleep(0.3)
        real_copy(dst, src)
        copied_at.append(time.monotonic())

    def timed_append(self, *args, **kwargs):
        appended_at.append(time.monotonic())
        return real_append(self, *args, **kwargs)

    monkeypatch.setattr(staging, "copy_into", slow_copy)
    monkeypatch.setattr(file_per_rank.SequentialFile, "append", timed_append)
    a = np.arange(1000.0)
    with Checkpointer(tmp_path, asynchronous=True, track_failures=False) as ck:
        ck.save({"a": Block(a)}, 1)
        ck.wait()
        assert len(copied_at) == 1 and appended_at and min(appended_at) - copied_at[0] >= 0.3
        b = np.zeros(1000)
        ck.restore({"a": Block(b)})
    assert np.array_equal(b, a)


def test_retention_uncommits_at_the_commit_and_deletes_in_the_background(tmp_path, monkeypatch):
    from hpcckpt.root import catalog

    gate, started = threading.Event(), threading.Event()
    deleting = []
    original = catalog.delete_directories

    def held(entries):  # retention's deletion waits until the test lets it go: the commit must not wait for it
        if entries and threading.current_thread().name == "hpcckpt-retention":
            deleting.append([e.path for e in entries])
            started.set()
            gate.wait(30)
        return original(entries)

    monkeypatch.setattr(catalog, "delete_directories", held)
    a = np.arange(1000.0)
    with Checkpointer(tmp_path, asynchronous=True, keep=2, track_failures=False, handle_signals=False) as ck:
        for step in (1, 2, 3):
            a += 1.0
            ck.save({"a": Block(a)}, step)
            ck.wait()
        # committed: the dropped version is no version any more, its directory still being deleted
        assert ck.steps() == [2, 3]
        assert started.wait(30)  # the worker thread takes the queued directory when it gets a core
        assert len(deleting) == 1 and os.path.isdir(deleting[0][0]) and not gate.is_set()
        gate.set()
        b = np.zeros(1000)
        ck.restore({"a": Block(b)})
        assert np.array_equal(b, a)
    assert not os.path.exists(deleting[0][0])  # close waited for the deletion
    with Checkpointer(tmp_path, track_failures=False, handle_signals=False) as ck:
        assert ck.steps() == [2, 3]


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


def _held_writes(monkeypatch, release):
    """Every background write waits for ``release``; the list of what each wait returned (False: it timed out)."""
    original = file_per_rank.SequentialFile.append
    waited = []

    def held(self, buffer):
        waited.append(release.wait(30))
        return original(self, buffer)

    monkeypatch.setattr(file_per_rank.SequentialFile, "append", held)
    return waited


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(90)
def test_save_blocks_only_for_the_copy_and_skip_if_busy(comm, mpi_tmp, monkeypatch):
    release = threading.Event()
    waited = _held_writes(monkeypatch, release)  # no write can finish before the test sets release
    a = np.ones(1000)
    blocking = []
    with Checkpointer(mpi_tmp, asynchronous=True, skip_if_busy=True, track_failures=False) as ck:
        monkeypatch.setattr(ck.pacer, "record_save", lambda step, s: blocking.append(s))
        assert ck.save({"u": _block(comm, a)}, 1).pending  # returned with its writes still held
        assert ck.save({"u": _block(comm, a)}, 2) is None  # busy: skipped, counted
        assert ck.skipped == 1
        assert ck.latest() is None  # step 1 is pending: latest() lists committed versions only
        assert len(blocking) == 2  # the pacer got both saves' figures before any write ran: the foreground part
        release.set()
        ck.wait()
        assert ck.steps() == [1] and ck.latest() == 1
    assert waited and all(waited)  # every write waited for the release: none ran while save() had not returned


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
    ck.wait()
    assert ck.steps() == [2]
    ck.close()


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(60)
@pytest.mark.parametrize("levels", [False, True])
def test_repeated_save_with_unchanged_layout_calls_no_mpi(comm, mpi_tmp, levels):
    extra = {"local_dir": os.path.join(mpi_tmp, "local"), "ranks_per_node": 1, "partner_every": 1} if levels else {}
    a = np.arange(3000.0) + comm.rank
    with Checkpointer(os.path.join(mpi_tmp, "root"), asynchronous=True, track_failures=False, chunk_bytes=4096,
                      **extra) as ck:
        ck.save({"u": _block(comm, a), "t": 0}, 1)  # plans collectively (one allgather)
        ck.wait()
        counting = CountingComm(ck.engine.comm)
        ck.engine.comm = counting
        for step in (2, 3):
            ck.save({"u": _block(comm, a), "t": step}, step)
            assert counting.calls == [], counting.calls  # the foreground part: no collective at all
            a += 1.0
            ck.wait()  # the commit does the agreement
            counting.calls.clear()
        ck.engine.comm = counting._comm
        assert ck.steps() == [1, 2, 3]
    with Checkpointer(os.path.join(mpi_tmp, "root"), track_failures=False, **extra) as ck:
        b = np.zeros(3000)
        assert ck.restore({"u": _block(comm, b), "t": None})["t"] == 3
        assert np.array_equal(b, np.arange(3000.0) + comm.rank + 1.0)


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(60)
def test_layout_change_on_one_rank_is_reconciled_at_the_commit(comm, mpi_tmp):
    """Rank 0's Ragged grows: the others reuse the cached plan with stale row offsets, fixed at the commit."""
    from hpcckpt import Ragged

    rows = lambda step, r: np.arange(10 * (1 + (step if r == 0 else 0)), dtype=np.int64) + 1000 * r  # noqa: E731
    a = np.arange(500.0) + comm.rank
    with Checkpointer(mpi_tmp, asynchronous=True, track_failures=False, chunk_bytes=64) as ck:
        for step in (1, 2, 3):
            ck.save({"p": Ragged(rows(step, comm.rank)), "u": _block(comm, a)}, step)
        ck.wait()
        assert ck.engine.plan_cache.variables["p"].shape == (40 + 10 * (comm.size - 1),)  # everyone adopted it
        for step in (1, 2, 3):
            got = ck.restore({"p": Ragged(rows=len(rows(step, comm.rank))), "u": _block(comm, np.zeros(500))},
                             step=step)
            assert np.array_equal(got["p"].local, rows(step, comm.rank))
        # an invalid change (blocks that no longer tile) fails on every rank at the next call, then recovers
        bad = np.arange(400.0) if comm.rank == 1 else a
        ck.save({"p": Ragged(rows(3, comm.rank)), "u": _block(comm, bad)}, 4)
        with pytest.raises(CheckpointError, match="asynchronous save of step 4"):
            ck.wait()
        assert not ck.engine.plan_cache.valid
        ck.save({"p": Ragged(rows(3, comm.rank)), "u": _block(comm, a)}, 5)
        ck.wait()
        assert ck.steps() == [1, 2, 3, 5]
