"""Errors reach the user once: ``hpcckpt.report_errors`` around an MPI program, run as real mpiexec
jobs: a CheckpointError is one line on stderr and exit status 1 on every rank; an exception on one rank is its
traceback, prefixed with the rank, and an MPI_Abort, so that no rank hangs."""

from __future__ import annotations

import os
import socket
import threading

import pytest

import hpcckpt
from hpcckpt.mpi import report
from hpcckpt.mpi.report import one_line, prefixed, unread_bytes, wait_until_taken
from mpitools import ROOT, run_mpi

SCRIPT = os.path.join(ROOT, "tests", "scripts", "report_errors.py")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("nranks, mode", [(2, "checkpoint-error"), (4, "checkpoint-error"), (2, "decorated"),
                                          (4, "decorated")])
def test_a_checkpoint_error_is_one_line_and_status_1_everywhere(tmp_path, nranks, mode):
    proc = run_mpi(nranks, SCRIPT, tmp_path / "root", mode, timeout=90, check=False)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr  # one line, from rank 0, no traceback
    assert lines[0].startswith(f"hpcckpt: error (raised on all {nranks} ranks): no committed checkpoint under")
    assert "What to do:" in lines[0]
    assert proc.returncode == 1 and "NOT REACHED" not in proc.stdout, (proc.returncode, proc.stdout)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("nranks", [2, 4])
def test_an_exception_on_one_rank_is_its_traceback_and_no_rank_hangs(tmp_path, nranks):
    proc = run_mpi(nranks, SCRIPT, tmp_path / "root", "crash-one", timeout=90, check=False)  # a hang fails here
    assert proc.returncode != 0 and "NOT REACHED" not in proc.stdout, (proc.returncode, proc.stdout)
    assert "[rank 1] Traceback (most recent call last):" in proc.stderr, proc.stderr
    assert "[rank 1] ValueError: a bug in the application on rank 1" in proc.stderr, proc.stderr
    assert "[rank 0] Traceback" not in proc.stderr, proc.stderr  # only the rank that raised it
    assert proc.stderr.count("ValueError: a bug") == 1, proc.stderr  # once: nothing runs on after the abort


@pytest.mark.timeout(120)
def test_a_checkpoint_error_on_one_rank_only_is_its_line_and_no_rank_hangs(tmp_path):
    proc = run_mpi(3, SCRIPT, tmp_path / "root", "checkpoint-error-on-one", timeout=90, check=False)
    assert proc.returncode != 0 and "NOT REACHED" not in proc.stdout, (proc.returncode, proc.stdout)
    assert proc.stderr.count("hpcckpt: error") == 1, proc.stderr
    assert "[rank 1] hpcckpt: error: the application's own check failed on rank 1." in proc.stderr, proc.stderr


