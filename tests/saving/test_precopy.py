"""Self-adaptive pre-copy (hpcckpt.saving.precopy): values at the call are what is stored, whatever the rounds saw.

Run the MPI part with ``mpiexec -n N python tests/mpi_pytest.py --with-mpi -m mpi tests/saving/test_precopy.py``.
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

from hpcckpt import Block, Checkpointer, CheckpointError
from hpcckpt.policy import FixedSteps
from hpcckpt.transport import file_per_rank

EVERY = 8
ROWS, COLS = 48, 1024  # 8 KiB rows: a 16 KiB block is two rows


def _checkpointer(root, comm=None, **extra):
    return Checkpointer(root, comm=comm, asynchronous=True, incremental=True, policy=FixedSteps(EVERY),
                        block_bytes=1 << 14, track_failures=False, handle_signals=False,
                        **{"precopy": {"min_block": 1 << 12}, **extra})


def _compute(ck, rounds_too: bool = True):
    """A step's computation: long enough for this rank's save writer (and the rounds' writers) to finish, so that
    what runs when does not depend on the machine's load."""
    while (ck.engine.pending is not None and not ck.engine.pending.writer.done) or \
            (rounds_too and ck.engine.precopy.writing):
        time.sleep(0.002)


def _run(ck, a, steps, rng, dirty_rows=3, everywhere=False, rounds_too=True, first=1):
    """The time loop: random rows change each step; the state is overwritten right after every save call and
    between rounds; returns ``{step: the values at the save call}``."""
    saved = {}
    for step in range(first, first + steps):
        _compute(ck, rounds_too)
        if everywhere:
            a[:] = rng.random(a.shape)
        else:
            a[rng.integers(0, a.shape[0], dirty_rows)] = rng.random((dirty_rows, a.shape[1]))
        before = a.copy()
        started = ck.engine.precopy.started
        result = ck.maybe_save(step)
        if result is not None:
            saved[step] = before
            a[:] = -1.0  # right after the call: the save must keep the values at the call
        elif ck.engine.precopy.started > started:  # a round started: change blocks while it hashes and copies
            a[rng.integers(0, a.shape[0], 2)] = rng.random((2, a.shape[1]))
    ck.wait()
    return saved


def _restore_all(root, saved, comm=None, block=None):
    with Checkpointer(root, comm=comm, track_failures=False, handle_signals=False) as ck:
        for step, want in saved.items():
            got = np.zeros_like(want) if block is None else np.zeros(block[1], want.dtype)
            lo = (0, 0) if block is None else block[0]
            ck.restore({"u": Block(got, lo, want.shape)}, step=step)
            expect = want if block is None else want[lo[0]:lo[0] + block[1][0]]
            assert np.array_equal(got, expect), step


def test_rounds_write_ahead_and_the_checkpoint_stores_the_values_at_the_call(tmp_path):
    rng = np.random.default_rng(1)
    a = rng.random((ROWS, COLS))
    root = str(tmp_path / "root")
    with _checkpointer(root) as ck:
        ck.register({"u": Block(a, (0, 0), a.shape)})
        saved = _run(ck, a, 5 * EVERY, rng)
        results = [ck.last_result]
        pc = ck.engine.precopy
        assert pc.plan.rounds == 0 and not pc.precopied  # the interval ended with the last save
    assert sorted(saved) == [EVERY * k for k in range(1, 6)]
    info = results[-1].incremental
    assert info["precopied_bytes"] > 0  # rounds did write blocks of the last version ahead of it
    assert info["written_bytes"] < info["changed_bytes"]  # and the checkpoint wrote only the rest
    # every block is written now, pre-copied, an older version's or a duplicate, and counted once
    assert info["written_bytes"] + info["precopied_bytes"] + info["referenced_bytes"] + \
        info["deduplicated_bytes"] == info["total_bytes"]
    assert not os.path.exists(os.path.join(root, ".hpcckpt-precopy", "r000000"))  # moved in, or removed at close
    files = os.listdir(os.path.join(results[-1].path, "data"))
    assert any(f.startswith("precopy-") for f in files) and "part-000000.bin" in files
    _restore_all(root, saved)


def test_a_block_changed_while_a_background_round_copies_it_is_never_taken_from_the_round(tmp_path, monkeypatch):
    """The interleaving a background round must survive: the application changes a block between the round's
    hash of it and its copy, then changes it back before the call.  The round's file holds the changed bytes;
    the checkpoint must store the values at the call (the round records the hash of its copy, not of the
    block it hashed first)."""
    from hpcckpt.saving import staging

    rng = np.random.default_rng(6)
    a = rng.random((ROWS, COLS))
    original_copy = staging.copy_into
    torn = []

    def copy_after_a_change(dst, src):  # a round's copy of its first block sees the application's write
        if threading.current_thread().name == "hpcckpt-precopy" and not torn and src.size:
            at = (src.__array_interface__["data"][0] - a.__array_interface__["data"][0]) // a.itemsize
            torn.append((at, src.copy(), np.shares_memory(src, a)))
            src[...] = 7.0
        original_copy(dst, src)

    monkeypatch.setattr(staging, "copy_into", copy_after_a_change)
    root = str(tmp_path / "root")
    saved = {}
    with _checkpointer(root) as ck:
        ck.register({"u": Block(a, (0, 0), a.shape)})
        pc = ck.engine.precopy
        for step in range(1, 2 * EVERY + 1):
            _compute(ck)
            if torn and "restored" not in saved:  # undo the write before the call: the block is as it was hashed
                at, block, _ = torn[0]
                a.reshape(-1)[at:at + block.size] = block.reshape(-1)
                saved["restored"] = None
            else:
                a[rng.integers(0, ROWS, 2)] = rng.random((2, COLS))
            before = a.copy()
            if ck.maybe_save(step) is not None:
                saved[step] = before
        ck.wait()
        assert torn and torn[0][2]  # the round read the application's array itself, in its own thread
        assert pc.started >= 1
    saved.pop("restored")
    _restore_all(root, saved)


@pytest.mark.timeout(120)
def test_a_round_larger_than_the_staging_pool_streams_through_it(tmp_path):
    rng = np.random.default_rng(7)
    a = rng.random((ROWS, COLS))  # 384 KiB: a round after a full save copies most of it
    root = str(tmp_path / "root")
    with _checkpointer(root, staging_bytes=3 << 14) as ck:  # room for three 16 KiB blocks only
        ck.register({"u": Block(a, (0, 0), a.shape)})
        saved = _run(ck, a, 3 * EVERY, rng, dirty_rows=2)
        assert ck.last_result.incremental["precopied_bytes"] > 3 << 14
    _restore_all(root, saved)


def test_a_round_still_writing_at_the_save_is_abandoned_and_the_next_rounds_start_earlier(tmp_path, monkeypatch):
    original = file_per_rank.SequentialFile.append
    release, waited = threading.Event(), []

    def held(self, buffer, hasher=None):  # a round's writes wait until the test releases them
        if "precopy-" in self.name:
            waited.append(release.wait(60))
        return original(self, buffer, hasher)

    monkeypatch.setattr(file_per_rank.SequentialFile, "append", held)
    rng = np.random.default_rng(2)
    a = rng.random((ROWS, COLS))
    root = str(tmp_path / "root")
    with _checkpointer(root) as ck:
        ck.register({"u": Block(a, (0, 0), a.shape)})
        pc = ck.engine.precopy
        saved = _run(ck, a, 2 * EVERY, rng, dirty_rows=2, rounds_too=False)
        assert pc.plan.start == 0.25  # the round of the second interval was still writing at its save
        assert ck.last_result.incremental["precopied_bytes"] == 0
        release.set()
        saved.update(_run(ck, a, EVERY, rng, dirty_rows=1, first=2 * EVERY + 1))
        assert pc.rounds == [] and ck.last_result.incremental["precopied_bytes"] > 0
    assert not os.path.exists(os.path.join(root, ".hpcckpt-precopy", "r000000"))  # the abandoned file too
    assert all(waited)  # no round write gave up waiting
    _restore_all(root, saved)


def test_a_failing_round_drops_precopy_and_the_checkpoint_writes_everything(tmp_path, monkeypatch):
    original = file_per_rank.SequentialFile.append

    def broken(self, buffer, hasher=None):
        if "precopy-" in self.name:
            raise OSError(28, "No space left on device")
        return original(self, buffer, hasher)

    monkeypatch.setattr(file_per_rank.SequentialFile, "append", broken)
    rng = np.random.default_rng(3)
    a = rng.random((ROWS, COLS))
    root = str(tmp_path / "root")
    with _checkpointer(root) as ck:
        ck.register({"u": Block(a, (0, 0), a.shape)})
        saved = _run(ck, a, 3 * EVERY, rng)
        info = ck.last_result.incremental
        assert info["precopied_bytes"] == 0 and info["written_bytes"] > 0
    _restore_all(root, saved)


def test_a_state_that_changes_everywhere_every_step_stops_precopy(tmp_path):
    rng = np.random.default_rng(4)
    a = rng.random((ROWS, COLS))
    root = str(tmp_path / "root")
    with _checkpointer(root) as ck:
        ck.register({"u": Block(a, (0, 0), a.shape)})
        pc = ck.engine.precopy
        saved = _run(ck, a, EVERY, rng, everywhere=True)
        started = [pc.started]
        saved.update(_run(ck, a, EVERY, rng, everywhere=True, first=EVERY + 1))  # two rounds show the rate
        started.append(pc.started)
        assert pc.plan.skip == 1 and pc.plan.backoff == 2  # stopped: the next interval is skipped
        saved.update(_run(ck, a, EVERY, rng, everywhere=True, first=2 * EVERY + 1))
        started.append(pc.started)
        assert pc.plan.skip == 0  # skipped, then the next one probes again
        saved.update(_run(ck, a, EVERY, rng, everywhere=True, first=3 * EVERY + 1))
        started.append(pc.started)
        assert pc.plan.skip == 2 and pc.plan.backoff == 4  # stopped again: the backoff doubles
        # rounds ran in the second and the fourth interval only
        assert started[0] == 0 and started[1] > 0 and started[2] == started[1] and started[3] > started[2]
    # none of their blocks was still the state at the call: their files left the versions (deleted by now)
    assert not any(f.startswith("precopy-") for step in saved
                   for f in os.listdir(os.path.join(root, f"step-{step:012d}", "data")))
    assert not os.path.exists(os.path.join(root, ".hpcckpt-precopy", "x000000"))  # deleted by close at the latest
    _restore_all(root, saved)


def test_the_probe_after_a_backoff_writes_nothing_and_a_state_that_slowed_down_is_copied_again(tmp_path,
                                                                                            monkeypatch):
    import hpcckpt.saving.precopy as precopy_module
    writers = []

    class CountedWrite(precopy_module.BackgroundWrite):
        def __init__(self, *args, **kwargs):
            writers.append(args[1])  # the round file's name
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(precopy_module, "BackgroundWrite", CountedWrite)
    rng = np.random.default_rng(5)
    a = rng.random((ROWS, COLS))
    root = str(tmp_path / "root")
    with _checkpointer(root) as ck:
        ck.register({"u": Block(a, (0, 0), a.shape)})
        pc = ck.engine.precopy
        saved = _run(ck, a, 2 * EVERY, rng, everywhere=True)  # the second interval's rounds stop pre-copy
        assert pc.plan.skip == 1 and not pc.plan.copies
        saved.update(_run(ck, a, EVERY, rng, dirty_rows=1, first=2 * EVERY + 1))  # skipped
        copied, started = len(writers), pc.started
        saved.update(_run(ck, a, EVERY, rng, dirty_rows=1, first=3 * EVERY + 1))  # the probe: hashes only
        assert pc.started > started and len(writers) == copied  # its rounds ran, none made a file
        info = ck.last_result.incremental
        assert info["precopied_bytes"] == 0 and 0 < info["probed_bytes"] < info["changed_bytes"]
        assert pc.plan.copies and pc.plan.backoff == 1  # little changed since the probe: copying pays again
        saved.update(_run(ck, a, EVERY, rng, dirty_rows=1, first=4 * EVERY + 1))
        assert len(writers) > copied and ck.last_result.incremental["precopied_bytes"] > 0
    _restore_all(root, saved)


@pytest.mark.parametrize("options", [{"incremental": False}, {"precopy": {"start": 2.0}},
                                     {"precopy": "always"}])
def test_bad_precopy_options_are_checkpoint_errors(tmp_path, options):
    kwargs = {"asynchronous": True, "incremental": True, "precopy": True, **options}
    with pytest.raises(CheckpointError):
        Checkpointer(str(tmp_path / "root"), track_failures=False, handle_signals=False, **kwargs)


@pytest.mark.parametrize("mode", [{}, {"asynchronous": True}, {"asynchronous": True, "local_dir": "local"}])
def test_precopy_with_full_versions_is_refused_with_the_reason(tmp_path, mode):
    mode = {k: str(tmp_path / v) if k == "local_dir" else v for k, v in mode.items()}
    with pytest.raises(CheckpointError, match="^precopy needs incremental=True: pre-copy writes ahead the blocks "
                                              "that changed since the previous checkpoint") as err:
        Checkpointer(str(tmp_path / "root"), precopy=True, track_failures=False, handle_signals=False, **mode)
    assert "supported" not in str(err.value)


# ------------------------------------------------------------------ MPI
@pytest.fixture
def comm():
    from mpi4py import MPI

    return MPI.COMM_WORLD


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(120)
def test_precopy_under_mpi_restores_exactly_on_other_rank_counts(comm, mpi_tmp):
    from mpi4py import MPI

    rows = 48 + 16 * comm.rank  # uneven blocks: ranks do different rounds (and few enough change for them to pay)
    lo = sum(48 + 16 * r for r in range(comm.rank))
    total = sum(48 + 16 * r for r in range(comm.size))
    rng = np.random.default_rng(10 + comm.rank)
    a = rng.random((rows, COLS))
    root = os.path.join(mpi_tmp, "root")
    with _checkpointer(root, comm=comm) as ck:
        ck.register({"u": Block(a, (lo, 0), (total, COLS))})
        mine = _run(ck, a, 4 * EVERY, rng, dirty_rows=1 + comm.rank)
        info = ck.last_result.incremental
    assert info["precopied_bytes"] > 0
    saved = {step: np.concatenate(comm.allgather(part)) for step, part in mine.items()}
    if comm.rank == 0:  # one process
        _restore_all(root, saved, comm=MPI.COMM_SELF)
    sub = comm.Split(0 if comm.rank < comm.size - 1 else MPI.UNDEFINED, comm.rank)
    if sub != MPI.COMM_NULL:  # one rank fewer, an even split of the rows
        n = total // sub.size
        start = sub.rank * n
        count = n if sub.rank < sub.size - 1 else total - start
        _restore_all(root, saved, comm=sub, block=((start, 0), (count, COLS)))
        sub.Free()
    comm.Barrier()


def test_precopy_of_device_arrays(tmp_path, monkeypatch):
    """CuPy state (tests/support/fakecupy.py): rounds hash on the device (mix128) and stage only new blocks to the host."""
    import fakecupy

    cupy = fakecupy.install(monkeypatch)
    rng = np.random.default_rng(5)
    dev = cupy.asarray(rng.random((ROWS, COLS)))
    root = str(tmp_path / "root")
    saved = {}
    with _checkpointer(root) as ck:
        ck.register({"u": Block(dev, (0, 0), dev.shape)})
        for step in range(1, 3 * EVERY + 1):
            _compute(ck)
            dev[int(rng.integers(0, ROWS))] += 1.0
            before = dev.get().copy()
            if ck.maybe_save(step) is not None:
                saved[step] = before
                dev += 1.0  # right after the call
        ck.wait()
        assert ck.last_result.incremental["precopied_bytes"] > 0
    _restore_all(root, saved)
