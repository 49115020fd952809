"""SignalFlag chaining, replacement, deferral; the Checkpointer's signal and halt-file paths on one process.

Each test installs real handlers and sends real signals to this process
(os.kill delivers at once: the Python handler runs before os.kill returns to
the next bytecode).  The MPI side (every rank, mpiexec, Ctrl-C) is in
tests/policy/test_signal_launcher.py and tests/policy/test_mpi_pacing.py.
"""

import os
import signal
import warnings

import numpy as np
import pytest

import hpcckpt
from hpcckpt.root import halt
from hpcckpt.policy import FixedSteps, SignalFlag


@pytest.fixture(autouse=True)
def _keep_handlers():
    saved = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT)}
    yield
    for s, h in saved.items():
        signal.signal(s, h)


def test_chains_to_the_application_handler_installed_before():
    hits = []
    signal.signal(signal.SIGTERM, lambda s, f: hits.append(s))
    with SignalFlag() as flag:
        os.kill(os.getpid(), signal.SIGTERM)
        assert flag.is_set and flag.signum == signal.SIGTERM
        assert hits == [signal.SIGTERM]


def test_sigterm_with_sig_dfl_does_not_kill_and_sigint_does_not_raise():
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with SignalFlag() as flag:
        os.kill(os.getpid(), signal.SIGTERM)  # SIG_DFL would end this process: the flag wins
        assert flag.signum == signal.SIGTERM
        os.kill(os.getpid(), signal.SIGINT)  # default_int_handler would raise KeyboardInterrupt here
        assert flag.signum == signal.SIGINT and flag.count == 2 and flag.pending is None
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_replacing_handler_is_adopted_with_one_warning_and_restored_at_uninstall():
    hits = []

    def app_handler(signum, frame):
        hits.append(signum)

    flag = SignalFlag().install()
    signal.signal(signal.SIGTERM, app_handler)  # as Veros' run() does
    with pytest.warns(RuntimeWarning, match=r"SIGTERM handler of hpcckpt was replaced by .*app_handler.*re-installed"):
        assert flag.adopt_replacements() == [signal.SIGTERM]
    os.kill(os.getpid(), signal.SIGTERM)
    assert flag.signum == signal.SIGTERM and hits == [signal.SIGTERM]  # both: the flag and the application
    signal.signal(signal.SIGTERM, app_handler)  # replaced again: re-adopted, no second warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert flag.adopt_replacements() == [signal.SIGTERM]
        assert flag.adopt_replacements() == []
    flag.uninstall()
    assert signal.getsignal(signal.SIGTERM) is app_handler  # the application keeps its handler


def test_chained_handlers_wait_inside_deferred_and_their_exception_is_held():
    def stop_now(signum, frame):  # a common "stop" idiom (Veros' signals_to_exception)
        raise SystemExit(f"received signal {signum}")

    signal.signal(signal.SIGTERM, stop_now)
    with SignalFlag() as flag:
        with flag.deferred():
            with flag.deferred():
                os.kill(os.getpid(), signal.SIGTERM)
                assert flag.is_set and flag.pending is None  # not called yet: inside a collective section
            assert flag.pending is None
        assert isinstance(flag.pending, SystemExit)  # called at the end of the section, exception held
        with pytest.raises(SystemExit, match="received signal 15"):
            flag.raise_pending()
        flag.raise_pending()  # once


def _state(u, step):
    return {"u": hpcckpt.Block(u, (0,), u.shape), "step": step}


def test_replaced_handler_still_leads_to_checkpoint_then_the_applications_exit(tmp_path):
    ck = hpcckpt.Checkpointer(tmp_path / "ck", policy=FixedSteps(1000), track_failures=False, handle_signals=True)
    calls = []

    def stop_now(signum, frame):
        calls.append(signum)
        raise SystemExit("app stops")

    signal.signal(signal.SIGTERM, stop_now)  # the application replaces hpcckpt's handler
    u = np.arange(4.0)
    with pytest.warns(RuntimeWarning, match="SIGTERM handler of hpcckpt was replaced"):
        assert ck.maybe_save(_state(u, 1), 1) is None  # adopted here
    u += 1
    os.kill(os.getpid(), signal.SIGTERM)
    assert calls == [signal.SIGTERM]  # the application's handler ran, its SystemExit is held
    with pytest.raises(SystemExit, match="app stops"):
        ck.maybe_save(_state(u, 2), 2)  # raised only after the final checkpoint is committed
    assert ck.should_exit() and ck.stop_reason == "SIGTERM"
    ck.close()
    assert ck.pacer.signals.pending is None
    assert np.array_equal(hpcckpt.open(tmp_path / "ck" / "step-000000000002").read("u"), u)


