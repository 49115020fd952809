"""Debug mode (issue 13): a collective hpcckpt call made on a subset of the ranks ends the job within the
timeout, with one line naming the call, instead of hanging forever."""

from __future__ import annotations

import os
import time

import pytest

from hpcckpt.watchdog import WatchedComm, entry_point, watch
from mpitools import ROOT, run_mpi

SCRIPT = os.path.join(ROOT, "tests", "scripts", "subset_call.py")


@pytest.mark.timeout(120)
def test_a_call_on_one_rank_aborts_with_its_name_in_debug_mode(tmp_path):
    t = time.monotonic()
    proc = run_mpi(2, SCRIPT, tmp_path / "root", timeout=90, check=False,
                   env={"HPCCKPT_DEBUG": "1", "HPCCKPT_DEBUG_TIMEOUT": "3"})
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "STEPS" not in proc.stdout, out
    assert "rank 0 waited 3 s in MPI" in out and "hpcckpt.checkpointer.steps" in out, out
    assert time.monotonic() - t < 60


def test_debug_mode_is_off_by_default_and_for_one_process(monkeypatch):
    from hpcckpt.collective import SerialComm

    class Two(SerialComm):
        def Get_size(self):
            return 2

    monkeypatch.delenv("HPCCKPT_DEBUG", raising=False)
    comm = Two()
    assert watch(comm) is comm
    monkeypatch.setenv("HPCCKPT_DEBUG", "1")
    watched = watch(comm)
    assert isinstance(watched, WatchedComm) and watch(watched) is watched
    assert watched.bcast(5) == 5 and watched.Get_rank() == 0  # calls pass through, timers cancelled
    one = SerialComm()
    assert watch(one) is one
    assert entry_point() == "an hpcckpt call"  # called from a test: no hpcckpt frame on the stack