def test_serial_checkpoint_error_is_one_line_and_exit_status_1(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HPCCKPT_NO_MPI", "1")
    with pytest.raises(SystemExit) as stop:
        with hpcckpt.report_errors():
            hpcckpt.Checkpointer(tmp_path, track_failures=False).restore({"u": hpcckpt.Block([1.0])})
    assert stop.value.code == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("hpcckpt: error: no committed checkpoint under"), err


def test_serial_other_errors_and_exits_pass_through(monkeypatch):
    monkeypatch.setenv("HPCCKPT_NO_MPI", "1")
    with pytest.raises(ValueError, match="boom"):
        with hpcckpt.report_errors():
            raise ValueError("boom")
    with pytest.raises(SystemExit) as stop:
        with hpcckpt.report_errors():
            raise SystemExit(3)
    assert stop.value.code == 3

    @hpcckpt.report_errors()
    def fine():
        return 7
    assert fine() == 7


def test_the_line_and_the_prefix():
    text = one_line(hpcckpt.CheckpointError("save failed\non 2 of 4 ranks: rank 1: OSError."), 4)
    assert "\n" not in text and "save failed on 2 of 4 ranks: rank 1: OSError. What to do:" in text
    assert prefixed("[rank 3] ", "a\nb\n") == "[rank 3] a\n[rank 3] b\n"


class _Stop(Exception):
    """What the stand-in os._exit raises: the process would end here."""


def _two_ranks(monkeypatch, rank=1, others_raise=True, events=None):
    """A stand-in two-rank communicator whose Abort is recorded, and an os._exit that does not end pytest;
    ``others_raise``: whether the other rank reaches the error path too (the non-blocking barrier completes);
    ``events``: a list that gets "drained" when the rank waits for its output to be taken, "aborted" at Abort."""
    from hpcckpt.mpi.collective import SerialComm

    aborted = []
    events = [] if events is None else events
    monkeypatch.setattr(report, "wait_until_taken", lambda fds, seconds: events.append(("drained", fds)))

    class Request:
        def Test(self):
            return others_raise

    class Two(SerialComm):
        def Get_rank(self):
            return rank

        def Get_size(self):
            return 2

        def Abort(self, code):
            aborted.append(code)
            events.append("aborted")

        def Ibarrier(self):
            return Request()

    def no_exit(code):
        raise _Stop(code)

    monkeypatch.setattr("hpcckpt.mpi.report.os._exit", no_exit)
    return Two(), aborted


def test_an_exception_is_the_prefixed_traceback_then_abort(monkeypatch, capsys):
    events = []
    comm, aborted = _two_ranks(monkeypatch, events=events)
    with pytest.raises(_Stop):
        with hpcckpt.report_errors(comm):
            raise KeyError("missing")
    err = capsys.readouterr().err
    assert aborted == [1] and err.startswith("[rank 1] Traceback") and "[rank 1] KeyError: 'missing'" in err
    assert events == [("drained", (1, 2)), "aborted"]  # stdout and stderr taken by the launcher, then the abort
    assert all(line.startswith("[rank 1] ") for line in err.splitlines()), err


def test_ctrl_c_is_one_line_per_rank_then_abort(monkeypatch, capsys):
    comm, aborted = _two_ranks(monkeypatch)
    with pytest.raises(_Stop):
        with hpcckpt.report_errors(comm):
            raise KeyboardInterrupt
    assert aborted == [1]
    assert capsys.readouterr().err == "[rank 1] interrupted (KeyboardInterrupt): aborting the job\n"


def test_a_checkpoint_error_prints_on_rank_0_only(monkeypatch, capsys):
    for rank, lines in ((0, 1), (1, 0)):
        comm, aborted = _two_ranks(monkeypatch, rank)
        with pytest.raises(SystemExit) as stop:
            with hpcckpt.report_errors(comm):
                raise hpcckpt.CheckpointError("save of step 3 failed")
        assert stop.value.code == 1 and aborted == []  # agreed: every rank exits, nothing to abort
        assert len(capsys.readouterr().err.splitlines()) == lines


def test_a_checkpoint_error_on_some_ranks_only_is_their_line_then_abort(monkeypatch, capsys):
    monkeypatch.setattr("hpcckpt.mpi.report.AGREE_SECONDS", 0.05)
    comm, aborted = _two_ranks(monkeypatch, 1, others_raise=False)
    with pytest.raises(_Stop):
        with hpcckpt.report_errors(comm):
            raise hpcckpt.CheckpointError("my own check failed")
    err = capsys.readouterr().err
    assert aborted == [1] and len(err.splitlines()) == 1, err
    assert err.startswith("[rank 1] hpcckpt: error: my own check failed.") and "did not raise it" in err


def test_unread_bytes_of_a_pipe_and_a_socket_until_their_reader_takes_them(tmp_path):
    r, w = os.pipe()
    left, right = socket.socketpair()
    with open(tmp_path / "log", "wb") as f, left, right:
        try:
            os.write(w, b"[rank 1] lost?\n")
            left.sendall(b"[rank 1] lost?\n")
            f.write(b"kept")
            f.flush()
            assert unread_bytes(w) == 15 and unread_bytes(left.fileno()) > 0
            assert unread_bytes(f.fileno()) == 0  # a file keeps what was written
            os.read(r, 100)
            right.recv(100)
            assert unread_bytes(w) == 0 and unread_bytes(left.fileno()) == 0
        finally:
            os.close(r)
            os.close(w)
    assert unread_bytes(w) == 0  # closed: nothing to wait for


def test_wait_until_taken_returns_once_the_reader_has_read_and_gives_up_at_its_deadline(monkeypatch):
    r, w = os.pipe()
    try:
        os.write(w, b"the last line")
        assert not wait_until_taken([w], 0.0)  # nobody reads: false at the deadline
        polled, taken = threading.Event(), []
        reader = threading.Thread(target=lambda: (polled.wait(30), taken.append(os.read(r, 100))))
        reader.start()
        sleep = report.time.sleep
        monkeypatch.setattr(report.time, "sleep", lambda s: (polled.set(), sleep(s)))  # the reader reads only
        assert wait_until_taken([w], 30)  # once the wait is polling
        assert taken == [b"the last line"]
        reader.join()
    finally:
        os.close(r)
        os.close(w)