def test_halt_file_asks_for_a_final_checkpoint_and_is_removed_at_close(tmp_path):
    root = tmp_path / "ck"
    root.mkdir()
    halt.request(root, "  disk   maintenance ")
    assert halt.requested(root) == "disk maintenance"
    u = np.arange(3, dtype=np.int64)
    with hpcckpt.Checkpointer(root, policy=FixedSteps(1000), handle_signals=False) as ck:
        assert ck.maybe_save(_state(u, 5), 5) is not None
        assert ck.should_exit()
        assert ck.stop_reason == f"halt file {root / '.hpcckpt-halt'} (disk maintenance)"
        assert os.path.exists(root / ".hpcckpt-halt")  # until the run closes
    assert not os.path.exists(root / ".hpcckpt-halt")
    from hpcckpt.policy import FailureHistory

    assert FailureHistory.load(str(root)).runs[-1].end_reason == "halt"  # a clean end, not a failure
    back = np.zeros(3, np.int64)
    hpcckpt.load(_state(back, 0), str(root / "step-000000000005"))
    assert np.array_equal(back, u)


def test_no_halt_file_no_stop(tmp_path):
    with hpcckpt.Checkpointer(tmp_path, policy=FixedSteps(1000), track_failures=False, handle_signals=False) as ck:
        assert ck.maybe_save(_state(np.zeros(2), 1), 1) is None
        assert not ck.should_exit() and ck.stop_reason is None


def test_cli_halt_writes_removes_and_refuses_a_missing_root(tmp_path, capsys):
    from hpcckpt.cli import main

    root = tmp_path / "ck"
    root.mkdir()
    assert main(["halt", str(root), "--reason", "quota\ncheck"]) == 0
    assert halt.requested(root) == "quota check"  # one line, as the job prints it
    assert main(["halt", str(root), "--remove"]) == 0 and halt.requested(root) is None
    assert main(["halt", str(root), "--remove"]) == 0
    assert "has no halt file" in capsys.readouterr().out
    assert main(["halt", str(tmp_path / "nope")]) == 1
    assert "no such checkpoint root" in capsys.readouterr().err
    (root / ".hpcckpt-halt").touch()  # any file at the path counts, with no reason
    assert halt.requested(root) == ""


def test_flags_closed_out_of_order_leave_sigint_as_it_was():
    signal.signal(signal.SIGINT, signal.default_int_handler)
    first, second = SignalFlag().install(), SignalFlag().install()  # second chains to first
    first.uninstall()  # second's handler stays in place: first's is still in its chain
    os.kill(os.getpid(), signal.SIGINT)
    assert second.signum == signal.SIGINT and not first.is_set and second.pending is None  # nor raises
    second.uninstall()  # puts back what first's handler, now transparent, stood for
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)


def test_two_checkpointers_share_one_chain_and_both_flags_set(tmp_path):
    """Two Checkpointers of one process saving in turn: no warning, no chain that grows with every save (it
    once grew by one handler per save and signal, until getsignal's repr of it hit the recursion limit)."""
    signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    state = {"u": hpcckpt.Block(np.arange(4.0))}
    first = hpcckpt.Checkpointer(tmp_path / "a", keep=1, track_failures=False)
    second = hpcckpt.Checkpointer(tmp_path / "b", keep=1, track_failures=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for step in range(60):
            first.save(state, step=step)
            second.save(state, step=step)
    depth, handler = 0, signal.getsignal(signal.SIGUSR1)
    while callable(handler) and hasattr(handler, "previous"):
        depth, handler = depth + 1, handler.previous
    assert depth == 2 and handler == signal.SIG_DFL
    os.kill(os.getpid(), signal.SIGUSR1)
    assert first.pacer.signals.is_set and second.pacer.signals.is_set
    first.close()
    second.close()
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL


def test_an_application_handler_between_two_flags_is_adopted_once_and_keeps_running():
    hits = []
    first = SignalFlag().install()
    signal.signal(signal.SIGTERM, lambda s, f: hits.append(s))  # the application, between the two flags
    second = SignalFlag().install()
    with pytest.warns(RuntimeWarning, match="SIGTERM handler of hpcckpt was replaced"):
        assert first.adopt_replacements() == [signal.SIGTERM]  # the application may not chain on: adopt
    assert first.adopt_replacements() == [] and second.adopt_replacements() == []
    os.kill(os.getpid(), signal.SIGTERM)
    assert first.is_set and second.is_set and hits == [signal.SIGTERM]
    first.uninstall()
    second.uninstall()
