"""Collective calls made on a subset of the ranks: read-only queries work on any subset; in debug mode
ranks in different hpcckpt calls get one CheckpointError naming both, and a collective call made on a subset ends
the job within the timeout, with one line naming the call, instead of hanging forever."""

from __future__ import annotations

import os
import re

import pytest

from hpcckpt.mpi.collective import SerialComm
from hpcckpt.errors import CheckpointError
from hpcckpt.mpi.watchdog import WatchedComm, public_call, raise_if_calls_differ, watch
from mpitools import ROOT, run_mpi

SCRIPT = os.path.join(ROOT, "tests", "scripts", "subset_call.py")
DEBUG = {"HPCCKPT_DEBUG": "1", "HPCCKPT_DEBUG_TIMEOUT": "3"}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("nranks", [2, 3])
def test_rank_0_alone_lists_the_steps_and_every_rank_goes_on(tmp_path, nranks):
    proc = run_mpi(nranks, SCRIPT, tmp_path / "root", "query", timeout=90)  # no debug mode: it would hang
    out = proc.stdout
    assert out.count("STEPS [1, 2] LATEST 2") == 1, out
    assert out.count("LEVELS [1, 2, 3] 3") == 1, out  # step 3 from rank 0's node directory
    assert out.count("PENDING [1] 1") == 1 and out.count("COMMITTED [1, 2] 2") == 1, out  # pending: not listed
    assert sorted(re.findall(r"DONE \d+", out)) == [f"DONE {r}" for r in range(nranks)], out


@pytest.mark.timeout(120)
def test_a_save_on_one_rank_aborts_with_its_name_in_debug_mode(tmp_path):
    proc = run_mpi(2, SCRIPT, tmp_path / "root", "save-on-one", timeout=90, check=False, env=DEBUG)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "SAVED" not in proc.stdout, out
    assert "rank 0 waited 3 s in MPI allreduce inside Checkpointer.save(step=2)" in out, out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("nranks", [2, 3])
def test_ranks_in_different_calls_raise_one_error_naming_both(tmp_path, nranks):
    proc = run_mpi(nranks, SCRIPT, tmp_path / "root", "different-calls", timeout=90, env=DEBUG)
    # mpiexec may join the ranks' long lines: count occurrences, not lines
    raised = sorted(int(r) for r in re.findall(r"ERROR (\d+): collective calls do not match", proc.stdout))
    assert raised == list(range(nranks)), proc.stdout  # every rank raised it
    assert proc.stdout.count("rank 0 is in Checkpointer.save(step=2) (MPI allreduce), rank 1 in "
                             "Checkpointer.restore() (MPI bcast)") == nranks, proc.stdout
    assert sorted(re.findall(r"DONE \d+", proc.stdout)) == [f"DONE {r}" for r in range(nranks)], proc.stdout


def test_debug_mode_is_off_by_default_and_for_one_process(monkeypatch):
    from hpcckpt.mpi.collective import SerialComm

    class Two(SerialComm):
        def Get_size(self):
            return 2

    comm = Two()
    for off in (None, "", "0"):
        if off is None:
            monkeypatch.delenv("HPCCKPT_DEBUG", raising=False)
        else:
            monkeypatch.setenv("HPCCKPT_DEBUG", off)
        assert watch(comm) is comm  # no wrapper: no extra collective
    monkeypatch.setenv("HPCCKPT_DEBUG", "1")
    watched = watch(comm)
    assert isinstance(watched, WatchedComm) and watch(watched) is watched
    assert watched.bcast(5) == 5 and watched.Get_rank() == 0  # calls pass through, timers cancelled
    one = SerialComm()
    assert watch(one) is one
    assert public_call() == ("an hpcckpt call", "an hpcckpt call")  # called from a test: no hpcckpt frame


class TagRecorder(SerialComm):
    """One process that says it is one of two ranks (so debug mode tags its collectives) and keeps the tags
    exchanged: the (public call, MPI operation, call with its step) triples."""

    def __init__(self):
        super().__init__()
        self.tags = []

    def Get_size(self):
        return 2

    def allgather(self, obj):
        if isinstance(obj, tuple) and len(obj) == 3:
            self.tags.append(obj)
        return [obj]


def test_the_tag_names_the_public_call_and_its_step(tmp_path, monkeypatch):
    import numpy as np

    from hpcckpt import Block, Checkpointer

    comm = TagRecorder()
    monkeypatch.setenv("HPCCKPT_DEBUG", "1")
    ck = Checkpointer(tmp_path, comm=comm, track_failures=False, strategy="file-per-rank")
    ck.save({"u": Block(np.zeros(4))}, 7)
    assert ("Checkpointer", "allgather", "Checkpointer()") in comm.tags
    assert ("Checkpointer.save", "allgather", "Checkpointer.save(step=7)") in comm.tags


def test_tags_that_differ_are_one_error_naming_both_calls_and_ranks():
    same = ("Checkpointer.save", "allgather", "Checkpointer.save(step=1)")
    raise_if_calls_differ([same, ("Checkpointer.save", "allgather", "Checkpointer.save(step=2)")])  # the digest's
    with pytest.raises(CheckpointError, match=r"rank 0 is in Checkpointer.save\(step=1\) \(MPI allgather\), "
                                              r"rank 2 in hpcckpt.load\(\) \(MPI bcast\)"):
        raise_if_calls_differ([same, same, ("hpcckpt.load", "bcast", "hpcckpt.load()")])
    with pytest.raises(CheckpointError, match="MPI gather"):  # same call, other MPI operation
        raise_if_calls_differ([same, ("Checkpointer.save", "gather", "Checkpointer.save(step=1)")])


def test_a_listing_reports_what_retention_keeps(tmp_path):
    """Rank 0 retires old versions after a save has returned elsewhere: a rank listing meanwhile (here: a
    retired version still on disk) reports the versions kept, as rank 0 will once it is done."""
    import shutil

    import numpy as np

    from hpcckpt import Block, Checkpointer

    with Checkpointer(tmp_path, keep=1, track_failures=False) as ck:
        ck.save({"u": Block(np.zeros(4))}, 1)
        ck.save({"u": Block(np.ones(4))}, 2)
        ck.series.retirement.wait()  # rank 0's thread has deleted step 1's directory (uncommitted at once)
        shutil.copytree(tmp_path / "step-000000000002", tmp_path / "step-000000000001")  # not yet deleted
        assert ck.steps() == [2] and ck.latest() == 2


def test_the_tag_of_a_function_call_names_its_module(tmp_path, monkeypatch):
    import numpy as np

    import hpcckpt

    comm = TagRecorder()
    monkeypatch.setenv("HPCCKPT_DEBUG", "1")
    hpcckpt.save({"u": hpcckpt.Block(np.zeros(4))}, tmp_path / "one", comm=comm, strategy="file-per-rank")
    seen = [tag[0] for tag in comm.tags]
    assert seen and set(seen) == {"hpcckpt.save"}, seen
